#!/usr/bin/env python3
"""What a tollgate's per-upstream metric series cost: scrape bytes, samples and RSS with
many configured upstreams, idle and used.

For each count of upstreams, a fresh release tollgate (two worker threads) is started
with that many upstreams (retries and a budget on each), all pointing at one local
HTTP/1.1 backend on loopback. It is measured idle, then after one request through the
proxy to the first 10 upstreams, then after one request to every upstream: the bytes and
samples of a `GET /metrics`, and VmRSS from /proc/PID/status after that scrape. With
promtool on the PATH the scrape is checked with `promtool check metrics` (its lint
findings are counted; an unparsable scrape fails the run).

    scripts/series.py                          # 100, 2000, 10000 upstreams
    scripts/series.py --counts 2000            # some counts only
    scripts/series.py --bin path/to/tollgate   # default: $CARGO_TARGET_DIR/release/tollgate

Prints a Markdown table (docs/benchmarks.md keeps one). Build first:
`cargo build --release --bin tollgate`.
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USED_FEW = 10


def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Backend:
    """Answers every HTTP/1.1 request `200 ok`, keep-alive, on a loopback port."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.stopped = False
        self.conns = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    @staticmethod
    def serve(c):
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = c.recv(65536)
                    if not data:
                        return
                    buf += data
                _, buf = buf.split(b"\r\n\r\n", 1)
                c.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        except OSError:
            return
        finally:
            c.close()

    def stop(self):
        self.stopped = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def config(n, listen, admin, backend):
    out = [
        "[runtime]\nworker_threads = 2\n",
        f'[listener]\naddr = "127.0.0.1:{listen}"\nunknown_authorities = "refuse"\n',
        f'[admin]\naddr = "127.0.0.1:{admin}"\n',
    ]
    for i in range(n):
        out.append(
            f'[upstreams.u{i}]\nauthorities = ["u{i}"]\n'
            f'endpoints = ["127.0.0.1:{backend}"]\n'
            f"[upstreams.u{i}.retry]\nmax_attempts = 2\n"
            f'on = ["connect-failure", "reset", "503"]\n'
            f"[upstreams.u{i}.budget]\nratio = 0.1\n"
        )
    return "".join(out)


def http_get(port, path, host, conn=None):
    """One GET over `conn` (or a new connection); returns (status, body, conn)."""
    if conn is None:
        conn = socket.create_connection(("127.0.0.1", port), timeout=30)
    conn.sendall(f"GET {path} HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            raise RuntimeError(f"connection closed before the head of {host}{path}")
        buf += data
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = None
    chunked = False
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v.strip())
        if k.strip().lower() == "transfer-encoding" and "chunked" in v.lower():
            chunked = True
    if chunked:
        body = read_chunked(conn, body)
    else:
        while len(body) < (length or 0):
            data = conn.recv(1 << 20)
            if not data:
                break
            body += data
    return status, body, conn


def read_chunked(conn, buf):
    out = b""
    while True:
        while b"\r\n" not in buf:
            buf += conn.recv(1 << 20)
        size_line, buf = buf.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        while len(buf) < size + 2:
            buf += conn.recv(1 << 20)
        out += buf[:size]
        buf = buf[size + 2 :]
        if size == 0:
            return out


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def samples(text):
    return sum(1 for l in text.splitlines() if l and not l.startswith("#"))


def promtool(text):
    """`ok`, `N lint findings`, or `-` without promtool; an unparsable scrape raises."""
    tool = shutil.which("promtool")
    if tool is None:
        return "-"
    p = subprocess.run(
        [tool, "check", "metrics"], input=text.encode(), capture_output=True
    )
    out = (p.stdout + p.stderr).decode(errors="replace")
    if "error while linting" in out or "text format parsing error" in out:
        raise RuntimeError(f"promtool cannot parse the scrape:\n{out}")
    findings = [l for l in out.splitlines() if l.strip()]
    return "ok" if p.returncode == 0 else f"{len(findings)} lint findings"


def measure(binary, n, backend, verbose):
    listen, admin = free_ports(2)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tollgate.toml")
        with open(path, "w") as f:
            f.write(config(n, listen, admin, backend.port))
        proc = subprocess.Popen(
            [binary, "run", "--config", path],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL if not verbose else None,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"tollgate exited with {proc.returncode}")
                try:
                    status, _, c = http_get(admin, "/readyz", "admin")
                    c.close()
                    if status == 200:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("tollgate not ready within 60 s")
                time.sleep(0.05)

            def row(used):
                # Two scrapes: the first one's buffers are what a scraped tollgate holds.
                for _ in range(2):
                    status, body, c = http_get(admin, "/metrics", "admin")
                    c.close()
                    if status != 200:
                        raise RuntimeError(f"/metrics answered {status}")
                text = body.decode()
                rows.append(
                    (n, used, len(body), samples(text), rss_kib(proc.pid), promtool(text))
                )

            row(0)
            conn = None
            for i in range(n):
                if i == USED_FEW:
                    row(USED_FEW)
                status, _, conn = http_get(listen, "/", f"u{i}", conn)
                if status != 200:
                    raise RuntimeError(f"u{i} answered {status}")
            if conn is not None:
                conn.close()
            row(n)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="100,2000,10000")
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    ap.add_argument("--bin", default=os.path.join(target, "release", "tollgate"))
    ap.add_argument("--label", default="", help="a first column, e.g. the commit")
    ap.add_argument("-v", "--verbose", action="store_true", help="tollgate's logs")
    args = ap.parse_args()
    backend = Backend()
    try:
        label = f"| {args.label} " if args.label else ""
        print(
            ("| build " if args.label else "")
            + "| upstreams | used | scrape bytes | samples | RSS MiB | promtool |"
        )
        print(("|---" if args.label else "") + "|---:|---:|---:|---:|---:|---|")
        for n in (int(c) for c in args.counts.split(",")):
            for n, used, size, count, rss, check in measure(
                args.bin, n, backend, args.verbose
            ):
                print(
                    f"{label}| {n:,} | {used:,} | {size:,} | {count:,} | "
                    f"{rss / 1024:.1f} | {check} |",
                    flush=True,
                )
    finally:
        backend.stop()


if __name__ == "__main__":
    sys.exit(main())

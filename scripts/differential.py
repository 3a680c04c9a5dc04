#!/usr/bin/env python3
"""The request reader, differentially: malformed and ambiguous HTTP/1.1 requests sent
raw to tollgate, nginx and HAProxy, each in front of a recording upstream that keeps
the exact bytes it receives.

    differential.py TOLLGATE NGINX HAPROXY [--list] [--only NAME]

For every case, one line: each peer's verdict (its status, or `closed` / `waited`
when it gave no answer) and whether the request reached its upstream (`>up`). tollgate
may refuse more than the others, but

  - it never forwards what nginx or HAProxy refuses (answers 4xx/5xx without
    forwarding, or closes): the request is ambiguous or malformed to one of them;
  - whatever it forwards is clean and normalised: CRLF only, an origin-form (or `*`
    for OPTIONS) target, `HTTP/1.1`, one Host, no obsolete folding, no control
    characters, one framing (a single digits-only Content-Length, or
    `Transfer-Encoding: chunked` alone with chunk lines as RFC 9112 writes them), and
    a body that is exactly what that framing says;
  - the well-formed cases are forwarded by all three (the harness sees traffic).

Exits 1 if any case breaks a rule. Everything runs on loopback ports it picks itself.
"""

import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

TIMEOUT = 1.5

# name, raw request, and what is known of it: GOOD for the well-formed controls every
# peer must forward; a VALID reason for a request RFC 9110/9112 allows that nginx or
# HAProxy refuses for its own strictness, not as ambiguous (tollgate may forward it,
# cleanly); None for the rest, which tollgate must not forward if either refuses it.
GOOD = "good"


def valid(why):
    return "valid: " + why



CASES = [
    ("get", b"GET /ok HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n", GOOD),
    ("post length", b"POST /ok HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello", GOOD),
    ("post chunked", b"POST /ok HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n", GOOD),
    ("chunk extension", b"POST /ok HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5;a=b\r\nhello\r\n0\r\n\r\n", GOOD),
    ("chunked trailers", b"POST /ok HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n", GOOD),
    ("http/1.0", b"GET /ok HTTP/1.0\r\nHost: app\r\n\r\n", GOOD),
    ("tab before value", b"GET /ok HTTP/1.1\r\nHost: app\r\nX-A:\tv\r\nConnection: close\r\n\r\n", GOOD),
    ("tab before Host", b"GET /ok HTTP/1.1\r\nHost:\tapp\r\nConnection: close\r\n\r\n", valid("OWS is SP or HTAB (RFC 9110 5.6.3); nginx skips SP only")),
    # Content-Length and Transfer-Encoding together, and the smuggled request after.
    ("CL.TE", b"POST /cl-te HTTP/1.1\r\nHost: app\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n", None),
    ("TE.CL", b"POST /te-cl HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n5c\r\nGPOST /smuggled HTTP/1.1\r\nHost: app\r\nContent-Length: 15\r\n\r\nx=1\r\n0\r\n\r\n", None),
    ("CL 0 then TE", b"POST /x HTTP/1.1\r\nHost: app\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n", None),
    # Transfer-Encoding variants.
    ("TE xchunked", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: xchunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n", None),
    ("TE chunked, identity", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked, identity\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n", None),
    ("TE identity", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello", None),
    ("TE gzip, chunked", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n", None),
    ("TE twice", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n", None),
    ("TE space before colon", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding : chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n", None),
    ("TE vertical tab", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding:\x0bchunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n", None),
    ("TE in HTTP/1.0", b"POST /x HTTP/1.0\r\nHost: app\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", None),
    ("TE folded", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding:\r\n chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n", None),
    # Line endings and folding.
    ("obs-fold", b"GET /x HTTP/1.1\r\nHost: app\r\nX-A: 1\r\n 2\r\nConnection: close\r\n\r\n", None),
    ("bare LF head", b"GET /x HTTP/1.1\nHost: app\nConnection: close\n\n", None),
    ("bare LF one line", b"GET /x HTTP/1.1\r\nHost: app\nX-A: 1\r\nConnection: close\r\n\r\n", None),
    ("bare CR in value", b"GET /x HTTP/1.1\r\nHost: app\r\nX-A: a\rb\r\nConnection: close\r\n\r\n", None),
    ("NUL in value", b"GET /x HTTP/1.1\r\nHost: app\r\nX-A: a\x00b\r\nConnection: close\r\n\r\n", None),
    ("NUL in name", b"GET /x HTTP/1.1\r\nHost: app\r\nX-\x00A: 1\r\nConnection: close\r\n\r\n", None),
    ("NUL in target", b"GET /x\x00y HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n", None),
    ("space in name", b"GET /x HTTP/1.1\r\nHost: app\r\nX A: 1\r\nConnection: close\r\n\r\n", None),
    ("empty name", b"GET /x HTTP/1.1\r\nHost: app\r\n: 1\r\nConnection: close\r\n\r\n", None),
    # Host.
    ("no Host", b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n", None),
    ("Host twice, same", b"GET /x HTTP/1.1\r\nHost: app\r\nHost: app\r\nConnection: close\r\n\r\n", None),
    ("Host twice, differing", b"GET /x HTTP/1.1\r\nHost: app\r\nHost: evil\r\nConnection: close\r\n\r\n", None),
    ("Host with userinfo", b"GET /x HTTP/1.1\r\nHost: evil@app\r\nConnection: close\r\n\r\n", None),
    ("Host with path", b"GET /x HTTP/1.1\r\nHost: app/x\r\nConnection: close\r\n\r\n", None),
    # Request targets.
    ("absolute-form", b"GET http://app/x HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n", None),
    ("absolute-form, empty path", b"GET http://app?x=1 HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n", valid("an absolute-URI with an empty path (RFC 9112 3.2.2), sent on as /?x=1")),
    ("asterisk, OPTIONS", b"OPTIONS * HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n", valid("asterisk-form is OPTIONS's (RFC 9112 3.2.4); nginx has no asterisk-form")),
    ("asterisk, POST", b"POST * HTTP/1.1\r\nHost: app\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", None),
    ("authority-form, GET", b"GET app:80 HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n", None),
    ("query alone", b"GET ?x=1 HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n", None),
    ("ftp scheme", b"GET ftp://app/x HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n", None),
    ("version 1.2", b"GET /x HTTP/1.2\r\nHost: app\r\nConnection: close\r\n\r\n", None),
    ("version 2.0", b"GET /x HTTP/2.0\r\nHost: app\r\nConnection: close\r\n\r\n", None),
    ("lower-case method", b"get /x HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n", valid("a method is a case-sensitive token (RFC 9110 9.1), sent on as it came; nginx takes upper-case only")),
    # Content-Length.
    ("CL 5, 5", b"POST /x HTTP/1.1\r\nHost: app\r\nContent-Length: 5, 5\r\nConnection: close\r\n\r\nhello", valid("equal lengths are one length (RFC 9110 8.6), sent on as one field")),
    ("CL twice, same", b"POST /x HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello", valid("equal lengths are one length (RFC 9110 8.6), sent on as one field")),
    ("CL 5, 6", b"POST /x HTTP/1.1\r\nHost: app\r\nContent-Length: 5, 6\r\nConnection: close\r\n\r\nhello!", None),
    ("CL twice, differing", b"POST /x HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello!", None),
    ("CL huge", b"POST /x HTTP/1.1\r\nHost: app\r\nContent-Length: 99999999999999999999\r\nConnection: close\r\n\r\nhello", None),
    ("CL above i64", b"POST /x HTTP/1.1\r\nHost: app\r\nContent-Length: 9223372036854775808\r\nConnection: close\r\n\r\nhello", None),
    ("CL signed", b"POST /x HTTP/1.1\r\nHost: app\r\nContent-Length: +5\r\nConnection: close\r\n\r\nhello", None),
    ("CL hex", b"POST /x HTTP/1.1\r\nHost: app\r\nContent-Length: 0x5\r\nConnection: close\r\n\r\nhello", None),
    ("CL leading zeros", b"POST /x HTTP/1.1\r\nHost: app\r\nContent-Length: 005\r\nConnection: close\r\n\r\nhello", None),
    ("CL named by Connection", b"POST /x HTTP/1.1\r\nHost: app\r\nContent-Length: 5\r\nConnection: content-length, close\r\n\r\nhello", None),
    ("Host named by Connection", b"GET /x HTTP/1.1\r\nHost: app\r\nConnection: host, close\r\n\r\n", None),
    # Chunk-size lines and chunk data.
    ("chunk size garbage", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5garbage\r\nhello\r\n0\r\n\r\n", None),
    ("chunk size space", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5 \r\nhello\r\n0\r\n\r\n", None),
    ("chunk size 0x", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", None),
    ("chunk size negative", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n-5\r\nhello\r\n0\r\n\r\n", None),
    ("chunk size overflow", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n", None),
    ("chunk size bare LF", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\nhello\r\n0\r\n\r\n", None),
    ("chunk extension bare LF", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5;a\nb\r\nhello\r\n0\r\n\r\n", None),
    ("chunk extension bad", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5;a b\r\nhello\r\n0\r\n\r\n", None),
    ("chunk extension unterminated quote", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5;a=\"b\r\nhello\r\n0\r\n\r\n", None),
    ("chunk data too long", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nhello\r\n0\r\n\r\n", None),
    ("chunk data bare LF after", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\n0\r\n\r\n", None),
    ("last chunk bare LF", b"POST /x HTTP/1.1\r\nHost: app\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\n\r\n", None),
]

TCHAR = set(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


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


class Recorder:
    """An upstream that keeps every byte it receives and answers each request it can
    frame (a CRLF head, then a Content-Length or chunked body) with `200 ok`."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.received = bytearray()
        self.conns = []
        threading.Thread(target=self.accept, daemon=True).start()

    def take(self):
        with self.lock:
            got = bytes(self.received)
            self.received.clear()
            return got

    def accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        buf = b""
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                conn.close()
                return
            with self.lock:
                self.received += data
            buf += data
            while True:
                end = frame_end(buf)
                if end is None:
                    break
                buf = buf[end:]
                try:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                except OSError:
                    return


def frame_end(buf):
    """Where the request at the front of `buf` ends, if it can be framed (leniently:
    the recorder answers what it can; cleanliness is judged apart)."""
    head = buf.find(b"\r\n\r\n")
    if head < 0:
        return None
    head += 4
    text = buf[:head].decode("latin-1").lower()
    if re.search(r"\ntransfer-encoding:[^\n]*chunked", text):
        at = head
        while True:
            eol = buf.find(b"\r\n", at)
            if eol < 0:
                return None
            try:
                size = int(buf[at:eol].split(b";")[0].strip() or b"x", 16)
            except ValueError:
                return len(buf)
            if size == 0:
                end = buf.find(b"\r\n\r\n", eol)
                return None if end < 0 else end + 4
            at = eol + 2 + size + 2
            if at > len(buf):
                return None
    m = re.search(r"\ncontent-length:\s*(\d+)", text)
    n = int(m.group(1)) if m else 0
    return head + n if len(buf) >= head + n else None


def chunk_line_ok(line):
    m = re.fullmatch(rb"[0-9A-Fa-f]{1,15}((?:[ \t]*;[ \t]*[!#$%&'*+\-.^_`|~0-9A-Za-z]+(?:[ \t]*=[ \t]*(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+|\"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*\"))?)*)", line)
    return m is not None


def problems(raw):
    """What is not clean and normalised in the requests `raw` holds (empty: clean)."""
    found = []
    at = 0
    while at < len(raw):
        head_end = raw.find(b"\r\n\r\n", at)
        if head_end < 0:
            return found + ["an incomplete head"]
        head = raw[at:head_end]
        at = head_end + 4
        if re.search(rb"\r(?!\n)|(?<!\r)\n", head):
            found.append("a bare CR or LF in the head")
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or parts[2] != b"HTTP/1.1" or not parts[0] or not set(parts[0]) <= TCHAR:
            found.append(f"request line {lines[0]!r}")
            return found
        method, target = parts[0], parts[1]
        if not (target.startswith(b"/") or (target == b"*" and method == b"OPTIONS")):
            found.append(f"target {target!r}")
        if re.search(rb"[\x00-\x20\x7f]", target):
            found.append(f"control character in target {target!r}")
        fields = []
        for line in lines[1:]:
            if line[:1] in (b" ", b"\t"):
                found.append("obsolete line folding")
                continue
            name, sep, value = line.partition(b":")
            if not sep or not name or not set(name) <= TCHAR:
                found.append(f"field line {line!r}")
                continue
            if re.search(rb"[\x00-\x08\x0a-\x1f\x7f]", value):
                found.append(f"control character in {name!r}")
            fields.append((name.lower(), value.strip(b" \t")))
        names = [n for n, _ in fields]
        if names.count(b"host") != 1:
            found.append(f"{names.count(b'host')} Host fields")
        lengths = [v for n, v in fields if n == b"content-length"]
        codings = [v for n, v in fields if n == b"transfer-encoding"]
        if lengths and codings:
            found.append("Content-Length and Transfer-Encoding")
        if codings:
            if codings != [b"chunked"]:
                found.append(f"Transfer-Encoding {codings!r}")
            while True:
                eol = raw.find(b"\r\n", at)
                if eol < 0:
                    return found + ["a chunked body cut short"]
                line = raw[at:eol]
                if not chunk_line_ok(line):
                    return found + [f"chunk line {line!r}"]
                size = int(re.match(rb"[0-9A-Fa-f]+", line).group(0), 16)
                at = eol + 2
                if size == 0:
                    end = raw.find(b"\r\n\r\n", at - 2)
                    if end < 0:
                        return found + ["trailers cut short"]
                    at = end + 4
                    break
                if raw[at + size:at + size + 2] != b"\r\n":
                    return found + ["chunk data not followed by CRLF"]
                at += size + 2
        elif lengths:
            if len(lengths) != 1 or not re.fullmatch(rb"0|[1-9]\d{0,18}", lengths[0]) or int(lengths[0]) > 2**63 - 1:
                found.append(f"Content-Length {lengths!r}")
                return found
            n = int(lengths[0])
            if len(raw) < at + n:
                return found + ["a body shorter than its Content-Length"]
            at += n
    return found


def ask(port, raw):
    """Sends `raw` and reads until the peer closes, or nothing comes for TIMEOUT.
    Returns the first status (or `closed` / `waited`) and the bytes read."""
    got = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
            s.sendall(raw)
            while True:
                try:
                    data = s.recv(65536)
                except socket.timeout:
                    break
                except OSError:
                    break
                if not data:
                    break
                got += data
    except OSError:
        pass
    m = re.match(rb"HTTP/1\.[01] (\d{3})", got)
    if m:
        return m.group(1).decode(), got
    return ("closed" if not got else "garbled"), got


def wait_port(port, what, proc):
    for _ in range(100):
        if proc.poll() is not None:
            sys.exit(f"{what} exited at start (status {proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{what} did not listen on :{port}")


def main():
    args = sys.argv[1:]
    if "--list" in args:
        for name, _, _ in CASES:
            print(name)
        return 0
    only = args[args.index("--only") + 1] if "--only" in args else None
    tollgate, nginx, haproxy = args[:3]
    work = tempfile.mkdtemp(prefix="tollgate-differential.")
    rec = {peer: Recorder() for peer in ("tollgate", "nginx", "haproxy")}
    tg, admin, ngx, hap = free_ports(4)
    with open(os.path.join(work, "tollgate.toml"), "w") as f:
        f.write(
            f'[runtime]\nworker_threads = 1\n[listener]\naddr = "127.0.0.1:{tg}"\n'
            f'[admin]\naddr = "127.0.0.1:{admin}"\n[upstreams.app]\nauthorities = ["app"]\n'
            f'endpoints = ["127.0.0.1:{rec["tollgate"].port}"]\nprotocol = "http1"\n'
        )
    with open(os.path.join(work, "nginx.conf"), "w") as f:
        f.write(
            f"daemon off;\nworker_processes 1;\nerror_log {work}/nginx.err warn;\npid {work}/nginx.pid;\n"
            "events { worker_connections 256; }\nhttp {\n  access_log off;\n"
            f"  server {{\n    listen 127.0.0.1:{ngx};\n    location / {{\n"
            f"      proxy_pass http://127.0.0.1:{rec['nginx'].port};\n"
            "      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n"
            "      proxy_set_header Host $http_host;\n    }\n  }\n}\n"
        )
    with open(os.path.join(work, "haproxy.cfg"), "w") as f:
        f.write(
            "global\n  maxconn 256\ndefaults\n  mode http\n  timeout connect 2s\n"
            "  timeout client 5s\n  timeout server 5s\n"
            f"frontend front\n  bind 127.0.0.1:{hap}\n  default_backend rec\n"
            f"backend rec\n  server rec 127.0.0.1:{rec['haproxy'].port}\n"
        )
    procs = {
        "tollgate": subprocess.Popen(
            [tollgate, "run", "--config", os.path.join(work, "tollgate.toml")],
            stderr=open(os.path.join(work, "tollgate.err"), "w"),
            env={**os.environ, "RUST_LOG": "warn"},
        ),
        "nginx": subprocess.Popen(
            [nginx, "-c", os.path.join(work, "nginx.conf"), "-p", work],
            stderr=subprocess.DEVNULL,
        ),
        "haproxy": subprocess.Popen(
            [haproxy, "-f", os.path.join(work, "haproxy.cfg"), "-db"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    }
    ports = {"tollgate": tg, "nginx": ngx, "haproxy": hap}
    failed = 0
    try:
        for peer, proc in procs.items():
            wait_port(ports[peer], peer, proc)
        print(f"{'case':36} {'tollgate':12} {'nginx':12} {'haproxy':12} verdict")
        for name, raw, known in CASES:
            if only and name != only:
                continue
            for r in rec.values():
                r.take()
            verdicts = {}
            threads = []
            for peer in procs:
                def run(peer=peer):
                    verdicts[peer] = ask(ports[peer], raw)
                t = threading.Thread(target=run)
                t.start()
                threads.append(t)
            for t in threads:
                t.join()
            time.sleep(0.05)
            forwarded = {peer: r.take() for peer, r in rec.items()}
            wrong = []
            refused_by = [
                p for p in ("nginx", "haproxy")
                if not forwarded[p] and (verdicts[p][0] in ("closed", "garbled") or verdicts[p][0] >= "400")
            ]
            if forwarded["tollgate"]:
                if refused_by and not (known or "").startswith("valid: "):
                    wrong.append(f"forwarded what {' and '.join(refused_by)} refused")
                wrong += problems(forwarded["tollgate"])
                if b"/smuggled" in forwarded["tollgate"].split(b"\r\n\r\n", 1)[0] or re.search(rb"\r\n\r\n[A-Z]+ /smuggled", forwarded["tollgate"]):
                    wrong.append("a smuggled request reached the upstream")
            if known == GOOD and not all(forwarded.values()):
                wrong.append("a well-formed request was not forwarded by every peer")
            cells = []
            for peer in procs:
                v = verdicts[peer][0]
                if v == "closed" and not verdicts[peer][1]:
                    v = "closed"
                cells.append(f"{v}{' >up' if forwarded[peer] else ''}")
            verdict = "FAIL: " + "; ".join(wrong) if wrong else "ok"
            if not wrong and refused_by and forwarded["tollgate"]:
                verdict = f"ok ({known})"
            failed += bool(wrong)
            print(f"{name:36} {cells[0]:12} {cells[1]:12} {cells[2]:12} {verdict}", flush=True)
        alive = [p for p, proc in procs.items() if proc.poll() is not None]
        if alive:
            print(f"FAIL: {', '.join(alive)} exited during the run")
            failed += 1
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        subprocess.run(["rm", "-rf", work], check=False)
    print(f"{len(CASES) if not only else 1} cases, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

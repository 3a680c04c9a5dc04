#!/usr/bin/env python3
"""A sidecar's idle memory as a fresh pod starts it: `BIN run` with the default config,
the binary (and the `tollgate-proxy` beside it, which `tollgate run` hands over to) evicted
from the page cache first, so that what is read and mapped at start is counted as a new
node's first pod counts it. VmRSS, RssAnon and RssFile from /proc/PID/status once the
admin port answers `/readyz` and a second has passed, medians over rounds; the binaries
are taken in turn within each round, so that they share the host's noise.

    scripts/idle-memory.py BIN [BIN ...]           # e.g. an older build against this one
    scripts/idle-memory.py --rounds 7 --config config/tollgate.toml BIN ...

Build first: `cargo build --release`.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
import urllib.request

FIELDS = ("VmRSS", "RssAnon", "RssFile")


def evict(path):
    """Drops `path`'s pages from the page cache (they are clean: nothing is lost)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in FIELDS:
                out[key] = int(value.split()[0])
    return out


def admin_addr(config):
    """The admin address the config binds (the line `addr = ...` after `[admin]`)."""
    section = None
    with open(config) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line.startswith("["):
                section = line
            elif section == "[admin]" and line.startswith("addr"):
                return line.split("=", 1)[1].strip().strip('"')
    return "127.0.0.1:15090"


def ready(addr, limit=10.0):
    until = time.monotonic() + limit
    while time.monotonic() < until:
        try:
            with urllib.request.urlopen(f"http://{addr}/readyz", timeout=0.5) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.02)
    return False


def one(binary, config, admin):
    evict(binary)
    proxy = os.path.join(os.path.dirname(binary), "tollgate-proxy")
    if os.path.exists(proxy):
        evict(proxy)
    p = subprocess.Popen([binary, "run", "--config", config],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not ready(admin):
            sys.exit(f"{binary} did not answer /readyz at {admin} within 10 s")
        time.sleep(1.0)  # idle: "a second after it started" (docs/benchmarks.md)
        return status(p.pid)
    finally:
        p.terminate()
        p.wait(timeout=20)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--config", default="config/tollgate.toml")
    args = ap.parse_args()
    admin = admin_addr(args.config)
    seen = {b: [] for b in args.binaries}
    for _ in range(args.rounds):
        for b in args.binaries:
            seen[b].append(one(b, args.config, admin))
    print(f"| binary | {' | '.join(FIELDS)} (kB, median of {args.rounds}) | VmRSS each |")
    print("|---|---|---|---|---|")
    for b, runs in seen.items():
        med = [str(statistics.median(r[k] for r in runs)) for k in FIELDS]
        print(f"| {b} | {' | '.join(med)} | {', '.join(str(r['VmRSS']) for r in runs)} |")


if __name__ == "__main__":
    main()

# One column of a harm row, as a Python app POSTs with requests: each call of the plan
# (stdin: "seq at_ms path" a line) sent once at its instant, HARM_START_MS (wall clock)
# plus at_ms, as a POST of a small JSON body to HARM_BASE + path. requests honours
# `http_proxy`: the request goes to the proxy in absolute form, on a connection where
# urllib3 leaves Nagle's algorithm on (it turns it off only for connections straight to
# the server), so the body, written after the head, waits for the head's ACK. Calls run
# on a pool of threads, a Session each, keeping its connections alive as an app's does.
# A line a call on stdout: "seq status ok latency_us attempts outcome" ("-" for no
# outcome, status 0 for no answer).
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

import requests

plan = []
for line in sys.stdin.read().splitlines():
    if line.strip():
        seq, at, path = line.split(" ")
        plan.append((int(seq), int(at), path))

base = os.environ["HARM_BASE"]
column = os.environ["HARM_COLUMN"]
start = int(os.environ["HARM_START_MS"]) / 1000.0
patience = int(os.environ["HARM_PATIENCE_MS"]) / 1000.0

local = threading.local()


def session():
    s = getattr(local, "session", None)
    if s is None:
        s = requests.Session()
        local.session = s
    return s


def one(seq, path, began):
    try:
        r = session().post(
            base + path,
            json={"order": seq, "column": int(column)},
            headers={"x-harm-column": column, "x-harm-seq": str(seq)},
            timeout=patience,
        )
        body = r.content
        status = r.status_code
        ok = status == 200 and body == b"done"
        attempts = r.headers.get("x-tollgate-attempts", "0").strip() or "0"
        outcome = r.headers.get("x-tollgate-outcome", "-").strip() or "-"
    except Exception:
        status, ok, attempts, outcome = 0, False, "0", "-"
    us = int((time.monotonic() - began) * 1e6)
    return f"{seq} {status} {int(ok)} {us} {attempts} {outcome}"


pool = ThreadPoolExecutor(max_workers=64)
futures = []
for seq, at, path in plan:
    wait_s = start + at / 1000.0 - time.time()
    if wait_s > 0:
        time.sleep(wait_s)
    futures.append(pool.submit(one, seq, path, time.monotonic()))

# Every call has an answer or has given up within its patience after its instant.
done, _ = wait(futures, timeout=patience + 30)
sys.stdout.write("\n".join(f.result() for f in done) + "\n")
sys.stdout.flush()
# The threads of calls still waiting are not waited for.
os._exit(0)

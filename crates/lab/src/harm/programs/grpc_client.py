# One column of a harm row, as a Python app calls a gRPC service with grpcio: each call
# of the plan (stdin: "seq at_ms path" a line) sent once at its instant, HARM_START_MS
# (wall clock) plus at_ms, as a unary call with the path as its message. grpcio honours
# `http_proxy` (its C core sends CONNECT host:port); without it the channel dials
# HARM_TARGET itself. A line a call on stdout: "seq status ok latency_us attempts
# outcome", status 200 for grpc OK and 0 otherwise, "-" for no outcome.
import os
import sys
import threading
import time

import grpc

plan = []
for line in sys.stdin.read().splitlines():
    if line.strip():
        seq, at, path = line.split(" ")
        plan.append((int(seq), int(at), path))

target = os.environ["HARM_TARGET"]
column = os.environ["HARM_COLUMN"]
start = int(os.environ["HARM_START_MS"]) / 1000.0
patience = int(os.environ["HARM_PATIENCE_MS"]) / 1000.0
proxied = bool(os.environ.get("http_proxy"))
channel = grpc.insecure_channel(target, options=[("grpc.enable_http_proxy", int(proxied))])
call = channel.unary_unary("/harm.Harm/Call")

lines = []
lock = threading.Lock()
left = threading.Semaphore(0)


def done(seq, began, future):
    us = int((time.monotonic() - began) * 1e6)
    try:
        metadata = dict(future.initial_metadata() or ())
        metadata.update(dict(future.trailing_metadata() or ()))
        ok = future.code() == grpc.StatusCode.OK and future.result() == b"done"
    except Exception:
        ok, metadata = False, {}
    attempts = metadata.get("x-tollgate-attempts", "0")
    outcome = metadata.get("x-tollgate-outcome", "-")
    with lock:
        lines.append(f"{seq} {200 if ok else 0} {int(ok)} {us} {attempts} {outcome}")
    left.release()


for seq, at, path in plan:
    wait = start + at / 1000.0 - time.time()
    if wait > 0:
        time.sleep(wait)
    began = time.monotonic()
    future = call.future(
        path.encode(),
        timeout=patience,
        metadata=(("x-harm-column", column), ("x-harm-seq", str(seq))),
    )
    future.add_done_callback(lambda f, seq=seq, began=began: done(seq, began, f))

# Every call has an answer or has given up within its patience after its instant.
deadline = time.monotonic() + patience + 30
for _ in plan:
    if not left.acquire(timeout=max(0.0, deadline - time.monotonic())):
        break
with lock:
    sys.stdout.write("\n".join(lines) + "\n")
sys.stdout.flush()
channel.close()

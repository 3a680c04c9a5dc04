#!/usr/bin/env python3
"""The app of deploy/podman/play.sh's pods: a small HTTP server on $PORT (8080).

  GET /healthz, /ready      200 (the probes)
  GET /echo                 200, the request's headers as JSON
  GET /fail-once?key=K      503 the first time for K, 200 after (a retry succeeds)
  GET /slow?ms=N            200 after N milliseconds (a request in flight at SIGTERM)
  GET /stats                200, how many requests each path got, and how many are
                            in flight
Anything else: 404. Stops on SIGTERM.
"""

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

lock = threading.Lock()
hits = {}
failed = set()
inflight = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, status, body):
        data = json.dumps(body).encode() + b"\n"
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (the stdlib's name)
        global inflight
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        with lock:
            hits[url.path] = hits.get(url.path, 0) + 1
            inflight += 1
        try:
            self.route(url.path, query)
        finally:
            with lock:
                inflight -= 1

    def route(self, path, query):
        if path in ("/healthz", "/ready"):
            self.reply(200, {"ok": True})
        elif path == "/echo":
            self.reply(200, {k.lower(): v for k, v in self.headers.items()})
        elif path == "/fail-once":
            key = query.get("key", [""])[0]
            with lock:
                first = key not in failed
                failed.add(key)
            self.reply(503 if first else 200, {"key": key, "failed": first})
        elif path == "/slow":
            time.sleep(min(int(query.get("ms", ["1000"])[0]), 30000) / 1000)
            self.reply(200, {"slept_ms": int(query.get("ms", ["1000"])[0])})
        elif path == "/stats":
            with lock:
                self.reply(200, {"hits": hits, "inflight": inflight - 1})
        else:
            self.reply(404, {"path": path})

    def log_message(self, *args):
        pass


def main():
    server = ThreadingHTTPServer(("0.0.0.0", int(os.environ.get("PORT", "8080"))), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print("app listening", flush=True)
    server.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A tiny loopback HTTP upstream for deploy/test.sh.

Answers every request with the same status: `e2e_upstream.py 200 PORTFILE` always
succeeds, `e2e_upstream.py 503 PORTFILE` always fails. It binds 127.0.0.1 on a port the
kernel picks and writes that port to PORTFILE once it is listening, so the caller never
races for a free port. It counts the requests it served in PORTFILE.count on exit.
"""

import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATUS = int(sys.argv[1])
PORT_FILE = sys.argv[2]
served = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self):
        global served
        served += 1
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        body = b"ok\n" if STATUS < 400 else b"unavailable\n"
        self.send_response(STATUS)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = _answer

    def log_message(self, *args):
        pass


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True

    def stop(*_):
        with open(PORT_FILE + ".count", "w") as f:
            f.write(f"{served}\n")
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with open(PORT_FILE + ".tmp", "w") as f:
        f.write(f"{server.server_address[1]}\n")
    os.replace(PORT_FILE + ".tmp", PORT_FILE)
    server.serve_forever()


if __name__ == "__main__":
    main()

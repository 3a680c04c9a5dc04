#!/usr/bin/env python3
"""Prints N distinct free loopback TCP ports on one line (all held open until every
one is chosen, so none is handed out twice).

    scripts/free-ports.py N
"""

import socket
import sys

socks = []
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 1):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))

#!/usr/bin/env python3
"""Upstreams for the soak: one that flaps and one that stays up.

    upstream.py FLAPPING_PORT STABLE_PORT [--seed N]

The flapping one cycles through three phases, each lasting 15 to 30 s:
  healthy  answers 200 (and /slow after a delay),
  failing  answers 503, half of them with Retry-After: 1,
  down     stops listening: connections are refused.
The stable one is always healthy. Both speak HTTP/1.1 with keep-alive, read
Content-Length and chunked request bodies, and answer:
  /slow?ms=N   after N milliseconds
  anything     at once, with the size of the request body it read
Phase changes are printed to stdout, one line each.
"""

import asyncio
import random
import sys
import time
from urllib.parse import parse_qs, urlsplit


async def read_body(reader, headers):
    if headers.get("transfer-encoding", "").lower().endswith("chunked"):
        size = 0
        while True:
            line = await reader.readline()
            if not line:
                raise ConnectionError("eof in chunked body")
            n = int(line.split(b";")[0].strip() or b"0", 16)
            if n == 0:
                # Trailers, up to the blank line.
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                return size
            await reader.readexactly(n + 2)
            size += n
    n = int(headers.get("content-length", "0") or "0")
    if n:
        await reader.readexactly(n)
    return n


class Server:
    def __init__(self, name, port):
        self.name = name
        self.port = port
        self.phase = "healthy"
        self.server = None
        self.requests = 0

    async def start(self):
        self.server = await asyncio.start_server(
            self.serve, "127.0.0.1", self.port, reuse_address=True, backlog=1024
        )

    async def stop_listening(self):
        if self.server is not None:
            self.server.close()
            self.server = None

    async def serve(self, reader, writer):
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                try:
                    method, target, _ = line.decode("latin-1").split(" ", 2)
                except ValueError:
                    return
                headers = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                size = await read_body(reader, headers)
                self.requests += 1
                status, extra, body = 200, "", f"{self.name} {method} {size}\n"
                if self.phase == "failing":
                    status, body = 503, "failing\n"
                    if random.random() < 0.5:
                        extra = "Retry-After: 1\r\n"
                elif self.phase == "down":
                    # Connections accepted before the listener closed: reset them.
                    writer.transport.abort()
                    return
                else:
                    url = urlsplit(target)
                    if url.path.endswith("/slow"):
                        ms = int(parse_qs(url.query).get("ms", ["200"])[0])
                        await asyncio.sleep(ms / 1000)
                reason = {200: "OK", 503: "Service Unavailable"}[status]
                payload = body.encode()
                writer.write(
                    (
                        f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(payload)}\r\n"
                        f"Content-Type: text/plain\r\n{extra}\r\n"
                    ).encode()
                    + payload
                )
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()


async def flap(server, rng):
    phases = ["healthy", "failing", "healthy", "down"]
    i = 0
    while True:
        phase = phases[i % len(phases)]
        i += 1
        server.phase = phase
        if phase == "down":
            await server.stop_listening()
        elif server.server is None:
            # The port may linger briefly after closing; retry the bind.
            while True:
                try:
                    await server.start()
                    break
                except OSError:
                    await asyncio.sleep(0.2)
        print(f"{time.time():.3f} {server.name} {phase}", flush=True)
        await asyncio.sleep(rng.uniform(15, 30))


async def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    seed = 1
    if "--seed" in sys.argv:
        seed = int(sys.argv[sys.argv.index("--seed") + 1])
        args = [a for a in args if a != str(seed)]
    flapping = Server("flapping", int(args[0]))
    stable = Server("stable", int(args[1]))
    await stable.start()
    print(f"{time.time():.3f} stable healthy", flush=True)
    await flap(flapping, random.Random(seed))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass

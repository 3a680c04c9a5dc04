#!/usr/bin/env python3
"""Mixed HTTP/1.1 load for the soak.

    load.py HOST:PORT SECONDS [CONCURRENCY]

Each worker keeps a keep-alive connection and picks, per request:
  55%  GET /                       (to `api` or `solo`)
  15%  POST /echo with a 1-8 KiB body (an idempotency key on half of them)
  10%  GET /slow?ms=100..600
   5%  PUT /echo with 100 KiB (larger than max_body: forwarded, never replayed)
   5%  GET /slow?ms=3000, abandoned after 100 ms (the connection is closed)
  10%  GET / on a fresh connection with Connection: close
Prints one JSON object: counts by status, client-side errors by kind, requests sent.
"""

import asyncio
import collections
import json
import random
import sys
import time

HOSTS = ["api", "api", "api", "solo"]


class Conn:
    def __init__(self, host, port):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def open(self):
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self):
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, method, path, host, body=b"", headers=()):
        if self.writer is None:
            await self.open()
        head = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
        if body or method in ("POST", "PUT"):
            head.append(f"Content-Length: {len(body)}")
        head.extend(headers)
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("closed before a response")
        status = int(status_line.split()[1])
        length, chunked, close = None, False, False
        while True:
            h = await self.reader.readline()
            if h in (b"\r\n", b"\n"):
                break
            if not h:
                raise ConnectionError("closed in the head")
            k, _, v = h.decode("latin-1").partition(":")
            k, v = k.strip().lower(), v.strip().lower()
            if k == "content-length":
                length = int(v)
            elif k == "transfer-encoding" and v.endswith("chunked"):
                chunked = True
            elif k == "connection" and v == "close":
                close = True
        if chunked:
            while True:
                n = int((await self.reader.readline()).split(b";")[0].strip() or b"0", 16)
                if n == 0:
                    while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                await self.reader.readexactly(n + 2)
        elif length is not None:
            await self.reader.readexactly(length)
        else:
            await self.reader.read()
            close = True
        if close:
            self.close()
        return status


async def worker(addr, deadline, stats, rng):
    host, port = addr.rsplit(":", 1)
    conn = Conn(host, int(port))
    while time.monotonic() < deadline:
        r = rng.random()
        upstream = rng.choice(HOSTS)
        try:
            if r < 0.55:
                status = await conn.request("GET", "/", upstream)
            elif r < 0.70:
                body = rng.randbytes(rng.randint(1024, 8192))
                extra = [f"Idempotency-Key: {rng.random()}"] if rng.random() < 0.5 else []
                status = await conn.request("POST", "/echo", upstream, body, extra)
            elif r < 0.80:
                status = await conn.request("GET", f"/slow?ms={rng.randint(100, 600)}", upstream)
            elif r < 0.85:
                status = await conn.request("PUT", "/echo", upstream, rng.randbytes(100 * 1024))
            elif r < 0.90:
                try:
                    await asyncio.wait_for(
                        conn.request("GET", "/slow?ms=3000", upstream), timeout=0.1
                    )
                except asyncio.TimeoutError:
                    pass
                conn.close()
                stats["abandoned"] += 1
                continue
            else:
                fresh = Conn(host, int(port))
                try:
                    status = await fresh.request("GET", "/", upstream, headers=["Connection: close"])
                finally:
                    fresh.close()
            stats[str(status)] += 1
        except (ConnectionError, asyncio.IncompleteReadError, OSError, ValueError, IndexError) as e:
            stats["error:" + type(e).__name__] += 1
            conn.close()
            await asyncio.sleep(0.05)
        stats["sent"] += 1


async def main():
    addr, seconds = sys.argv[1], float(sys.argv[2])
    concurrency = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    deadline = time.monotonic() + seconds
    stats = collections.Counter()
    await asyncio.gather(
        *(worker(addr, deadline, stats, random.Random(i)) for i in range(concurrency))
    )
    print(json.dumps(dict(sorted(stats.items()))))


if __name__ == "__main__":
    asyncio.run(main())

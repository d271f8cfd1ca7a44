"""Slowloris against the gateway: N connections trickle a body a byte a second while one client
posts a normal chat completion every 0.5 s; prints how the slow ones ended and each POST's
status over time (the scripted fake frontend stands in for the model).

    .venv/bin/python -m benchmarks.bench_slowloris --connections 330
    .venv/bin/python -m benchmarks.bench_slowloris --connections 4 --set max_active=1 \\
        --set queue_capacity=3
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import time

import httpx

from gateway.config import GatewayConfig
from tests.gateway.fake_frontend import FakeFrontendServer
from tests.gateway.harness import GatewayThread


async def slow_sender(port: int, ended: list[tuple[float, str]]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n")

    async def trickle() -> None:
        try:
            while True:
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(1)
        except (ConnectionError, OSError):
            pass

    task = asyncio.ensure_future(trickle())
    start = time.monotonic()
    try:
        line = await asyncio.wait_for(reader.readline(), 60)
        ended.append((time.monotonic() - start, line.split()[1].decode()))
    except (TimeoutError, ConnectionError, IndexError) as exc:
        ended.append((time.monotonic() - start, type(exc).__name__))
    task.cancel()
    writer.close()


async def run(gw: GatewayThread, connections: int, seconds: float) -> None:
    ended: list[tuple[float, str]] = []
    senders = [asyncio.ensure_future(slow_sender(gw.config.port, ended))
               for _ in range(connections)]
    await asyncio.sleep(1.0)
    timeline = []
    async with httpx.AsyncClient(timeout=30) as client:
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            response = await client.post(gw.url + "/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "x"}]})
            timeline.append((round(time.monotonic() - start + 1, 1), response.status_code))
            await asyncio.sleep(0.5)
    await asyncio.gather(*senders)
    cut = [t for t, status in ended if status == "408"]
    print("slow senders:", dict(collections.Counter(status for _, status in ended)),
          f"408 after {min(cut):.1f}-{max(cut):.1f} s" if cut else "")
    print("normal POSTs (seconds since the slow senders connected, status):", timeline)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=330)
    parser.add_argument("--seconds", type=float, default=14.0)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=INT",
                        help="an integer GatewayConfig field (max_active=1, ...)")
    args = parser.parse_args()
    overrides = {k: int(v) for k, v in (item.split("=", 1) for item in args.set)}
    fake = FakeFrontendServer()
    try:
        with GatewayThread(GatewayConfig(frontend_address=fake.address, **overrides)) as gw:
            asyncio.run(run(gw, args.connections, args.seconds))
    finally:
        fake.stop()


if __name__ == "__main__":
    main()

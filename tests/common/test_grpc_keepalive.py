"""Keepalive: the servers accept the pings the clients send (issue 20 item 3).

With the clients pinging every second and the channel idle for longer than several ping
intervals, a real gRPC server built with `server_options()` must never answer GOAWAY
too_many_pings: the connection stays READY, the health watch (a stream with no data, the
case gRPC polices) never ends, and a request after the idle period succeeds. A server left at
gRPC's defaults (pings at most every 5 minutes) fails all three.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.errors import ValidationError
from services.common.grpc_client import UpstreamHealth, open_channel
from services.common.grpc_server import (
    DEFAULT_KEEPALIVE_MS,
    KEEPALIVE_ENV,
    keepalive_ms,
    server_options,
)

INTERVAL_MS = 1000
IDLE_S = 5.0
# What the servers ran with before: message limits only, gRPC's ping policing at its defaults.
OLD_SERVER_OPTIONS = tuple(o for o in server_options(INTERVAL_MS)
                           if o[0].startswith("grpc.max_"))


async def _idle_connection(options) -> tuple[list[grpc.ChannelConnectivity], UpstreamHealth,
                                              list[bool], int]:
    """Serve health with `options`, watch it through `open_channel`, stay idle for IDLE_S."""
    server = grpc.aio.server(options=options)
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    channel = open_channel(f"127.0.0.1:{port}")
    flips: list[bool] = []
    watcher = UpstreamHealth("upstream", channel)

    async def record() -> None:
        flips.append(watcher.serving)

    watcher._on_change = record
    states: list[grpc.ChannelConnectivity] = []

    async def track_states() -> None:
        state = channel.get_state()
        while True:
            await channel.wait_for_state_change(state)
            state = channel.get_state()
            states.append(state)

    try:
        watcher.start()
        deadline = time.monotonic() + 30
        while not watcher.serving:
            assert time.monotonic() < deadline, "the watch never saw SERVING"
            await asyncio.sleep(0.05)
        flips.clear()
        tracker = asyncio.create_task(track_states())
        await asyncio.sleep(IDLE_S)               # idle: only pings cross the connection
        tracker.cancel()
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10)
        return states, watcher, flips, reply.status
    finally:
        await watcher.stop()
        await channel.close()
        await server.stop(None)


@pytest.mark.timeout(60)
async def test_idle_channel_survives_pings_longer_than_the_interval(monkeypatch):
    monkeypatch.setenv(KEEPALIVE_ENV, str(INTERVAL_MS))
    states, watcher, flips, status = await _idle_connection(server_options())
    assert states == [], f"the connection left READY while idle: {states}"
    assert watcher.reconnects == 0              # the health stream was never ended (GOAWAY)
    assert flips == [] and watcher.serving
    assert status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.timeout(60)
async def test_old_server_settings_answer_goaway(monkeypatch):
    """The same idle period against the old server options: GOAWAY too_many_pings ends the
    watch (what the issue saw every few minutes at 30 s pings). The watcher re-watches at once
    and, the upstream being right back, never reports it down."""
    monkeypatch.setenv(KEEPALIVE_ENV, str(INTERVAL_MS))
    states, watcher, flips, status = await _idle_connection(OLD_SERVER_OPTIONS)
    assert grpc.ChannelConnectivity.IDLE in states or watcher.reconnects > 0
    assert flips == [], "a transient reconnect flipped the upstream's health"
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_keepalive_setting(monkeypatch):
    monkeypatch.delenv(KEEPALIVE_ENV, raising=False)
    assert keepalive_ms() == DEFAULT_KEEPALIVE_MS
    options = dict(server_options())
    assert options["grpc.http2.min_ping_interval_without_data_ms"] <= DEFAULT_KEEPALIVE_MS
    assert options["grpc.keepalive_permit_without_calls"] == 1
    monkeypatch.setenv(KEEPALIVE_ENV, "0")
    with pytest.raises(ValidationError, match=KEEPALIVE_ENV):
        keepalive_ms()

"""Client-side gRPC helpers: channels with Helios' options and upstream health watching."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.grpc_server import channel_options

log = logging.getLogger(__name__)


def open_channel(address: str) -> grpc.aio.Channel:
    """An insecure async channel (in-cluster traffic is h2c; TLS terminates at Envoy)."""
    return grpc.aio.insecure_channel(address, options=channel_options())


class UpstreamHealth:
    """Watches one upstream's overall health (`grpc.health.v1` Watch on service "").

    `serving` is True while the upstream reports SERVING. A status the upstream reports
    (NOT_SERVING while loading or draining) applies at once. A watch that ends without one (the
    connection went away: a GOAWAY, a reconnect, the process died) is re-opened at once and
    `serving` holds for `grace_s`: an upstream that answers the new watch within it never shows
    as down, one that does not is NOT_SERVING after `grace_s`. `on_change` (if given) is awaited
    after every change.
    """

    def __init__(
        self,
        name: str,
        channel: grpc.aio.Channel,
        on_change: Callable[[], Awaitable[None]] | None = None,
        retry_s: float = 0.5,
        grace_s: float = 1.5,
    ) -> None:
        self.name = name
        self.serving = False
        self.reconnects = 0           # watches that ended without a status (for tests, logs)
        self._stub = health_pb2_grpc.HealthStub(channel)
        self._on_change = on_change
        self._retry_s = retry_s
        self._grace_s = grace_s
        self._task: asyncio.Task[None] | None = None
        self._expiry: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name=f"health-watch-{self.name}")

    async def stop(self) -> None:
        for task in (self._task, self._expiry):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _set(self, serving: bool) -> None:
        if serving != self.serving:
            log.info("upstream %s is %s", self.name, "SERVING" if serving else "NOT_SERVING")
            self.serving = serving
            if self._on_change:
                await self._on_change()

    def _cancel_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    async def _expire(self) -> None:
        await asyncio.sleep(self._grace_s)
        self._expiry = None
        await self._set(False)

    async def _watch(self) -> None:
        while True:
            answered = False
            try:
                call = self._stub.Watch(health_pb2.HealthCheckRequest(service=""))
                async for response in call:
                    answered = True
                    self._cancel_expiry()
                    await self._set(response.status == health_pb2.HealthCheckResponse.SERVING)
            except grpc.aio.AioRpcError as exc:
                log.info("health watch on %s ended (%s: %s); watching again", self.name,
                         exc.code().name, exc.details())
            self.reconnects += 1
            if self.serving and self._expiry is None:
                self._expiry = asyncio.create_task(self._expire(),
                                                   name=f"health-expiry-{self.name}")
            # A watch that had answered is re-opened at once (the connection is new); one that
            # never answered waits `retry_s` so a down upstream is not polled in a tight loop.
            await asyncio.sleep(0 if answered else self._retry_s)

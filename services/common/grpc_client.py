"""Client-side gRPC helpers: channels with Helios' options and upstream health watching."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.grpc_server import CHANNEL_OPTIONS

log = logging.getLogger(__name__)


def open_channel(address: str) -> grpc.aio.Channel:
    """An insecure async channel (in-cluster traffic is h2c; TLS terminates at Envoy)."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


class UpstreamHealth:
    """Watches one upstream's overall health (`grpc.health.v1` Watch on service "").

    `serving` is True while the upstream reports SERVING; the watch reconnects on failure.
    `on_change` (if given) is awaited after every change.
    """

    def __init__(
        self,
        name: str,
        channel: grpc.aio.Channel,
        on_change: Callable[[], Awaitable[None]] | None = None,
        retry_s: float = 0.5,
    ) -> None:
        self.name = name
        self.serving = False
        self._stub = health_pb2_grpc.HealthStub(channel)
        self._on_change = on_change
        self._retry_s = retry_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name=f"health-watch-{self.name}")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _set(self, serving: bool) -> None:
        if serving != self.serving:
            log.info("upstream %s is %s", self.name, "SERVING" if serving else "NOT_SERVING")
            self.serving = serving
            if self._on_change:
                await self._on_change()

    async def _watch(self) -> None:
        while True:
            try:
                call = self._stub.Watch(health_pb2.HealthCheckRequest(service=""))
                async for response in call:
                    await self._set(response.status == health_pb2.HealthCheckResponse.SERVING)
            except grpc.aio.AioRpcError as exc:
                log.debug("health watch on %s ended: %s", self.name, exc.code())
            await self._set(False)
            await asyncio.sleep(self._retry_s)

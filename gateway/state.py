"""GatewayState: what every route shares (config, frontend client, admission, store, metrics)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from fastapi import Request

from gateway.admission import Admission
from gateway.config import GatewayConfig
from gateway.frontend_client import FrontendClient
from gateway.generation import EventStream
from gateway.metrics import GatewayMetrics
from gateway.responses_store import ResponsesStore, open_store
from services.common.errors import HeliosError
from services.common.grpc_client import UpstreamHealth, open_channel


class GatewayState:
    """Built in the app's lifespan (it needs the running event loop); `app.state.gateway`."""

    def __init__(self, config: GatewayConfig, admission: Admission,
                 metrics: GatewayMetrics) -> None:
        self.config = config
        self.admission = admission
        self.metrics = metrics
        self.channel: grpc.aio.Channel = open_channel(config.frontend_address)
        self.frontend = FrontendClient(self.channel)
        self.frontend_health = UpstreamHealth("frontend", self.channel)
        self.store: ResponsesStore = open_store(config)
        self.streams: set[EventStream] = set()      # every running generation

    def track(self, stream: EventStream) -> Callable[[], Awaitable[None]]:
        """Register a running generation; the returned closer cancels and forgets it."""
        self.streams.add(stream)

        async def close() -> None:
            self.streams.discard(stream)
            await stream.close()

        return close

    def abort_streams(self, error: HeliosError) -> int:
        """End every running generation with `error` (after the shutdown grace period)."""
        streams = list(self.streams)
        for stream in streams:
            stream.abort(error)
        return len(streams)

    @property
    def accepting(self) -> bool:
        return self.admission.accepting

    @property
    def active(self) -> int:
        """Admitted HTTP requests whose response has not been fully sent."""
        return self.admission.active

    def start(self) -> None:
        self.frontend_health.start()

    async def close(self) -> None:
        self.admission.close()
        await self.frontend_health.stop()
        await self.store.close()
        await self.channel.close()


def gateway_state(request: Request) -> GatewayState:
    return request.app.state.gateway


def request_id(request: Request) -> str:
    return request.state.request_id

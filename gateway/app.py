"""The FastAPI application: routes and the frontend client it shares between requests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.config import GatewayConfig
from services.common.grpc_client import UpstreamHealth, open_channel


class GatewayState:
    """What the routes share: config, the frontend channel and its health."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.channel = open_channel(config.frontend_address)
        self.frontend_health = UpstreamHealth("frontend", self.channel)
        self.accepting = True       # False once shutdown began: new requests get 503
        self.active = 0             # responses in flight (the shutdown grace waits for them)


def create_app(config: GatewayConfig) -> FastAPI:
    state: GatewayState | None = None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nonlocal state
        state = GatewayState(config)
        app.state.gateway = state
        state.frontend_health.start()
        try:
            yield
        finally:
            state.accepting = False
            await state.frontend_health.stop()
            await state.channel.close()

    app = FastAPI(title="Helios", version="0.1.0", lifespan=lifespan)

    @app.get("/health")
    async def health() -> Response:
        # 200 only while the frontend reports SERVING, which it does only while the engine and
        # imageprep do: one probe covers the whole chain.
        ready = state is not None and state.accepting and state.frontend_health.serving
        if ready:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=503,
                            headers={"Retry-After": "1"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app

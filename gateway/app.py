"""The FastAPI application: routers, error handlers, the ingress layer, /health and /metrics.

    app = create_app(config)
    app.state.admission.pause()            # embedders: new requests get 503
    await app.state.admission.wait_for_requests(timeout_s=30)
    app.state.admission.resume()
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.admission import Admission, BodyReaders
from gateway.anthropic.messages import router as anthropic_router
from gateway.config import GatewayConfig
from gateway.cors import OriginPolicy
from gateway.errors import HttpError, error_body, http_error, protocol_for_path, route_error
from gateway.ingress import BodyLimits, Ingress
from gateway.metrics import GatewayMetrics, scrape_upstreams
from gateway.ollama.embed import router as ollama_embed_router
from gateway.ollama.routes import router as ollama_router
from gateway.openai.chat import router as chat_router
from gateway.openai.completions import router as completions_router
from gateway.openai.embeddings import router as embeddings_router
from gateway.openai.models import router as models_router
from gateway.openai.responses import router as responses_router
from gateway.state import GatewayState
from gateway.validation import validation_error
from services.common.errors import HeliosError, InternalError
from services.common.heap import freeze_startup_heap
from services.common.metrics import merge_exposition

log = logging.getLogger(__name__)


def error_response(request: Request, error: HttpError) -> Response:
    state = getattr(request.app.state, "gateway", None)
    if state is not None:
        state.metrics.errors.labels(error.kind).inc()
    request_id = request.scope.get("state", {}).get("request_id", "")
    body = error_body(protocol_for_path(request.url.path), error, request_id)
    # ASCII-escaped JSON: an error may quote client text, which must never break the reply.
    return Response(json.dumps(body).encode(), status_code=error.status,
                    headers=error.headers(), media_type="application/json")


def _install_error_handlers(app: FastAPI, config: GatewayConfig) -> None:
    def typed(request: Request, exc: HeliosError) -> Response:
        if exc.kind.value in ("internal", "worker_failure", "poisoned", "drain_failure",
                              "manifest"):
            log.error("request failed: %s (cause: %s)", exc.display_message, exc.cause_text)
        return error_response(request, http_error(exc,
                                                  default_retry_after_s=config.retry_after_s))

    @app.exception_handler(HeliosError)
    async def on_helios_error(request: Request, exc: HeliosError) -> Response:
        return typed(request, exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
        return typed(request, validation_error(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = (f"no route {request.method} {request.url.path}" if exc.status_code == 404
                   else str(exc.detail))
        response = error_response(request, route_error(exc.status_code, message))
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        return response

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected failure on %s %s", request.method, request.url.path)
        error = InternalError(f"internal gateway error: {type(exc).__name__}")
        return typed(request, error)


def create_app(config: GatewayConfig, *, freeze_heap: bool = False) -> FastAPI:
    """The gateway app. `freeze_heap`: the gateway process's own app (gateway/server.py)
    freezes the start-up heap once its lifespan started (services/common/heap.py); apps run
    inside another process (tests) leave that process's heap alone."""
    admission = Admission(config.admission_limit, capacity_hint=config.capacity_hint,
                          retry_after_s=config.retry_after_s)
    metrics = GatewayMetrics(config.admission_limit, lambda: admission.active)
    body_readers = BodyReaders(config.max_body_readers, retry_after_s=config.retry_after_s)
    metrics.watch_body_readers(config.max_body_readers, lambda: body_readers.active)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = GatewayState(config, admission, metrics)
        app.state.gateway = state
        state.start()
        if freeze_heap:
            freeze_startup_heap("gateway")
        try:
            yield
        finally:
            await state.close()

    app = FastAPI(title="Helios", version="0.1.0", lifespan=lifespan,
                  description="OpenAI, Anthropic and Ollama compatible HTTP gateway")
    app.state.admission = admission
    app.state.body_readers = body_readers
    app.state.metrics = metrics
    _install_error_handlers(app, config)

    @app.get("/health", tags=["ops"])
    async def health(request: Request) -> Response:
        # 200 only while the frontend reports SERVING, which it does only while the engine and
        # imageprep do: one probe covers the whole chain.
        state: GatewayState | None = getattr(request.app.state, "gateway", None)
        if state is not None and state.accepting and state.frontend_health.serving:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=503,
                            headers={"Retry-After": "1"})

    @app.get("/metrics", tags=["ops"])
    async def prometheus() -> Response:
        # The gateway's own metrics, then (single-node runs) every upstream service's.
        body = metrics.render()
        if config.metrics_upstreams:
            body = merge_exposition([body.decode(), *await scrape_upstreams(
                config.metrics_upstreams)])
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    for router in (models_router, chat_router, completions_router, responses_router,
                   anthropic_router, ollama_router, embeddings_router, ollama_embed_router):
        app.include_router(router)
    app.add_middleware(Ingress, api_key=config.api_key, admission=admission,
                       body_readers=body_readers, metrics=metrics,
                       limits=BodyLimits(config.max_body_bytes, config.body_timeout_s,
                                         config.body_min_rate, config.body_grace_s),
                       origins=OriginPolicy(config.allowed_origins),
                       default_retry_after_s=config.retry_after_s)
    return app

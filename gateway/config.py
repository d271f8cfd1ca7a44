"""GatewayConfig: one frozen dataclass for the HTTP gateway."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.cors import check_origin_pattern
from services.common.config import CommonConfig, option
from services.common.errors import ValidationError


@dataclass(frozen=True)
class GatewayConfig(CommonConfig):
    """The HTTP gateway: OpenAI, Anthropic and Ollama APIs in front of the frontend's gRPC."""

    host: str = option("127.0.0.1", "HTTP bind address")
    port: int = option(8000, "HTTP port")
    frontend_address: str = option("127.0.0.1:50051", "frontend gRPC address")
    api_key: str = option("", "require this bearer token / x-api-key ('' = open)")
    redis_url: str = option("", "stored responses in Redis ('' = in memory)")
    # HTTP admission (reference design: at most queue_capacity + max_active requests are
    # reserved before any JSON body is read; the rest get 429 + Retry-After).
    max_active: int = option(64, "requests the model serves at once (HTTP admission share)")
    queue_capacity: int = option(256, "requests that may wait beyond max_active before 429")
    max_body_bytes: int = option(32 * 1024 * 1024, "largest request body accepted (413 above)")
    # The body phase: a request reading its body holds a body-reader slot (its own pool), not
    # an admission permit, and must finish within body_timeout_s and keep an average of
    # body_min_rate bytes/s after body_grace_s (408 otherwise): slow senders cannot starve
    # admission (docs/gateway.md, "A request's path").
    max_body_readers: int = option(256, "requests that may be sending their body at once "
                                        "(429 above it)")
    body_timeout_s: float = option(60.0, "seconds a request body may take in all (408 past it)")
    body_min_rate: int = option(1024, "average bytes/s a request body must keep after "
                                      "body_grace_s (408 below it; 0 = no minimum)")
    body_grace_s: float = option(5.0, "seconds before body_min_rate applies")
    # CORS: loopback origins (http(s)://localhost, 127.0.0.1, [::1], any port) and desktop
    # apps' schemes are always allowed, like Ollama; these are added ('*' = any origin, '*'
    # inside a pattern = any characters; gateway/cors.py).
    allowed_origins: tuple[str, ...] = option(
        (), "browser origins allowed besides loopback ones (e.g. https://app.example.com, "
            "https://*.example.com, chrome-extension://*, *)")
    capacity_hint: str = option("raise --queue-capacity / --max-active (gateway)",
                                "appended to 429 ingress-capacity errors")
    retry_after_s: float = option(1.0, "Retry-After sent with 429/503 when upstream gives none")
    sse_keepalive_s: float = option(10.0, "idle seconds before an SSE keep-alive comment / ping")
    # A server that closes an idle keep-alive connection at the moment a client reuses it
    # fails that request (httpx: ReadError). uvicorn's default (5 s) equals httpx's pool
    # expiry (the openai/anthropic SDKs) and is far below Envoy's upstream idle timeout (300 s,
    # docker/envoy.yaml), so both raced; longer than both, the client always closes first.
    keep_alive_s: float = option(330.0, "idle seconds a keep-alive client connection stays open "
                                        "(keep above the proxy's upstream idle timeout)")
    responses_ttl_s: int = option(7 * 24 * 3600, "lifetime of stored /v1/responses objects")
    responses_max_entries: int = option(10_000, "stored responses kept in memory (no Redis)")
    ollama_version: str = option("0.12.0", "version reported by /api/version")
    thinking_signature_key: str = option(
        "", "HMAC key signing Anthropic thinking blocks ('' = a random per-process key; set "
            "one shared key when several gateways or restarts must verify each other's)")
    metrics_upstreams: tuple[str, ...] = option(
        (), "other services' /metrics URLs that /metrics appends (single-node picture)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.port <= 65535:
            raise ValidationError("port must be within 0..65535", param="port")
        if not self.frontend_address:
            raise ValidationError("gateway needs --frontend-address", param="frontend_address")
        if self.max_active < 1:
            raise ValidationError("max_active must be >= 1", param="max_active")
        if self.queue_capacity < 0:
            raise ValidationError("queue_capacity must be >= 0", param="queue_capacity")
        if self.max_body_bytes < 1024:
            raise ValidationError("max_body_bytes must be >= 1024", param="max_body_bytes")
        if self.max_body_readers < 1:
            raise ValidationError("max_body_readers must be >= 1", param="max_body_readers")
        if self.body_timeout_s <= 0:
            raise ValidationError("body_timeout_s must be > 0", param="body_timeout_s")
        if self.body_min_rate < 0:
            raise ValidationError("body_min_rate must be >= 0", param="body_min_rate")
        if self.body_grace_s < 0:
            raise ValidationError("body_grace_s must be >= 0", param="body_grace_s")
        for origin in self.allowed_origins:
            check_origin_pattern(origin)
        if self.retry_after_s < 0:
            raise ValidationError("retry_after_s must be >= 0", param="retry_after_s")
        if self.keep_alive_s <= 0:
            raise ValidationError("keep_alive_s must be > 0", param="keep_alive_s")
        if self.sse_keepalive_s <= 0:
            raise ValidationError("sse_keepalive_s must be > 0", param="sse_keepalive_s")
        if self.responses_ttl_s < 1:
            raise ValidationError("responses_ttl_s must be >= 1", param="responses_ttl_s")
        for url in self.metrics_upstreams:
            if not url.startswith(("http://", "https://")):
                raise ValidationError(f"metrics upstream {url!r} is not an http(s) URL",
                                      param="metrics_upstreams")
        if self.responses_max_entries < 1:
            raise ValidationError("responses_max_entries must be >= 1",
                                  param="responses_max_entries")

    @property
    def admission_limit(self) -> int:
        """Requests reserved at once: waiting (queue_capacity) plus served (max_active)."""
        return self.queue_capacity + self.max_active

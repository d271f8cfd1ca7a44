"""API-key authentication on raw ASGI headers (before any body is read).

With `api_key` set, every route except /health and /metrics needs `Authorization: Bearer KEY`;
Anthropic routes (/v1/messages*) also accept `x-api-key: KEY`, which the Anthropic SDK sends.
"""

from __future__ import annotations

import hmac

OPEN_PATHS = frozenset({"/health", "/metrics"})


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return ""


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))


def is_authorized(api_key: str, path: str, headers: list[tuple[bytes, bytes]]) -> bool:
    if not api_key or path in OPEN_PATHS:
        return True
    authorization = _header(headers, b"authorization")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and _same(token.strip(), api_key):
        return True
    if path.startswith("/v1/messages"):
        key = _header(headers, b"x-api-key")
        if key and _same(key, api_key):
            return True
    return False

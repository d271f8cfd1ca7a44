"""CORS for browser clients: which origins may call the gateway, and the headers they get.

Loopback origins (`http(s)://localhost`, `127.0.0.1`, `[::1]`, any port) and desktop apps'
own schemes (`app://`, `tauri://`, `vscode-webview://`, `vscode-file://`: no web site can
send them) are always allowed, as Ollama allows them; `allowed_origins` adds exact origins (`https://app.example.com`),
patterns with `*` (`https://*.example.com`, `chrome-extension://*`) or `*` for any origin. A
request whose Origin names the gateway's own host (its Swagger UI at /docs) is same-origin.

The ingress layer (`gateway/ingress.py`) answers a preflight (OPTIONS with Origin and
Access-Control-Request-Method) before auth and admission: 204 with the origin echoed, the
methods, the requested headers echoed (the SDKs' `authorization`, `x-api-key`,
`anthropic-version`, `x-stainless-*` ...) and a max age; a disallowed origin gets 403 without
CORS headers, preflight or not, so a page on another site cannot even start a generation
with a "simple" (preflight-free) request. Every response to an allowed origin, error replies
and event streams included, carries `Access-Control-Allow-Origin`, `Vary: Origin` and the
headers the clients read (`x-request-id`, `retry-after` ...).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from services.common.errors import ValidationError

Headers = list[tuple[bytes, bytes]]

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
APP_SCHEMES = ("app://", "tauri://", "vscode-webview://", "vscode-file://")
ALLOW_METHODS = b"GET, HEAD, POST, DELETE, OPTIONS"
# When a preflight names no headers (the browser then sends only safelisted ones).
DEFAULT_ALLOW_HEADERS = b"authorization, content-type, x-api-key, anthropic-version"
EXPOSE_HEADERS = b"x-request-id, request-id, retry-after, retry-after-ms, x-should-retry"
MAX_AGE_S = b"600"

_ORIGIN = re.compile(r"^[a-z][a-z0-9+.-]*://[^/?#\s]+$")


def check_origin_pattern(pattern: str) -> None:
    """Config validation: `*`, `null`, or `scheme://host[:port]` (with `*` wildcards)."""
    if pattern in ("*", "null"):
        return
    if not _ORIGIN.match(pattern.lower()):
        raise ValidationError(f"allowed origin {pattern!r} is not an origin: write "
                              "scheme://host[:port] without a path ('*' = any origin)",
                              param="allowed_origins")


def is_loopback(origin: str) -> bool:
    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018 (raises on a malformed port)
    except ValueError:
        return False
    return (parts.scheme in ("http", "https") and parts.hostname in LOOPBACK_HOSTS
            and not parts.path and not parts.query and not parts.fragment)


class OriginPolicy:
    """Decides whether a browser origin may call the gateway."""

    def __init__(self, patterns: Iterable[str]) -> None:
        patterns = [p.lower().rstrip("/") for p in patterns]
        self.any = "*" in patterns
        self.exact = frozenset(p for p in patterns if "*" not in p)
        self.wildcards = tuple(re.compile(re.escape(p).replace(r"\*", r"[^/\s]*"))
                               for p in patterns if "*" in p and p != "*")

    def allows(self, origin: str, host: str = "") -> bool:
        origin = origin.strip().lower()
        if self.any or origin in self.exact or is_loopback(origin) or \
                origin.startswith(APP_SCHEMES):
            return True
        if any(pattern.fullmatch(origin) for pattern in self.wildcards):
            return True
        # Same-origin: a page the gateway serves itself (/docs) on a non-loopback host.
        return bool(host) and "://" in origin and origin.split("://", 1)[1] == host.lower()


def header(headers: Headers, name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def is_preflight(scope: dict) -> bool:
    return (scope["method"] == "OPTIONS"
            and header(scope["headers"], b"access-control-request-method") is not None)


def preflight_headers(origin: bytes, request_headers: Headers) -> Headers:
    """The headers of the 204 answering an allowed origin's preflight."""
    asked = header(request_headers, b"access-control-request-headers")
    headers = [(b"access-control-allow-origin", origin),
               (b"access-control-allow-methods", ALLOW_METHODS),
               (b"access-control-allow-headers", asked.strip() if asked else
                DEFAULT_ALLOW_HEADERS),
               (b"access-control-max-age", MAX_AGE_S),
               (b"vary", b"Origin, Access-Control-Request-Method, "
                         b"Access-Control-Request-Headers"),
               (b"content-length", b"0")]
    if header(request_headers, b"access-control-request-private-network") == b"true":
        headers.append((b"access-control-allow-private-network", b"true"))
    return headers


def add_response_headers(headers: Headers, origin: bytes) -> Headers:
    """An allowed origin's actual response: the origin echoed, Vary: Origin, exposed headers."""
    out = [(k, v) for k, v in headers if k.lower() != b"vary"]
    vary = [v for k, v in headers if k.lower() == b"vary"]
    merged = b", ".join([*vary, b"Origin"]) if not any(
        b"origin" in v.lower() for v in vary) else b", ".join(vary)
    out += [(b"access-control-allow-origin", origin), (b"vary", merged),
            (b"access-control-expose-headers", EXPOSE_HEADERS)]
    return out

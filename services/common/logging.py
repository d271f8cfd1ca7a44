"""Structured logging: one line per record, `text` (key=value) or `json`.

Every record carries the service name; extra context goes in `extra={"fields": {...}}`:

    log.info("request admitted", extra={"fields": {"request_id": rid, "prompt_tokens": n}})
"""

from __future__ import annotations

import json
import logging
import sys
import time

_STD_ATTRS = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class _Formatter(logging.Formatter):
    def __init__(self, service: str, fmt: str) -> None:
        super().__init__()
        self._service = service
        self._json = fmt == "json"

    def format(self, record: logging.LogRecord) -> str:
        fields = dict(getattr(record, "fields", {}) or {})
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and key != "fields":
                fields[key] = value
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        stamp += f".{int(record.msecs):03d}Z"
        message = record.getMessage()
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self._json:
            payload = {"ts": stamp, "level": record.levelname.lower(), "service": self._service,
                       "logger": record.name, "msg": message, **fields}
            return json.dumps(payload, default=str, ensure_ascii=False)
        extras = " ".join(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}"
                          for k, v in fields.items() if k != "exc")
        line = f"{stamp} {record.levelname:<7} {self._service:<9} {message}"
        if extras:
            line += "  " + extras
        if "exc" in fields:
            line += "\n" + fields["exc"]
        return line


def setup_logging(service: str, level: str = "info", fmt: str = "text") -> None:
    """Configure the root logger of this process (call once, at the service entrypoint)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(service, fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("asyncio", "httpx", "httpcore", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))

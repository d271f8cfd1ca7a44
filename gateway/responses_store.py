"""Stored /v1/responses objects: Redis when `redis_url` is set, memory otherwise.

A stored response keeps what GET returns (`response`), the input items it was created from
(`input_items`, for GET .../input_items) and the conversation as chat messages (`history`:
the earlier turns, this input, and this output), which a later `previous_response_id`
continues. Records expire after `responses_ttl_s`; the memory store also keeps at most
`responses_max_entries`, dropping the least recently used.
"""

from __future__ import annotations

import collections
import json
import time
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.config import GatewayConfig
from services.common.errors import UnavailableError

KEY_PREFIX = "helios:response:"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    history: list[dict[str, Any]]

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "response": self.response,
                           "input_items": self.input_items, "history": self.history},
                          ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> StoredResponse:
        data = json.loads(text)
        return cls(id=data["id"], response=data["response"], input_items=data["input_items"],
                   history=data["history"])


class ResponsesStore(Protocol):
    async def put(self, stored: StoredResponse) -> None: ...
    async def get(self, response_id: str) -> StoredResponse | None: ...
    async def delete(self, response_id: str) -> bool: ...
    async def close(self) -> None: ...


class MemoryResponsesStore:
    """In-process store (one gateway, or tests): LRU-bounded, with expiry."""

    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._entries: collections.OrderedDict[str, tuple[float, str]] = \
            collections.OrderedDict()

    async def put(self, stored: StoredResponse) -> None:
        self._entries[stored.id] = (time.monotonic() + self._ttl_s, stored.to_json())
        self._entries.move_to_end(stored.id)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    async def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        expires, text = entry
        if time.monotonic() >= expires:
            del self._entries[response_id]
            return None
        self._entries.move_to_end(response_id)
        return StoredResponse.from_json(text)

    async def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None

    async def close(self) -> None:
        self._entries.clear()


class RedisResponsesStore:
    """Shared store for several gateway replicas: one JSON value per response, with a TTL."""

    def __init__(self, url: str, ttl_s: int) -> None:
        import redis.asyncio as redis

        self._redis = redis.from_url(url)
        self._ttl_s = ttl_s
        self._errors = (redis.RedisError, OSError)

    def _unavailable(self, exc: Exception) -> UnavailableError:
        error = UnavailableError(f"the stored-responses table (Redis) is unavailable: {exc}",
                                 retry_after_s=1.0, service="gateway")
        error.__cause__ = exc
        return error

    async def put(self, stored: StoredResponse) -> None:
        try:
            await self._redis.set(KEY_PREFIX + stored.id, stored.to_json(), ex=self._ttl_s)
        except self._errors as exc:
            raise self._unavailable(exc) from exc

    async def get(self, response_id: str) -> StoredResponse | None:
        try:
            text = await self._redis.get(KEY_PREFIX + response_id)
        except self._errors as exc:
            raise self._unavailable(exc) from exc
        return StoredResponse.from_json(text) if text is not None else None

    async def delete(self, response_id: str) -> bool:
        try:
            return bool(await self._redis.delete(KEY_PREFIX + response_id))
        except self._errors as exc:
            raise self._unavailable(exc) from exc

    async def close(self) -> None:
        await self._redis.aclose()


def open_store(config: GatewayConfig) -> ResponsesStore:
    if config.redis_url:
        return RedisResponsesStore(config.redis_url, config.responses_ttl_s)
    return MemoryResponsesStore(config.responses_ttl_s, config.responses_max_entries)

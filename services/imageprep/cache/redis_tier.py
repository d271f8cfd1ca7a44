"""Redis tier: prepared-image records shared by every imageprep replica, with a TTL.

Keys (values are encode_record() blobs and raw 32-byte identities):

    helios:imageprep:v1:image:<identity hex>
    helios:imageprep:v1:source:<source key hex>

Reads refresh the TTL (GETEX). Redis is a cache here: after the start-up check, a failing Redis
degrades to misses with a warning (at most one every 30 s) instead of failing requests.
"""

from __future__ import annotations

import logging
import time

import redis

from services.common.errors import UnavailableError
from services.imageprep.prepared import CorruptRecord, PreparedImage, decode_record, encode_record

log = logging.getLogger(__name__)

PREFIX = "helios:imageprep:v1:"
IDENTITY_BYTES = 32
_WARN_EVERY_S = 30.0


class RedisTier:
    def __init__(self, url: str, ttl_s: int) -> None:
        self.url = url
        self.ttl_s = ttl_s
        self._client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self._last_warning = 0.0

    def check(self) -> None:
        """Start-up check: a configured Redis must answer."""
        try:
            self._client.ping()
        except redis.RedisError as exc:
            raise UnavailableError(f"imageprep cannot reach its Redis tier at {self.url}: "
                                   f"{exc}") from exc

    def _degraded(self, what: str, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._last_warning > _WARN_EVERY_S:
            self._last_warning = now
            log.warning("redis tier %s failed (treated as a miss): %s", what, exc)

    def get(self, identity: bytes) -> PreparedImage | None:
        key = f"{PREFIX}image:{identity.hex()}"
        try:
            blob = self._client.getex(key, ex=self.ttl_s)
        except redis.RedisError as exc:
            self._degraded("get", exc)
            return None
        if not isinstance(blob, bytes):
            return None
        try:
            image = decode_record(blob)
            if image.identity != identity:
                raise CorruptRecord("record holds another identity")
            return image
        except CorruptRecord as exc:
            log.warning("dropping corrupt redis record %s: %s", key, exc)
            try:
                self._client.delete(key)
            except redis.RedisError as delete_exc:
                self._degraded("delete", delete_exc)
            return None

    def put(self, image: PreparedImage) -> bool:
        try:
            self._client.set(f"{PREFIX}image:{image.identity.hex()}", encode_record(image),
                             ex=self.ttl_s)
            return True
        except redis.RedisError as exc:
            self._degraded("put", exc)
            return False

    def lookup_source(self, key: bytes) -> bytes | None:
        try:
            identity = self._client.getex(f"{PREFIX}source:{key.hex()}", ex=self.ttl_s)
        except redis.RedisError as exc:
            self._degraded("source lookup", exc)
            return None
        if isinstance(identity, bytes) and len(identity) == IDENTITY_BYTES:
            return identity
        return None

    def bind_source(self, key: bytes, identity: bytes) -> None:
        try:
            self._client.set(f"{PREFIX}source:{key.hex()}", identity, ex=self.ttl_s)
        except redis.RedisError as exc:
            self._degraded("source bind", exc)

    def close(self) -> None:
        self._client.close()

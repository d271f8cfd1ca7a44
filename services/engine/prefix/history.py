"""PrefixHistory: chained BLAKE2b-128 keys over 64-token blocks of a prompt (and its images).

    root      = H("root",    identity)
    block[b]  = H("block",   identity, block[b-1] (root for b=0), 64 tokens, events in block b)
    key(T)    = block[T/64 - 1]                       when T is a multiple of 64 (root for T=0)
              = H("partial", identity, block[T//64 - 1], tokens [64*(T//64), T), events there)

`identity` is the model's 32-byte manifest identity, so two engines agree on a key exactly when
they serve the same model and recipe. A conditioning event (an image) carries its absolute
token position and a 32-byte identity; it first affects the keys of prefixes that consume its
position (endpoints T > position). Events keep their insertion order, even at one position.

Keys are stable under appending: adding later tokens or later events never changes the key of
an endpoint already covered, which is what lets a request's prompt checkpoints serve the next
turn of the same conversation. Events must therefore be added before the tokens they condition.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.common.errors import ValidationError

BLOCK_TOKENS = 64
KEY_BYTES = 16
IDENTITY_BYTES = 32

_ROOT, _BLOCK, _PARTIAL = b"helios-root", b"helios-block", b"helios-partial"
_SALT = b"helios-salt"
MAX_SALT_CHARS = 256


def salted_identity(identity: bytes, salt: str) -> bytes:
    """The identity a salted request's history hashes from (`cache_salt`: tenants with
    different salts never share a key, so never share cached KV; "" keeps the model's)."""
    if not salt:
        return identity
    return hashlib.blake2b(identity + salt.encode("utf-8", "surrogatepass"),
                           digest_size=IDENTITY_BYTES, person=_SALT).digest()


@dataclass(frozen=True, slots=True)
class ConditioningEvent:
    """Something besides tokens that conditions the prefix from `position` on (an image)."""

    position: int      # absolute prompt position of the first token it conditions
    identity: bytes    # 32-byte content identity (e.g. the image's semantic hash)

    def __post_init__(self) -> None:
        if self.position < 0:
            raise ValidationError(f"conditioning position must be >= 0, got {self.position}")
        if len(self.identity) != IDENTITY_BYTES:
            raise ValidationError(f"conditioning identity must be {IDENTITY_BYTES} bytes, got "
                                  f"{len(self.identity)}")


def _token_bytes(tokens: Sequence[int]) -> bytes:
    packed = array("I", tokens)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _hash(person: bytes, *parts: bytes) -> bytes:
    digest = hashlib.blake2b(digest_size=KEY_BYTES, person=person)
    for part in parts:
        digest.update(part)
    return digest.digest()


class PrefixHistory:
    """The keys of one token sequence's prefixes, hashed incrementally as it grows."""

    __slots__ = ("_blocks", "_event_positions", "_events", "_identity", "_root", "_tokens")

    def __init__(self, identity: bytes, tokens: Sequence[int] = (),
                 events: Iterable[ConditioningEvent] = ()) -> None:
        if len(identity) != IDENTITY_BYTES:
            raise ValidationError(f"model identity must be {IDENTITY_BYTES} bytes, got "
                                  f"{len(identity)}")
        self._identity = bytes(identity)
        self._root = _hash(_ROOT, self._identity)
        self._tokens: list[int] = []
        self._blocks: list[bytes] = []
        self._events: list[ConditioningEvent] = []
        self._event_positions: list[int] = []
        self.extend(tokens, events)

    # -- growth -----------------------------------------------------------------------------
    def extend(self, tokens: Sequence[int], events: Iterable[ConditioningEvent] = ()) -> None:
        """Append tokens, and events at positions not yet consumed by an existing token."""
        for event in events:
            self.add_event(event)
        if any(not 0 <= t < 2**32 for t in tokens):
            raise ValidationError("token ids must fit in 32 bits")
        self._tokens.extend(tokens)
        while len(self._tokens) >= (len(self._blocks) + 1) * BLOCK_TOKENS:
            self._blocks.append(self._block_key(len(self._blocks)))

    def add_event(self, event: ConditioningEvent) -> None:
        if event.position < len(self._tokens):
            raise ValidationError(
                f"a conditioning event at position {event.position} arrives after the token "
                f"there ({len(self._tokens)} tokens already hashed): add events first")
        if self._event_positions and event.position < self._event_positions[-1]:
            raise ValidationError("conditioning events must be added in position order")
        self._events.append(event)
        self._event_positions.append(event.position)

    # -- reading ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def identity(self) -> bytes:
        return self._identity

    @property
    def tokens(self) -> Sequence[int]:
        return self._tokens

    @property
    def root_key(self) -> bytes:
        return self._root

    @property
    def num_blocks(self) -> int:
        """Complete 64-token blocks hashed so far."""
        return len(self._blocks)

    def block_key(self, index: int) -> bytes:
        return self._blocks[index]

    def anchor_key(self, endpoint: int) -> bytes:
        """Key of the last complete block at or before `endpoint` (the root for < 64)."""
        self._check_endpoint(endpoint)
        blocks = endpoint // BLOCK_TOKENS
        return self._blocks[blocks - 1] if blocks else self._root

    def key(self, endpoint: int) -> bytes:
        """The exact key of the prefix of `endpoint` tokens (and the events it consumes)."""
        self._check_endpoint(endpoint)
        aligned = endpoint - endpoint % BLOCK_TOKENS
        anchor = self._blocks[aligned // BLOCK_TOKENS - 1] if aligned else self._root
        if aligned == endpoint:
            return anchor
        return _hash(_PARTIAL, self._identity, anchor, struct.pack("<Q", endpoint - aligned),
                     _token_bytes(self._tokens[aligned:endpoint]),
                     self._event_bytes(aligned, endpoint))

    def events_before(self, endpoint: int) -> tuple[ConditioningEvent, ...]:
        return tuple(self._events[:bisect.bisect_left(self._event_positions, endpoint)])

    # -- internals --------------------------------------------------------------------------
    def _check_endpoint(self, endpoint: int) -> None:
        if not 0 <= endpoint <= len(self._tokens):
            raise ValidationError(f"endpoint {endpoint} outside the history "
                                  f"(0..{len(self._tokens)})")

    def _event_bytes(self, start: int, end: int) -> bytes:
        lo = bisect.bisect_left(self._event_positions, start)
        hi = bisect.bisect_left(self._event_positions, end)
        parts = [struct.pack("<Q", hi - lo)]
        for event in self._events[lo:hi]:
            parts.append(struct.pack("<Q", event.position))
            parts.append(event.identity)
        return b"".join(parts)

    def _block_key(self, index: int) -> bytes:
        start = index * BLOCK_TOKENS
        parent = self._blocks[index - 1] if index else self._root
        return _hash(_BLOCK, self._identity, parent,
                     _token_bytes(self._tokens[start:start + BLOCK_TOKENS]),
                     self._event_bytes(start, start + BLOCK_TOKENS))

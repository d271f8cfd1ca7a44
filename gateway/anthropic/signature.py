"""Signatures of Anthropic `thinking` blocks.

Anthropic's thinking blocks carry an opaque `signature` that clients send back unchanged with
the block in later turns (the SDK's `ThinkingBlock.signature` is a required string; agents such
as Claude Code refuse or drop blocks without one). Helios signs the thinking text with
HMAC-SHA256 under the gateway's `thinking_signature_key` (a random per-process key when unset,
so signatures then verify only on the process that issued them):

    signature = base64url("hs1" + HMAC-SHA256(key, thinking text))

A thinking block that comes back with a signature that does not verify is refused (400
invalid_request_error, as Anthropic does); a block without one (absent or "") is accepted as
the client's own text.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets

_VERSION = b"hs1"


class ThinkingSigner:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def sign(self, thinking: str) -> str:
        digest = hmac.new(self._key, thinking.encode("utf-8", "surrogatepass"),
                          hashlib.sha256).digest()
        return base64.urlsafe_b64encode(_VERSION + digest).decode("ascii")

    def verify(self, thinking: str, signature: str) -> bool:
        # As bytes: compare_digest refuses str with non-ASCII characters (a TypeError, a 500
        # on a fuzzed signature).
        return hmac.compare_digest(self.sign(thinking).encode("ascii"),
                                   signature.encode("utf-8", "surrogatepass"))


@functools.cache
def thinking_signer(key: str) -> ThinkingSigner:
    """The signer for a configured key ('' = this process's random key)."""
    return ThinkingSigner(key.encode() if key else secrets.token_bytes(32))

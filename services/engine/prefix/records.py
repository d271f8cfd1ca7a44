"""The values the prefix checkpoint cache hands out: opaque handles and typed outcomes."""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """An immutable exact checkpoint as callers see it (opaque: pass it back to the cache)."""

    checkpoint_id: int     # monotonic within one cache, never reused
    endpoint: int          # tokens the checkpoint covers (its snapshot's consumed length)
    snapshot_id: int | None   # snapshot row: partial tail page + final hidden state at
                              # endpoint; None for a block checkpoint (a page-aligned block
                              # boundary with no saved state: a hit on it prefills on)
    resumes: bool = True      # a full-prompt hit can sample from it (its row saved the hidden
                              # state); False for a block checkpoint and for a tail checkpoint
                              # (captured inside a chunk: its row holds the partial page alone)

    @property
    def is_block(self) -> bool:
        return self.snapshot_id is None


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """A lookup's answer: the deepest ready checkpoint on the history (or none): an exact
    checkpoint, or a block checkpoint split out of a longer one at a shared block boundary."""

    checkpoint: CheckpointRef | None
    page_ids: tuple[int, ...]   # complete pages covering [0, endpoint // page_size), in order

    @property
    def endpoint(self) -> int:
        return self.checkpoint.endpoint if self.checkpoint else 0


@dataclass(frozen=True, slots=True)
class Pin:
    """Proof of one pin on a checkpoint (and so on all its ancestors); give it to `unpin`."""

    checkpoint: CheckpointRef
    serial: int


class PublishOutcome(enum.Enum):
    CREATED = "created"      # the proposal's pages and snapshot now belong to the cache
    EXISTING = "existing"    # an equal checkpoint exists: the proposal's resources stay yours


@dataclass(frozen=True, slots=True)
class Publication:
    outcome: PublishOutcome
    checkpoint: CheckpointRef   # the created one, or the existing equal one


@dataclass(frozen=True, slots=True)
class RetiredResources:
    """Storage of an evicted checkpoint: still reserved until `final_use_fence` completes."""

    page_ids: tuple[int, ...]
    snapshot_ids: tuple[int, ...]
    final_use_fence: int


@dataclass(frozen=True, slots=True)
class ReusableResources:
    """Ids whose final-use fence completed: the caller may reuse their storage now."""

    page_ids: tuple[int, ...] = ()
    snapshot_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class BlockEvent:
    """Complete 64-token blocks that became cached (stored) or stopped being cached; or, with
    `cleared`, every block at once (the cache emptied: subscribers drop what they hold)."""

    stored: bool
    block_keys: tuple[bytes, ...]   # in prefix order
    parent_key: bytes               # key of the block before the first; b"" at the root
    token_ids: tuple[int, ...] = ()   # stored events: the blocks' tokens (64 per key)
    cleared: bool = False
    medium: str = "GPU"             # the tier: GPU (device pages) or CPU (the host tier)

    @classmethod
    def all_cleared(cls) -> BlockEvent:
        return cls(False, (), b"", (), cleared=True)


@dataclass(frozen=True, slots=True)
class Advance:
    """What `advance_completed(fence)` made true."""

    published: tuple[CheckpointRef, ...]   # created checkpoints that joined lookup
    reusable: ReusableResources

"""Publishing what a step reached into the prefix cache: a checkpoint at a target endpoint
(its tail pages move to the cache and the sequence pins it), and the terminal capture a
finished choice saves for the next turn of its conversation."""

from __future__ import annotations

from services.engine.prefix.records import PublishOutcome
from services.engine.scheduler.requests import FinishReason
from services.engine.scheduler.sequence import Phase, Sequence
from services.engine.scheduler.state import SchedulerState


def publish(state: SchedulerState, seq: Sequence, fence: int, endpoint: int | None = None,
            *, resumable: bool = True) -> None:
    """The step that reached a target endpoint (by default the sequence's computed length)
    completed: publish its checkpoint. A tail capture's is not `resumable`: its snapshot row
    holds the partial page alone."""
    res = state.resources
    cache = seq.cache
    endpoint = seq.num_computed if endpoint is None else endpoint
    row = cache.take_target(endpoint)
    state.inflight.fulfil(seq, endpoint)     # cached now (or never will be, by this sequence)
    start = cache.base.endpoint if cache.base else 0
    size = res.page_size
    tail = cache.page_ids[start // size:endpoint // size]
    if not cache.owns(start, endpoint, size):        # never expected: skip it
        res.retire_snapshots([row], fence)
        return
    publication = res.cache.publish(seq.request.history, endpoint, cache.base, tail, row,
                                    fence, resumable=resumable)
    if publication.outcome is PublishOutcome.EXISTING:
        # An equal checkpoint serves lookups already. The sequence keeps its own pages (no
        # remapping) and its base: pinning the duplicate would hold pages it never reads, and
        # its next checkpoint can chain from its base over its still-private pages.
        res.retire_snapshots([row], fence)
        return
    new_pin = res.cache.pin(publication.checkpoint)
    res.cache.mark_used(publication.checkpoint, fence)
    for pin in cache.published(tail, new_pin, publication.checkpoint):
        res.cache.mark_used(pin.checkpoint, fence)
        res.cache.unpin(pin)


def begin_terminal_capture(state: SchedulerState, seq: Sequence, reason: FinishReason) -> bool:
    """Checkpoint a finished choice's exact consumed state (prompt + output but the last,
    pending token): the next turn of the conversation starts with those tokens. Only choice 0,
    only beyond the prompt, only when a snapshot row is obtainable; the caller is told the
    choice finished now, and one zero-token step saves the state before the slot retires."""
    res = state.resources
    cache = seq.cache
    endpoint = seq.total_len - 1
    start = cache.base.endpoint if cache.base else 0
    if seq.index or seq.request.cancelled or endpoint <= max(start, seq.prompt_len):
        return False
    if not cache.owns(start, endpoint, res.page_size):
        return False
    if not res.reclaim(snapshots=1):
        return False
    (row,) = res.snapshots.allocate(1)
    history = seq.request.history
    history.extend(seq.tokens(len(history), endpoint))
    cache.reserve(endpoint, row)
    seq.phase = Phase.CAPTURING
    seq.output.finish(reason)
    seq.bump()
    return True

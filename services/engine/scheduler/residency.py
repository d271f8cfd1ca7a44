"""Moving sequences in and out of slots: residency (with prefix lookup), preemption, release.

A sequence becomes resident when a slot is free and the pages for its first chunk can be
obtained. Residency looks the prompt up in the prefix cache, pins the hit (its pages become the
front of the page table), plans a restore of the hit's partial tail page, selects checkpoint
endpoints and reserves their snapshot rows. Release gives everything back behind the fence of
the sequence's last submitted step: pins are released after use is recorded, private pages and
snapshot rows retire, and the slot retires until that fence completes.

With the host tier, the lookup spans both tiers (`KVResources.lookup`): host blocks that
continue the GPU hit get private pages here and are copied into them by the sequence's first
step (`CacheHold.onload`, taken at commit), so its prefill starts after them.
"""

from __future__ import annotations

from services.engine.prefix.history import BLOCK_TOKENS
from services.engine.scheduler.checkpoints import select_checkpoint_ends
from services.engine.scheduler.resources import TieredHit
from services.engine.scheduler.sequence import Phase, Sequence
from services.engine.scheduler.state import SchedulerState


def is_eligible(seq: Sequence) -> bool:
    """Followers (choices 1..n-1) wait until the leader has consumed the prompt, so that they
    share its prompt pages through the prompt-end checkpoint."""
    if seq.index == 0:
        return True
    leader = seq.request.seqs[0]
    return leader.is_finished or leader.num_computed >= leader.prompt_len


def admit_waiting(state: SchedulerState) -> None:
    """Make waiting sequences resident, oldest first, while slots and pages allow.

    The head of the queue is never overtaken by a younger sequence that happens to fit (so a
    long prompt cannot be starved); only ineligible followers are skipped, and prompts whose
    next blocks a resident sequence is prefilling (`InflightBlocks.worth_waiting`)."""
    res = state.resources
    index = 0
    while index < len(state.waiting) and state.slots.num_free:
        seq = state.waiting[index]
        if not is_eligible(seq):
            index += 1
            continue
        # a scoring sequence needs logits for every prompt row: no cached prefix (limit 0)
        hit = res.lookup(seq.request.history, 0 if seq.scoring else seq.prompt_len)
        if not seq.scores_prompt and seq.phase is Phase.QUEUED and res.cache.block_reuse and \
                state.inflight.worth_waiting(seq.request.history, hit.endpoint,
                                             seq.prompt_len):
            index += 1                           # its blocks are being prefilled: wait
            continue
        first = min(state.config.prefill_chunk_size, seq.total_len - hit.endpoint)
        needed = res.pages_for(hit.endpoint + first) - len(hit.gpu.page_ids)
        headroom = len(state.running)           # one page per resident sequence, soon
        if res.reclaimable_pages() < needed + headroom:
            if not drop_waiting_pins(state) or res.reclaimable_pages() < needed + headroom:
                break
            continue                             # pins dropped: look the head up again
        del state.waiting[index]
        make_resident(state, seq, hit)


def make_resident(state: SchedulerState, seq: Sequence, tiered: TieredHit) -> None:
    res = state.resources
    handle = state.slots.acquire()
    assert handle is not None
    fresh = seq.phase is Phase.QUEUED          # first residency (not a preempted comeback)
    seq.handle = handle
    seq.phase = Phase.RUNNING
    seq.bump()
    hit = tiered.gpu
    pin = res.cache.pin(hit.checkpoint) if hit.checkpoint is not None else None
    request = seq.request
    if seq.index == 0 and request.admission_pin is not None:
        res.cache.unpin(request.admission_pin)      # replaced by the residency pin
        request.admission_pin = None
    seq.cache.hold(hit, pin)
    host_tokens = _bring_back(state, seq, tiered)
    endpoint = hit.endpoint + host_tokens
    restore = resume = None
    # a block checkpoint (no snapshot) is page aligned and never the whole sequence, nor is a
    # tail checkpoint (a snapshot without the hidden state: lookup never makes it a full hit);
    # host blocks continue only a block-aligned GPU hit and always leave a token to prefill
    snapshot = hit.checkpoint.snapshot_id if hit.checkpoint is not None else None
    if snapshot is not None and not host_tokens and hit.endpoint % res.page_size:
        restore = (snapshot, hit.endpoint % res.page_size)
    if snapshot is not None and not host_tokens and hit.endpoint == seq.total_len:
        assert hit.checkpoint is not None and hit.checkpoint.resumes, "lookup: no full hit"
        resume = snapshot
    seq.progress.start(endpoint, restore, resume)
    if seq.index == 0:
        if fresh and endpoint > request.cached_tokens:
            # blocks a leader prefilled after this request's admission lookup, or blocks the
            # host tier brings back: reuse counts, per tier
            if hit.endpoint != request.cached_tokens:
                res.cache.counters.reused_later(request.cached_tokens, hit.endpoint)
            if host_tokens and res.host is not None:
                res.host.count_hit(host_tokens // BLOCK_TOKENS)
                request.cached_tokens_host = host_tokens
            request.cached_tokens = endpoint
        _reserve_checkpoints(state, seq)
        if seq.cache.targets:
            state.inflight.promise(seq, request.history, endpoint, max(seq.cache.targets))
    state.running[handle.slot] = seq


def _bring_back(state: SchedulerState, seq: Sequence, tiered: TieredHit) -> int:
    """Pin the host blocks continuing the hit and give them private pages to be copied into
    (evicting GPU leaves if needed); returns the tokens they cover (0: the GPU hit alone)."""
    res = state.resources
    host = res.host
    blocks = tiered.host_blocks
    if host is None or not blocks:
        return 0
    host.pin(blocks)
    count = len(blocks) * host.pages_per_block
    if not res.reclaim(pages=count):
        host.release(blocks, 0)
        return 0
    seq.cache.bring_back(blocks, res.pages.allocate(count))
    return tiered.host_tokens


def _reserve_checkpoints(state: SchedulerState, seq: Sequence) -> None:
    res = state.resources
    wanted = select_checkpoint_ends(
        prompt_len=seq.prompt_len, message_ends=seq.request.request.checkpoint_token_ends,
        reused=seq.num_computed, extra_fraction=state.config.checkpoint_extra_fraction)
    for endpoint in wanted:               # most important first; keep what rows allow
        if not res.reclaim(snapshots=1):
            break
        (row,) = res.snapshots.allocate(1)
        seq.cache.reserve(endpoint, row)


def drop_waiting_pins(state: SchedulerState) -> bool:
    """Release the admission pins of queued requests (page pressure); True if any."""
    dropped = False
    for request in state.requests.values():
        if request.admission_pin is not None:
            state.resources.cache.unpin(request.admission_pin)
            request.admission_pin = None
            dropped = True
    return dropped


def release(state: SchedulerState, seq: Sequence) -> None:
    """Give back a resident sequence's slot, pins, pages and rows behind its last use."""
    res = state.resources
    fence = seq.progress.last_fence
    state.inflight.withdraw(seq)
    _, blocks = seq.cache.take_onload()         # never copied: nothing read them
    if blocks and res.host is not None:
        res.host.release(blocks, 0)
    pins, pages, rows = seq.cache.release()
    for pin in pins:
        res.cache.mark_used(pin.checkpoint, fence)
        res.cache.unpin(pin)
    res.retire_pages(pages, fence)
    res.retire_snapshots(rows, fence)
    seq.progress.released()
    if seq.handle is not None:
        state.running.pop(seq.handle.slot, None)
        state.slots.release(seq.handle, fence, res.completed)
    seq.bump()


def preempt(state: SchedulerState, seq: Sequence) -> None:
    """Take a resident sequence out of its slot; it resumes later from a fresh lookup."""
    release(state, seq)
    seq.handle = None
    seq.phase = Phase.PREEMPTED
    seq.progress.reset()
    state.counters.preemptions += 1
    state.enqueue(seq)

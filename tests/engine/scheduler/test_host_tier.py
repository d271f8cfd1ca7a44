"""The host-memory KV tier through the scheduler and the page-reading fake runner.

Blocks evicted from the GPU are copied to host pages by the next step and copied back into
fresh device pages when a later prompt shares them; the fake runner reads KV through the page
table, so a copy to or from the wrong page, a copy that runs too late or a host page reused
too early changes the tokens.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.engine.prefix.history import BLOCK_TOKENS, PrefixHistory
from tests.engine.fakes import Arrival, reference_tokens, run_arrivals, run_step
from tests.engine.scheduler.conftest import VOCAB, make_engine, prompt_of, request


def _serve(scheduler, runner):
    """Run until idle: (tokens per request, last usage per request)."""
    outputs: dict[str, list[int]] = {}
    usage = {}
    for _ in range(10_000):
        ran, updates = run_step(scheduler, runner)
        for update in updates:
            usage[update.request_id] = update.usage
            for delta in update.deltas:
                outputs.setdefault(update.request_id, []).extend(delta.token_ids)
        if not scheduler.has_work:
            return outputs, usage
        assert ran or scheduler.state.in_flight, "stalled"
    raise AssertionError("did not finish")


def _evict_with_others(scheduler, runner, length: int) -> None:
    for i in range(2):
        scheduler.admit(request(f"other{i}", prompt_of(length, salt=50 + i), 4))
        _serve(scheduler, runner)


def test_evicted_blocks_come_back_from_the_host_tier_exactly():
    # 24 pages of 16 tokens: one 200-token prompt and its output fit, two do not
    scheduler, runner = make_engine(num_pages=24, page_size=16, host_pages=32, max_num_seqs=1)
    res = scheduler.state.resources
    host = res.host
    assert host is not None
    first = prompt_of(200, salt=1)
    scheduler.admit(request("first", first, 4))
    _serve(scheduler, runner)
    _evict_with_others(scheduler, runner, 200)
    history = PrefixHistory(scheduler.identity, tuple(first))
    assert res.cache.lookup(history, count=False).endpoint == 0       # gone from the GPU
    assert host.counters.offloaded >= 3 and all(history.block_key(b) in host for b in range(3))
    # a prompt sharing the first three blocks: they come back instead of being recomputed
    again = first[:3 * BLOCK_TOKENS] + prompt_of(40, salt=9)
    assert scheduler.admit(request("again", again, 6)).usage.cached_tokens == 0
    outputs, usage = _serve(scheduler, runner)
    assert outputs["again"] == reference_tokens(again, 6, vocab=VOCAB)
    assert usage["again"].cached_tokens == 3 * BLOCK_TOKENS
    assert usage["again"].cached_tokens_host == 3 * BLOCK_TOKENS
    onloads = [s for s in runner.steps if s.transfers.onload]
    assert len(onloads) == 1 and len(onloads[0].transfers.onload) == 3 * host.pages_per_block
    (seq,) = onloads[0].seqs                          # copied by the step that prefills on
    assert seq.start == 3 * BLOCK_TOKENS and seq.token_ids == tuple(again[seq.start:])
    assert host.counters.hits == 1 and host.counters.onloaded_tokens == 3 * BLOCK_TOKENS
    # the blocks are back on the GPU: a third prompt hits them there
    third = first[:3 * BLOCK_TOKENS] + prompt_of(10, salt=11)
    scheduler.admit(request("third", third, 3))
    outputs, usage = _serve(scheduler, runner)
    assert outputs["third"] == reference_tokens(third, 3, vocab=VOCAB)
    assert usage["third"].cached_tokens == 3 * BLOCK_TOKENS
    assert usage["third"].cached_tokens_host == 0 and host.counters.hits == 1


def test_a_gpu_hit_inside_a_block_continues_from_the_host_at_its_start():
    """A message-boundary checkpoint at 100 tokens stays on the GPU; the blocks after it
    were evicted to the host: the hit is cut back to 64 and the host supplies 64..192."""
    scheduler, runner = make_engine(num_pages=24, page_size=16, host_pages=32, max_num_seqs=1)
    res = scheduler.state.resources
    first = prompt_of(200, salt=2)
    scheduler.admit(request("first", first, 2, ends=(100,)))
    _serve(scheduler, runner)
    # evict only the leaf (the checkpoint at 200); the one at 100 is its parent
    retired = res.cache.evict(pages=1)
    assert [r.page_ids for r in retired] and res.cache.lookup(
        PrefixHistory(scheduler.identity, tuple(first)), count=False).endpoint == 100
    scheduler.admit(request("carrier", prompt_of(5, salt=7), 1))   # its step copies them down
    _serve(scheduler, runner)
    again = first[:3 * BLOCK_TOKENS] + prompt_of(30, salt=3)
    scheduler.admit(request("again", again, 5))
    outputs, usage = _serve(scheduler, runner)
    assert outputs["again"] == reference_tokens(again, 5, vocab=VOCAB)
    assert usage["again"].cached_tokens == 3 * BLOCK_TOKENS
    assert usage["again"].cached_tokens_host == 2 * BLOCK_TOKENS


def test_salted_blocks_never_come_back_for_another_salt():
    scheduler, runner = make_engine(num_pages=24, page_size=16, host_pages=64, max_num_seqs=1)
    first = prompt_of(200, salt=4)
    scheduler.admit(replace(request("first", first, 2), cache_salt="tenant-a"))
    _serve(scheduler, runner)
    _evict_with_others(scheduler, runner, 200)
    scheduler.admit(replace(request("b", first, 3), cache_salt="tenant-b"))
    outputs, usage = _serve(scheduler, runner)
    assert outputs["b"] == reference_tokens(first, 3, vocab=VOCAB)
    assert usage["b"].cached_tokens == 0
    scheduler.admit(replace(request("a", first, 3), cache_salt="tenant-a"))
    outputs, usage = _serve(scheduler, runner)
    assert outputs["a"] == reference_tokens(first, 3, vocab=VOCAB)
    assert usage["a"].cached_tokens_host >= BLOCK_TOKENS


_request = st.tuples(
    st.integers(0, 3),            # which shared prefix
    st.integers(60, 330),         # prefix length used
    st.integers(0, 40),           # private suffix length
    st.integers(1, 12),           # max tokens
    st.integers(0, 40),           # cancel after this many steps (>= 12: never)
    st.integers(0, 40),           # arrival step
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(_request, min_size=4, max_size=16),
       gpu_blocks=st.integers(6, 10), page_size=st.sampled_from([4, 16, 64]),
       host_blocks=st.integers(1, 16), slots=st.integers(1, 3),
       hold_every=st.integers(0, 3))
def test_random_workload_with_a_host_tier_is_exact_and_leaks_nothing(
        requests, gpu_blocks, page_size, host_blocks, slots, hold_every):
    """Shared prefixes over a GPU pool of a few prompts and a small host tier: evictions
    offload, hits onload, the host tier evicts; every request still produces the reference
    tokens, and at the end every page of both tiers is free or cached."""
    per_block = BLOCK_TOKENS // page_size
    num_pages = gpu_blocks * per_block + 2
    scheduler, runner = make_engine(num_pages=num_pages, page_size=page_size,
                                    max_num_seqs=slots, num_snapshots=8,
                                    max_num_batched_tokens=96,
                                    host_pages=host_blocks * per_block)
    res = scheduler.state.resources
    assert res.host is not None
    expected: dict[str, tuple[list[int], int]] = {}
    budget = (num_pages - 2) * page_size - 16
    arrivals = []
    for i, (prefix, length, suffix, max_tokens, cancel, at) in enumerate(requests):
        prompt = (prompt_of(330, salt=prefix)[:length] +
                  prompt_of(suffix, salt=100 + i))[:budget]
        max_tokens = min(max_tokens, budget + 16 - len(prompt))
        rid = f"r{i}"
        arrivals.append(Arrival(at, request(rid, prompt, max_tokens, seed=i),
                                cancel if cancel < 12 else None))
        expected[rid] = (prompt, max_tokens)
    outputs, cancelled = run_arrivals(scheduler, runner, arrivals, hold_every=hold_every)
    for rid, (prompt, max_tokens) in expected.items():
        if rid not in cancelled:
            assert outputs[rid][0] == reference_tokens(prompt, max_tokens, seed=int(rid[1:]),
                                                    vocab=VOCAB), rid
    assert res.pages.num_free + res.cache.num_cached_pages == res.pages.capacity
    host = res.host
    res.advance_completed(res.fences.issued)             # nothing is in flight
    assert host.pool.num_free + host.num_used_pages == host.num_pages
    assert all(block.pins == 0 for block in host._blocks.values())

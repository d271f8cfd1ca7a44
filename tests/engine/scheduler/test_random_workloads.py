"""Random workloads through the scheduler and the page-reading fake runner.

Shared prefixes, message boundaries, n > 1, tight pools (eviction and preemption), cancels at
random moments and held completions. Every request that is not cancelled must produce exactly
the reference tokens, the engine must never stall, and at the end every slot, page and snapshot
row is free or owned by a cached checkpoint.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.fakes import Arrival, reference_tokens, run_arrivals
from tests.engine.scheduler.conftest import VOCAB, make_engine, prompt_of, request

_request = st.tuples(
    st.integers(0, 3),            # which shared prefix
    st.integers(1, 90),           # prefix length used
    st.integers(0, 40),           # private suffix length
    st.integers(1, 24),           # max tokens
    st.integers(1, 3),            # n
    st.integers(0, 60),           # cancel after this many steps (>= 15: never)
    st.integers(0, 6),            # arrival step
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(_request, min_size=1, max_size=10),
       num_pages=st.integers(60, 200), page_size=st.sampled_from([1, 4, 16]),
       slots=st.integers(1, 5), hold_every=st.integers(0, 4))
def test_random_workload_is_exact_and_leaks_nothing(requests, num_pages, page_size, slots,
                                                    hold_every):
    scheduler, runner = make_engine(num_pages=num_pages, page_size=page_size,
                                    max_num_seqs=slots, num_snapshots=12,
                                    max_num_batched_tokens=96)
    expected: dict[str, tuple[list[int], int, int]] = {}
    arrivals = []
    for i, (prefix, length, suffix, max_tokens, n, cancel, at) in enumerate(requests):
        prompt = prompt_of(90, salt=prefix)[:length] + prompt_of(suffix, salt=100 + i)
        prompt = prompt[:(num_pages - 2) * page_size // 2]   # leave room for output
        ends = (length,) if 0 < length < len(prompt) else ()
        rid = f"r{i}"
        max_tokens = min(max_tokens, (num_pages - 2) * page_size - len(prompt))
        arrivals.append(Arrival(at, request(rid, prompt, max_tokens, seed=i, n=n, ends=ends),
                                cancel if cancel < 15 else None))
        expected[rid] = (prompt, max_tokens, n)
    outputs, cancelled = run_arrivals(scheduler, runner, arrivals, hold_every=hold_every,
                                      max_steps=3000)
    for rid in expected:
        if rid in cancelled:
            continue
        prompt, max_tokens, n = expected[rid]
        index = int(rid[1:])
        for choice in range(n):
            assert outputs[rid][choice] == reference_tokens(
                prompt, max_tokens, seed=index, vocab=VOCAB, choice=choice), (rid, choice)
    state = scheduler.state
    res = state.resources
    assert state.slots.num_free == state.slots.num_slots
    assert res.pages.num_free + res.cache.num_cached_pages == res.pages.capacity
    assert res.snapshots.num_free + res.cache.num_owned_snapshots == res.snapshots.capacity

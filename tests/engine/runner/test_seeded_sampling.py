"""Seeded sampling end to end: the same seed gives the same tokens alone, among batch
neighbours, with different chunking and after preemption; choices of n > 1 differ."""

from __future__ import annotations

from tests.engine.fakes import run_until_idle
from tests.engine.runner.conftest import greedy_request, make_engine, random_prompt

SAMPLING = dict(temperature=0.9, top_p=0.95, top_k=50, presence_penalty=0.3)


def _sample(engine, requests):
    for req in requests:
        engine.scheduler.admit(req)
    return run_until_idle(engine.scheduler, engine.runner)


def test_same_seed_same_tokens_whatever_the_neighbours(source):
    prompt = random_prompt(40, 1)
    alone = _sample(make_engine(source, page_size=4),
                    [greedy_request("x", prompt, 16, seed=1234, **SAMPLING)])["x"][0]
    neighbours = [greedy_request(f"n{i}", random_prompt(10 + 30 * i, 50 + i), 5 + i, seed=i,
                                 **SAMPLING) for i in range(4)]
    batched = _sample(make_engine(source, page_size=4, prefill_chunk_size=64,
                                  max_num_batched_tokens=64),
                      [*neighbours[:2], greedy_request("x", prompt, 16, seed=1234, **SAMPLING),
                       *neighbours[2:]])["x"][0]
    assert batched == alone
    other_seed = _sample(make_engine(source, page_size=4),
                         [greedy_request("x", prompt, 16, seed=99, **SAMPLING)])["x"][0]
    assert other_seed != alone


def test_same_seed_after_preemption(source):
    prompt = random_prompt(60, 2)
    alone = _sample(make_engine(source, page_size=4),
                    [greedy_request("x", prompt, 20, seed=5, **SAMPLING)])["x"][0]
    probe = make_engine(source, page_size=4)
    page = probe.runner.kv.num_bytes // probe.runner.kv.num_pages
    row = page + probe.runner.model.config.hidden_size * 4
    tight = make_engine(source, page_size=4, max_num_seqs=3, num_snapshots=3,
                        kv_cache_bytes=3 * row + 44 * page)
    requests = [greedy_request(f"o{i}", random_prompt(60, 10 + i), 20, seed=i, **SAMPLING)
                for i in range(2)]
    out = _sample(tight, [*requests, greedy_request("x", prompt, 20, seed=5, **SAMPLING)])
    assert tight.scheduler.state.counters.preemptions > 0
    assert out["x"][0] == alone


def test_n_choices_are_distinct_and_reproducible(source):
    prompt = random_prompt(30, 3)
    first = _sample(make_engine(source, page_size=4),
                    [greedy_request("x", prompt, 12, seed=77, n=3, **SAMPLING)])["x"]
    second = _sample(make_engine(source, page_size=4),
                     [greedy_request("x", prompt, 12, seed=77, n=3, **SAMPLING)])["x"]
    assert first == second
    assert len({tuple(tokens) for tokens in first.values()}) == 3

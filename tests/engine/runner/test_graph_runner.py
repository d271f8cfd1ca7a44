"""GraphRunner on the CPU (its decode "graphs" run eagerly on the same padded views): the same
tokens and logprobs as TorchRunner and transformers, with and without two-frame overlap.

Covers pure decode at every power-of-two capacity (padding rows), chunked prefill mixed with
decodes, full and partial prefix hits (resume from snapshots, restores), terminal checkpoints
captured behind an overlapped decode, preemption, n > 1, seeded sampling with every filter,
min_tokens with EOS, logit bias and logprobs, and the page-table uploads (only new entries).
"""

from __future__ import annotations

import pytest

from services.engine.runner.graph_runner import GraphRunner
from tests.engine.fakes import run_like_the_loop
from tests.engine.runner.conftest import greedy_request, hf_greedy, make_engine, random_prompt

SAMPLING = dict(temperature=0.8, top_p=0.9, top_k=40, min_p=0.02, presence_penalty=0.4,
                frequency_penalty=0.2, repetition_penalty=1.1)


def _engine(source, runner: str, overlap: bool = False, **overrides):
    values = dict(page_size=4, max_num_seqs=6, kv_cache_bytes=8 << 20, prefill_chunk_size=64,
                  max_num_batched_tokens=80)
    values.update(overrides)
    return make_engine(source, runner=runner, overlap="on" if overlap else "off", **values)


def _run(engine, requests):
    for request in requests:
        engine.scheduler.admit(request)
    return run_like_the_loop(engine.scheduler, engine.runner)


def _both(source, requests_factory, **overrides):
    """Outputs of TorchRunner, GraphRunner and GraphRunner with overlap, same requests."""
    results = []
    for runner, overlap in (("torch", False), ("graph", False), ("graph", True)):
        engine = _engine(source, runner, overlap, **overrides)
        results.append((engine, _run(engine, requests_factory())))
    return results


def test_graph_runner_is_chosen_and_overlaps(source):
    engine = _engine(source, "graph", overlap=True)
    assert isinstance(engine.runner, GraphRunner)
    assert engine.runner.window == 2 and engine.scheduler.state.config.overlap
    assert engine.runner.graphs.capacities == (1, 2, 4, 8)
    assert _engine(source, "graph").runner.window == 1


def test_greedy_batches_match_torch_runner_and_use_every_capacity(source):
    shapes = [(5, 1, 9), (40, 2, 14), (3, 3, 6), (70, 4, 11), (17, 5, 20), (1, 6, 3)]

    def requests():
        return [greedy_request(f"r{i}", random_prompt(n, s), m, logprobs=True, top_logprobs=3)
                for i, (n, s, m) in enumerate(shapes)]
    (_torch_engine, want), *graph_runs = _both(source, requests)
    for engine, got in graph_runs:
        assert got == want
        runner = engine.runner
        assert runner.graph_steps > 10 and runner.eager_steps > 0
        assert {c for c in runner.graphs.capacities if c <= 8} == {1, 2, 4, 8}


def test_logprobs_match_torch_runner(source):
    prompt = random_prompt(23, 4)
    logprobs = []
    for runner, overlap in (("torch", False), ("graph", True)):
        engine = _engine(source, runner, overlap)
        engine.scheduler.admit(greedy_request("a", prompt, 10, logprobs=True, top_logprobs=5))
        seen = []
        while engine.scheduler.has_work:
            if engine.runner.outstanding < engine.runner.window:
                plan = engine.scheduler.plan()
                if plan is not None:
                    fence = engine.scheduler.state.resources.fences.next_fence
                    engine.runner.submit(engine.scheduler.commit(plan, fence))
                    continue
            for update in engine.scheduler.complete(engine.runner.wait()):
                for delta in update.deltas:
                    seen.extend(delta.logprobs)
        logprobs.append(seen)
    assert len(logprobs[0]) == len(logprobs[1]) == 10
    for a, b in zip(*logprobs, strict=True):
        assert a.token_id == b.token_id
        assert abs(a.logprob - b.logprob) < 1e-5
        assert [t.token_id for t in a.top] == [t.token_id for t in b.top]
        assert all(abs(x.logprob - y.logprob) < 1e-5 for x, y in zip(a.top, b.top, strict=True))


def test_seeded_sampling_with_every_filter_matches_torch_runner(source):
    def requests():
        return [greedy_request("x", random_prompt(30, 1), 16, seed=7, **SAMPLING),
                greedy_request("y", random_prompt(12, 2), 12, seed=8, temperature=1.1),
                greedy_request("z", random_prompt(50, 3), 14, seed=9),
                greedy_request("b", random_prompt(9, 5), 8, seed=3, temperature=0.7,
                               logit_bias={5: 30.0, 6: -100.0}),
                greedy_request("n", random_prompt(20, 6), 9, seed=11, n=2, temperature=0.9,
                               top_k=20)]
    (_, want), *graph_runs = _both(source, requests)
    for _, got in graph_runs:
        assert got == want
    assert any(t == 5 for t in want["b"][0])            # the bias is felt


def test_min_tokens_suppresses_eos_like_torch_runner(source):
    prompt = random_prompt(15, 8)
    free = _run(_engine(source, "torch"), [greedy_request("f", prompt, 12)])["f"][0]
    eos = free[1]

    def requests():
        from services.engine.sampling import SamplingParams
        from services.engine.scheduler.requests import EngineRequest, StopRules
        params = SamplingParams.create(temperature=0.0, max_tokens=12, min_tokens=4,
                                       stop_token_ids=[eos], seed=0)
        return [EngineRequest(request_id="m", prompt_token_ids=tuple(prompt), sampling=params,
                              stop=StopRules(max_tokens=12, min_tokens=4,
                                             stop_token_ids=frozenset({eos})), seed=0)]
    (_, want), *graph_runs = _both(source, requests)
    assert eos not in want["m"][0][:4] and len(want["m"][0]) >= 4
    for _, got in graph_runs:
        assert got == want


def test_prefix_hits_terminal_state_and_preemption_match(source, tmp_path):
    prompt = random_prompt(37, 9)

    def run(engine):
        # a longer neighbour keeps decoding while "first" saves its terminal state, so that
        # capture rides along a decode step (a graph step on the graph runner)
        outs = _run(engine, [greedy_request("first", prompt, 7, ends=(21,)),
                             greedy_request("long", random_prompt(15, 30), 20)])
        outs |= _run(engine, [greedy_request("again", prompt, 7)])               # full hit
        other = prompt[:21] + random_prompt(9, 10)
        outs |= _run(engine, [greedy_request("partial", other, 5, ends=(21,))])  # partial
        turn2 = prompt + outs["first"][0][:-1] + random_prompt(6, 11)
        outs |= _run(engine, [greedy_request("turn2", turn2, 5)])                # terminal
        # exactly the terminal state: sampling resumes from the hidden state saved there,
        # which must give the same next token as when "first" sampled it
        exact = prompt + outs["first"][0][:-1]
        outs |= _run(engine, [greedy_request("exact", exact, 3)])
        assert outs["exact"][0][0] == outs["first"][0][-1]
        return outs, engine.scheduler.state.resources.cache.counters.reused_tokens

    results = [run(_engine(source, runner, overlap))
               for runner, overlap in (("torch", False), ("graph", False), ("graph", True))]
    assert results[0][1] == 37 + 21 + 37 + 6 + 37 + 6
    assert results[1] == results[0] and results[2] == results[0]


def test_preemption_matches(source):
    probe = _engine(source, "torch")
    page = probe.runner.kv.num_bytes // probe.runner.kv.num_pages
    row = page + probe.runner.model.config.hidden_size * 4
    tight = dict(max_num_seqs=3, num_snapshots=3, kv_cache_bytes=3 * row + 44 * page)

    def requests():
        return [greedy_request(f"p{i}", random_prompt(60, 20 + i), 20, seed=i, **SAMPLING)
                for i in range(3)]
    results = _both(source, requests, **tight)
    assert all(engine.scheduler.state.counters.preemptions > 0 for engine, _ in results)
    assert results[1][1] == results[0][1] and results[2][1] == results[0][1]


def test_matches_transformers_on_the_demo_model(demo_source, hf_demo):
    prompt = random_prompt(33, 12, vocab=151_000)
    engine = make_engine(demo_source, runner="graph", overlap="on")
    out = _run(engine, [greedy_request("a", prompt, 10)])
    assert out["a"][0] == hf_greedy(hf_demo, prompt, 10)[0]


def test_decode_uploads_only_new_page_table_entries(source):
    engine = _engine(source, "graph", page_size=4)
    runner = engine.runner
    uploads: list[int] = []
    original = runner.mirror.updates

    def counting(handle, page_ids, index, value):
        uploads.append(original(handle, page_ids, index, value))
        return uploads[-1]
    runner.mirror.updates = counting
    _run(engine, [greedy_request("a", random_prompt(20, 13), 18)])
    # the first step uploads the 5 prompt pages (20 tokens of 4), then one page every 4
    # decodes, up to the 37 tokens whose KV exists at the end
    assert uploads[0] == 5 and sum(uploads) == -(-(20 + 18 - 1) // 4)
    assert max(uploads[1:]) == 1


def test_a_step_that_captured_its_graph_is_untimed(source, monkeypatch):
    """The first replay of a graph captures it (on CUDA: a warm-up run, the capture and a
    synchronisation inside the step's timing events): that step's duration is no cost of the
    graph, so the cost model gets none (an untimed observation), and the next replay of the
    same graph is timed. (On the CPU no graph is captured; the capture is simulated.)"""
    from services.engine.runner.decode_graphs import DecodeGraphs

    engine = _engine(source, "graph")
    replay, seen = DecodeGraphs.replay, set()

    def first_replay_captures(self, packed, packing, mode, logprobs, grammar=False):
        replay(self, packed, packing, mode, logprobs, grammar)
        key = (packing, mode, logprobs, grammar)
        captured = key not in seen
        seen.add(key)
        return captured

    monkeypatch.setattr(DecodeGraphs, "replay", first_replay_captures)
    durations = []
    complete = GraphRunner._complete

    def recorded(self):
        completion = complete(self)
        durations.append(completion.duration_s)
        return completion

    monkeypatch.setattr(GraphRunner, "_complete", recorded)
    _run(engine, [greedy_request("a", random_prompt(9, 1), 6)])
    # the prompt in the 16-row prefill graph, then five decodes in the b1 decode graph
    assert len(seen) == 2 and engine.runner.graph_steps == 6
    assert engine.runner.prefill_graph_steps == 1
    # eagerly: only the terminal checkpoint after the last token (a step that feeds nothing)
    assert engine.runner.eager_steps == 1
    assert engine.scheduler.state.counters.launches_by_kind["snapshot"] == 1
    assert [d for d in durations if d < 0] == [-1.0, -1.0]
    stats = engine.scheduler.state.costs.shapes[("decode", "b1 t1")]
    assert stats.untimed == 1 and len(stats.recent) == 4


def test_prefill_graphs_serve_prefill_and_mixed_steps_like_eager_steps(source):
    """Prefill chunks, last chunks that sample, and chunks beside decodes run in the prefill
    graphs of their token capacities (16 .. 128 at an 80-token budget) and give exactly the
    tokens and logprobs of the same steps run eagerly (`cuda_graph_prefill` off); what still
    runs eagerly is only what no graph serves (here the terminal checkpoint steps that feed
    nothing)."""
    shapes = [(5, 1, 9), (40, 2, 14), (3, 3, 6), (70, 4, 11), (17, 5, 20), (1, 6, 3),
              (77, 7, 4)]

    def requests():
        return [greedy_request(f"r{i}", random_prompt(n, s), m, logprobs=True, top_logprobs=3)
                for i, (n, s, m) in enumerate(shapes)]
    eager = _engine(source, "graph", True, cuda_graph_prefill="off")
    assert eager.runner.graphs.prefill_rows == ()
    want = _run(eager, requests())
    assert eager.runner.prefill_graph_steps == 0
    graphed = _engine(source, "graph", True)
    runner = graphed.runner
    assert runner.graphs.prefill_rows == (16, 32, 64, 128)
    got = _run(graphed, requests())
    assert got == want
    kinds = graphed.scheduler.state.counters.launches_by_kind
    assert kinds["prefill"] + kinds["mixed"] == runner.prefill_graph_steps >= 3
    assert runner.eager_steps == kinds["snapshot"]


def test_steps_no_prefill_graph_serves_run_eagerly(source):
    """Prompt scoring, a resume from a snapshot (a full prefix hit) and a step past every
    token capacity run eagerly, with the same results as the torch runner."""
    from dataclasses import replace

    prompt = random_prompt(37, 9)

    def run(engine):
        def eager_steps() -> int:            # the torch runner: every step is eager
            return getattr(engine.runner, "eager_steps", 0)

        outs = _run(engine, [greedy_request("first", prompt, 4)])
        before = eager_steps()
        outs |= _run(engine, [greedy_request("again", prompt, 4)])      # resumes
        resumed = eager_steps() - before
        scored = replace(greedy_request("scored", random_prompt(12, 3), 2), prompt_logprobs=2)
        engine.scheduler.admit(scored)
        entries = []
        while engine.scheduler.has_work:
            if engine.runner.outstanding:
                updates = engine.scheduler.complete(engine.runner.wait())
            else:
                plan = engine.scheduler.plan()
                fence = engine.scheduler.state.resources.fences.next_fence
                engine.runner.submit(engine.scheduler.commit(plan, fence))
                continue
            for update in updates:
                for delta in update.deltas:
                    entries.extend((e.position, round(e.logprob, 4)) for e in
                                   delta.prompt_logprobs)
        return outs, resumed, entries

    want, _, want_scores = run(_engine(source, "torch"))
    engine = _engine(source, "graph")
    got, resumed, got_scores = run(engine)
    assert got == want and got_scores == want_scores and len(got_scores) == 11
    assert resumed >= 1                               # the resume ran eagerly
    # a step of more rows than the largest prefill graph: at a 64-token budget the graphs
    # hold 16, 32 and 64 rows, and a decode beside the oldest prefill's 64-token minimum
    # chunk makes 65
    small = _engine(source, "graph", max_num_batched_tokens=64, prefill_chunk_size=64)
    assert small.runner.graphs.prefill_rows == (16, 32, 64)

    def pair():
        return [greedy_request("short", random_prompt(6, 4), 12),
                greedy_request("long", random_prompt(150, 5), 3)]
    assert _run(small, pair()) == _run(_engine(source, "torch", max_num_batched_tokens=64,
                                               prefill_chunk_size=64), pair())
    kinds = small.scheduler.state.counters.launches_by_kind
    assert 0 < small.runner.prefill_graph_steps < kinds["prefill"] + kinds["mixed"]


@pytest.mark.parametrize("budget,slots", [(160, 1), (80, 6), (64, 2), (2048, 64)])
def test_every_graph_packing_fits_the_input_buffers(source, budget: int, slots: int):
    """Every graph the runner would capture (prefill graphs included) packs its all-padding
    capture step within the input buffers' bounds, whatever the step budget and slots: a
    160-token budget with one slot once made a 256-row prefill graph past the 224 rows the
    buffers hold, which failed only at the CUDA capture."""
    from services.engine.runner.decode_graphs import padding_step

    engine = _engine(source, "graph", max_num_batched_tokens=budget, max_num_seqs=slots,
                     prefill_chunk_size=64 * max(1, budget // 128))
    graphs = engine.runner.graphs
    assert graphs.prefill_rows and max(graphs.prefill_rows) <= graphs.frames.limits.tokens
    packings = [graphs.prefill_packing(rows) for rows in graphs.prefill_rows]
    packings += [graphs.packing(c) for c in graphs.capacities]
    for packing in packings:
        views = padding_step(graphs.frames, packing, graphs.mirror).views
        assert len(views.input_ids) == packing.tokens

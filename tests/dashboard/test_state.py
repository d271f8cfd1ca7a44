"""The dashboard's aggregation rules, without a terminal."""

from __future__ import annotations

from services.dashboard import render
from services.dashboard.sample import CompletionSample, EngineSample, GraphSample, RequestSample
from services.dashboard.state import MAX_COMPLETIONS, MAX_REQUEST_ROWS, DashboardState


def sample(t: float, *, prompt=0, gen=0, requests=(), completions=(), session="s", graphs=()):
    return EngineSample(
        session_id=session, engine_time_s=t, uptime_s=t, slots_total=64, slots_live=len(requests),
        slots_free=64 - len(requests), slots_retiring=0, num_running=len(requests), num_waiting=0,
        pages_total=100, pages_free=50, pages_cached=10, pages_retiring=0, checkpoints_cached=2,
        requests_completed=1, requests_failed=0, requests_cancelled=0, prefix_reused_tokens=64,
        prompt_tokens=prompt, generation_tokens=gen, admission_paused=False, draining=False,
        dropped_updates=3, graphs=tuple(graphs), requests=tuple(requests),
        completions=tuple(completions))


def row(slot, phase="decode", gen=1):
    return RequestSample((slot, gen), phase, 10, 20, 5, 1.0, None, 2)


def done(seq, t, kind="decode", label="b8", ms=2.0, reqs=((0, 1),)):
    return CompletionSample(seq, t, kind, label, ms, tuple(reqs), 0, len(reqs))


def test_throughput_is_the_counter_rate_over_the_window():
    state = DashboardState()
    for i in range(6):
        state.ingest(sample(i * 0.5, prompt=i * 500, gen=i * 50), local_s=i * 0.5)
    tp = state.throughput()
    assert tp.prefill_tps == 1000.0
    assert tp.generation_tps == 100.0


def test_scheduler_pane_counts_the_last_two_seconds():
    state = DashboardState()
    completions = [done(i, i * 0.25, ms=2.0) for i in range(1, 17)]  # t = 0.25 .. 4.0
    completions.append(done(17, 3.9, kind="prefill", label="b1 t512", ms=6.0, reqs=((1, 1),)))
    completions.append(done(18, 3.95, kind="prefill", label="b1 t512", ms=None, reqs=((1, 1),)))
    graphs = [GraphSample("decode", "b8", 16, 2.0, 2.0, 0, 16, False),
              GraphSample("decode", "b16", 0, 0.0, 0.0, 0, 0, False)]
    state.ingest(sample(4.0, completions=completions, graphs=graphs), local_s=0)
    rows = {(r.kind, r.label): r for r in state.scheduler_rows()}
    decode = rows[("decode", "b8")]
    assert decode.calls == 8  # t in (2.0, 4.0]: 2.25, 2.5, ..., 4.0
    assert decode.mean_ms == 2.0
    prefill = rows[("prefill", "b1 t512")]
    assert prefill.calls == 2 and prefill.untimed == 1 and prefill.max_ms == 6.0
    assert abs(prefill.share - 6.0 / (6.0 + 2.0 * decode.calls)) < 1e-9
    assert rows[("decode", "b16")].calls == 0 and rows[("decode", "b16")].estimate_ms is None


def test_history_prefers_primary_kinds_per_cell():
    state = DashboardState()
    completions = [done(1, 9.2, kind="prefill"), done(2, 9.4, kind="snapshot"),
                   done(3, 8.5, kind="snapshot"), done(4, 5.5, kind="decode"),
                   done(5, 5.6, kind="decode", reqs=((2, 1),))]
    state.ingest(sample(10.0, requests=[row(0)], completions=completions), local_s=0)
    history = state.history((0, 1))
    assert len(history) == 10
    assert history[9] == "P"        # prefill beats the later snapshot in its cell
    assert history[8] == "s"        # only a snapshot: shown in lowercase
    assert history[5] == "D"
    assert history.count("·") == 7


def test_retired_rows_stay_while_their_history_does():
    state = DashboardState()
    state.ingest(sample(1.0, requests=[row(0), row(1)], completions=[done(1, 1.0)]), local_s=0)
    state.ingest(sample(2.0, requests=[]), local_s=1)
    keys = {r.sample.key: r.retired for r in state.ordered_rows()}
    assert keys == {(0, 1): True}  # (1, 1) had no history and is gone
    state.ingest(sample(12.0, requests=[]), local_s=2)
    assert state.ordered_rows() == []


def test_buffers_are_bounded_and_truncation_is_marked():
    state = DashboardState()
    many = [done(i, 1.0) for i in range(MAX_COMPLETIONS + 10)]
    rows = [row(i) for i in range(MAX_REQUEST_ROWS + 5)]
    state.ingest(sample(1.0, requests=rows, completions=many), local_s=0)
    assert len(state.completions) == MAX_COMPLETIONS
    assert len(state.rows) == MAX_REQUEST_ROWS
    assert state.truncated_completions and state.truncated_rows
    lines = render.header(state, "m", 0.0, 120, render.View())
    assert "history truncated" in lines[1] and "dropped updates 3" in lines[1]


def test_a_restarted_engine_starts_over():
    state = DashboardState()
    state.ingest(sample(5.0, requests=[row(0)], completions=[done(1, 5.0)]), local_s=0)
    state.ingest(sample(0.5, session="new"), local_s=1)
    assert not state.completions and not state.rows


def test_wide_terminals_show_more_columns():
    state = DashboardState()
    state.ingest(sample(1.0, requests=[row(0)], completions=[done(1, 1.0)]), local_s=0)
    narrow = render.requests(state, 80, 10, 0)
    wide = render.requests(state, 120, 10, 0)
    assert "prompt" not in narrow[0] and "prompt" in wide[0] and "bursts" in wide[0]
    assert "10/20" in wide[1]
    sched_narrow = render.scheduler(state.scheduler_rows(), 80)
    sched_wide = render.scheduler(state.scheduler_rows(), 120)
    assert "max ms" not in sched_narrow[0] and "req/call" in sched_wide[0]
    assert all(len(line) <= 80 for line in narrow + sched_narrow)


def test_scrolling_moves_the_visible_rows():
    state = DashboardState()
    state.ingest(sample(1.0, requests=[row(i) for i in range(30)]), local_s=0)
    top = render.requests(state, 120, 6, 0)
    scrolled = render.requests(state, 120, 6, 3)
    assert top[1].startswith("0.1") and scrolled[1].startswith("3.1")
    assert "rows 4-8 of 30" in scrolled[-1]


def test_the_speculative_rows():
    """Drafter steps, verification steps, accepted drafts per round that offered any (bonus
    excluded) and draft positions per round (zero-draft rounds included), from GetLoad."""
    import dataclasses

    from services.common.pb import engine_pb2
    from services.dashboard.sample import from_pb

    off = render.overview(_ingested(sample(1.0)), 120)
    assert any(line.startswith("Speculation") and "acceptance —" in line for line in off)
    snapshot = engine_pb2.LoadSnapshot(speculative=engine_pb2.SpeculativeLoad(
        method="ngram", num_speculative_tokens=4, num_drafts=8, num_draft_tokens=20,
        num_accepted_tokens=14, verification_steps=6, drafter_steps=0, rounds=10, depth=20))
    spec = from_pb(snapshot).speculative
    assert spec is not None and from_pb(engine_pb2.LoadSnapshot()).speculative is None
    on = render.overview(_ingested(dataclasses.replace(sample(1.0), speculative=spec)), 120)
    (line,) = [line for line in on if line.startswith("Speculation")]
    assert "drafter steps 0" in line and "verification steps 6" in line
    assert "acceptance 1.75" in line and "DEPTH 2.00" in line


def _ingested(engine_sample) -> DashboardState:
    state = DashboardState()
    state.ingest(engine_sample, local_s=0)
    return state

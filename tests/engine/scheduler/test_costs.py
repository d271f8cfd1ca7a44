"""DurationEstimator: median of the last nine observations per shape, stale after 30 s."""

from __future__ import annotations

from services.engine.scheduler.costs import DurationEstimator


def observe(estimator, duration, now, label="b8 t8"):
    estimator.observe(kind="decode", label=label, batch_capacity=8, token_capacity=8,
                      num_requests=5, duration_s=duration, now=now)


def test_starts_unmeasured_then_tracks_the_median_of_nine():
    estimator = DurationEstimator()
    assert estimator.estimated_duration_s("decode", "b8 t8") is None
    observe(estimator, 0.010, now=1.0)
    assert estimator.estimated_duration_s("decode", "b8 t8") == 0.010
    for i, duration in enumerate([0.001] * 5 + [0.050] * 4):
        observe(estimator, duration, now=2.0 + i)
    assert estimator.estimated_duration_s("decode", "b8 t8") == 0.001   # 0.010 fell out
    observe(estimator, 0.050, now=20.0)
    assert estimator.estimated_duration_s("decode", "b8 t8") == 0.050   # 5 of 9 are 0.050
    stats = estimator.shapes[("decode", "b8 t8")]
    assert stats.calls == 11 and stats.requests_total == 55 and stats.max_s == 0.050


def test_stale_after_30_seconds_and_replaced_by_the_next_observation():
    estimator = DurationEstimator()
    for i in range(5):
        observe(estimator, 0.004, now=float(i))
    stats = estimator.shapes[("decode", "b8 t8")]
    assert not stats.is_stale(now=30.0) and stats.is_stale(now=34.5)
    assert estimator.estimated_duration_s("decode", "b8 t8") == 0.004   # stale, still there
    observe(estimator, 0.009, now=40.0)
    assert estimator.estimated_duration_s("decode", "b8 t8") == 0.009   # replaced, not mixed


def test_untimed_observations_are_counted_but_not_averaged():
    estimator = DurationEstimator()
    observe(estimator, -1.0, now=1.0)
    stats = estimator.shapes[("decode", "b8 t8")]
    assert stats.calls == 1 and stats.untimed == 1 and stats.estimate_s() is None


# -- the choice the estimates feed: how much prefill a step takes ------------------------------

from services.engine.scheduler.costs import chunk_budget, shape_label  # noqa: E402


def _mixed(estimator, tokens: int, seconds: float, num_seqs: int = 9) -> None:
    estimator.observe(kind="mixed", label=shape_label(num_seqs, tokens), batch_capacity=16,
                      token_capacity=tokens, num_requests=num_seqs, duration_s=seconds,
                      now=1.0)


def _choose(estimator, budget=504):
    return chunk_budget(estimator, num_seqs=8, num_outputs=8, num_tokens=8, budget=budget,
                        min_chunk=64, output_value=64.0)


def test_unmeasured_capacities_are_explored_largest_first():
    estimator = DurationEstimator()
    assert _choose(estimator) == 504                       # nothing measured: the full budget
    _mixed(estimator, 512, 0.020)
    assert _choose(estimator) == 248                       # t256 next: 8 + 248 tokens
    _mixed(estimator, 256, 0.012)
    assert _choose(estimator) == 120
    _mixed(estimator, 128, 0.010)
    # all measured (a chunk is at least 64 tokens: no t64 candidate): 1016 / 20 ms,
    # 760 / 12 ms, 632 / 10 ms of value per second -> t256
    assert _choose(estimator) == 248


def test_value_per_duration_decides_once_measured():
    estimator = DurationEstimator()
    # memory-bound: a small chunk costs about what the decodes cost alone
    for tokens, seconds in ((128, 0.0102), (256, 0.0110), (512, 0.0250)):
        _mixed(estimator, tokens, seconds)
    # value = 64 * 8 outputs + chunk; per second: t128 (120): 62.0k, t256 (248): 69.1k,
    # t512 (504): 40.6k -> the t256 capacity wins
    assert _choose(estimator) == 248
    # compute-bound everywhere (cost proportional to tokens): the decodes' value favours the
    # smallest chunk
    for tokens in (128, 256, 512):
        for _ in range(9):
            _mixed(estimator, tokens, 0.0001 * tokens)
    assert _choose(estimator) == 120
    assert _choose(estimator, budget=60) == 60             # below one chunk: the budget
    assert shape_label(9, 264) == "b16 t512"

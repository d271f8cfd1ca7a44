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

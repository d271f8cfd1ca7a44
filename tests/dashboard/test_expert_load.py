"""The dashboard's expert-load view and its overview lines (MoE models)."""

from __future__ import annotations

import dataclasses

from services.common.pb import engine_pb2
from services.dashboard import render
from services.dashboard.sample import from_pb
from services.dashboard.state import DashboardState
from tests.dashboard.test_state import sample


def moe_sample(t: float, tokens: tuple[int, ...]):
    return dataclasses.replace(sample(t), expert_tokens=tokens, moe_layers=2,
                               experts_per_token=2)


def test_window_growth_busiest_expert_and_imbalance() -> None:
    state = DashboardState()
    state.ingest(moe_sample(0.0, (100, 100, 100, 100)), local_s=0.0)
    first = state.expert_load()
    assert first is not None and first.window_s is None and first.tokens == (100,) * 4
    assert first.busiest == 0 and first.imbalance == 1.0
    state.ingest(moe_sample(1.0, (110, 150, 100, 140)), local_s=1.0)
    state.ingest(moe_sample(2.5, (120, 220, 100, 160)), local_s=2.5)
    load = state.expert_load()
    assert load is not None
    assert load.tokens == (20, 120, 0, 60) and load.window_s == 2.5   # since t=0 (>= 2 s)
    assert load.busiest == 1 and load.busiest_share == 0.6
    assert load.imbalance == 120 / 50
    lines = render.overview(state, 200)
    assert any("most loaded #1 (120 tokens, 60%, 2.4x mean)" in line for line in lines)
    assert any("4 x 2 layers, top-2" in line for line in lines)
    bars = next(line for line in lines if "per expert" in line)
    assert bars.endswith("|▂█ ▄|")


def test_dense_models_show_no_expert_lines_and_pb_round_trip() -> None:
    state = DashboardState()
    state.ingest(sample(0.0), local_s=0.0)
    assert state.expert_load() is None
    assert not any("Experts" in line for line in render.overview(state, 200))
    message = engine_pb2.LoadSnapshot(session_id="s", expert_tokens=[3, 0, 9], moe_layers=4,
                                      experts_per_token=2)
    converted = from_pb(message)
    assert converted.expert_tokens == (3, 0, 9) and converted.moe_layers == 4
    assert converted.experts_per_token == 2

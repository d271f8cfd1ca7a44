"""A Qwen3-MoE checkpoint through the engine core on the CPU: the graph runner (decode steps
padded to their capacity) gives the torch runner's tokens, and the expert counters hold the
real rows only: (prompt + generated - one per request) x k x sparse layers."""

from __future__ import annotations

from services.engine.model.moe import expert_load
from tests.engine.gpu.test_gpu_runner import _engine, _requests, _run
from tests.engine.model.checkpoints import SPECS, build_checkpoint


def test_graph_runner_padding_rows_route_nothing(tmp_path) -> None:
    spec = SPECS["qwen3-moe"]
    checkpoint = build_checkpoint(spec, tmp_path / "qwen3-moe")
    want, _ = _run(_engine(checkpoint, "cpu", "float32", runner="torch"), _requests())
    engine = _engine(checkpoint, "cpu", "float32", runner="graph")
    requests = _requests()
    got, _ = _run(engine, requests)
    assert got == want and engine.runner.graph_steps > 10
    load = expert_load(engine.runner.model)
    counters = engine.scheduler.state.counters
    rows = counters.prompt_tokens + counters.generation_tokens - len(requests)
    assert load is not None and load.layers == 2 and load.top_k == 3
    assert sum(load.tokens) == rows * load.top_k * load.layers

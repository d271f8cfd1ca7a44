"""GetLoad through a real engine process serving a tiny Qwen3-MoE checkpoint: the expert
counters add up to what the steps routed (each real token, k experts, every sparse layer;
padding and warm-up rows never count)."""

from __future__ import annotations

import random

from tests.engine.model.checkpoints import SPECS, VOCAB_SIZE, build_checkpoint
from tests.engine.service.conftest import generate_request, start_engine


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB_SIZE) for _ in range(length)]


def test_expert_load_counts_every_routed_token(tmp_path) -> None:
    spec = SPECS["qwen3-moe"]
    checkpoint = build_checkpoint(spec, tmp_path / "qwen3-moe")
    experts, top_k = spec.overrides["num_experts"], spec.overrides["num_experts_per_tok"]
    sparse_layers = spec.overrides["num_hidden_layers"] - len(spec.overrides["mlp_only_layers"])
    with start_engine(tmp_path, name="moe", model=str(checkpoint)) as engine:
        idle = engine.wait_idle()
        assert list(idle.expert_tokens) == [0] * experts      # warm-up forwards reset
        assert idle.moe_layers == sparse_layers and idle.experts_per_token == top_k
        requests = [generate_request(f"r{i}", _prompt(n, 50 + i), max_tokens=m)
                    for i, (n, m) in enumerate(((13, 6), (5, 9), (21, 4)))]
        for request in requests:    # one after another: no shared prefixes, no preemption
            responses = list(engine.stub.Generate(request, timeout=120))
            assert sum(len(o.token_ids) for r in responses for o in r.outputs) \
                == request.sampling.max_tokens
        load = engine.wait_idle()
        rows = load.prompt_tokens + load.generation_tokens - len(requests)
        assert load.prompt_tokens == 13 + 5 + 21 and load.generation_tokens == 6 + 9 + 4
        assert sum(load.expert_tokens) == rows * top_k * sparse_layers
        assert len(load.expert_tokens) == experts and max(load.expert_tokens) > 0


"""Nothing compiles while serving (issue 19): after start-up (decode graphs captured, the eager
step shapes warmed up: runner/warm_up.py), serving prompts of many lengths, chunked long
prompts, queues deeper than the slots and mixed prefill + decode steps compiles no new
variant of any Triton kernel (kernels/variants.py). The model has the Qwen3-8B attention shape
(32 query heads, 8 KV heads, head_dim 128) on two small layers with dummy weights, so the
kernels meet the tiles and splits the real model's steps choose."""

from __future__ import annotations

import json
import random

import pytest

pytestmark = pytest.mark.gpu

CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 320,
          "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
          "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
          "max_position_embeddings": 16384, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
          "tie_word_embeddings": False}


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(320) for _ in range(length)]


def serving_rounds() -> list[list]:
    """The requests served, round by round (benchmarks/gpu/diag_compile_variants.py prints
    the keys of what they compile)."""
    from tests.engine.runner.conftest import greedy_request

    lengths = (1, 2, 3, 5, 16, 17, 63, 64, 65, 100, 127, 128, 200, 257, 511, 512, 513, 700,
               1023, 1500, 2047, 3000)
    rng = random.Random(0)
    return [
        # more requests than slots, short and long, each a few tokens: prefill, mixed, decode
        [greedy_request(f"a{i}", _prompt(n, i), rng.randrange(2, 12))
         for i, n in enumerate(lengths * 2)],
        # long prompts: chunked prefill late in a prompt, decodes over long contexts
        [greedy_request(f"b{i}", _prompt(n, 100 + i), 24)
         for i, n in enumerate((6000, 9000, 12000, 15000))],
        # a single request at a time (batch-1 steps of each length)
        *([greedy_request(f"c{n}", _prompt(n, 200 + n), 3)] for n in (7, 90, 600, 4000)),
    ]


def test_serving_compiles_no_kernel_variant(tmp_path):
    from services.common.core import open_model
    from services.engine.kernels.variants import compiled_variants, new_variants
    from tests.engine.model.checkpoints import write_tokenizer
    from tests.engine.runner.conftest import make_engine, serve

    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    write_tokenizer(tmp_path)
    engine = make_engine(open_model(tmp_path, allow_missing_weights=True), device="cuda",
                         dtype="bfloat16", load_format="dummy", page_size=16, max_num_seqs=32,
                         prefill_chunk_size=512, max_num_batched_tokens=1024,
                         kv_cache_bytes=1 << 30)
    after_start = compiled_variants()
    assert after_start["attention_kernel._paged_attention_kernel"] > 0     # graphs captured
    assert after_start["attention_kernel._paged_attention_any_size_kernel"] > 0   # warmed up
    rounds = serving_rounds()
    for requests in rounds:
        tokens, _, _ = serve(engine, requests)
        assert all(len(tokens[r.request_id]) == r.stop.max_tokens for r in requests)
    assert new_variants(after_start) == {}, "kernels compiled while serving (before, after)"


# a draft model of its own width, head count and depth: its kernels cannot ride on the
# variants the target's warm-up compiled
DRAFT = {**CONFIG, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1,
         "num_attention_heads": 16, "num_key_value_heads": 4}


def test_a_draft_model_compiles_nothing_while_serving(tmp_path):
    """Speculating with a draft model (`speculative_method draft`), one request at a time over
    prompts of many lengths, long ones included: the draft model's eager catch-ups (a
    prompt's chunks, a catch-up past the round graphs) compile no kernel variant either
    (DraftModelProposer.warm_up; an H100 once spent 1.7 s of a 256-token request in them)."""
    from services.common.core import open_model
    from services.engine.kernels.variants import compiled_variants, new_variants
    from tests.engine.model.checkpoints import write_tokenizer
    from tests.engine.runner.conftest import greedy_request, make_engine, serve

    for name, config in (("target", CONFIG), ("draft", DRAFT)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        write_tokenizer(tmp_path / name)
    engine = make_engine(open_model(tmp_path / "target", allow_missing_weights=True),
                         device="cuda", dtype="bfloat16", load_format="dummy", page_size=16,
                         max_num_seqs=8, prefill_chunk_size=512, max_num_batched_tokens=1024,
                         kv_cache_bytes=1 << 30, speculative_method="draft",
                         speculative_model=str(tmp_path / "draft"), num_speculative_tokens=4)
    after_start = compiled_variants()
    lengths = (1, 2, 5, 16, 17, 63, 64, 65, 100, 200, 257, 511, 513, 1023, 1500, 3000, 9000)
    for i, n in enumerate(lengths):
        request = greedy_request(f"d{i}", _prompt(n, 300 + i), 40)
        tokens, _, _ = serve(engine, [request])
        assert len(tokens[request.request_id]) == 40
    assert engine.scheduler.state.counters.spec_drafter_steps > 0
    assert new_variants(after_start) == {}, "kernels compiled while serving (before, after)"

"""The forward contract beyond parity: graph safety, padding rows, dtypes, the KV cache object."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ValidationError
from services.engine.model import (
    ForwardBatch,
    allocate_kv_cache,
    build_metadata,
    kv_cache_bytes_per_page,
    ops,
)

MODEL = "qwen3-qknorm-sharded"


def _step_inputs():
    meta = build_metadata([3, 1], [3, 6], [[2], [5, 7]], page_size=4, num_padding_rows=2)
    input_ids = torch.tensor([11, 12, 13, 14, 0, 0])
    positions = torch.tensor([0, 1, 2, 5, 0, 0])
    return input_ids, positions, meta


def test_forward_graph_safe_path_has_no_data_dependent_breaks(engine_models, monkeypatch):
    """With the graph-safe attention (the CUDA fallback), dynamo traces forward in one graph."""
    import torch._dynamo

    model = engine_models[MODEL]
    kv_cache = allocate_kv_cache(model.config, 16, 4, "cpu", torch.float32)
    input_ids, positions, meta = _step_inputs()

    def graph_breaks() -> int:
        torch._dynamo.reset()
        batch = ForwardBatch(input_ids, positions, meta)
        return torch._dynamo.explain(model.forward)(batch, kv_cache).graph_break_count

    assert graph_breaks() > 0   # the CPU varlen path reads lengths: the detector sees it
    monkeypatch.setattr(ops, "varlen_paged_attention", ops.reference_paged_attention)
    assert graph_breaks() == 0
    torch._dynamo.reset()


def test_padding_rows_change_nothing(engine_models) -> None:
    """What padding rows (slot -1, as a CUDA graph's fixed batch appends) promise:

    - the real rows' hidden states and K/V do not depend on what the padding rows hold: two
      batches of the same shape that differ only in their padding rows are bit-identical
      (same shapes run the same kernels, and no kernel reduces across rows);
    - padding rows write no KV slot: every slot the unpadded batch leaves untouched is still
      zero after the padded batch;
    - against the unpadded batch (a different row count) the real rows agree to float32
      rounding only: CPU matmul kernels block by the row count and are not batch-invariant
      (a fresh clone once saw 1.3e-6), so bit-identity across shapes is not promised.
    """
    model = engine_models[MODEL]
    input_ids, positions, meta = _step_inputs()

    def run(ids, pos, metadata):
        cache = allocate_kv_cache(model.config, 16, 4, "cpu", torch.float32)
        return model(ForwardBatch(ids, pos, metadata), cache).hidden, cache

    padded, padded_cache = run(input_ids, positions, meta)
    other_ids = input_ids.clone()
    other_ids[4:] = torch.tensor([7, 9])
    other_pos = positions.clone()
    other_pos[4:] = torch.tensor([3, 4])
    other, other_cache = run(other_ids, other_pos, meta)
    assert torch.equal(padded[:4], other[:4])
    for a, b in zip(padded_cache.k_caches + padded_cache.v_caches,
                    other_cache.k_caches + other_cache.v_caches, strict=True):
        assert torch.equal(a, b)

    plain_meta = build_metadata([3, 1], [3, 6], [[2], [5, 7]], page_size=4)
    plain, plain_cache = run(input_ids[:4], positions[:4], plain_meta)
    torch.testing.assert_close(padded[:4], plain, rtol=1e-5, atol=1e-5)
    written = plain_meta.slot_mapping
    for a, b in zip(padded_cache.k_caches + padded_cache.v_caches,
                    plain_cache.k_caches + plain_cache.v_caches, strict=True):
        flat_a, flat_b = a.flatten(0, 1), b.flatten(0, 1)
        untouched = torch.ones(flat_a.shape[0], dtype=torch.bool)
        untouched[written] = False
        assert not flat_a[untouched].any()          # padding wrote no slot
        torch.testing.assert_close(flat_a[written], flat_b[written], rtol=1e-5, atol=1e-5)


def test_bfloat16_forward_tracks_float32(checkpoint_dirs, engine_models) -> None:
    from services.common.core import open_model
    from services.engine.model import load_model

    model32 = engine_models[MODEL]
    model16 = load_model(open_model(checkpoint_dirs[MODEL]), "cpu", torch.bfloat16)
    assert model16.model.embed_tokens.weight.dtype == torch.bfloat16 and model16.cos_sin_cache.dtype == torch.float32
    input_ids, positions, meta = _step_inputs()
    results = []
    for model in (model32, model16):
        cache = allocate_kv_cache(model.config, 16, 4, "cpu", model.dtype)
        hidden = model(ForwardBatch(input_ids, positions, meta), cache).hidden
        assert hidden.dtype == model.dtype
        logits = model.compute_logits(hidden[:4])
        assert logits.dtype == torch.float32
        results.append(torch.softmax(logits, dim=-1))
    assert (results[0] - results[1]).abs().max() < 0.05


def test_allocate_kv_cache_shapes_and_bytes(engine_models) -> None:
    config = engine_models[MODEL].config
    cache = allocate_kv_cache(config, num_pages=10, page_size=16, device="cpu",
                              dtype=torch.bfloat16)
    assert cache.num_layers == config.num_hidden_layers
    assert cache.num_pages == 10 and cache.page_size == 16
    assert cache.k_caches[0].shape == (10, 16, config.num_key_value_heads, config.head_dim)
    assert cache.num_bytes == 10 * kv_cache_bytes_per_page(config, 16, torch.bfloat16)
    assert all(t.is_contiguous() for t in cache.k_caches + cache.v_caches)
    with pytest.raises(ValidationError):
        allocate_kv_cache(config, 0, 16, "cpu", torch.float32)


def test_build_metadata_layout_and_validation() -> None:
    meta = build_metadata([2, 1], [5, 1], [[3, 1], [4]], page_size=4, num_padding_rows=1)
    assert meta.query_start_loc.tolist() == [0, 2, 3]
    assert meta.seq_lens.tolist() == [5, 1]
    assert meta.page_table.tolist() == [[3, 1], [4, 0]]
    # positions 3 and 4 of sequence 0: page 3 offset 3, page 1 offset 0; then page 4 offset 0
    assert meta.slot_mapping.tolist() == [15, 4, 16, -1]
    assert (meta.max_query_len, meta.max_seq_len) == (2, 5)
    assert meta.query_start_loc.dtype == torch.int32 and meta.slot_mapping.dtype == torch.int64
    with pytest.raises(ValidationError):
        build_metadata([3], [2], [[0]], page_size=4)          # more new tokens than KV
    with pytest.raises(ValidationError):
        build_metadata([1], [9], [[0, 1]], page_size=4)       # pages do not cover the KV


@pytest.mark.parametrize("name", ["qwen3-qknorm-sharded", "gemma3"])
def test_aux_hidden_states_are_the_reference_layers_outputs(name, engine_models,
                                                            reference_models) -> None:
    """Selected layers' outputs (what a drafter reads) equal transformers' hidden states."""
    model = engine_models[name]
    layers = tuple(range(model.config.num_hidden_layers - 1))   # the last one: normed there
    prompt = [5, 9, 31, 7, 2, 88, 41, 13, 64, 3, 17]
    meta = build_metadata([len(prompt)], [len(prompt)], [[1, 2, 3]], page_size=4)
    cache = allocate_kv_cache(model.config, 8, 4, "cpu", torch.float32)
    model.set_aux_hidden_layers(layers)
    try:
        out = model(ForwardBatch(torch.tensor(prompt), torch.arange(len(prompt)), meta), cache)
    finally:
        model.set_aux_hidden_layers(())
    with torch.no_grad():
        ref = reference_models[name](torch.tensor([prompt]), output_hidden_states=True)
    assert len(out.aux_hidden) == len(layers) >= 1
    for got, layer in zip(out.aux_hidden, layers, strict=True):
        want = ref.hidden_states[layer + 1][0]        # hidden_states[0] is the embedding
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.hidden, ref.hidden_states[-1][0], rtol=1e-4, atol=1e-4)
    plain = model(ForwardBatch(torch.tensor(prompt), torch.arange(len(prompt)), meta),
                  allocate_kv_cache(model.config, 8, 4, "cpu", torch.float32))
    assert plain.aux_hidden == ()
    with pytest.raises(ValueError, match="outside"):
        model.set_aux_hidden_layers((model.config.num_hidden_layers,))


def test_text_models_take_one_row_of_positions(engine_models) -> None:
    model = engine_models[MODEL]
    input_ids, positions, meta = _step_inputs()
    cache = allocate_kv_cache(model.config, 16, 4, "cpu", torch.float32)
    with pytest.raises(ValueError, match="positions of 1 row"):
        model(ForwardBatch(input_ids, positions.expand(3, -1), meta), cache)

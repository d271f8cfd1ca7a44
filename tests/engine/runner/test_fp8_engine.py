"""FP8 through the engine: `kv_cache_dtype: fp8` allocates e4m3 pages (one byte an element:
the same budget holds itemsize-times the pages), `quantization: fp8` loads FP8 projections,
and requests run to completion through the scheduler and TorchRunner; per-head KV scales
(Attention.set_kv_scales) store k / scale and still attend correctly."""

from __future__ import annotations

import random

import torch

from services.engine.model import ForwardBatch, allocate_kv_cache, build_metadata
from services.engine.model.layers.attention import Attention
from services.engine.model.layers.fp8_linear import Fp8Linear
from tests.engine.fakes import run_until_idle
from tests.engine.runner.conftest import greedy_request, make_engine

E4M3 = torch.float8_e4m3fn


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(151_000) for _ in range(length)]


def test_fp8_kv_pool_and_requests(demo_source):
    dense = make_engine(demo_source)
    fp8 = make_engine(demo_source, kv_cache_dtype="fp8", quantization="fp8")
    assert dense.runner.kv.k_caches[0].dtype == torch.float32   # the CPU's compute dtype
    assert fp8.runner.kv.k_caches[0].dtype == E4M3
    # the same byte budget: pages of 1-byte elements instead of 4-byte ones (the snapshot
    # rows share the budget, so the ratio is at least 4 only for the pages' part)
    assert fp8.info.num_pages >= 3.5 * dense.info.num_pages, (fp8.info, dense.info)
    model = fp8.runner.model
    assert any(isinstance(m, Fp8Linear) for m in model.modules())
    requests = [greedy_request(f"r{i}", _prompt(30 + 17 * i, i), 8) for i in range(3)]
    outputs = {}
    for engine in (dense, fp8):
        for req in requests:
            engine.scheduler.admit(req)
        outputs[engine is fp8] = run_until_idle(engine.scheduler, engine.runner)
    for req in requests:
        assert len(outputs[True][req.request_id][0]) == 8


def _attention_logits(model, kv_dtype, scales=None):
    for module in model.modules():
        if isinstance(module, Attention):
            module.set_kv_scales(*(scales or (1.0, 1.0)))
    lengths = (21, 9)
    tables = [list(range(0, 6)), list(range(6, 9))]
    kv = allocate_kv_cache(model.config, 9, 4, model.device, kv_dtype)
    meta = build_metadata(list(lengths), list(lengths), tables, 4, model.device)
    ids = torch.tensor(_prompt(sum(lengths), 7)) % model.config.vocab_size
    positions = torch.tensor([i for n in lengths for i in range(n)])
    hidden = model(ForwardBatch(ids, positions, meta), kv).hidden
    return model.compute_logits(hidden), kv


def test_per_head_kv_scales(demo_source):
    model = make_engine(demo_source).runner.model
    dense, _ = _attention_logits(model, torch.float32)
    unit, _ = _attention_logits(model, E4M3)
    heads = model.config.num_key_value_heads
    k_scale = torch.linspace(0.02, 0.08, heads)   # per head; v per tensor
    scaled, kv = _attention_logits(model, E4M3, (k_scale, 0.05))
    for logits in (unit, scaled):
        error = float((logits - dense).norm() / dense.norm())
        assert 0 < error < 0.05, error
    # the pages hold k / scale: per head, the stored magnitudes follow 1 / scale
    stored = kv.k_caches[0].float().abs().amax(dim=(0, 1, 3))          # [Hk]
    _, unit_kv = _attention_logits(model, E4M3)
    unit_stored = unit_kv.k_caches[0].float().abs().amax(dim=(0, 1, 3))
    ratio = stored / unit_stored.clamp(min=1e-6)
    assert torch.allclose(ratio.clamp(max=448 / unit_stored.clamp(min=1e-6)),
                          (1 / k_scale).clamp(max=448 / unit_stored.clamp(min=1e-6)),
                          rtol=0.15)

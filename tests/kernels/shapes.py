"""One call of each kernel wrapper at Qwen3-8B shapes, for the sm_90 compile report/test.

Qwen3-8B: hidden 4096, 32 query heads, 8 KV heads, head dim 128, MLP 12288, page size 16."""

from __future__ import annotations

import torch

from tests.kernels.batch import make_batch

HIDDEN, NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, INTERMEDIATE, PAGE_SIZE = 4096, 32, 8, 128, 12288, 16
WINDOW = 1024  # a sliding window (Gemma 3's local layers), for the windowed attention variants


def qwen3_8b_calls() -> list[str]:
    """Calls each wrapper once per launch variant (CPU tensors; run under capture_launches)."""
    # the modules directly: the package hides its names on machines without CUDA
    from services.engine.kernels.activation import gelu_tanh_and_mul, silu_and_mul
    from services.engine.kernels.attention import paged_attention
    from services.engine.kernels.kv_write import write_kv
    from services.engine.kernels.norm import fused_add_rms_norm, rms_norm
    from services.engine.kernels.prologue import qkv_prologue
    from services.engine.kernels.rotary import apply_rotary
    from services.engine.kernels.skinny_linear import linear, norm_linear

    bf16 = torch.bfloat16
    names: list[str] = []
    tokens = 64
    x = torch.randn(tokens, HIDDEN, dtype=bf16)
    w = torch.randn(HIDDEN, dtype=bf16)
    rms_norm(x, w, 1e-6)
    names.append("rms_norm H=4096")
    fused_add_rms_norm(x, x.clone(), w, 1e-6)
    names.append("fused_add_rms_norm H=4096")
    qkv = torch.randn(tokens, (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, dtype=bf16)
    q, k, v = qkv.split([NUM_Q_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM], -1)
    q = q.view(tokens, NUM_Q_HEADS, HEAD_DIM)
    k = k.view(tokens, NUM_KV_HEADS, HEAD_DIM)
    v = v.view(tokens, NUM_KV_HEADS, HEAD_DIM)
    rms_norm(q, torch.randn(HEAD_DIM, dtype=bf16), 1e-6)
    names.append("rms_norm q-norm D=128")
    cache = torch.randn(4096, HEAD_DIM, dtype=torch.float32)
    apply_rotary(q, k, torch.arange(tokens), cache)
    names.append("apply_rotary neox")
    silu_and_mul(torch.randn(tokens, 2 * INTERMEDIATE, dtype=bf16))
    names.append("silu_and_mul I=12288")
    gelu_tanh_and_mul(torch.randn(tokens, 2 * INTERMEDIATE, dtype=bf16))
    names.append("gelu_tanh_and_mul I=12288")

    shape = dict(num_q_heads=NUM_Q_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, page_size=PAGE_SIZE)
    decode = make_batch([300] * 4, [1] * 4, **shape, poison_unused=False)
    write_kv(k[:4], v[:4], decode.k_cache, decode.v_cache, decode.meta.slot_mapping)
    names.append("write_kv")
    qkv_prologue(qkv[:4], torch.randn(HEAD_DIM, dtype=bf16), torch.randn(HEAD_DIM, dtype=bf16),
                 1e-6, torch.arange(4), cache, True, decode.k_cache, decode.v_cache,
                 decode.meta.slot_mapping, NUM_Q_HEADS, NUM_KV_HEADS)
    names.append("qkv_prologue qk-norm")
    paged_attention(decode.q, decode.k_cache, decode.v_cache, decode.meta, 0.088, num_splits=1)
    names.append("attention decode")
    paged_attention(decode.q, decode.k_cache, decode.v_cache, decode.meta, 0.088, num_splits=4)
    names += ["attention decode split", "attention split reduce"]
    prefill = make_batch([300, 200], [300, 100], **shape, poison_unused=False)
    paged_attention(prefill.q, prefill.k_cache, prefill.v_cache, prefill.meta, 0.088, num_splits=1)
    names.append("attention prefill")
    paged_attention(decode.q, decode.k_cache, decode.v_cache, decode.meta, 0.088, WINDOW,
                    num_splits=1)
    names.append("attention decode sliding")
    paged_attention(decode.q, decode.k_cache, decode.v_cache, decode.meta, 0.088, WINDOW,
                    num_splits=4)
    names += ["attention decode split sliding", "attention split reduce (sliding)"]
    paged_attention(prefill.q, prefill.k_cache, prefill.v_cache, prefill.meta, 0.088, WINDOW,
                    num_splits=1)
    names.append("attention prefill sliding")
    row = x[:1]
    norm_linear(row, row.clone(), w, 1e-6, torch.randn(qkv.shape[1], HIDDEN, dtype=bf16))
    names.append("norm_linear qkv M=1")
    gate_up = torch.randn(2 * INTERMEDIATE, HIDDEN, dtype=bf16)
    norm_linear(row, row.clone(), w, 1e-6, gate_up, activation="silu")
    names.append("norm_linear gate_up silu M=1")
    norm_linear(row, row.clone(), w, 1e-6, gate_up, activation="gelu_tanh")
    names.append("norm_linear gate_up gelu_tanh M=1")
    linear(torch.randn(1, INTERMEDIATE, dtype=bf16), torch.randn(HIDDEN, INTERMEDIATE, dtype=bf16))
    names.append("linear down M=1")
    linear(row, torch.randn(151936, HIDDEN, dtype=bf16), out_dtype=torch.float32)
    names.append("linear lm_head fp32 M=1")
    rows = x[:5]   # a verification's rows (the 2-16-row tl.dot kernel)
    norm_linear(rows, rows.clone(), w, 1e-6, torch.randn(qkv.shape[1], HIDDEN, dtype=bf16))
    names.append("norm_linear qkv M=5")
    norm_linear(rows, rows.clone(), w, 1e-6, gate_up, activation="silu")
    names.append("norm_linear gate_up silu M=5")
    linear(torch.randn(5, INTERMEDIATE, dtype=bf16), torch.randn(HIDDEN, INTERMEDIATE, dtype=bf16))
    names.append("linear down M=5")
    linear(rows, torch.randn(151936, HIDDEN, dtype=bf16), out_dtype=torch.float32)
    names.append("linear lm_head fp32 M=5")
    return names


def eager_step_variants(count: int = 60, seed: int = 1, windows: tuple[int, ...] = (0,)
                        ) -> dict[str, dict[str, int]]:
    """Distinct Triton compilations (`sm90_compile.compile_key`) that `count` random eager
    steps need: a token budget split between decode rows and prefill chunks, contexts up to
    2,304, the engine's fixed page-table width; attention once per sliding window in `windows`
    (0: full attention; Gemma 3 runs both). Run with kernels compiled (not interpreted):
    launches are recorded, nothing runs. Returns the counts by kernel name for all launches
    ("all") and for those of the full-attention calls and the other ops alone ("full")."""
    import random

    from tests.kernels.sm90_compile import compile_key

    rng = random.Random(seed)
    max_len = 2304
    steps = []
    for _ in range(count):
        num_seqs = rng.choice([1, 2, 3, 8, 17, 64, 130])
        decodes = rng.randint(0, num_seqs - 1)
        left = rng.choice([64, 256, 512, 1024, 2048]) - decodes
        q_lens = [1] * decodes
        for _ in range(num_seqs - decodes):
            q = rng.randint(1, max(1, left))
            q_lens.append(q)
            left = max(1, left - q)
        steps.append((q_lens, [q + rng.randint(0, max_len - q) for q in q_lens]))
    launches, of_windows = record_eager_steps(steps, max_len, windows)
    variants: dict[str, dict[str, set]] = {"all": {}, "full": {}}
    for index, launch in enumerate(launches):
        key = compile_key(launch)
        for part in ("all",) if index in of_windows else ("all", "full"):
            variants[part].setdefault(key[0], set()).add(key)
    return {part: {name: len(keys) for name, keys in counts.items()}
            for part, counts in variants.items()}


def record_eager_steps(steps: list[tuple[list[int], list[int]]], max_len: int,
                       windows: tuple[int, ...] = (0,)) -> tuple[list, set[int]]:
    """The attention (once per window in `windows`), residual norm and QKV prologue launches
    of eager steps given as (query lengths, KV lengths), with the engine's fixed page-table
    width for `max_len`, recorded (`capture_launches`), not run; and the indices of the
    windowed attention launches."""
    import dataclasses

    from services.engine.kernels.attention import paged_attention
    from services.engine.kernels.norm import fused_add_rms_norm
    from services.engine.kernels.prologue import qkv_prologue
    from tests.kernels.batch import make_batch
    from tests.kernels.sm90_compile import capture_launches

    page = PAGE_SIZE
    width = max_len // page + 1
    bf16 = torch.bfloat16
    windowed = []  # (first, end) launch indices of the windowed attention calls
    with capture_launches() as launches:
        for q_lens, seq_lens in steps:
            tokens = sum(q_lens)
            batch = make_batch(seq_lens, q_lens, num_q_heads=NUM_Q_HEADS,
                               num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, page_size=page,
                               poison_unused=False)
            table = torch.zeros(len(q_lens), width, dtype=torch.int32)
            table[:, : batch.meta.page_table.shape[1]] = batch.meta.page_table
            meta = dataclasses.replace(batch.meta, page_table=table)
            for window in windows:
                first = len(launches)
                paged_attention(batch.q, batch.k_cache, batch.v_cache, meta, 0.088, window)
                if window:
                    windowed.append((first, len(launches)))
            x = torch.randn(tokens, HIDDEN, dtype=bf16)
            fused_add_rms_norm(x, x.clone(), torch.ones(HIDDEN, dtype=bf16), 1e-6)
            qkv = torch.randn(tokens, (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, dtype=bf16)
            qkv_prologue(qkv, torch.ones(HEAD_DIM, dtype=bf16), torch.ones(HEAD_DIM, dtype=bf16),
                         1e-6, torch.arange(tokens), torch.randn(4096, HEAD_DIM), True,
                         batch.k_cache, batch.v_cache, meta.slot_mapping, NUM_Q_HEADS,
                         NUM_KV_HEADS)
    return launches, {i for first, end in windowed for i in range(first, end)}

"""The primitive ops of the forward pass: plain-torch references and the dispatch to kernels.

Each op `<name>` below dispatches: when its first tensor is on CUDA and
`services.engine.kernels` imports and exposes a callable `<name>` (same signature, same
semantics), that kernel runs; otherwise the plain-torch reference `reference_<name>` does.
`HELIOS_KERNELS=torch` (read once per process; `kernel_ops.cache_clear()` re-reads it) forces
the references everywhere. Kernel tests compare against the `reference_*` functions.

Shapes: T packed rows, H hidden, Hq/Hk query/KV heads, D head_dim, I intermediate size.
Nothing here synchronises with the device except the CPU-only varlen attention path, so the
CUDA path can be captured in a graph.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from services.engine.model.attention import AttentionMetadata
from services.engine.model.fp8 import FP8_DTYPE, FP8_MAX, Fp8Weight, fp8_linear, fp8_norm_linear

log = logging.getLogger(__name__)

OP_NAMES = ("rms_norm", "fused_add_rms_norm", "apply_rotary", "silu_and_mul",
            "gelu_tanh_and_mul", "write_kv", "paged_attention", "qkv_prologue", "linear",
            "norm_linear", "fp8_linear", "fp8_norm_linear")
GATED_ACTIVATIONS = ("silu", "gelu_tanh")   # norm_linear's `activation` (None: no activation)


@functools.cache
def kernel_ops() -> dict[str, Callable[..., Any]]:
    """The kernels `services.engine.kernels` provides, by op name (empty when forced off)."""
    if os.environ.get("HELIOS_KERNELS", "").strip().lower() == "torch":
        return {}
    try:
        # import_module reads sys.modules (not the parent package's attribute), so a module
        # substituted there is honoured whatever was imported before
        kernels = importlib.import_module("services.engine.kernels")
    except ImportError:
        return {}
    except Exception:  # a broken kernel module must not take the engine down
        log.exception("services.engine.kernels failed to import; using torch reference ops")
        return {}
    return {name: fn for name in OP_NAMES if callable(fn := getattr(kernels, name, None))}


def _kernel(name: str, tensor: torch.Tensor) -> Callable[..., Any] | None:
    return kernel_ops().get(name) if tensor.is_cuda else None


# ---------------------------------------------------------------------------------------------
# Dispatching ops (the names the model calls)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, H] -> [T, H]: x / rms(x) * weight, computed in float32."""
    kernel = _kernel("rms_norm", x)
    return kernel(x, weight, eps) if kernel else reference_rms_norm(x, weight, eps)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [T, H], residual [T, H]) -> (rms_norm(x + residual), x + residual)."""
    kernel = _kernel("fused_add_rms_norm", x)
    if kernel:
        return kernel(x, residual, weight, eps)
    return reference_fused_add_rms_norm(x, residual, weight, eps)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                 cos_sin_cache: torch.Tensor, is_neox: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hk, D] by their positions (int64 [T]).

    cos_sin_cache [max_pos, D]: cos of each of the D/2 frequencies in the first half, sin in
    the second. is_neox: rotate the two halves of D (Llama/Qwen/Mistral); otherwise
    interleaved pairs (GPT-J). Returns the rotated (q, k); kernels may rotate in place.
    """
    kernel = _kernel("apply_rotary", q)
    if kernel:
        return kernel(q, k, positions, cos_sin_cache, is_neox)
    return reference_apply_rotary(q, k, positions, cos_sin_cache, is_neox)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] (gate then up) -> silu(gate) * up [T, I]."""
    kernel = _kernel("silu_and_mul", x)
    return kernel(x) if kernel else reference_silu_and_mul(x)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] (gate then up) -> gelu_tanh(gate) * up [T, I] (Gemma's gated MLP)."""
    kernel = _kernel("gelu_tanh_and_mul", x)
    return kernel(x) if kernel else reference_gelu_tanh_and_mul(x)


def gated_activation(x: torch.Tensor, activation: str) -> torch.Tensor:
    """x [T, 2I] -> act(gate) * up [T, I] for `activation` in GATED_ACTIVATIONS."""
    if activation == "silu":
        return silu_and_mul(x)
    if activation == "gelu_tanh":
        return gelu_tanh_and_mul(x)
    raise ValueError(f"unknown gated activation {activation!r} (known: {GATED_ACTIVATIONS})")


def linear(x: torch.Tensor, weight: torch.Tensor | Fp8Weight, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [T, K] @ weight [N, K]^T + bias -> [T, N] in out_dtype (x's by default). On CUDA a
    skinny kernel for decode-sized T (cuBLAS above it), with the cast fused in. An FP8
    weight (model/fp8.py) takes the FP8 path."""
    if isinstance(weight, Fp8Weight):
        return fp8_linear(x, weight, bias, out_dtype)
    kernel = _kernel("linear", x)
    if kernel:
        return kernel(x, weight, bias, out_dtype=out_dtype)
    return reference_linear(x, weight, bias, out_dtype)


def norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                eps: float, weight: torch.Tensor | Fp8Weight, bias: torch.Tensor | None = None,
                activation: str | None = None, *, out_dtype: torch.dtype | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """A sublayer's way in: (y, new residual) with y = rms_norm(x + residual) @ W^T + b (no
    add when residual is None: then the new residual is x), and with an `activation` (silu,
    gelu_tanh) the weight's gate/up halves combined as act(gate) * up [T, N/2]. One launch on
    CUDA for decode-sized T; elsewhere the composition of the ops above (the same order and
    roundings). An FP8 weight takes the FP8 path (model/fp8.py). `out_dtype`: y's dtype (x's
    by default; a router's float32 logits)."""
    if isinstance(weight, Fp8Weight):
        y, residual = fp8_norm_linear(x, residual, norm_weight, eps, weight, bias, activation)
    else:
        kernel = _kernel("norm_linear", x)
        if kernel:
            return kernel(x, residual, norm_weight, eps, weight, bias, activation,
                          out_dtype=out_dtype)
        y, residual = composed_norm_linear(x, residual, norm_weight, eps, weight, bias,
                                           activation)
    return (y if out_dtype is None else y.to(out_dtype)), residual


def composed_norm_linear(x: torch.Tensor, residual: torch.Tensor | None,
                         norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                         bias: torch.Tensor | None = None, activation: str | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """norm_linear as separate (dispatching) ops: the norm, the projection, the activation."""
    if residual is None:
        normed, residual = rms_norm(x, norm_weight, eps), x
    else:
        normed, residual = fused_add_rms_norm(x, residual, norm_weight, eps)
    y = F.linear(normed, weight, bias)
    return (gated_activation(y, activation) if activation else y), residual


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor,
             kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Store k, v [T, Hk, D] at flat slots (int64 [T]) of the caches, in place; -1 is skipped.
    FP8 caches hold e4m3 values: k / k_scale and v / v_scale with `kv_scales` (float32 [Hk]
    each), else the values themselves, rounded to nearest even and clamped to +-448."""
    kernel = _kernel("write_kv", k)
    if kernel:
        if kv_scales is None:
            kernel(k, v, k_cache, v_cache, slot_mapping)
        else:
            kernel(k, v, k_cache, v_cache, slot_mapping, kv_scales=kv_scales)
    else:
        reference_write_kv(k, v, k_cache, v_cache, slot_mapping, kv_scales)


def qkv_prologue(qkv: torch.Tensor, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None,
                 eps: float, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                 is_neox: bool, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, num_q_heads: int, num_kv_heads: int,
                 kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The attention prologue: qkv [T, (Hq + 2 Hk) D] -> q [T, Hq, D] normed (QK-norm when
    the weights are given) and rotated; k (normed, rotated) and v written to the cache.
    One fused kernel on CUDA; elsewhere the composition of the ops above (the same order).
    FP8 caches with per-head `kv_scales` take the composition (write_kv divides)."""
    kernel = _kernel("qkv_prologue", qkv)
    if kernel and kv_scales is None:
        return kernel(qkv, q_norm, k_norm, eps, positions, cos_sin_cache, is_neox, k_cache,
                      v_cache, slot_mapping, num_q_heads, num_kv_heads)
    return composed_qkv_prologue(qkv, q_norm, k_norm, eps, positions, cos_sin_cache, is_neox,
                                 k_cache, v_cache, slot_mapping, num_q_heads, num_kv_heads,
                                 kv_scales)


def composed_qkv_prologue(qkv: torch.Tensor, q_norm: torch.Tensor | None,
                          k_norm: torch.Tensor | None, eps: float, positions: torch.Tensor,
                          cos_sin_cache: torch.Tensor, is_neox: bool, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, slot_mapping: torch.Tensor, num_q_heads: int,
                          num_kv_heads: int,
                          kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None
                          ) -> torch.Tensor:
    """qkv_prologue as separate (dispatching) ops: norm, rotary, KV write."""
    num_tokens = qkv.shape[0]
    head_dim = k_cache.shape[3]
    q_size, kv_size = num_q_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
    if q_norm is not None and k_norm is not None:
        q = rms_norm(q.reshape(-1, head_dim), q_norm, eps)
        k = rms_norm(k.reshape(-1, head_dim), k_norm, eps)
    q = q.reshape(num_tokens, num_q_heads, head_dim)                 # [T, Hq, D]
    k = k.reshape(num_tokens, num_kv_heads, head_dim)                # [T, Hk, D]
    v = v.reshape(num_tokens, num_kv_heads, head_dim)                # [T, Hk, D]
    q, k = apply_rotary(q, k, positions, cos_sin_cache, is_neox)
    write_kv(k, v, k_cache, v_cache, slot_mapping, kv_scales)
    return q


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float, sliding_window: int = 0,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of q [T, Hq, D] over the paged KV of each row's sequence -> [T, Hq, D].

    With `sliding_window` W > 0 the row at position p sees only positions (p - W, p]. With
    `sinks` [Hq] (gpt-oss's attention sinks) each head's softmax denominator also holds
    exp(sink): a learned logit no value stands behind. The new rows' K/V must already be
    written (write_kv). Padding rows return finite garbage.
    """
    kernel = _kernel("paged_attention", q)
    if kernel:
        if sinks is None:   # the call without sinks stays what it was
            return kernel(q, k_cache, v_cache, meta, scale, sliding_window)
        return kernel(q, k_cache, v_cache, meta, scale, sliding_window, sinks=sinks)
    if q.is_cuda:
        return reference_paged_attention(q, k_cache, v_cache, meta, scale, sliding_window,
                                         sinks)
    return varlen_paged_attention(q, k_cache, v_cache, meta, scale, sliding_window, sinks)


# ---------------------------------------------------------------------------------------------
# Plain-torch references


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def reference_fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    new_residual = x + residual
    return reference_rms_norm(new_residual, weight, eps), new_residual


def reference_apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                           cos_sin_cache: torch.Tensor, is_neox: bool = True
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache.index_select(0, positions).float().chunk(2, dim=-1)  # [T, D/2]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)                                  # [T, 1, D/2]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        if is_neox:
            x1, x2 = xf.chunk(2, dim=-1)
            out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = xf[..., 0::2], xf[..., 1::2]
            out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return out.to(x.dtype)

    return rotate(q), rotate(k)


def reference_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def reference_gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    y = F.linear(x, weight, bias)
    return y if out_dtype is None or y.dtype == out_dtype else y.to(out_dtype)


def to_cache_dtype(values: torch.Tensor, dtype: torch.dtype,
                   scale: torch.Tensor | None = None) -> torch.Tensor:
    """K/V rows [T, Hk, D] as a cache of `dtype` stores them: e4m3 pages hold values /
    scale[head] clamped to +-448 (torch's cast rounds to nearest even), others a cast."""
    if dtype != FP8_DTYPE:
        return values.to(dtype)
    v = values.float()
    if scale is not None:
        v = v / scale.float()[:, None]
    return v.clamp(-FP8_MAX, FP8_MAX).to(dtype)


def reference_write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                       kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    # Without a host sync we cannot drop the -1 rows, so each padding row re-writes what a
    # valid row writes (same slot, same value: duplicates are harmless), or, when no row is
    # valid, slot 0's current contents back to slot 0.
    valid = slot_mapping >= 0                                    # [T]
    any_valid = valid.any()
    first = torch.argmax(valid.to(torch.int32)).view(1)         # first valid row (0 if none)
    fallback_slot = torch.where(any_valid, slot_mapping.index_select(0, first), 0)
    slots = torch.where(valid, slot_mapping, fallback_slot)      # [T]
    scales = kv_scales if kv_scales is not None else (None, None)
    for src, cache, scale in ((k, k_cache, scales[0]), (v, v_cache, scales[1])):
        flat = cache.view(-1, *cache.shape[2:])                  # [num_slots, Hk, D]
        # padding rows rewrite a valid row's value, or slot 0's own (decoded back exactly)
        current = flat[:1].to(src.dtype) if scale is None else (
            flat[:1].float() * scale.float()[:, None]).to(src.dtype)
        fallback = torch.where(any_valid, src.index_select(0, first), current)
        values = to_cache_dtype(torch.where(valid[:, None, None], src, fallback),  # [T, Hk, D]
                                cache.dtype, scale)
        if cache.dtype == FP8_DTYPE:   # index_copy_ has no e4m3 kernels: copy the bytes
            flat.view(torch.uint8).index_copy_(0, slots, values.view(torch.uint8))
        else:
            flat.index_copy_(0, slots, values)


def _gather_kv(cache: torch.Tensor, page_table: torch.Tensor, num_positions: int
               ) -> torch.Tensor:
    """KV of positions [0, num_positions) for each sequence: [B, num_positions, Hk, D]."""
    page_size = cache.shape[1]
    pos = torch.arange(num_positions, device=cache.device)
    page_idx = (pos // page_size).clamp(max=page_table.shape[1] - 1)
    pages = page_table[:, page_idx].long().clamp(0, cache.shape[0] - 1)      # [B, S]
    slots = pages * page_size + pos % page_size                               # [B, S]
    return cache.view(-1, *cache.shape[2:])[slots]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
            scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, L, Hq, D], k/v [B, S, Hk, D], allowed bool [B, L, S] -> [B, L, Hq, D] (float32).
    sinks [Hq]: one more logit per head in the softmax, its probability dropped."""
    b, L, hq, d = q.shape
    hk = k.shape[2]
    qg = q.float().view(b, L, hk, hq // hk, d).permute(0, 2, 3, 1, 4)   # [B, Hk, G, L, D]
    kt = k.float().permute(0, 2, 3, 1).unsqueeze(2)                    # [B, Hk, 1, D, S]
    vg = v.float().permute(0, 2, 1, 3).unsqueeze(2)                    # [B, Hk, 1, S, D]
    scores = torch.matmul(qg, kt) * scale                              # [B, Hk, G, L, S]
    scores = scores.masked_fill(~allowed[:, None, None], float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1)
    else:
        sink = sinks.float().view(1, hk, hq // hk, 1, 1).expand(b, hk, hq // hk, L, 1)
        probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    out = torch.matmul(probs, vg)                                      # [B, Hk, G, L, D]
    return out.permute(0, 3, 1, 2, 4).reshape(b, L, hq, d)


def reference_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              meta: AttentionMetadata, scale: float, sliding_window: int = 0,
                              sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Graph-safe reference: pad the batch to [B, max_query_len, ...] with tensor ops only."""
    num_rows = q.shape[0]
    num_seqs = meta.seq_lens.shape[0]
    max_q, max_s = meta.max_query_len, meta.max_seq_len
    qsl = meta.query_start_loc.long()
    rows = torch.arange(num_rows, device=q.device)
    valid = rows < qsl[-1]                                                    # [T]
    seq = torch.searchsorted(qsl[1:], rows, right=True).clamp(max=num_seqs - 1)
    offset = rows - qsl[seq]
    seq = torch.where(valid, seq, 0)
    offset = torch.where(valid, offset, max_q)         # padding rows share a spare row
    padded_q = q.new_zeros(num_seqs, max_q + 1, *q.shape[1:])                 # [B, L+1, Hq, D]
    padded_q[seq, offset] = q
    q_lens = qsl[1:] - qsl[:-1]                                               # [B]
    seq_lens = meta.seq_lens.long()
    query_pos = (seq_lens - q_lens)[:, None] + torch.arange(max_q + 1, device=q.device)
    key_pos = torch.arange(max_s, device=q.device)
    allowed = (key_pos[None, None, :] <= query_pos[:, :, None]) & (
        key_pos[None, None, :] < seq_lens[:, None, None])                    # [B, L+1, S]
    if sliding_window:
        allowed &= key_pos[None, None, :] > query_pos[:, :, None] - sliding_window
    # keep rows that see nothing (padding) finite; a valid row always sees its own position
    allowed[:, :, 0] |= ~allowed.any(dim=-1)
    k = _gather_kv(k_cache, meta.page_table, max_s)
    v = _gather_kv(v_cache, meta.page_table, max_s)
    out = _attend(padded_q, k, v, allowed, scale, sinks)
    return out[seq, offset].to(q.dtype)


def varlen_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           meta: AttentionMetadata, scale: float, sliding_window: int = 0,
                           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The CPU path: one sequence at a time (reads lengths on the host; never for graphs)."""
    out = torch.zeros_like(q)
    starts = meta.query_start_loc.tolist()
    seq_lens = meta.seq_lens.tolist()
    for i, seq_len in enumerate(seq_lens):
        begin, end = starts[i], starts[i + 1]
        q_len = end - begin
        table = meta.page_table[i : i + 1]
        k = _gather_kv(k_cache, table, seq_len)
        v = _gather_kv(v_cache, table, seq_len)
        query_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        key_pos = torch.arange(seq_len, device=q.device)[None, :]
        allowed = key_pos <= query_pos[:, None]
        if sliding_window:
            allowed &= key_pos > query_pos[:, None] - sliding_window
        out[begin:end] = _attend(q[None, begin:end], k, v, allowed[None], scale,
                                 sinks)[0].to(q.dtype)
    return out

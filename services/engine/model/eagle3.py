"""EAGLE-3 heads (`speculative_method eagle3`): a one-layer drafter that reads the target's
hidden states, in the public checkpoint format (`LlamaForCausalLMEagle3`, for Llama-3.1 and
Qwen3 targets alike: the head's layer is Llama-shaped).

    config = parse_eagle3_config(head_config_json, target_config, name)
    head = load_eagle3_head(directory, config, device, dtype, max_positions)
    fused = head.fuse(aux)                 # the target's three hidden states [T, 3 Ht] -> [T, H]
    normed, prenorm = head(embeds, hidden, positions, kv, meta)
    draft_ids = head.logits(normed).argmax(-1); target_ids = head.draft_to_target[draft_ids]

The format: `fc` [H, 3 Ht] fuses the target's hidden states at three depths (low, mid, high:
`eagle_aux_hidden_state_layer_ids` j, each the hidden state entering target layer j, i.e.
after layer j - 1; default 2, L // 2, L - 3 for an L-layer target; pinned ids are read as
vLLM reads them, while SGLang reads pinned ids as layer outputs, one layer later, so a head
trained for SGLang with pinned ids drafts worse here, never wrongly). One decoder layer
(`midlayer.*`) takes the token's embedding and that fused state, each RMS-normed
(`input_layernorm`, `hidden_norm`), concatenated [embed, hidden] into q/k/v projections of
2H inputs; the residual is the fused state before its norm (after it with
`norm_before_residual`). `norm` and `lm_head` [draft_vocab, H] score a reduced vocabulary;
`d2t` maps a draft id to the target's (target = draft + d2t[draft]); `t2d` (the inverse mask)
is not needed. `embed_tokens` is optional: without it the target's embedding is shared.
A row at position i takes the embedding of token i + 1 and the target's state at i and
predicts token i + 2; a chained draft feeds the head's own pre-norm output back as the next
row's hidden state. Every tensor is checked at load: a missing or unexpected tensor, a shape
the config does not imply, a hidden size unlike the target's or a `d2t` entry outside the
target's vocabulary is refused, naming the head directory and the tensor.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from services.common.errors import ValidationError
from services.engine.model import ops
from services.engine.model.attention import AttentionMetadata, KVCache
from services.engine.model.config import ModelConfig
from services.engine.model.layers import Embedding, Linear, RMSNorm
from services.engine.model.layers.attention import Attention
from services.engine.model.layers.linear import PackedLinear
from services.engine.model.layers.mlp import GatedMLP
from services.engine.model.layers.weights import WeightShapeError, weight_loader, weight_shards
from services.engine.model.llama import parse_llama
from services.engine.model.rope import build_cos_sin_cache

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
AUX_LAYER_IDS = "eagle_aux_hidden_state_layer_ids"
# checkpoint projection name -> (packed parameter, shard)
_PACKED = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"),
           "v_proj": ("qkv_proj", "v"), "gate_proj": ("gate_up_proj", "gate"),
           "up_proj": ("gate_up_proj", "up")}


@dataclass(frozen=True, slots=True)
class Eagle3Config:
    name: str                        # the head directory, for messages
    layer: ModelConfig               # the head's decoder layer (one Llama layer)
    target_hidden_size: int
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...]   # the format's ids: the state entering target layer j
    norm_before_residual: bool

    @property
    def target_layers(self) -> tuple[int, ...]:
        """The target layers whose output the head reads, ascending and distinct (the
        target's forward returns them so: CausalLM.set_aux_hidden_layers)."""
        return tuple(sorted({j - 1 for j in self.aux_layer_ids}))

    @property
    def aux_order(self) -> tuple[int, ...]:
        """For each of fc's three inputs (low, mid, high), its index in target_layers."""
        return tuple(self.target_layers.index(j - 1) for j in self.aux_layer_ids)


def _refuse(name: str, what: str, param: str = "speculative_model") -> ValidationError:
    return ValidationError(f"EAGLE-3 head {name}: {what}", param=param)


def parse_eagle3_config(raw: Mapping[str, Any], target: ModelConfig, name: str) -> Eagle3Config:
    """The head's config.json checked against the target's config."""
    architectures = list(raw.get("architectures") or [])
    if not set(architectures) & set(ARCHITECTURES):
        raise _refuse(name, f"architectures {architectures} is not an EAGLE-3 head "
                      f"({' or '.join(ARCHITECTURES)})")
    try:
        layer = parse_llama({**raw, "num_hidden_layers": 1})
    except ValidationError as exc:
        raise _refuse(name, exc.message) from exc
    target_hidden = int(raw.get("target_hidden_size") or layer.hidden_size)
    if target_hidden != target.hidden_size:
        raise _refuse(name, f"target hidden size {target_hidden}, the target's is "
                      f"{target.hidden_size}")
    if layer.vocab_size != target.vocab_size:
        raise _refuse(name, f"vocab_size {layer.vocab_size}, the target's is "
                      f"{target.vocab_size}")
    eagle = raw.get("eagle_config") or {}
    count = target.num_hidden_layers
    ids = raw.get(AUX_LAYER_IDS) or eagle.get(AUX_LAYER_IDS) or (2, count // 2, count - 3)
    ids = tuple(int(j) for j in ids)
    if len(ids) != 3 or not all(1 <= j <= count for j in ids):     # count: the last output
        raise _refuse(name, f"{AUX_LAYER_IDS} {list(ids)}: three layers of the target's "
                      f"1..{count} expected", param=AUX_LAYER_IDS)
    draft_vocab = int(raw.get("draft_vocab_size") or layer.vocab_size)
    if not 1 <= draft_vocab <= layer.vocab_size:
        raise _refuse(name, f"draft_vocab_size {draft_vocab} outside 1..{layer.vocab_size}")
    return Eagle3Config(name, layer, target_hidden, draft_vocab, ids,
                        bool(raw.get("norm_before_residual", False)))


class Eagle3Layer(nn.Module):
    """The head's decoder layer: [norm(embed), norm(hidden)] -> attention -> gated MLP."""

    def __init__(self, config: Eagle3Config, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        layer = config.layer
        size = layer.hidden_size
        self.eps = layer.rms_norm_eps
        self.norm_before_residual = config.norm_before_residual
        self.input_layernorm = RMSNorm(size, self.eps, device=device, dtype=dtype)
        self.hidden_norm = RMSNorm(size, self.eps, device=device, dtype=dtype)
        self.self_attn = Attention(layer, 0, device=device, dtype=dtype)
        self.self_attn.qkv_proj = PackedLinear(
            2 * size, {"q": layer.q_size, "k": layer.kv_size, "v": layer.kv_size},
            bias=layer.qkv_bias, device=device, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(size, self.eps, device=device, dtype=dtype)
        self.mlp = GatedMLP(layer, device=device, dtype=dtype)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        attn, mlp = self.self_attn, self.mlp
        normed = ops.rms_norm(hidden, self.hidden_norm.weight, self.eps)
        residual = normed if self.norm_before_residual else hidden
        joined = torch.cat([ops.rms_norm(embeds, self.input_layernorm.weight, self.eps),
                            normed], dim=-1)                                # [T, 2H]
        qkv = ops.linear(joined, attn.qkv_proj.weight, attn.qkv_proj.bias)
        x = attn(qkv, positions, cos_sin_cache, k_cache, v_cache, meta)
        activation, residual = ops.norm_linear(
            x, residual, self.post_attention_layernorm.weight, self.eps,
            mlp.gate_up_proj.linear_weight, mlp.gate_up_proj.bias, activation=mlp.activation)
        return mlp(activation), residual


class Eagle3Head(nn.Module):
    """fc, the decoder layer, the final norm, the draft lm_head and the vocabulary map."""

    draft_to_target: torch.Tensor     # int64 [draft_vocab]: the target id of each draft id

    def __init__(self, config: Eagle3Config, *, has_embedding: bool,
                 device: torch.device | str, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__()
        layer = config.layer
        self.config = config
        self.fc = Linear(3 * config.target_hidden_size, layer.hidden_size, bias=False,
                         device=device, dtype=dtype)
        self.embed_tokens = Embedding(layer.vocab_size, layer.hidden_size, device=device,
                                      dtype=dtype) if has_embedding else None
        self.midlayer = Eagle3Layer(config, device=device, dtype=dtype)
        self.norm = RMSNorm(layer.hidden_size, layer.rms_norm_eps, device=device, dtype=dtype)
        self.lm_head = Linear(layer.hidden_size, config.draft_vocab_size, bias=False,
                              device=device, dtype=dtype)
        self.register_buffer("draft_to_target", torch.arange(
            config.draft_vocab_size, dtype=torch.int64, device=device), persistent=False)
        self.register_buffer("cos_sin_cache", build_cos_sin_cache(
            layer, max_positions, device, layer.rope), persistent=False)
        self.max_positions = max_positions

    def fuse(self, aux: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The target's states after its `target_layers` ([T, Ht] each) -> [T, H]."""
        return self.fc(torch.cat([aux[i] for i in self.config.aux_order], dim=-1))

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                kv: KVCache, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """(embeds [T, H], hidden [T, H]) -> (final-normed [T, H] for logits, the pre-norm
        state [T, H] a chained row feeds back); writes the rows' K/V into `kv`."""
        k_cache, v_cache = kv.layer(0)
        x, residual = self.midlayer(embeds, hidden, positions, self.cos_sin_cache, k_cache,
                                    v_cache, meta)
        return ops.fused_add_rms_norm(x, residual, self.norm.weight,
                                      self.config.layer.rms_norm_eps)

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """[N, H] -> float32 [N, draft_vocab]."""
        return ops.linear(normed, self.lm_head.weight, out_dtype=torch.float32)


def _head_tensors(directory: Path) -> Iterator[tuple[str, str, torch.Tensor]]:
    """(file, name, tensor) of the head's safetensors files, else its pytorch_model*.bin."""
    files = sorted(directory.glob("*.safetensors"))
    if files:
        from safetensors import safe_open

        for path in files:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open has no iterator)
                    yield path.name, name, handle.get_tensor(name)
        return
    for path in sorted(directory.glob("pytorch_model*.bin")):
        for name, tensor in torch.load(path, map_location="cpu", weights_only=True).items():
            yield path.name, name, tensor


def _parameter_name(name: str) -> tuple[str, str | None]:
    """A checkpoint name -> (head parameter name, shard)."""
    name = name.removeprefix("model.")
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in _PACKED:
            parts[i], shard = _PACKED[part]
            return ".".join(parts), shard
    return name, None


def head_has_embedding(directory: Path) -> bool:
    return any(_parameter_name(name)[0] == "embed_tokens.weight"
               for _, name, _ in _head_tensors(directory))


@torch.inference_mode()
def load_eagle3_head(directory: Path, config: Eagle3Config, device: torch.device,
                     dtype: torch.dtype, max_positions: int, target_vocab: int) -> Eagle3Head:
    """The head with every tensor of `directory` loaded and checked (module docstring)."""
    name = config.name
    has_embedding = head_has_embedding(directory)
    width, target_width = config.layer.hidden_size, config.target_hidden_size
    if not has_embedding and width != target_width:
        raise _refuse(name, f"hidden size {width} without its own embed_tokens (the "
                      f"target's embedding it would share is {target_width} wide)",
                      param="embed_tokens")
    head = Eagle3Head(config, has_embedding=has_embedding, device=device, dtype=dtype,
                      max_positions=max_positions)
    params = dict(head.named_parameters())
    expected = {(p, s) for p, param in params.items() for s in weight_shards(param)}
    filled: set[tuple[str, str | None]] = set()
    d2t: torch.Tensor | None = None
    for file_name, tensor_name, tensor in _head_tensors(directory):
        param_name, shard = _parameter_name(tensor_name)
        if param_name == "t2d":
            continue
        if param_name == "d2t":
            d2t = tensor
            continue
        param = params.get(param_name)
        if param is None or (param_name, shard) not in expected:
            raise _refuse(name, f"{file_name}: unexpected tensor {tensor_name!r}",
                          param=tensor_name)
        try:
            weight_loader(param)(param, tensor.to(dtype), shard)
        except WeightShapeError as exc:
            raise _refuse(name, f"{file_name}: tensor {tensor_name!r} has shape {exc.got}, "
                          f"the config implies {exc.expected}", param=tensor_name) from exc
        filled.add((param_name, shard))
    missing = sorted(expected - filled, key=lambda t: (t[0], t[1] or ""))
    if missing:
        param_name, shard = missing[0]
        label = param_name if shard is None else f"{param_name} ({shard})"
        raise _refuse(name, f"lacks tensor {label!r}", param=param_name)
    head.draft_to_target.copy_(_vocabulary_map(config, d2t, target_vocab))
    return head


def _vocabulary_map(config: Eagle3Config, d2t: torch.Tensor | None,
                    target_vocab: int) -> torch.Tensor:
    """draft id -> target id; refused unless every target id is in 0..target_vocab - 1."""
    size = config.draft_vocab_size
    base = torch.arange(size, dtype=torch.int64)
    if d2t is None:
        if size != config.layer.vocab_size:
            raise _refuse(config.name, f"draft_vocab_size {size} without a d2t tensor",
                          param="d2t")
        return base
    if tuple(d2t.shape) != (size,) or d2t.dtype.is_floating_point:
        raise _refuse(config.name, f"d2t has shape {tuple(d2t.shape)} ({d2t.dtype}), "
                      f"draft_vocab_size {size} integers expected", param="d2t")
    targets = base + d2t.to(torch.int64)
    bad = ((targets < 0) | (targets >= target_vocab)).nonzero()
    if bad.numel():
        draft = int(bad[0])
        raise _refuse(config.name, f"d2t maps draft id {draft} to {int(targets[draft])}, "
                      f"outside the target's vocabulary 0..{target_vocab - 1}", param="d2t")
    return targets

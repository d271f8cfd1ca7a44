"""Which FP8 scheme the engine's decoder projections run: parsed from config.json's
`quantization_config` (`helios prepare` records it in the manifest), or asked for with the
engine setting `quantization: fp8` (online).

    scheme = parse_quantization(config_json, setting="")   # Fp8Scheme, or None for dense

Supported (anything else raises UnsupportedError naming the method or field):

- Hugging Face `quant_method: fp8` (`fmt: e4m3`): with `weight_block_size: [128, 128]`
  (Qwen's and DeepSeek's `-FP8` releases) the weights are e4m3 with one float32
  `weight_scale_inv` per 128x128 block and the activations are quantized per token in groups
  of 128 at run time; without a block size one `weight_scale_inv` per tensor, activations
  dynamic per token, or, with `activation_scheme: static`, the checkpoint's `input_scale`;
- compressed-tensors (llm-compressor) float 8-bit weights with `strategy` `channel` (one
  `weight_scale` per output row), `tensor` (one per tensor) or `block`, and input activations
  `dynamic` per `token` (or per `group`), or static per `tensor` (`input_scale`);
- online (`quantization: fp8` on a bf16/fp16/fp32 checkpoint, GGUF cores included): each
  output row of every decoder projection quantized at load with its own scale (amax / 448),
  activations dynamic per token.

The embeddings, norms and lm_head stay in the model dtype. The scheme's `name` is what the
manifest and the engine's logs record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.common.errors import UnsupportedError

QUANTIZATIONS = ("", "fp8")          # the engine setting `quantization` ("" = the checkpoint's)
WEIGHT_KINDS = ("block", "channel", "tensor")
ACTIVATION_KINDS = ("group", "token", "static")
# methods an architecture family reads itself (gpt-oss's MXFP4 experts, model/gpt_oss.py):
# not an FP8 scheme of the decoder projections, which stay dense (or online FP8)
FAMILY_METHODS = ("mxfp4",)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class Fp8Scheme:
    """How the decoder projections are stored and how their inputs are quantized."""

    method: str                        # "fp8" (HF), "compressed-tensors" or "online"
    weights: str                       # WEIGHT_KINDS: one scale per 128x128 block, row, tensor
    activations: str                   # ACTIVATION_KINDS: dynamic groups / tokens, static
    block: tuple[int, int] = (128, 128)   # (rows, columns) of a weight block; group = block[1]

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_KINDS or self.activations not in ACTIVATION_KINDS:
            raise ValueError(f"bad FP8 scheme {self.weights}/{self.activations}")

    @property
    def group_size(self) -> int:
        """Activation elements per scale for `group` activations."""
        return self.block[1]

    @property
    def scale_name(self) -> str:
        """The weight-scale tensor's name in the checkpoint (online: none is read)."""
        return "weight_scale_inv" if self.method == "fp8" else "weight_scale"

    @property
    def stored(self) -> bool:
        """The checkpoint holds e4m3 weights and scales (else: quantized at load)."""
        return self.method != "online"

    @property
    def name(self) -> str:
        weights = (f"block{self.block[0]}x{self.block[1]}" if self.weights == "block"
                   else self.weights)
        acts = {"group": f"dynamic-group{self.group_size}", "token": "dynamic-token",
                "static": "static-tensor"}[self.activations]
        return f"fp8-e4m3:{self.method}:w-{weights}:a-{acts}"


ONLINE_FP8 = Fp8Scheme("online", "channel", "token")


def _unsupported(message: str, param: str = "quantization_config") -> UnsupportedError:
    return UnsupportedError(f"quantization_config: {message}", param=param)


def _check_ignored(entries: Any, field: str) -> None:
    """Modules a checkpoint leaves unquantized: the lm_head (and a vision tower) is fine;
    a decoder projection left dense is not a layout this engine runs."""
    for entry in entries or ():
        text = str(entry)
        if any(p in text for p in PROJECTIONS) and "vision" not in text and "visual" not in text:
            raise _unsupported(f"{field} lists {text!r}: decoder projections left unquantized "
                               "are not supported (only lm_head may be)", param=field)


def _block(value: Any, field: str) -> tuple[int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 2 or \
            any(not isinstance(v, int) or v < 1 for v in value):
        raise _unsupported(f"{field} {value!r} is not a [rows, columns] block", param=field)
    if tuple(value) != (128, 128):
        raise _unsupported(f"{field} {list(value)} is not supported (supported: [128, 128])",
                           param=field)
    return (int(value[0]), int(value[1]))


def _parse_hf_fp8(config: Mapping[str, Any]) -> Fp8Scheme:
    fmt = str(config.get("fmt") or "e4m3")
    if fmt != "e4m3":
        raise _unsupported(f"fp8 fmt {fmt!r} is not supported (supported: e4m3)", param="fmt")
    activation = str(config.get("activation_scheme") or "dynamic")
    if activation not in ("dynamic", "static"):
        raise _unsupported(f"activation_scheme {activation!r} is not supported "
                           "(supported: dynamic, static)", param="activation_scheme")
    _check_ignored(config.get("modules_to_not_convert"), "modules_to_not_convert")
    block = config.get("weight_block_size")
    if block is not None:
        if activation != "dynamic":
            raise _unsupported("block-wise weights with static activations are not supported",
                               param="activation_scheme")
        return Fp8Scheme("fp8", "block", "group", _block(block, "weight_block_size"))
    return Fp8Scheme("fp8", "tensor", "static" if activation == "static" else "token")


def _float8(args: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(args, Mapping):
        raise _unsupported(f"compressed-tensors {what} {args!r} is not a mapping")
    bits, kind = args.get("num_bits"), args.get("type")
    if bits != 8 or kind != "float":
        raise _unsupported(f"compressed-tensors {what} of {bits}-bit {kind} are not supported "
                           "(supported: 8-bit float, i.e. FP8 e4m3)", param=what)
    if args.get("symmetric") is False:
        raise _unsupported(f"compressed-tensors asymmetric {what} are not supported", param=what)
    return args


def _parse_compressed_tensors(config: Mapping[str, Any]) -> Fp8Scheme:
    fmt = str(config.get("format") or "float-quantized")
    if fmt not in ("float-quantized", "naive-quantized"):
        raise _unsupported(f"compressed-tensors format {fmt!r} is not supported (supported: "
                           "float-quantized, naive-quantized)", param="format")
    if config.get("kv_cache_scheme"):
        raise _unsupported("compressed-tensors kv_cache_scheme (calibrated KV scales) is not "
                           "supported; use the engine's kv_cache_dtype", param="kv_cache_scheme")
    groups = config.get("config_groups") or {}
    if not isinstance(groups, Mapping) or len(groups) != 1:
        raise _unsupported(f"compressed-tensors needs exactly one config group, got "
                           f"{len(groups) if isinstance(groups, Mapping) else groups!r}",
                           param="config_groups")
    group = next(iter(groups.values()))
    targets = [str(t) for t in group.get("targets") or ()]
    if targets != ["Linear"]:
        raise _unsupported(f"compressed-tensors targets {targets} are not supported "
                           "(supported: ['Linear'])", param="targets")
    _check_ignored(config.get("ignore"), "ignore")
    weights = _float8(group.get("weights"), "weights")
    strategy = str(weights.get("strategy") or "tensor")
    if weights.get("dynamic"):
        raise _unsupported("compressed-tensors dynamic weight scales are not supported",
                           param="weights")
    block: tuple[int, int] = (128, 128)
    if strategy == "block":
        block = _block(weights.get("block_structure"), "block_structure")
    elif strategy not in ("channel", "tensor"):
        raise _unsupported(f"compressed-tensors weight strategy {strategy!r} is not supported "
                           "(supported: channel, tensor, block)", param="strategy")
    acts = group.get("input_activations")
    if acts is None:
        raise _unsupported("compressed-tensors weight-only FP8 (no input_activations) is not "
                           "supported (supported: W8A8)", param="input_activations")
    acts = _float8(acts, "input_activations")
    act_strategy = str(acts.get("strategy") or "tensor")
    if acts.get("dynamic"):
        if act_strategy == "group" and strategy == "block" and \
                int(acts.get("group_size") or 0) == block[1]:
            return Fp8Scheme("compressed-tensors", "block", "group", block)
        if act_strategy == "token" and strategy != "block":
            return Fp8Scheme("compressed-tensors", strategy, "token", block)
    elif act_strategy == "tensor" and strategy != "block":
        return Fp8Scheme("compressed-tensors", strategy, "static", block)
    raise _unsupported(
        f"compressed-tensors {'dynamic' if acts.get('dynamic') else 'static'} {act_strategy} "
        f"activations with {strategy} weights are not supported (supported: dynamic token or "
        "static tensor with channel/tensor weights, dynamic group with block weights)",
        param="input_activations")


def parse_quantization(config: Mapping[str, Any], setting: str = "") -> Fp8Scheme | None:
    """The scheme of config.json's `quantization_config` (text_config's for a VLM), else the
    online scheme when `setting` is "fp8", else None (dense weights)."""
    if setting not in QUANTIZATIONS:
        raise UnsupportedError(f"quantization {setting!r} is not supported (supported: fp8)",
                               param="quantization")
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else {}
    quant = config.get("quantization_config") or (text or {}).get("quantization_config")
    if not quant:
        return ONLINE_FP8 if setting == "fp8" else None
    if not isinstance(quant, Mapping):
        raise _unsupported(f"{quant!r} is not a mapping")
    method = str(quant.get("quant_method") or "")
    if method in FAMILY_METHODS:
        return ONLINE_FP8 if setting == "fp8" else None
    if method == "fp8":
        return _parse_hf_fp8(quant)
    if method == "compressed-tensors":
        return _parse_compressed_tensors(quant)
    if method == "mxfp4":   # gpt-oss's experts: its family dequantizes them at load (gpt_oss.py)
        return None
    raise _unsupported(f"quant_method {method or '(none)'!r} is not supported by the Helios "
                       "engine (supported: fp8, compressed-tensors FP8; or a dense checkpoint "
                       "with quantization: fp8)", param="quant_method")

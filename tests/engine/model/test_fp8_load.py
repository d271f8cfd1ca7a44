"""FP8 checkpoints and online FP8 quantization: the config's scheme, the manifest's record,
every stored layout loaded into the right rows, refusals that name what is unsupported, and
the forward pass of each against the dense model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from services.common.core import inspect_model_dir, open_model
from services.common.errors import ManifestError, UnsupportedError
from services.common.quantization import ONLINE_FP8, Fp8Scheme, parse_quantization
from services.engine.model import load_model
from services.engine.model.layers.fp8_linear import Fp8Linear
from tests.engine.model.checkpoints import build_checkpoint
from tests.engine.model.driver import PagedDriver
from tests.engine.model.fp8_checkpoints import FORMATS, SPEC, write_fp8_checkpoint

PACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
PROMPTS = [[5, 17, 99, 3, 250, 8, 41, 77, 120, 6, 64], [200, 1, 33], [7] * 9, [300, 12, 45, 8]]


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint(SPEC, tmp_path_factory.mktemp("dense"))


def _rows(model: torch.nn.Module, name: str) -> tuple[Fp8Linear, slice]:
    """The FP8 layer and its rows that checkpoint tensor `name` fills."""
    module_path, proj = name.removesuffix(".weight").rsplit(".", 1)
    target, index = PACKED.get(proj, (proj, None))
    layer = model.get_submodule(f"{module_path}.{target}")
    assert isinstance(layer, Fp8Linear)
    if index is None:
        return layer, slice(0, layer.out_features)
    start, size = list(layer.shards.values())[index]
    return layer, slice(start, start + size)


def _logits(model: torch.nn.Module) -> torch.Tensor:
    """Each prompt's next-token logits (chunked prefill, a mixed batch)."""
    driver = PagedDriver(model, num_pages=32, page_size=4)
    seqs = [driver.add(prompt, max_new_tokens=1) for prompt in PROMPTS]
    driver.run(chunk_size=4)
    return model.compute_logits(torch.stack([s.hidden[0] for s in seqs]))


@pytest.mark.parametrize("layout", list(FORMATS))
def test_fp8_checkpoint_loads_every_row(tmp_path: Path, dense_dir: Path, layout: str) -> None:
    directory, expected = write_fp8_checkpoint(tmp_path / layout, layout)
    manifest = inspect_model_dir(directory)
    scheme = parse_quantization(json.loads((directory / "config.json").read_text()))
    assert scheme is not None and manifest.quantization == scheme.name
    assert scheme.weights == {"hf-block": "block", "ct-channel": "channel",
                              "ct-tensor-static": "tensor"}[layout]
    model = load_model(open_model(directory))
    for name, dequantized in expected.items():
        layer, rows = _rows(model, name)
        got = layer.linear_weight.dequantize(torch.float64)[rows]
        assert torch.equal(got, dequantized), name
        if layout == "ct-tensor-static":
            assert torch.all(layer.input_scale == 0.02)
    # the FP8 model computes what the dense model does, up to the scheme's rounding
    dense = _logits(load_model(open_model(dense_dir)))
    fp8 = _logits(model)
    error = (fp8 - dense).norm() / dense.norm()
    assert 0 < error < 0.1, error


def test_online_quantization_per_channel(dense_dir: Path) -> None:
    dense_model = load_model(open_model(dense_dir))
    model = load_model(open_model(dense_dir), quantization="fp8")
    assert model.config.quantization == ONLINE_FP8
    layers = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert len(layers) == 4 * SPEC.config().num_hidden_layers
    for name, module in model.named_modules():
        if not isinstance(module, Fp8Linear):
            continue
        dense = dense_model.get_submodule(name).weight.double()
        scale = module.scale.double()
        assert module.weight.dtype == torch.float8_e4m3fn and scale.shape == (dense.shape[0],)
        assert torch.allclose(scale, dense.abs().amax(dim=1) / 448, rtol=1e-6)
        # e4m3: 3 mantissa bits (relative error <= 2^-4), subnormal step 2^-9 of the scale
        error = (module.linear_weight.dequantize(torch.float64) - dense).abs()
        assert torch.all(error <= dense.abs() / 16 + scale[:, None] * 2 ** -9 + 1e-12), name
    assert isinstance(model.lm_head.weight, torch.nn.Parameter)
    assert model.lm_head.weight.dtype == torch.float32   # lm_head and norms stay dense
    dense_logits, fp8_logits = _logits(dense_model), _logits(model)
    assert 0 < (fp8_logits - dense_logits).norm() / dense_logits.norm() < 0.1


def test_stored_fp8_refuses_a_dense_tensor(tmp_path: Path, dense_dir: Path) -> None:
    directory = tmp_path / "mixed"
    shutil.copytree(dense_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = FORMATS["ct-channel"]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ManifestError, match="stores float8_e4m3fn"):
        load_model(open_model(directory))


@pytest.mark.parametrize(("quant", "names"), [
    ({"quant_method": "awq", "bits": 4}, "'awq'"),
    ({"quant_method": "gptq"}, "'gptq'"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "'e5m2'"),
    ({"quant_method": "fp8", "weight_block_size": [64, 64]}, r"\[64, 64\]"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"},
     "static"),
    ({"quant_method": "fp8", "modules_to_not_convert": ["model.layers.0.mlp.down_proj"]},
     "down_proj"),
    ({**FORMATS["ct-channel"], "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group"},
        "input_activations": None}}}, "4-bit int"),
    ({**FORMATS["ct-channel"], "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
        "input_activations": None}}}, "weight-only"),
    ({**FORMATS["ct-channel"], "kv_cache_scheme": {"num_bits": 8}}, "kv_cache_scheme"),
])
def test_unsupported_quantization_is_named(tmp_path: Path, dense_dir: Path, quant: dict,
                                           names: str) -> None:
    with pytest.raises(UnsupportedError, match=names):
        parse_quantization({"quantization_config": quant})
    directory = tmp_path / "unsupported"
    shutil.copytree(dense_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = quant
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedError, match=names):   # helios prepare / open_model refuse
        inspect_model_dir(directory)
    with pytest.raises(UnsupportedError, match="'int8'"):
        parse_quantization({}, "int8")


def test_family_quantization_passes_through() -> None:
    """gpt-oss's MXFP4 experts are the family's own (model/gpt_oss.py), not refused here."""
    mxfp4 = {"quantization_config": {"quant_method": "mxfp4"}}
    assert parse_quantization(mxfp4) is None
    assert parse_quantization(mxfp4, "fp8") == ONLINE_FP8


def test_block_scheme_refuses_partial_blocks() -> None:
    from services.engine.model.registry import parse_model_config

    config = json.loads(json.dumps(SPEC.config().to_dict()))
    config.update(num_key_value_heads=2, architectures=["LlamaForCausalLM"],
                  quantization_config=FORMATS["hf-block"])
    model_config = parse_model_config(config)
    assert model_config.quantization == Fp8Scheme("fp8", "block", "group")
    from services.engine.model.registry import build_model

    with pytest.raises(UnsupportedError, match="the k shard \\(64 rows\\)"):
        build_model(model_config, "cpu", torch.float32)

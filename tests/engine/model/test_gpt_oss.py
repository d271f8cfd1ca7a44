"""gpt-oss beyond the shared parity scenarios (test_parity.py runs the "gpt-oss" spec alone,
batched, chunked and on prefix pages): MXFP4 expert weights dequantized at load, the real
gpt-oss-20b config, and the loader's refusals.

The MXFP4 checkpoint is the tiny random "gpt-oss" checkpoint with its expert matrices
quantized here (one power-of-two scale per 32 values, each value the nearest E2M1 code), saved
as `*_blocks` / `*_scales` in the released checkpoints' layout, with `quant_method: mxfp4`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.common.core import open_model
from services.common.errors import ManifestError, UnsupportedError
from services.engine.model import ModelConfig, load_model
from tests.engine.model.driver import PagedDriver
from tests.engine.model.test_parity import LOGPROB_TOLERANCE, make_prompt

MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
EXPERT_MATRICES = ("gate_up_proj", "down_proj")

# the public openai/gpt-oss-20b config.json (sizes as released)
GPT_OSS_20B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
    "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32,
    "num_experts_per_tok": 4, "vocab_size": 201088, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "sliding_window": 128, "attention_bias": True,
    "swiglu_limit": 7.0, "experts_per_token": 4, "hidden_act": "silu",
    "layer_types": ["sliding_attention", "full_attention"] * 12, "rope_theta": 150000,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"]},
}


def quantize_mxfp4(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[..., K] -> (blocks uint8 [..., K/32, 16], scales uint8 [..., K/32], the values they
    stand for [..., K] in float64): scale 2^(floor(log2 amax) - 2), nearest code per value."""
    groups = rows.double().reshape(*rows.shape[:-1], -1, 32)
    amax = groups.abs().amax(-1)
    exponent = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=1e-30))) - 2,
                           torch.full_like(amax, -127.0))
    scaled = groups / torch.exp2(exponent)[..., None]
    index = (scaled.abs()[..., None] - MAGNITUDES).abs().argmin(-1)
    codes = (index + 8 * (scaled < 0)).to(torch.uint8)
    values = MAGNITUDES[index] * torch.where(scaled < 0, -1.0, 1.0) * torch.exp2(exponent)[..., None]
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exponent + 127).to(torch.uint8), values.flatten(-2)


@pytest.fixture(scope="module")
def mxfp4_checkpoint(checkpoint_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                     ) -> tuple[Path, dict[str, torch.Tensor]]:
    """(the MXFP4 checkpoint, each expert matrix's dequantized values [E, R, K] by name)."""
    directory = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    return directory, write_mxfp4_checkpoint(checkpoint_dirs["gpt-oss"], directory)


def write_mxfp4_checkpoint(source: Path, directory: Path) -> dict[str, torch.Tensor]:
    """The dense gpt-oss checkpoint at `source` with its expert matrices as MXFP4, written to
    `directory`; -> each expert matrix's dequantized values [E, R, K] by name."""
    for path in source.iterdir():
        if path.suffix != ".safetensors":
            shutil.copy(path, directory / path.name)
    tensors, expected = {}, {}
    for name, tensor in load_file(source / "model.safetensors").items():
        if name.endswith(EXPERT_MATRICES):
            # transformers holds x @ W ([E, K, R]); MXFP4 stores output rows first
            blocks, scales, values = quantize_mxfp4(tensor.transpose(1, 2))
            tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
            expected[name] = values
        else:
            tensors[name] = tensor
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"] = GPT_OSS_20B["quantization_config"]
    (directory / "config.json").write_text(json.dumps(config))
    return expected


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    return torch.cat((t[:, 0::2], t[:, 1::2]), dim=1)


def test_mxfp4_experts_load_as_their_dequantized_values(mxfp4_checkpoint) -> None:
    directory, expected = mxfp4_checkpoint
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    model = load_model(open_model(directory))
    stored = load_file(directory / "model.safetensors")
    for i, layer in enumerate(model.model.layers):
        experts = layer.mlp.experts
        prefix = f"model.layers.{i}.mlp.experts."
        gate_up = expected[prefix + "gate_up_proj"]           # [E, 2I, H], gate/up interleaved
        assert torch.equal(experts.w_gate_up.double(), _deinterleave(gate_up))
        assert torch.equal(experts.w_down.double(), expected[prefix + "down_proj"])
        # transformers' own dequantization of the same bytes agrees ([E, K, R] layout)
        theirs = convert_moe_packed_tensors(stored[prefix + "gate_up_proj_blocks"],
                                            stored[prefix + "gate_up_proj_scales"],
                                            dtype=torch.float32)
        assert torch.equal(experts.w_gate_up, _deinterleave(theirs.transpose(1, 2)))
    # every FP4 value times a power of two is a bf16 number: bf16 loading loses nothing
    bf16 = load_model(open_model(directory), dtype=torch.bfloat16)
    for ours, exact in zip(bf16.model.layers, model.model.layers, strict=True):
        assert torch.equal(ours.mlp.experts.w_gate_up.float(), exact.mlp.experts.w_gate_up)
        assert torch.equal(ours.mlp.experts.w_down.float(), exact.mlp.experts.w_down)


def test_mxfp4_checkpoint_greedy_parity(mxfp4_checkpoint) -> None:
    """The dequantized model generates what transformers generates from the same MXFP4
    checkpoint (which it dequantizes on the CPU), past the 5-token window."""
    import transformers

    directory, _ = mxfp4_checkpoint
    # dequantize=True: transformers >= 5.25 with the `kernels` package (a dependency) and
    # triton >= 3.5 would otherwise run MXFP4 on the CPU through kernels fetched from the
    # Hugging Face Hub, which no test machine reaches
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32,
        quantization_config=transformers.Mxfp4Config(dequantize=True)).eval()
    driver = PagedDriver(load_model(open_model(directory)), page_size=4, seed=6)
    prompts = [make_prompt(11, seed=50), make_prompt(4, seed=51)]
    for prompt in prompts:
        driver.add(prompt, 12)
    driver.run(chunk_size=5)
    for seq in driver.sequences:
        ids = torch.tensor([seq.prompt])
        out = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                 do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=0)
        expected = out.sequences[0, len(seq.prompt):].tolist()
        assert seq.generated == expected
        logprobs = [float(torch.log_softmax(step[0], dim=-1)[t])
                    for step, t in zip(out.logits, expected, strict=True)]
        worst = max(abs(a - b) for a, b in zip(seq.logprobs, logprobs, strict=True))
        assert worst < LOGPROB_TOLERANCE


def test_mxfp4_checkpoint_missing_scales_names_the_tensor(mxfp4_checkpoint, tmp_path) -> None:
    directory, _ = mxfp4_checkpoint
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ManifestError, match=r"model\.layers\.1\.mlp\.experts\.down_proj_scales"):
        load_model(open_model(broken))


def test_mxfp4_blocks_of_the_wrong_shape_are_refused(mxfp4_checkpoint, tmp_path) -> None:
    directory, _ = mxfp4_checkpoint
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    tensors = load_file(broken / "model.safetensors")
    name = "model.layers.0.mlp.experts.gate_up_proj_blocks"
    tensors[name] = tensors[name][:, :, :1].contiguous()
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ManifestError, match="gate_up_proj_blocks.*has shape"):
        load_model(open_model(broken))


def test_kept_mxfp4_experts_hold_the_checkpoint_bytes(mxfp4_checkpoint) -> None:
    """`mxfp4_experts: keep`: the experts stay packed (4.25 bits a weight) and stand for
    exactly the values the dequantizing load gives; the greedy tokens and logprobs are the
    same (the torch path dequantizes one expert at a time)."""
    from services.engine.model.expert_weights import Mxfp4Experts
    from services.engine.model.moe import expert_weight_bytes
    from services.engine.model.mxfp4 import Mxfp4Weight

    directory, _ = mxfp4_checkpoint
    dense = load_model(open_model(directory))
    kept = load_model(open_model(directory), mxfp4_experts="keep")
    for ours, theirs in zip(kept.model.layers, dense.model.layers, strict=True):
        experts = ours.mlp.experts
        assert isinstance(experts, Mxfp4Experts)
        assert isinstance(experts.w_gate_up, Mxfp4Weight)
        assert torch.equal(experts.w_gate_up.dequantize(), theirs.mlp.experts.w_gate_up)
        assert torch.equal(experts.w_down.dequantize(), theirs.mlp.experts.w_down)
        assert torch.equal(experts.gate_up_bias, theirs.mlp.experts.gate_up_bias)
    # float32 experts: 32 bits a weight against 4 + 8/32
    assert expert_weight_bytes(kept) < expert_weight_bytes(dense) / 6
    outputs = []
    for model in (dense, kept):
        driver = PagedDriver(model, page_size=4, seed=6)
        for prompt in (make_prompt(11, seed=50), make_prompt(4, seed=51)):
            driver.add(prompt, 8)
        driver.run(chunk_size=5)
        outputs.append([(seq.generated, seq.logprobs) for seq in driver.sequences])
    assert outputs[0] == outputs[1]


def test_keeping_mxfp4_needs_mxfp4_experts(checkpoint_dirs) -> None:
    from services.common.errors import ValidationError

    with pytest.raises(ValidationError, match="mxfp4_experts: keep needs .* quant_method "
                                              r"\(none\)"):
        load_model(open_model(checkpoint_dirs["gpt-oss"]), mxfp4_experts="keep")
    with pytest.raises(ValidationError, match="has no experts"):
        load_model(open_model(checkpoint_dirs["llama"]), mxfp4_experts="keep")
    with pytest.raises(ValidationError, match="mxfp4_experts must be one of"):
        ModelConfig.from_dict(GPT_OSS_20B, mxfp4_experts="fp4")


def test_dummy_weights_with_kept_mxfp4_experts() -> None:
    """A benchmark's dummy gpt-oss with kept experts: random codes under small scales give
    finite logits (the engine's load_format dummy)."""
    from services.engine.model.dummy import load_dummy_model

    config = {**GPT_OSS_20B, "hidden_size": 64, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
              "vocab_size": 128, "layer_types": ["sliding_attention", "full_attention"]}
    model = load_dummy_model(ModelConfig.from_dict(config, mxfp4_experts="keep"), "cpu",
                             torch.float32, max_positions=64)
    experts = model.model.layers[0].mlp.experts
    assert experts.w_gate_up_blocks.dtype == torch.uint8
    assert 0 < float(experts.w_gate_up.dequantize().abs().max()) <= 6 * 2 ** -7
    driver = PagedDriver(model, page_size=4, seed=1)
    driver.add([1, 2, 3, 4, 5], 3)
    driver.run(chunk_size=8)
    assert len(driver.sequences[0].generated) == 3
    assert all(torch.isfinite(torch.tensor(driver.sequences[0].logprobs)))


def test_gpt_oss_20b_config() -> None:
    config = ModelConfig.from_dict(GPT_OSS_20B)
    assert [layer.sliding_window for layer in config.layers] == [128, 0] * 12
    rope = config.rope
    assert (rope.rope_type, rope.factor, rope.theta, rope.truncate) == ("yarn", 32.0, 150000.0,
                                                                        False)
    assert rope.original_max_position_embeddings == 4096 and config.max_context == 131072
    assert config.qkv_bias and config.o_bias and config.rms_norm_eps == 1e-5
    moe = config.moe
    assert moe is not None
    assert (moe.num_experts, moe.top_k, moe.intermediate_size) == (32, 4, 2880)
    assert (moe.activation, moe.expert_bias, moe.router_bias) == ("swiglu_oai", True, True)
    assert (moe.swiglu_limit, moe.swiglu_alpha) == (7.0, 1.702)
    assert moe.sparse_layers == (True,) * 24


def test_other_quantizations_are_refused() -> None:
    config = {**GPT_OSS_20B, "quantization_config": {"quant_method": "awq"}}
    with pytest.raises(UnsupportedError, match="awq"):
        ModelConfig.from_dict(config)


def test_the_engine_setting_reaches_the_model(mxfp4_checkpoint, tmp_path) -> None:
    """`mxfp4_experts` (flag, env, YAML like every engine setting) is validated, and
    build_engine loads the experts kept when it says keep."""
    from services.common.errors import ValidationError
    from services.engine.config import EngineConfig
    from services.engine.model.expert_weights import Experts, Mxfp4Experts
    from tests.engine.runner.conftest import make_engine

    directory, _ = mxfp4_checkpoint
    with pytest.raises(ValidationError, match="mxfp4_experts must be dequantize or keep"):
        EngineConfig(model=str(tmp_path), mxfp4_experts="packed")
    for setting, kind in (("keep", Mxfp4Experts), ("dequantize", Experts)):
        engine = make_engine(open_model(directory), mxfp4_experts=setting)
        experts = engine.runner.model.model.layers[0].mlp.experts
        assert type(experts) is kind

"""EngineConfig: validation and derived values."""

from __future__ import annotations

import pytest

from services.common.config import load_config
from services.common.errors import ValidationError
from services.engine.config import EngineConfig


def test_derived_defaults():
    config = EngineConfig(model="m", max_num_seqs=8, prefill_chunk_size=128)
    assert config.batched_tokens == 136 and config.waiting_capacity == 32
    assert EngineConfig(model="m", max_waiting=5).waiting_capacity == 5


@pytest.mark.parametrize("fields, param", [
    ({"prefill_chunk_size": 100}, "prefill_chunk_size"),
    ({"max_num_batched_tokens": 32}, "max_num_batched_tokens"),
    ({"max_num_seqs": 128, "max_num_batched_tokens": 100}, "max_num_batched_tokens"),
    ({"page_size": 0}, "page_size"),
    ({"kv_cache_memory_fraction": 0.0}, "kv_cache_bytes"),
    ({"dtype": "int8"}, "dtype"),
    ({"cpu_threads": -1}, "cpu_threads"),
    ({"model": ""}, "model"),
])
def test_invalid_settings_name_the_field(fields, param):
    with pytest.raises(ValidationError) as info:
        EngineConfig(**{"model": "m", **fields})
    assert info.value.param == param


def test_flags_and_environment():
    config = load_config(EngineConfig, ["--model", "m", "--page-size", "32",
                                        "--kv-cache-bytes", "1048576"],
                         env={"HELIOS_MAX_NUM_SEQS": "4"})
    assert (config.page_size, config.kv_cache_bytes, config.max_num_seqs) == (32, 1 << 20, 4)


def test_speculative_settings_from_flags_environment_and_yaml(tmp_path):
    from services.engine.core.build import build_proposer
    from services.engine.scheduler.proposals import NgramProposer

    flags = load_config(EngineConfig, ["--model", "m", "--speculative-method", "ngram",
                                       "--num-speculative-tokens", "6"], env={})
    assert (flags.speculative_method, flags.num_speculative_tokens) == ("ngram", 6)
    assert build_proposer(flags) == NgramProposer(num_tokens=6)
    env = load_config(EngineConfig, ["--model", "m"],
                      env={"HELIOS_SPECULATIVE_METHOD": "ngram",
                           "HELIOS_NUM_SPECULATIVE_TOKENS": "3"})
    assert build_proposer(env) == NgramProposer(num_tokens=3)
    path = tmp_path / "helios.yaml"
    path.write_text("engine:\n  speculative_method: draft\n  speculative_model: /m/small\n")
    yaml = load_config(EngineConfig, ["--model", "m", "--config", str(path)], env={},
                       section="engine")
    assert (yaml.speculative_method, yaml.speculative_model) == ("draft", "/m/small")
    assert build_proposer(EngineConfig(model="m")) is None      # none: off by default


@pytest.mark.parametrize("fields, param", [
    ({"speculative_method": "medusa"}, "speculative_method"),
    ({"speculative_method": "draft"}, "speculative_model"),
    ({"speculative_method": "eagle3"}, "speculative_model"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"num_speculative_tokens": 16}, "num_speculative_tokens"),
])
def test_invalid_speculative_settings_name_the_field(fields, param):
    with pytest.raises(ValidationError) as info:
        EngineConfig(**{"model": "m", **fields})
    assert info.value.param == param


def test_methods_not_built_refuse_to_start():
    from services.common.errors import UnsupportedError
    from services.engine.core.build import build_proposer

    for method in ("draft", "eagle3"):
        with pytest.raises(UnsupportedError, match=f"speculative_method {method}"):
            build_proposer(EngineConfig(model="m", speculative_method=method,
                                        speculative_model="/m/small"))


def test_fp8_settings_from_flags_environment_and_yaml(tmp_path):
    flags = load_config(EngineConfig, ["--model", "m", "--quantization", "fp8",
                                       "--kv-cache-dtype", "fp8"], env={})
    assert (flags.quantization, flags.kv_cache_dtype) == ("fp8", "fp8")
    env = load_config(EngineConfig, ["--model", "m"],
                      env={"HELIOS_QUANTIZATION": "fp8", "HELIOS_KV_CACHE_DTYPE": "fp8"})
    assert (env.quantization, env.kv_cache_dtype) == ("fp8", "fp8")
    path = tmp_path / "helios.yaml"
    path.write_text("engine:\n  quantization: fp8\n  kv_cache_dtype: fp8\n")
    yaml = load_config(EngineConfig, ["--model", "m", "--config", str(path)], env={},
                       section="engine")
    assert (yaml.quantization, yaml.kv_cache_dtype) == ("fp8", "fp8")
    defaults = EngineConfig(model="m")
    assert (defaults.quantization, defaults.kv_cache_dtype) == ("", "auto")
    for name, value in (("quantization", "int4"), ("kv_cache_dtype", "fp4")):
        with pytest.raises(ValidationError) as info:
            EngineConfig(model="m", **{name: value})
        assert info.value.param == name


def test_the_kernel_variant_list_digest_ignores_where_the_engine_listens(tmp_path, monkeypatch):
    """`helios run` gives every start a fresh socket path and metrics port: a digest over
    them found no remembered kernel list on the H200's restart. Settings that size the steps
    must still make a new list."""
    import torch

    from services.engine.core.build import kernel_list_parts
    from services.engine.kernels.precompile import remembered_path

    monkeypatch.setenv("HELIOS_CACHE_DIR", str(tmp_path))
    model = {"hidden_size": 64, "num_hidden_layers": 2}
    versions = {"torch": "2.11.0", "triton": "3.6.0"}

    def path(**settings):
        config = EngineConfig(**{"model": "/models/a", **settings})
        return remembered_path(kernel_list_parts(config, model, torch.bfloat16, (9, 0),
                                                 versions))

    first = path(listen="unix:///tmp/run1/engine.sock", metrics_listen="127.0.0.1:9101")
    assert path(listen="unix:///tmp/run2/engine.sock", metrics_listen="127.0.0.1:9202",
                model="/other/copy", log_level="debug", kernel_compile_workers=3) == first
    assert path(max_num_seqs=128) != first
    assert path(max_num_batched_tokens=4096) != first
    assert remembered_path(kernel_list_parts(EngineConfig(model="/models/a"), model,
                                             torch.bfloat16, (10, 0), versions)) != first

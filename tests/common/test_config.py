"""Config precedence (default < YAML < env < flags), typing and validation."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from gateway.config import GatewayConfig
from services.common.config import load_config, to_flags
from services.common.errors import ValidationError
from services.engine.config import EngineConfig


def test_defaults_then_yaml_then_env_then_flags(tmp_path):
    path = tmp_path / "helios.yaml"
    path.write_text("engine:\n  model: /yaml/model\n  max_num_seqs: 8\n  prefill_chunk_size: 128\n"
                    "frontend:\n  frontend_workers: 3\n")
    env = {"HELIOS_MAX_NUM_SEQS": "16", "HELIOS_LOG_LEVEL": "debug"}
    config = load_config(EngineConfig, ["--config", str(path), "--prefill-chunk-size", "256"],
                         env=env, section="engine")
    assert config.model == "/yaml/model"          # yaml
    assert config.max_num_seqs == 16              # env beats yaml
    assert config.prefill_chunk_size == 256       # flag beats yaml
    assert config.log_level == "debug"            # env beats default
    assert config.device == "auto"                # default


def test_config_is_frozen():
    config = load_config(EngineConfig, ["--model", "m"], env={})
    with pytest.raises(FrozenInstanceError):
        config.model = "other"  # type: ignore[misc]


def test_bool_optional_and_round_trip():
    config = load_config(EngineConfig, ["--model", "m", "--max-model-len", "1024"], env={})
    assert config.max_model_len == 1024
    again = load_config(EngineConfig, to_flags(config), env={})
    assert again == config
    assert load_config(EngineConfig, ["--model", "m"], env={}).max_model_len is None


@pytest.mark.parametrize("argv, param", [
    (["--model", "m", "--prefill-chunk-size", "100"], "prefill_chunk_size"),
    (["--model", "m", "--max-num-seqs", "0"], "max_num_seqs"),
    (["--model", "m", "--log-level", "loud"], "log_level"),
    (["--model", "m", "--max-num-seqs", "many"], "max_num_seqs"),
    ([], "model"),
])
def test_invalid_values_are_validation_errors(argv, param):
    with pytest.raises(ValidationError) as info:
        load_config(EngineConfig, argv, env={})
    assert info.value.param == param


def test_unknown_yaml_key_is_refused(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text("port: 9000\nportt: 1\n")
    with pytest.raises(ValidationError, match="portt"):
        load_config(GatewayConfig, ["--config", str(path)], env={})


def test_env_bool():
    config = load_config(GatewayConfig, [], env={"HELIOS_PORT": "9100"})
    assert config.port == 9100

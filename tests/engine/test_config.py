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

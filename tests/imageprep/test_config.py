"""ImagePrepConfig: defaults, derived worker count, refusals, flags and environment."""

from __future__ import annotations

import os

import pytest

from services.common.config import load_config
from services.common.errors import ValidationError
from services.imageprep.config import PILLOW_BOMB_PIXELS, ImagePrepConfig


def test_defaults_and_worker_count():
    config = ImagePrepConfig()
    assert config.max_progressive_scans == 100 and config.torch_threads == 1
    assert config.num_workers == min(16, len(os.sched_getaffinity(0)))
    assert ImagePrepConfig(workers=3).num_workers == 3


@pytest.mark.parametrize("field, value, text", [
    ("max_decoded_pixels", PILLOW_BOMB_PIXELS + 1, "at most"),
    ("max_encoded_bytes", 0, "positive"),
    ("max_progressive_scans", 0, ">= 1"),
    ("max_pending_images", 0, ">= 1"),
    ("workers", -1, ">= 0"),
    ("fetch_chunk_bytes", 100, "fetch_chunk_bytes"),
    ("memory_cache_bytes", -1, ">= 0"),
])
def test_bad_values_are_refused(field, value, text):
    with pytest.raises(ValidationError, match=text):
        ImagePrepConfig(**{field: value})


def test_flags_and_environment():
    config = load_config(ImagePrepConfig, ["--workers", "4", "--disk-cache-dir", "/tmp/x"],
                         env={"HELIOS_MAX_ENCODED_BYTES": "1234", "HELIOS_WORKERS": "2"},
                         section="imageprep")
    assert (config.workers, config.max_encoded_bytes, config.disk_cache_dir) == (4, 1234, "/tmp/x")

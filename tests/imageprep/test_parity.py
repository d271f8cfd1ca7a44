"""Byte parity with transformers' fast Qwen-VL image processors (fingerprints.json).

fingerprints.json comes from tests/imageprep/generate_fingerprints.py run beside torchvision
(see its docstring). Every comparison is a SHA-256 of the exact bytes: decoded RGB, resized RGB,
pixel_values, grid, vision positions, interpolation indices and weights, cumulative patches,
expanded prompt ids, modality ids and mRoPE rows. No tolerance anywhere.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from services.common.errors import ValidationError
from services.imageprep.decode import DecodeLimits, decode_image
from services.imageprep.expansion import expand_prompt
from services.imageprep.positions import table_interpolation, vision_positions
from services.imageprep.processor import plan_geometry, process_image, resized_pixels
from services.imageprep.profiles import builtin_profile
from services.imageprep.sources import from_bytes
from tests.imageprep.conftest import FIXTURE_DIR, fingerprints, fixture_bytes, media_type_of

LIMITS = DecodeLimits(max_encoded_bytes=32 << 20, max_decoded_pixels=64 << 20)


def sha(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def decode_fixture(name: str):
    encoded = from_bytes(fixture_bytes(name), media_type_of(name), max_encoded_bytes=32 << 20)
    return decode_image(encoded, LIMITS)


def test_fixture_files_are_the_fingerprinted_ones():
    reference = fingerprints()
    assert len(reference["fixtures_sha256"]) >= 20
    for name, digest in reference["fixtures_sha256"].items():
        assert hashlib.sha256((FIXTURE_DIR / name).read_bytes()).hexdigest() == digest, name


def test_fixture_set_covers_the_required_cases():
    names = set(fingerprints()["fixtures_sha256"])
    for mode in ("1", "L", "LA", "P", "P_trns", "RGBA", "I16"):
        assert f"mode_{mode}.png" in names
    assert {f"exif{i}.jpg" for i in range(1, 9)} <= names
    assert {"progressive.jpg", "lossy.webp", "lossless_alpha.webp"} <= names
    repeated = [c for c in fingerprints()["pipelines"] if "repeated" in c["name"]]
    assert repeated and all(c["images"][0]["image"] == c["images"][2]["image"] for c in repeated)


PIPELINES = fingerprints()["pipelines"]


@pytest.mark.parametrize("case", PIPELINES, ids=[c["name"] for c in PIPELINES])
def test_pipeline_matches_transformers(case):
    settings = builtin_profile(case["profile"]).with_pixel_bounds(case["min_pixels"],
                                                                   case["max_pixels"])
    batch = []
    for expected in case["images"]:
        decoded = decode_fixture(expected["image"])
        assert list(decoded.rgb.shape) == expected["decoded_shape"]
        assert sha(decoded.rgb) == expected["decoded_sha256"], "decoded RGB differs"
        prepared = process_image(decoded, settings)
        geometry = prepared.geometry
        assert [geometry.height, geometry.width] == expected["resized_shape"]
        resized = resized_pixels(decoded.rgb, geometry)[0].permute(1, 2, 0).numpy()
        assert sha(resized) == expected["resized_sha256"], "resized RGB differs"
        tensors = prepared.tensors
        assert list(tensors["pixel_values"].shape) == expected["pixel_values_shape"]
        assert tensors["grid_thw"].tolist() == [expected["grid_thw"]]
        for name in ("pixel_values", "grid_thw", "vision_positions", "cu_patches",
                     "interp_indices", "interp_weights"):
            key = f"{name}_sha256"
            if key in expected:
                assert sha(tensors[name]) == expected[key], f"{name} differs"
            else:
                assert name not in tensors
        batch.append(tensors["pixel_values"])
    assert sha(np.concatenate(batch)) == case["batch_pixel_values_sha256"]


GEOMETRY = fingerprints()["geometry"]


@pytest.mark.parametrize("case", GEOMETRY,
                         ids=[f"{c['profile']}-{c['height']}x{c['width']}" for c in GEOMETRY])
def test_geometry_matches_transformers(case):
    settings = builtin_profile(case["profile"]).with_pixel_bounds(case["min_pixels"],
                                                                   case["max_pixels"])
    if "error" in case:
        with pytest.raises(ValidationError, match="aspect ratio"):
            plan_geometry(case["height"], case["width"], settings)
        return
    geometry = plan_geometry(case["height"], case["width"], settings)
    assert [geometry.height, geometry.width] == case["resized"]
    assert [geometry.grid_t, geometry.grid_h, geometry.grid_w] == case["grid_thw"]
    positions = vision_positions(geometry)
    assert sha(positions.numpy()) == case["vision_positions_sha256"]
    if settings.position_table_side:
        indices, weights = table_interpolation(positions, geometry, settings.position_table_side)
        assert sha(indices.numpy()) == case["interp_indices_sha256"]
        assert sha(weights.numpy()) == case["interp_weights_sha256"]


EXPANSIONS = fingerprints()["expansions"]


@pytest.mark.parametrize("case", EXPANSIONS, ids=[c["name"] for c in EXPANSIONS])
def test_prompt_expansion_matches_transformers(case):
    settings = builtin_profile(case["profile"])
    geometries = [plan_geometry(*decode_fixture(name).rgb.shape[:2], settings)
                  for name in case["images"]]
    assert [[g.grid_t, g.grid_h, g.grid_w] for g in geometries] == case["grid_thw"]
    expanded = expand_prompt(case["prompt_token_ids"], geometries,
                             image_token_id=case["image_token_id"],
                             vision_start_token_id=case["vision_start_token_id"])
    assert len(expanded.token_ids) == case["expanded_len"]
    assert sha(expanded.token_ids.astype("<u4")) == case["expanded_sha256"]
    assert sha(expanded.modality_ids) == case["modality_ids_sha256"]
    assert sha(expanded.mrope_positions.astype("<i4")) == case["mrope_positions_sha256"]
    assert expanded.rope_delta == case["rope_delta"]

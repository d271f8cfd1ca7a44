"""Per-request image limits of a vision core: written by `helios prepare`, kept through the
manifest's JSON, the ModelCard protobuf and the imageprep request, and stated in refusals."""

from __future__ import annotations

import base64
import json
import shutil

import pytest

from services.common.api.chat import ImagePart
from services.common.api.convert.model_card import model_card_from_pb, model_card_to_pb
from services.common.api.model_card import ModelCard
from services.common.core import (
    DEFAULT_IMAGE_LIMITS,
    MANIFEST_NAME,
    NO_IMAGE_LIMITS,
    ImageLimits,
    Manifest,
    open_model,
    prepare_core,
)
from services.common.errors import ValidationError
from services.frontend.convert_upstream import prepare_images_to_pb
from services.frontend.image_limits import (
    check_image_limits,
    encoded_size,
    encoded_size_bound,
)
from services.imageprep.convert import prepare_request_from_pb
from services.imageprep.decode import DecodeLimits

LIMITS = ImageLimits(max_images=3, max_image_bytes=1000, max_image_pixels=5000)


@pytest.fixture
def vision_dir(tmp_path, demo_model_dir):
    """The demo checkpoint's files under a vision architecture (the manifest reads only the
    config, the tokenizer and the weights' headers)."""
    copy = tmp_path / "model"
    shutil.copytree(demo_model_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    config["architectures"] = ["Qwen2_5_VLForConditionalGeneration"]
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_a_vision_core_keeps_its_limits_through_the_manifest(vision_dir, tmp_path):
    prepare_core(vision_dir, tmp_path / "core", image_limits=LIMITS)
    manifest = open_model(tmp_path / "core").manifest
    assert manifest.capabilities.vision and manifest.image_limits == LIMITS
    assert Manifest.from_json(manifest.to_json()) == manifest
    stored = json.loads((tmp_path / "core" / MANIFEST_NAME).read_text())
    assert stored["image_limits"] == {"max_images": 3, "max_image_bytes": 1000,
                                      "max_image_pixels": 5000}
    # a manifest written before the limits existed reads as "none of its own"
    del stored["image_limits"]
    assert Manifest.from_json(json.dumps(stored)).image_limits == NO_IMAGE_LIMITS


def test_defaults_for_vision_none_for_text(vision_dir, demo_model_dir, tmp_path):
    prepare_core(vision_dir, tmp_path / "vision")
    assert open_model(tmp_path / "vision").manifest.image_limits == DEFAULT_IMAGE_LIMITS
    prepare_core(demo_model_dir, tmp_path / "text")
    assert open_model(tmp_path / "text").manifest.image_limits == NO_IMAGE_LIMITS


def test_model_card_carries_the_limits():
    card = ModelCard(id="m", vision=True, max_images=3, max_image_bytes=1000,
                     max_image_pixels=5000)
    assert model_card_from_pb(model_card_to_pb(card)) == card


def _data_url(size: int) -> ImagePart:
    return ImagePart(url="data:image/png;base64," + base64.b64encode(b"x" * size).decode())


@pytest.mark.parametrize("size", [0, 1, 2, 3, 998, 1000, 1001])
def test_encoded_size_of_a_data_url(size):
    assert encoded_size(_data_url(size)) == size
    assert encoded_size(ImagePart(data=b"y" * size, media_type="image/png")) == size
    wrapped = _data_url(size).url
    wrapped = wrapped[:30] + "\r\n" + wrapped[30:] + " \n"       # MIME line breaks, a tail
    assert encoded_size(ImagePart(url=wrapped)) == size
    for image in (_data_url(size), ImagePart(url=wrapped)):
        assert encoded_size_bound(image) >= encoded_size(image)


def test_the_bound_decides_without_reading_the_payload():
    """Under the limit by the bound: no pass over the payload (the exact count is four)."""

    class Untouchable(str):
        def count(self, *args):
            raise AssertionError("the payload was read")

    image = ImagePart(url=Untouchable(_data_url(900).url))
    check_image_limits([image], LIMITS)
    with pytest.raises(AssertionError, match="read"):
        check_image_limits([ImagePart(url=Untouchable(_data_url(1001).url))], LIMITS)


def test_refusals_state_the_limit_and_the_manifest():
    check_image_limits([_data_url(1000)] * 3, LIMITS)
    with pytest.raises(ValidationError) as info:
        check_image_limits([_data_url(10)] * 4, LIMITS)
    assert "4 images in one request; the limit is 3" in info.value.message
    assert f"image_limits.max_images of the model core's manifest ({MANIFEST_NAME})" in \
        info.value.message
    with pytest.raises(ValidationError) as info:
        check_image_limits([_data_url(10), _data_url(1001)], LIMITS)
    assert "image 1 is 1001 bytes encoded; the limit is 1000 bytes" in info.value.message
    assert "image_limits.max_image_bytes" in info.value.message
    check_image_limits([_data_url(10)] * 40, NO_IMAGE_LIMITS)


def test_imageprep_applies_the_tighter_limits_and_names_their_origin():
    message = prepare_images_to_pb(request_id="r", profile="qwen2_5_vl", images=(),
                                   prompt_token_ids=[], image_token_id=1,
                                   vision_start_token_id=None, message_token_ends=(),
                                   limits=LIMITS)
    request = prepare_request_from_pb(message)
    own = DecodeLimits(max_encoded_bytes=20 << 20, max_decoded_pixels=64 << 20)
    narrowed = own.narrowed(request.max_image_bytes, request.max_image_pixels,
                            request.limits_source)
    assert (narrowed.max_encoded_bytes, narrowed.max_decoded_pixels) == (1000, 5000)
    assert narrowed.pixels_source == ImageLimits.source("max_image_pixels")
    assert narrowed.bytes_source == ImageLimits.source("max_image_bytes")
    # looser limits than imageprep's own leave its own in force, named as its settings
    loose = own.narrowed(1 << 40, 1 << 40, ImageLimits.ORIGIN)
    assert loose == own and "imageprep's max_decoded_pixels" in loose.pixels_source
    empty = prepare_request_from_pb(prepare_images_to_pb(
        request_id="r", profile="", images=(), prompt_token_ids=[], image_token_id=1,
        vision_start_token_id=None, message_token_ends=()))
    assert own.narrowed(empty.max_image_bytes, empty.max_image_pixels, "") == own

"""The imageprep service as a real process: Prepare, FetchPixels, typed errors, retention tiers.

One process serves the module (disk + Redis tiers). Its results are checked against the
transformers fingerprints end to end (data URL in, reassembled tensor bytes out). Two more
processes show retention across a restart (disk) and across replicas (Redis).
"""

from __future__ import annotations

import hashlib
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from services.common.errors import (
    ImageDecodeError,
    NotFoundError,
    UnsupportedError,
    ValidationError,
)
from services.common.grpc_errors import error_from_rpc
from services.common.grpc_server import CHANNEL_OPTIONS
from services.common.pb import imageprep_pb2, imageprep_pb2_grpc
from tests.imageprep.conftest import fingerprints, fixture_bytes, media_type_of
from tests.imageprep.images import data_url, png_bomb
from tests.support.processes import ServiceProcess
from tests.support.redis_server import RedisServer

DTYPES = {"float32": "<f4", "int64": "<i8", "int32": "<i4"}


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory) -> Iterator[RedisServer]:
    with RedisServer.start(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def disk_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("imageprep-disk")


def start(tmp: Path, name: str, *flags: str):
    address = f"unix://{tmp}/{name}.sock"
    return address, ServiceProcess.start(["serve", "imageprep", "--listen", address, *flags],
                                         tmp / f"{name}.log")


@pytest.fixture(scope="module")
def imageprep(tmp_path_factory, redis_server, disk_dir) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("imageprep")
    address, process = start(tmp, "main", "--disk-cache-dir", str(disk_dir),
                             "--redis-url", redis_server.url, "--fetch-chunk-bytes", "65536")
    with process as proc:
        proc.wait_grpc_serving(address)
        yield address
        assert proc.terminate(signal.SIGTERM) == 0, proc.output()


@pytest.fixture
def stub(imageprep):
    with grpc.insecure_channel(imageprep, options=CHANNEL_OPTIONS) as channel:
        yield imageprep_pb2_grpc.ImagePrepStub(channel)


def source(name: str) -> imageprep_pb2.ImageSource:
    return imageprep_pb2.ImageSource(data_url=data_url(fixture_bytes(name), media_type_of(name)))


def fetch(stub, identities, chunk_bytes: int = 65536) -> dict[bytes, dict[str, np.ndarray]]:
    tensors: dict[bytes, dict[str, np.ndarray]] = {}
    buffers: dict[tuple[bytes, str], bytearray] = {}
    for chunk in stub.FetchPixels(imageprep_pb2.FetchPixelsRequest(identities=identities)):
        assert len(chunk.data) <= chunk_bytes
        buffer = buffers.setdefault((chunk.identity, chunk.tensor), bytearray())
        assert chunk.offset == len(buffer)
        buffer += chunk.data
        if chunk.last:
            array = np.frombuffer(bytes(buffer), dtype=DTYPES[chunk.dtype]).reshape(chunk.shape)
            tensors.setdefault(chunk.identity, {})[chunk.tensor] = array
            del buffers[(chunk.identity, chunk.tensor)]
    assert not buffers
    return tensors


def sha(data) -> str:
    return hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest()


def reference_case(name: str) -> dict:
    return next(c for c in fingerprints()["pipelines"] if c["name"] == name)


@pytest.mark.parametrize("case_name", ["qwen3_repeated", "qwen2_5_repeated", "qwen3_mixed"])
def test_prepare_and_fetch_match_transformers(stub, case_name):
    case = reference_case(case_name)
    names = [entry["image"] for entry in case["images"]]
    response = stub.Prepare(imageprep_pb2.PrepareRequest(
        request_id=case_name, profile=case["profile"], images=[source(n) for n in names]))
    assert [d.source_index for d in response.images] == list(range(len(names)))
    tensors = fetch(stub, [d.identity for d in response.images])
    for descriptor, expected in zip(response.images, case["images"], strict=True):
        got = tensors[descriptor.identity]
        assert [descriptor.grid_t, descriptor.grid_h, descriptor.grid_w] == expected["grid_thw"]
        assert [descriptor.height, descriptor.width] == expected["resized_shape"]
        assert descriptor.num_patches == expected["pixel_values_shape"][0]
        assert descriptor.pixel_bytes == got["pixel_values"].nbytes
        for name, array in got.items():
            assert sha(array) == expected[f"{name}_sha256"], name
    batch = np.concatenate([tensors[d.identity]["pixel_values"] for d in response.images])
    assert sha(batch) == case["batch_pixel_values_sha256"]


def test_prompt_expansion_over_grpc(stub):
    case = next(c for c in fingerprints()["expansions"] if c["name"] == "qwen3_repeated_images")
    ends = [5, 20, len(case["prompt_token_ids"])]
    response = stub.Prepare(imageprep_pb2.PrepareRequest(
        request_id="expand", profile=case["profile"], images=[source(n) for n in case["images"]],
        prompt_token_ids=case["prompt_token_ids"], image_token_id=case["image_token_id"],
        vision_start_token_id=case["vision_start_token_id"], message_token_ends=ends))
    ids = np.array(response.expanded_token_ids, dtype="<u4")
    assert len(ids) == case["expanded_len"] and sha(ids) == case["expanded_sha256"]
    assert hashlib.sha256(response.modality_ids).hexdigest() == case["modality_ids_sha256"]
    multimodal = response.multimodal
    assert hashlib.sha256(multimodal.mrope_positions).hexdigest() == \
        case["mrope_positions_sha256"]
    assert multimodal.rope_delta == case["rope_delta"]
    assert [d.token_offset for d in multimodal.images] == [d.token_offset for d in response.images]
    extra = response.images[0].num_tokens - 1   # the three images are the same size
    placeholders = [i for i, t in enumerate(case["prompt_token_ids"])
                    if t == case["image_token_id"]]
    assert list(response.message_token_ends) == [
        end + extra * sum(p < end for p in placeholders) for end in ends]
    assert response.message_token_ends[-1] == len(ids)


def rpc_error(call) -> Exception:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return error_from_rpc(caught.value)


def test_typed_errors_over_the_wire(stub):
    bomb = imageprep_pb2.ImageSource(data=png_bomb(9000, 9000), media_type="image/png")
    error = rpc_error(lambda: stub.Prepare(imageprep_pb2.PrepareRequest(
        profile="qwen3_vl", images=[source("rgb_10x10.png"), bomb])))
    assert isinstance(error, ImageDecodeError) and error.param == "images[1]"
    assert "decoded-pixel limit" in error.message and error.service == "imageprep"
    error = rpc_error(lambda: stub.Prepare(imageprep_pb2.PrepareRequest(
        profile="qwen3_vl", images=[imageprep_pb2.ImageSource(data_url="https://x/a.png")])))
    assert isinstance(error, UnsupportedError)
    error = rpc_error(lambda: stub.Prepare(imageprep_pb2.PrepareRequest(
        profile="qwen3_vl", images=[source("rgb_10x10.png")], prompt_token_ids=[1, 2])))
    assert isinstance(error, ValidationError) and error.param == "image_token_id"
    error = rpc_error(lambda: list(stub.FetchPixels(
        imageprep_pb2.FetchPixelsRequest(identities=[b"\x01" * 32]))))
    assert isinstance(error, NotFoundError)
    error = rpc_error(lambda: list(stub.FetchPixels(
        imageprep_pb2.FetchPixelsRequest(identities=[b"short"]))))
    assert isinstance(error, ValidationError)


def test_retention_across_restart_and_replicas(stub, tmp_path, redis_server, disk_dir):
    response = stub.Prepare(imageprep_pb2.PrepareRequest(
        profile="qwen3_vl", images=[source("lossy.webp")]))
    identity = response.images[0].identity
    expected = fetch(stub, [identity])[identity]
    # A fresh process on the same disk directory (no Redis), and a replica that shares only
    # the Redis tier, both serve the tensors without a Prepare of their own.
    restarted, first = start(tmp_path, "restarted", "--disk-cache-dir", str(disk_dir))
    replica, second = start(tmp_path, "replica", "--redis-url", redis_server.url)
    with first as restarted_proc, second as replica_proc:
        for address, proc in ((restarted, restarted_proc), (replica, replica_proc)):
            proc.wait_grpc_serving(address)
            with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
                got = fetch(imageprep_pb2_grpc.ImagePrepStub(channel), [identity],
                            4 << 20)[identity]
            assert set(got) == set(expected)
            for name, array in expected.items():
                assert np.array_equal(got[name], array) and got[name].dtype == array.dtype
            assert proc.terminate() == 0


def test_fetch_bfloat16_pixels(stub):
    import torch

    response = stub.Prepare(imageprep_pb2.PrepareRequest(
        profile="qwen2_5_vl", images=[source("rgb_256x256.png")]))
    identity = response.images[0].identity
    exact = fetch(stub, [identity])[identity]
    pieces: dict[str, bytearray] = {}
    dtypes: dict[str, str] = {}
    for chunk in stub.FetchPixels(imageprep_pb2.FetchPixelsRequest(
            identities=[identity], pixel_dtype="bfloat16")):
        assert chunk.offset == len(pieces.setdefault(chunk.tensor, bytearray()))
        pieces[chunk.tensor] += chunk.data
        dtypes[chunk.tensor] = chunk.dtype
    rounded = torch.from_numpy(exact["pixel_values"].copy()).to(torch.bfloat16)
    assert dtypes["pixel_values"] == "bfloat16"
    assert bytes(pieces["pixel_values"]) == rounded.view(torch.int16).numpy().tobytes()
    for name, array in exact.items():
        if name != "pixel_values":
            assert bytes(pieces[name]) == array.tobytes() and dtypes[name] == str(array.dtype)
    error = rpc_error(lambda: list(stub.FetchPixels(imageprep_pb2.FetchPixelsRequest(
        identities=[identity], pixel_dtype="float16"))))
    assert isinstance(error, ValidationError) and error.param == "pixel_dtype"


@pytest.mark.parametrize("case_name", ["qwen3_repeated", "qwen2_5_repeated", "qwen3_mixed"])
def test_raw_pixels_make_transformers_pixel_values(imageprep, stub, case_name):
    """The engine's FetchPixels client asks for raw pixels (pixel_dtype uint8, an eighth of
    the bytes); the pixel_values it computes from them (RawPixels, the code the engine runs
    on its GPU) are transformers' to the bit, and the other tensors are unchanged."""
    from services.engine.model.vision.inputs import RawPixels, VisionInput
    from services.engine.vision.pixels import ImagePrepPixels

    case = reference_case(case_name)
    names = [entry["image"] for entry in case["images"]]
    response = stub.Prepare(imageprep_pb2.PrepareRequest(
        request_id=case_name, profile=case["profile"], images=[source(n) for n in names]))
    identities = list(dict.fromkeys(d.identity for d in response.images))  # as the engine asks
    client = ImagePrepPixels(imageprep)
    try:
        raw = dict(zip(identities, client.fetch(identities), strict=True))
    finally:
        client.close()
    values = fetch(stub, identities)
    for descriptor, expected in zip(response.images, case["images"], strict=True):
        tensors = raw[descriptor.identity]
        assert tensors["pixels_hwc"].dtype == np.uint8 and "pixel_values" not in tensors
        assert 8 * tensors["pixels_hwc"].nbytes == descriptor.pixel_bytes
        image = VisionInput.from_tensors(descriptor.identity, tensors, 2)
        assert isinstance(image.pixel_values, RawPixels)
        computed = image.pixel_values.values("cpu")
        assert tuple(computed.shape) == tuple(expected["pixel_values_shape"])
        assert sha(computed.numpy()) == expected["pixel_values_sha256"]
        for name, array in values[descriptor.identity].items():
            if name != "pixel_values":
                assert np.array_equal(tensors[name], array), name

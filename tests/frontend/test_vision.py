"""Vision requests: images go to imageprep with the prompt; the engine gets the expanded prompt."""

from __future__ import annotations

import json
import shutil

import grpc
import numpy as np
import pytest
from safetensors.numpy import save_file

from services.common import assets
from services.common.core import open_model
from services.common.pb import common_pb2, frontend_pb2
from services.frontend.model import FrontendModel
from tests.frontend.fakes import (
    FakeEngine,
    FakeImagePrep,
    FrontendHarness,
    Script,
    ScriptedChoice,
    UpstreamServer,
)

pytestmark = pytest.mark.timeout(120)

VL_TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{%- if message.content is string %}{{ message.content }}{%- else %}"
    "{%- for part in message.content %}{%- if part.type == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{%- elif part.type == 'text' %}{{ part.text }}"
    "{%- endif %}{%- endfor %}{%- endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
PNG_URL = "data:image/png;base64,iVBORw0KGgo="


@pytest.fixture(scope="module")
def vision_model_dir(tmp_path_factory):
    """A Qwen3-VL-shaped model directory: real Qwen tokenizer, a vision template, tiny weights."""
    root = tmp_path_factory.mktemp("vl-model")
    source = assets.fetch("qwen3")
    shutil.copyfile(source / "tokenizer.json", root / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["chat_template"] = VL_TEMPLATE
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    (root / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
        "vision_config": {"depth": 1},
        "text_config": {"max_position_embeddings": 2048, "vocab_size": 151936}}))
    save_file({"w": np.zeros((2, 2), dtype=np.float32)}, str(root / "model.safetensors"))
    return root


async def test_images_are_expanded_by_imageprep(vision_model_dir):
    model = FrontendModel.load(open_model(vision_model_dir))
    assert model.supports_vision and model.image_tokens is not None
    engine = FakeEngine(max_model_len=2048, vision=True)
    imageprep = FakeImagePrep(tokens_per_image=4)
    engine.script = Script([ScriptedChoice([model.tokenizer.encode("A cat.")])])
    chat = frontend_pb2.ChatInput(messages=[
        frontend_pb2.ChatMessage(role="system", text="Describe images."),
        frontend_pb2.ChatMessage(role="user", parts=frontend_pb2.ContentParts(parts=[
            frontend_pb2.ContentPart(text="What is this? "),
            frontend_pb2.ContentPart(image=frontend_pb2.ImageInput(url=PNG_URL)),
            frontend_pb2.ContentPart(text=" Be short.")]))])
    async with UpstreamServer(engine, imageprep) as upstream, FrontendHarness(
            vision_model_dir, upstream.address, upstream.address, loaded=model) as frontend:
        rendered = await frontend.stub.RenderChat(frontend_pb2.RenderChatRequest(chat=chat))
        assert rendered.num_images == 1
        events = [e async for e in frontend.stub.Generate(
            frontend_pb2.GenerateRequest(request_id="v1", chat=chat))]
    assert "".join(e.text.text for e in events) == "A cat."
    (prepare,) = imageprep.requests
    tokens = model.image_tokens
    assert prepare.profile == "qwen3_vl" and prepare.image_token_id == tokens.image_token_id
    assert prepare.vision_start_token_id == tokens.vision_start_token_id
    assert [image.data_url for image in prepare.images] == [PNG_URL]
    assert list(prepare.prompt_token_ids) == list(rendered.token_ids)
    assert list(prepare.message_token_ends) == list(rendered.message_token_ends)
    (sent,) = engine.requests
    ids = list(sent.prompt_token_ids)
    assert ids.count(tokens.image_token_id) == 4 and len(ids) == len(rendered.token_ids) + 3
    assert len(sent.multimodal.images) == 1 and sent.multimodal.images[0].num_tokens == 4
    first_end, user_end = rendered.message_token_ends
    assert list(sent.checkpoint_token_ends) == [first_end, user_end + 3]
    assert events[0].started.prompt_tokens == len(ids)
    assert events[-2].finish.reason == common_pb2.FINISH_REASON_STOP


async def test_images_refused_when_the_engine_runs_no_encoder(vision_model_dir):
    """A vision checkpoint whose engine does not run its encoder (ModelInfo vision false: a
    VLM's text part alone, or no pixel source): the card says no vision and images get a
    400 naming the model, before anything reaches imageprep or the engine."""
    model = FrontendModel.load(open_model(vision_model_dir))
    engine, imageprep = FakeEngine(max_model_len=2048, vision=False), FakeImagePrep()
    chat = frontend_pb2.ChatInput(messages=[frontend_pb2.ChatMessage(
        role="user", parts=frontend_pb2.ContentParts(parts=[
            frontend_pb2.ContentPart(image=frontend_pb2.ImageInput(url=PNG_URL))]))])
    async with UpstreamServer(engine, imageprep) as upstream, FrontendHarness(
            vision_model_dir, upstream.address, upstream.address, loaded=model) as frontend:
        (card,) = (await frontend.stub.ListModels(frontend_pb2.ListModelsRequest())).models
        assert not card.capabilities.vision
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in frontend.stub.Generate(
                    frontend_pb2.GenerateRequest(request_id="v2", chat=chat)):
                pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not accept images" in info.value.details()
    assert not imageprep.requests and not engine.requests


async def test_a_megabyte_image_is_not_a_large_request(vision_model_dir, monkeypatch):
    """A request counts as large (a heap trim after it, services/frontend/memory.py) by the
    text preparation copies, not by an image's encoded bytes: those are single blocks above
    the mmap threshold, and measuring the whole message (ByteSize) encoded it once more. A
    refused request is measured whole: its traceback holds the message until a collection."""
    from services.frontend.memory import LARGE_REQUEST_BYTES, MemoryReleaser

    sizes: list[int] = []
    started = MemoryReleaser.started

    def record(self, size):
        sizes.append(size)
        return started(self, size)

    monkeypatch.setattr(MemoryReleaser, "started", record)
    model = FrontendModel.load(open_model(vision_model_dir))
    engine = FakeEngine(max_model_len=2048, vision=True)
    engine.script = Script([ScriptedChoice([model.tokenizer.encode("A cat.")])])
    big_url = "data:image/png;base64," + "A" * (2 << 20)
    image = frontend_pb2.ChatInput(messages=[frontend_pb2.ChatMessage(
        role="user", parts=frontend_pb2.ContentParts(parts=[
            frontend_pb2.ContentPart(text="What is this?"),
            frontend_pb2.ContentPart(image=frontend_pb2.ImageInput(url=big_url))]))])
    refused = frontend_pb2.ChatInput(messages=[frontend_pb2.ChatMessage(
        role="user", parts=frontend_pb2.ContentParts(parts=[
            frontend_pb2.ContentPart(image=frontend_pb2.ImageInput(url=big_url)),
            frontend_pb2.ContentPart()]))])                # an empty part: refused
    async with UpstreamServer(engine, FakeImagePrep(tokens_per_image=4)) as upstream, \
            FrontendHarness(vision_model_dir, upstream.address, upstream.address,
                            loaded=model) as frontend:
        events = [e async for e in frontend.stub.Generate(
            frontend_pb2.GenerateRequest(request_id="big-image", chat=image))]
        assert "".join(e.text.text for e in events) == "A cat."
        with pytest.raises(grpc.aio.AioRpcError) as error:
            [e async for e in frontend.stub.Generate(
                frontend_pb2.GenerateRequest(request_id="refused", chat=refused))]
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert sizes[0] == len("What is this?")
    assert sizes[1] > LARGE_REQUEST_BYTES

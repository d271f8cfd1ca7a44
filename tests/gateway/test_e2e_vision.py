"""Images through the real four services (`helios run MODEL_DIR`: gateway, frontend,
imageprep, engine) with a tiny random-weight Qwen2.5-VL checkpoint (the real Qwen tokenizer,
a Qwen-VL chat template) and the official openai, anthropic and ollama SDKs: the greedy
answer to an image and a question equals transformers' generate on the same pixels and
prompt; usage counts the image tokens; the second request with the same image hits the
engine's feature cache; remote URLs get a clear 400; /api/show lists vision and the image limits. The checkpoint
runs as a prepared core whose manifest sets tight image limits (LIMITS): refusals past them
are 400s that state the limit and that the manifest set it."""

from __future__ import annotations

import base64
import io
import json
import shutil

import anthropic
import numpy as np
import ollama
import openai
import pytest
import torch

from services.common import assets
from services.common.core import ImageLimits, prepare_core
from tests.engine.model.vision.checkpoints import _perturb
from tests.support.processes import HeliosRun, free_port

pytestmark = pytest.mark.timeout(600)

TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{%- if message.content is string %}{{ message.content }}{%- else %}"
    "{%- for part in message.content %}{%- if part.type == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{%- elif part.type == 'text' %}{{ part.text }}"
    "{%- endif %}{%- endfor %}{%- endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
QUESTION = "What is in this picture?"
NEW = 8
EXACT = {"ignore_eos": True, "temperature": 0}
# far below imageprep's own settings (20 MiB, 64 Mpx), above every image the tests answer
LIMITS = ImageLimits(max_images=3, max_image_bytes=200_000, max_image_pixels=200_000)


def build_model(root):
    import transformers

    text = {"vocab_size": 151936, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "mrope_section": [2, 3, 3]}}
    config = transformers.Qwen2_5_VLConfig(
        text_config=text, tie_word_embeddings=True, image_token_id=151655,
        video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2,
                       "out_hidden_size": 64, "patch_size": 14, "window_size": 112,
                       "fullatt_block_indexes": [1]})
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).to(torch.float32)
    _perturb(model, 0)
    model.save_pretrained(root, safe_serialization=True)
    source = assets.fetch("qwen3")
    shutil.copyfile(source / "tokenizer.json", root / "tokenizer.json")
    tok_config = json.loads((source / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = TEMPLATE
    (root / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return model.eval()


def png_bytes(height: int, width: int, seed: int) -> bytes:
    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    return buffer.getvalue()


def reference_answer(model, tokenizer, png: bytes) -> tuple[str, int]:
    """transformers' greedy text for the image + question, and the expanded prompt length."""
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": QUESTION}]}]
    return reference_chat(model, tokenizer, messages, [png])


def reference_chat(model, tokenizer, messages: list, pngs: list[bytes]) -> tuple[str, int]:
    """transformers' greedy text for a chat whose {"type": "image"} parts are `pngs` in
    order (prepared by imageprep's pipeline), and the expanded prompt length."""
    from PIL import Image

    from services.imageprep.decode import DecodedImage
    from services.imageprep.expansion import expand_prompt
    from services.imageprep.processor import process_image
    from services.imageprep.profiles import builtin_profile

    prepared = [process_image(DecodedImage(np.asarray(Image.open(io.BytesIO(png)).convert(
        "RGB")), "RGB", 1), builtin_profile("qwen2_5_vl")) for png in pngs]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=False)
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    expanded = expand_prompt(ids, [p.geometry for p in prepared], image_token_id=151655,
                             vision_start_token_id=151652)
    input_ids = torch.tensor([expanded.token_ids.tolist()])
    with torch.no_grad():
        out = model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=NEW,
            min_new_tokens=NEW, do_sample=False, pad_token_id=0,
            pixel_values=torch.cat([torch.from_numpy(p.tensors["pixel_values"])
                                    for p in prepared]),
            image_grid_thw=torch.cat([torch.from_numpy(p.tensors["grid_thw"])
                                      for p in prepared]),
            mm_token_type_ids=torch.tensor([expanded.modality_ids.tolist()]))
    tokens = out[0, input_ids.shape[1]:].tolist()
    return tokenizer.decode(tokens, skip_special_tokens=True), input_ids.shape[1]


class VisionRecords:
    """Images the engine's encoder ran on (its dashboard 'vision' completion records), polled
    every second: the engine keeps records only while someone polls."""

    def __init__(self, run) -> None:
        import threading

        self.run, self.cursor, self.images = run, 0, 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.poll()              # starts the engine's record keeping; older records skipped
        self.images = 0
        self.thread.start()

    def poll(self) -> int:
        with self.lock:
            load = engine_load_with_completions(self.run, self.cursor)
            for record in load.completions:
                if record.sequence > self.cursor:
                    self.cursor = record.sequence
                    if record.kind == "vision":
                        self.images += int(record.label.split()[0])
            return self.images

    def _loop(self) -> None:
        while not self.stop.wait(1.0):
            self.poll()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def engine_load_with_completions(run, after: int = 0):
    import grpc

    from services.common.pb import engine_pb2, engine_pb2_grpc

    with grpc.insecure_channel(run.addresses["engine"]) as channel:
        return engine_pb2_grpc.EngineStub(channel).GetLoad(
            engine_pb2.GetLoadRequest(completions_after=after), timeout=30)


@pytest.fixture(scope="module")
def vision_stack(tmp_path_factory):
    import transformers

    root = tmp_path_factory.mktemp("qwen2_5_vl-tiny")
    reference = build_model(root)
    tokenizer = transformers.AutoTokenizer.from_pretrained(root)
    core = root.parent / "core"
    prepare_core(root, core, image_limits=LIMITS)
    runtime = root.parent / "run"
    runtime.mkdir(exist_ok=True)
    run = HeliosRun([str(core)], root.parent / "helios-run.log", runtime, free_port())
    try:
        run.wait_output("Helios is serving", timeout=300)
        yield run, reference, tokenizer
    finally:
        run.stop()


def test_images_through_every_api(vision_stack):
    run, reference, tokenizer = vision_stack
    png = png_bytes(120, 170, 1)
    data = base64.b64encode(png).decode()
    expected, prompt_len = reference_answer(reference, tokenizer, png)
    oai = openai.OpenAI(base_url=run.url + "/v1", api_key="k", max_retries=0, timeout=120)
    models = oai.models.list().data
    name = models[0].id
    content = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
               {"type": "text", "text": QUESTION}]
    reply = oai.chat.completions.create(model=name, max_tokens=NEW, extra_body=EXACT,
                                        messages=[{"role": "user", "content": content}])
    assert reply.choices[0].message.content == expected
    assert reply.usage.prompt_tokens == prompt_len          # the image's tokens counted
    claude = anthropic.Anthropic(base_url=run.url, api_key="k", max_retries=0, timeout=120)
    message = claude.messages.create(
        model=name, max_tokens=NEW, extra_body=EXACT,
        messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": data}},
            {"type": "text", "text": QUESTION}]}])
    assert message.content[0].text == expected
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == \
        prompt_len
    response = oai.responses.create(model=name, max_output_tokens=NEW, extra_body=EXACT,
                                    input=[{
                                        "role": "user", "content": [
                                            {"type": "input_image",
                                             "image_url": f"data:image/png;base64,{data}"},
                                            {"type": "input_text", "text": QUESTION}]}])
    assert response.output_text == expected
    client = ollama.Client(host=run.url)
    chat = client.chat(model=name, messages=[{"role": "user", "content": QUESTION,
                                              "images": [data]}],
                       options={"temperature": 0, "num_predict": NEW})
    assert chat.prompt_eval_count == prompt_len
    shown = client.show(name)
    assert "vision" in shown.capabilities
    arch = shown.modelinfo["general.architecture"]
    assert {key: value for key, value in shown.modelinfo.items() if ".vision." in key} == {
        f"{arch}.vision.request_max_images": 3,
        f"{arch}.vision.request_max_image_bytes": 200_000,
        f"{arch}.vision.request_max_image_pixels": 200_000}


def test_remote_urls_are_refused(vision_stack):
    run, _, _ = vision_stack
    oai = openai.OpenAI(base_url=run.url + "/v1", api_key="k", max_retries=0, timeout=120)
    name = oai.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=name, max_tokens=4, messages=[{
            "role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                {"type": "text", "text": QUESTION}]}])
    assert "remote image URLs are not fetched" in str(info.value)
    assert "inline images only" in str(info.value)


def _image_chat(oai, name: str, pngs: list[bytes]):
    content = [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(png).decode()}} for png in pngs]
    return oai.chat.completions.create(model=name, max_tokens=2, messages=[{
        "role": "user", "content": [*content, {"type": "text", "text": QUESTION}]}])


def flat_png(height: int, width: int) -> bytes:
    """Many pixels in few bytes (one colour compresses to almost nothing)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (90, 140, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_image_limits_come_from_the_core_manifest(vision_stack):
    """/v1/models shows the manifest's limits; more images, more bytes or more pixels than
    it allows are 400s that state the limit and its origin (the manifest, not imageprep's
    own, looser settings); at the limits the request is served."""
    run, _, _ = vision_stack
    oai = openai.OpenAI(base_url=run.url + "/v1", api_key="k", max_retries=0, timeout=120)
    model = oai.models.list().data[0]
    assert model.model_extra["image_limits"] == {
        "max_images": 3, "max_image_bytes": 200_000, "max_image_pixels": 200_000}
    small = png_bytes(28, 28, 3)
    assert _image_chat(oai, model.id, [small] * 3).choices[0].finish_reason == "length"
    origin = "of the model core's manifest (helios-core.json)"
    with pytest.raises(openai.BadRequestError) as info:
        _image_chat(oai, model.id, [small] * 4)
    assert "4 images in one request; the limit is 3 images per request, set by " \
        f"image_limits.max_images {origin}" in str(info.value)
    large = png_bytes(300, 300, 4)
    assert len(large) > 200_000
    with pytest.raises(openai.BadRequestError) as info:
        _image_chat(oai, model.id, [small, large])
    assert f"image 1 is {len(large)} bytes encoded; the limit is 200000 bytes per image, " \
        f"set by image_limits.max_image_bytes {origin}" in str(info.value)
    wide = flat_png(400, 600)
    assert len(wide) < 200_000
    with pytest.raises(openai.BadRequestError) as info:
        _image_chat(oai, model.id, [wide])
    assert "the image is 600x400 = 240000 pixels; the decoded-pixel limit is 200000, set " \
        f"by image_limits.max_image_pixels {origin}" in str(info.value)
    assert _image_chat(oai, model.id, [flat_png(400, 500)]).choices[0].finish_reason == \
        "length"


def test_an_image_imageprep_lost_fails_only_its_request(vision_stack):
    """The engine fetches pixels by identity; one imageprep never prepared (or evicted from
    every tier) fails that request with `unavailable` and the reason, before its step is
    committed; the engine keeps serving (an image chat right after still works)."""
    import grpc

    from services.common.errors import UnavailableError
    from services.common.pb import common_pb2, engine_pb2_grpc
    from tests.engine.service.conftest import generate_request, typed_error

    run, _, _ = vision_stack
    ids = [151644, 872, 198, 151652] + [151655] * 4 + [151653, 3838, 151645, 198]
    text = list(range(4)), list(range(6, 10))              # a 2 x 2 merged grid at 4
    rows = [text[0] + t + text[1] for t in ([4, 4, 4, 4], [4, 4, 5, 5], [4, 5, 4, 5])]
    multimodal = common_pb2.MultimodalInputs(
        images=[common_pb2.ImageDescriptor(identity=bytes(range(32)), token_offset=4,
                                           num_tokens=4, grid_t=1, grid_h=4, grid_w=4)],
        mrope_positions=np.asarray(rows, dtype="<i4").tobytes(), rope_delta=-2)
    with grpc.insecure_channel(run.addresses["engine"]) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        code, error = typed_error(lambda: list(stub.Generate(generate_request(
            "lost-image", ids, 4, multimodal=multimodal), timeout=120)))
    assert code == grpc.StatusCode.UNAVAILABLE and isinstance(error, UnavailableError), error
    assert "not retained" in str(error) or "could not return" in str(error)
    oai = openai.OpenAI(base_url=run.url + "/v1", api_key="k", max_retries=0, timeout=120)
    name = oai.models.list().data[0].id
    data = base64.b64encode(png_bytes(100, 100, 7)).decode()
    reply = oai.chat.completions.create(model=name, max_tokens=3, extra_body=EXACT, messages=[{
        "role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
            {"type": "text", "text": QUESTION}]}])
    assert reply.usage.completion_tokens == 3


def test_two_images_then_a_later_turn_and_the_same_image_again(vision_stack):
    """Two images in one message; the next turn of that conversation (a prefix hit across
    both images: no encoding); the first image again in a new chat (a feature-cache hit: the
    encoder does not run); each answer equal to transformers'."""
    run, reference, tokenizer = vision_stack
    oai = openai.OpenAI(base_url=run.url + "/v1", api_key="k", max_retries=0, timeout=120)
    name = oai.models.list().data[0].id
    first, second = png_bytes(150, 120, 21), png_bytes(110, 260, 22)
    url = [f"data:image/png;base64,{base64.b64encode(p).decode()}" for p in (first, second)]
    records = VisionRecords(run)
    turn1 = [{"role": "user", "content": [
        {"type": "text", "text": "Compare "},
        {"type": "image_url", "image_url": {"url": url[0]}},
        {"type": "text", "text": " with "},
        {"type": "image_url", "image_url": {"url": url[1]}}]}]
    hf1 = [{"role": "user", "content": [
        {"type": "text", "text": "Compare "}, {"type": "image"},
        {"type": "text", "text": " with "}, {"type": "image"}]}]
    reply = oai.chat.completions.create(model=name, max_tokens=NEW, extra_body=EXACT,
                                        messages=turn1)
    answer, length = reference_chat(reference, tokenizer, hf1, [first, second])
    assert reply.choices[0].message.content == answer
    assert reply.usage.prompt_tokens == length
    encoded = records.poll()
    assert encoded == 2
    turn2 = [*turn1, {"role": "assistant", "content": answer},
             {"role": "user", "content": "And now?"}]
    hf2 = [*hf1, {"role": "assistant", "content": answer},
           {"role": "user", "content": "And now?"}]
    reply = oai.chat.completions.create(model=name, max_tokens=NEW, extra_body=EXACT,
                                        messages=turn2)
    answer2, length2 = reference_chat(reference, tokenizer, hf2, [first, second])
    assert reply.choices[0].message.content == answer2 and reply.usage.prompt_tokens == length2
    cached = reply.usage.prompt_tokens_details.cached_tokens
    assert cached >= length - 8                      # the first turn's KV, images included
    again = [{"role": "user", "content": [
        {"type": "text", "text": "Once more: "},
        {"type": "image_url", "image_url": {"url": url[0]}}]}]
    reply = oai.chat.completions.create(model=name, max_tokens=NEW, extra_body=EXACT,
                                        messages=again)
    answer3, _ = reference_chat(reference, tokenizer, [{"role": "user", "content": [
        {"type": "text", "text": "Once more: "}, {"type": "image"}]}], [first])
    assert reply.choices[0].message.content == answer3
    assert records.poll() == encoded                  # neither request ran the encoder
    records.close()

"""The Qwen2.5-VL / Qwen3-VL paths on a CUDA device against the CPU float32 results, on the
tiny checkpoints of tests/engine/model/vision: the vision towers (packed SDPA, rotary and
linear kernels on CUDA), the mRoPE decoder with image features through the paged driver, and
the whole engine core (the vision stage and its device feature cache) on the GraphRunner
(decodes in CUDA graphs, image prefills eager) and on the TorchRunner.

Tolerances: float32 on the GPU gives the CPU's tokens (TF32 in the attention kernels: features
within 1e-2 relative); bf16 features within 5e-2 of the float32 ones (relative to their
norm), and bf16 greedy tokens teacher-forced within 0.25 nats of the float32 best, as
tests/engine/gpu/test_gpu_runner.py checks the text models."""

from __future__ import annotations

import pytest
import torch

from services.common.core import open_model
from services.engine.model import load_model
from services.engine.model.vision.inputs import VisionInput
from tests.engine.model.vision.checkpoints import SPECS, build_checkpoint, prepared_image
from tests.engine.model.vision.driver import VLDriver
from tests.engine.model.vision.prompts import Prompt, compose, random_text
from tests.engine.model.vision.test_engine_vision import DictPixels, request
from tests.engine.model.vision.test_graph_runner_vision import compare_runners, drive
from tests.engine.runner.conftest import make_engine

pytestmark = pytest.mark.gpu
NEW = 6


@pytest.fixture(scope="module", params=sorted(SPECS))
def checkpoint(request, tmp_path_factory):
    name = request.param
    return name, build_checkpoint(SPECS[name], tmp_path_factory.mktemp(name))


def _prompts(profile: str) -> dict[str, Prompt]:
    return {
        "text": compose([random_text(30, 1)]),
        "one": compose([random_text(4, 2), prepared_image(profile, 300, 420, 1),
                        random_text(6, 3)]),
        "two": compose([random_text(3, 4), prepared_image(profile, 140, 140, 2),
                        random_text(2, 5), prepared_image(profile, 500, 180, 3),
                        random_text(4, 6)]),
    }


def _inputs(model, prompt: Prompt) -> list[VisionInput]:
    merge = model.vl_config.vision.spatial_merge_size
    return [VisionInput.from_tensors(i.identity, i.tensors, merge) for i in prompt.images]


def _generate(model, prompts: dict[str, Prompt]) -> dict[str, list[int]]:
    driver = VLDriver(model, num_pages=512)
    seqs = {}
    for case, prompt in prompts.items():
        features = model.encode_images(_inputs(model, prompt))
        seqs[case] = driver.add(prompt.ids, prompt.positions, prompt.rope_delta,
                                list(zip(prompt.offsets, features, strict=True)), NEW)
    driver.run(chunk_size=37)
    return {case: seq.generated for case, seq in seqs.items()}


def test_towers_and_decoder_float32_match_cpu(checkpoint):
    name, directory = checkpoint
    cpu = load_model(open_model(directory), "cpu", torch.float32)
    gpu = load_model(open_model(directory), "cuda", torch.float32)
    prompts = _prompts(SPECS[name].profile)
    for prompt in prompts.values():
        for want, got in zip(cpu.encode_images(_inputs(cpu, prompt)),
                             gpu.encode_images(_inputs(gpu, prompt)), strict=True):
            scale = want.features.norm()
            assert (got.features.cpu() - want.features).norm() <= 1e-2 * scale
            for a, b in zip(want.deepstack, got.deepstack, strict=True):
                assert (b.cpu() - a).norm() <= 1e-2 * a.norm()
    assert _generate(gpu, prompts) == _generate(cpu, prompts)


def test_bf16_stays_near_float32(checkpoint):
    name, directory = checkpoint
    reference = load_model(open_model(directory), "cuda", torch.float32)
    model = load_model(open_model(directory), "cuda", torch.bfloat16)
    prompts = _prompts(SPECS[name].profile)
    for prompt in prompts.values():
        for want, got in zip(reference.encode_images(_inputs(reference, prompt)),
                             model.encode_images(_inputs(model, prompt)), strict=True):
            diff = (got.features.float() - want.features).norm()
            assert diff <= 5e-2 * want.features.norm()
    bf16 = _generate(model, prompts)
    # teacher-forced: every bf16 token is within 0.25 nats of float32's best at its step
    for case, prompt in prompts.items():
        for best, chosen in forced_logprobs(reference, prompt, bf16[case]):
            assert best - chosen <= 0.25, case


def forced_logprobs(model, prompt: Prompt, tokens: list[int]) -> list[tuple[float, float]]:
    """(best, chosen) logprob at each generated position of `prompt` followed by `tokens`,
    from one forward over the whole sequence (positions past the prompt: p + rope delta)."""
    from services.engine.model import ForwardBatch, allocate_kv_cache, build_metadata
    from services.engine.model.vision.inputs import ImageEmbeds

    device, page_size = model.device, 16
    length = len(prompt.ids) + len(tokens) - 1
    ids = prompt.ids + tokens[:-1]
    rows = [row + [p + prompt.rope_delta for p in range(len(prompt.ids), length)]
            for row in prompt.positions]
    pages = list(range(-(-length // page_size)))
    kv = allocate_kv_cache(model.config, len(pages), page_size, device, model.dtype)
    meta = build_metadata([length], [length], [pages], page_size, device)
    features = model.encode_images(_inputs(model, prompt))
    pieces = [(offset, f, 0, f.num_tokens)
              for offset, f in zip(prompt.offsets, features, strict=True)]
    batch = ForwardBatch(torch.tensor(ids, device=device),
                         torch.tensor(rows, dtype=torch.int64, device=device), meta,
                         images=ImageEmbeds.gather(pieces, device))
    hidden = model(batch, kv).hidden[len(prompt.ids) - 1:]
    logprobs = torch.log_softmax(model.compute_logits(hidden), dim=-1)
    return [(float(row.max()), float(row[t])) for row, t in zip(logprobs, tokens, strict=True)]


@pytest.mark.parametrize(("runner", "raw"), [("graph", False), ("torch", False),
                                             ("graph", True)])
def test_engine_core_on_cuda(checkpoint, runner, raw):
    """The whole engine on CUDA (float32; each runner): concurrent text and image requests,
    then the same image again (feature-cache hit on the device), equal to the CPU engine;
    `raw`: the CUDA engine fetches raw uint8 pixels and computes pixel_values on the GPU."""
    name, directory = checkpoint
    source = open_model(directory)
    profile = SPECS[name].profile
    prompts = _prompts(profile)
    again = compose([random_text(9, 40), prompts["one"].images[0], random_text(5, 41)])
    results = {}
    for device in ("cpu", "cuda"):
        engine = make_engine(source, device=device, dtype="float32", page_size=16,
                             imageprep_address="127.0.0.1:9",
                             runner=runner if device == "cuda" else "torch")
        pixels = DictPixels(raw=raw and device == "cuda")
        engine.runner.vision.pixels = pixels
        for rid, prompt in prompts.items():
            pixels.add(prompt)
            engine.scheduler.admit(request(rid, prompt))
        tokens = drive(engine)
        engine.scheduler.admit(request("again", again))
        tokens.update(drive(engine))
        assert engine.runner.vision.counters.images_encoded == 3     # "again" hit the cache
        # new images of one size, one request after another: on CUDA the second pass of
        # that layout is captured in an encoder graph and the third replays it
        for seed in (9, 10, 11):
            same = compose([random_text(5, seed), prepared_image(profile, 300, 420, seed),
                            random_text(3, seed + 50)])
            pixels.add(same)
            engine.scheduler.admit(request(f"size{seed}", same))
            tokens.update(drive(engine))
        encoder = engine.runner.vision.encoder
        assert engine.runner.vision.counters.images_encoded == 6
        if device == "cuda":
            assert encoder.captures >= 1 and encoder.replays >= 2
        results[device] = tokens
    assert results["cuda"] == results["cpu"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_encoder_graphs_replay_the_eager_pass(checkpoint, dtype):
    """EncoderGraphs on CUDA: a layout's first pass runs eagerly, its second is captured and
    replayed, later ones replay; every pass gives the eager tower's features for its own
    pixels (the static inputs take each pass's tensors), two-image passes included. With one
    graph kept, a second layout's capture drops the first, which then starts over."""
    from services.engine.vision.encoder_graphs import EncoderGraphs

    name, directory = checkpoint
    model = load_model(open_model(directory), "cuda", dtype)
    profile, merge = SPECS[name].profile, model.vl_config.vision.spatial_merge_size

    def images(*shapes: tuple[int, int, int]) -> list[VisionInput]:
        prepared = [prepared_image(profile, h, w, seed) for h, w, seed in shapes]
        return [VisionInput.from_tensors(p.identity, p.tensors, merge) for p in prepared]

    def check(got, want) -> None:
        for g, w in zip(got, want, strict=True):
            for a, b in zip((g.features, *g.deepstack), (w.features, *w.deepstack),
                            strict=True):
                assert a.shape == b.shape
                assert (a.float() - b.float()).norm() <= 1e-3 * b.float().norm()

    encoder = EncoderGraphs(model.visual, max_layouts=1)
    for seed in (1, 2, 3):                   # one layout: eager, capture + replay, replay
        batch = images((300, 420, seed))
        check(encoder(batch), model.visual(batch))
    assert (encoder.eager_passes, encoder.captures, encoder.replays) == (1, 1, 2)
    for seed in (4, 5):                      # two images a pass: eager, then capture
        batch = images((140, 140, seed), (500, 180, seed + 10))
        check(encoder(batch), model.visual(batch))
    assert (encoder.eager_passes, encoder.captures, encoder.replays) == (2, 2, 3)
    assert encoder.layouts == 1              # the first layout was dropped
    batch = images((300, 420, 6))
    check(encoder(batch), model.visual(batch))
    assert encoder.eager_passes == 3         # met again after its graph was dropped


def test_graph_runner_decodes_in_cuda_graphs(checkpoint):
    """The GraphRunner on CUDA (float32, captured decode graphs, two-frame overlap): two
    rounds of text, one- and two-image chats (the second round hits the feature cache) give
    the CPU torch runner's greedy tokens; decodes replayed graphs, image prefills ran
    eagerly."""
    name, directory = checkpoint
    runner = compare_runners(directory, SPECS[name].profile, device="cuda")
    assert runner.graph_steps > 0 and runner.graphs.graphs
    assert runner.window == 2


@pytest.mark.parametrize("profile", ["qwen2_5_vl", "qwen3_vl"])
async def test_raw_pixels_computed_on_the_gpu_equal_imageprep(profile):
    """The engine's default path (FetchPixels' raw uint8 pixels): pixel_values computed on
    CUDA are imageprep's float32 CPU values to the bit (correctly rounded subtraction and
    division on both devices)."""
    import numpy as np

    from tests.engine.model.vision.test_raw_pixels import _fetched

    identity, raw, _ = await _fetched(1024, 768, profile, "uint8")
    _, values, _ = await _fetched(1024, 768, profile, "float32")
    image = VisionInput.from_tensors(identity, raw, 2)
    on_gpu = image.pixel_values.values("cuda").cpu().numpy()
    assert np.array_equal(on_gpu.view(np.int32), values["pixel_values"].view(np.int32))

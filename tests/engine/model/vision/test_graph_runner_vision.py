"""Vision-language models on the GraphRunner: decode steps (text past the images, positions
p + rope delta on all three mRoPE rows) replay the decode graphs, steps that feed image rows
run eagerly with their [3, T] rows and image features; the greedy tokens equal the
TorchRunner's. On the CPU the graph runner replays its graphs as the same body on the same
padded views (no CUDA), so this checks the packing; tests/engine/gpu/test_gpu_vision.py runs
`compare_runners` on CUDA with real graphs."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.core import open_model
from services.engine.runner.graph_runner import GraphRunner
from services.engine.runner.torch_runner import TorchRunner
from services.engine.vision.preflight import prepare_plan_images
from tests.engine.model.vision.checkpoints import SPECS, prepared_image
from tests.engine.model.vision.prompts import Prompt, compose, random_text
from tests.engine.model.vision.test_engine_vision import NEW, DictPixels, request
from tests.engine.runner.conftest import make_engine


def runner_prompts(profile: str) -> list[dict[str, Prompt]]:
    """Two rounds: concurrent text, one-image and two-image chats; then the first image
    again in a new prompt (a feature-cache hit) beside a text prompt."""
    first = {
        "text": compose([random_text(20, 1)]),
        "one": compose([random_text(4, 2), prepared_image(profile, 150, 230, 1),
                        random_text(6, 3)]),
        "two": compose([random_text(3, 4), prepared_image(profile, 140, 140, 2),
                        random_text(2, 5), prepared_image(profile, 300, 120, 3),
                        random_text(4, 6)]),
    }
    again = {"again": compose([random_text(9, 40), first["one"].images[0],
                               random_text(5, 41)]),
             "text2": compose([random_text(11, 42)])}
    return [first, again]


def drive(engine: Any) -> dict[str, list[int]]:
    """The core loop's order: plan, prepare the plan's images, submit while the window has
    room, complete the oldest when it is full or nothing was planned."""
    scheduler, runner = engine.scheduler, engine.runner
    tokens: dict[str, list[int]] = {}
    while scheduler.has_work:
        submitted = False
        if runner.outstanding < runner.window:
            plan = scheduler.plan()
            if plan is not None:
                fence = scheduler.state.resources.fences.next_fence
                assert not prepare_plan_images(scheduler, runner.vision, plan, fence)
                runner.submit(scheduler.commit(plan, fence))
                submitted = True
        if runner.outstanding and (runner.outstanding >= runner.window or not submitted):
            for update in scheduler.complete(runner.wait()):
                for delta in update.deltas:
                    tokens.setdefault(update.request_id, []).extend(delta.token_ids)
    return tokens


def run_rounds(directory, profile: str, **settings) -> tuple[dict, Any]:
    """Every round's greedy tokens on an engine built with `settings`, and its runner."""
    engine = make_engine(open_model(directory), page_size=4, prefill_chunk_size=64,
                         max_num_batched_tokens=64, imageprep_address="127.0.0.1:9",
                         **settings)
    pixels = DictPixels()
    engine.runner.vision.pixels = pixels
    tokens: dict[str, list[int]] = {}
    for prompts in runner_prompts(profile):
        for rid, prompt in prompts.items():
            pixels.add(prompt)
            engine.scheduler.admit(request(rid, prompt))
        tokens.update(drive(engine))
    return tokens, engine.runner


def compare_runners(directory, profile: str, device: str = "cpu", **settings) -> GraphRunner:
    """The graph runner's tokens on `device` (NEW per request; engine `settings`) equal the
    CPU torch runner's (float32); each image was encoded once. Returns the graph runner
    (its step counts)."""
    want, torch_runner = run_rounds(directory, profile, device="cpu", dtype="float32",
                                    runner="torch")
    got, graph_runner = run_rounds(directory, profile, device=device, dtype="float32",
                                   runner="graph", **settings)
    assert isinstance(torch_runner, TorchRunner) and isinstance(graph_runner, GraphRunner)
    assert got == want
    assert all(len(t) == NEW for t in got.values())
    assert graph_runner.vision.counters.images_encoded == 3     # "again" hit the cache
    assert graph_runner.eager_steps > 0                  # the image prefills
    return graph_runner


@pytest.mark.parametrize("overlap", ["off", "on"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_graph_runner_equals_torch_runner(name, overlap, vl_checkpoint_dirs) -> None:
    """Also with two-frame overlap (a decode planned behind a step takes its token from
    the device; its offset comes from the slot's prompt)."""
    runner = compare_runners(vl_checkpoint_dirs[name], SPECS[name].profile, overlap=overlap)
    assert runner.graph_steps > 0                        # decodes replayed the graphs
    assert runner.window == (2 if overlap == "on" else 1)


def test_the_vision_attention_setting_reaches_the_tower(vl_checkpoint_dirs) -> None:
    from services.common.errors import ValidationError
    from services.engine.config import EngineConfig

    directory = vl_checkpoint_dirs["qwen2_5_vl"]
    for backend in ("triton", "sdpa"):
        engine = make_engine(open_model(directory), imageprep_address="127.0.0.1:9",
                             vision_attention=backend)
        assert engine.runner.vision.model.visual.attention_backend == backend
    with pytest.raises(ValidationError, match="vision_attention"):
        EngineConfig(model=str(directory), vision_attention="flash")


def test_triton_vision_attention_off_cuda_is_refused_at_start(vl_checkpoint_dirs,
                                                              monkeypatch) -> None:
    """On a CPU engine the Triton backend runs only in the interpreter: without
    TRITON_INTERPRET the start fails naming the setting (before the weights load)."""
    from services.common.errors import ValidationError

    source = open_model(vl_checkpoint_dirs["qwen2_5_vl"])
    for unset in ("", "0"):
        monkeypatch.setenv("TRITON_INTERPRET", unset)
        with pytest.raises(ValidationError) as info:
            make_engine(source, imageprep_address="127.0.0.1:9", vision_attention="triton",
                        device="cpu")
        assert str(info.value) == (
            "vision_attention triton needs a CUDA device, and the engine's device is cpu "
            "(device: cpu); use vision_attention sdpa, or set TRITON_INTERPRET=1 to run the "
            "kernel in Triton's CPU interpreter")
        assert info.value.param == "vision_attention"
        engine = make_engine(source, imageprep_address="127.0.0.1:9", device="cpu")
        assert engine.runner.vision.model.visual.attention_backend == "sdpa"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    engine = make_engine(source, imageprep_address="127.0.0.1:9", vision_attention="triton",
                         device="cpu")
    assert engine.runner.vision.model.visual.attention_backend == "triton"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_an_image_longer_than_the_step_budget(name, vl_checkpoint_dirs) -> None:
    """An image span of 300-380 tokens against a 64-token budget, beside decoding text and a
    later small image: the oldest prefill takes the span whole past the budget (a step holds
    the budget plus one image), a younger one waits for room; the graph runner's frames hold
    every step (they refused one before) and its tokens equal the torch runner's."""
    profile = SPECS[name].profile
    big = prepared_image(profile, 600, 500, 11)
    prompts = {"text": compose([random_text(20, 1)]),
               "big": compose([random_text(3, 2), big, random_text(4, 3)]),
               "small": compose([random_text(70, 4), prepared_image(profile, 150, 230, 12),
                                 random_text(2, 5)])}
    results, fed = {}, {}
    for runner in ("torch", "graph"):
        engine = make_engine(open_model(vl_checkpoint_dirs[name]), page_size=4,
                             prefill_chunk_size=64, max_num_batched_tokens=64,
                             imageprep_address="127.0.0.1:9", dtype="float32", runner=runner)
        pixels = DictPixels()
        engine.runner.vision.pixels = pixels
        for rid, prompt in prompts.items():
            pixels.add(prompt)
            engine.scheduler.admit(request(rid, prompt))
        commit = engine.scheduler.commit
        steps: list[int] = []

        def recording(plan, fence, commit=commit, steps=steps):
            steps.append(sum(p.num_tokens for p in plan.seqs))
            return commit(plan, fence)

        engine.scheduler.commit = recording
        results[runner] = drive(engine)
        fed[runner] = max(steps)
    assert results["graph"] == results["torch"]
    assert all(len(t) == NEW for t in results["graph"].values())
    # one step fed the whole big image (and the text's decode): past the budget, by one span
    assert big.geometry.num_tokens < fed["graph"] <= 64 + 64 + big.geometry.num_tokens

"""The real model through the scheduler and TorchRunner, in-process (no gRPC)."""

from __future__ import annotations

import random

import pytest

from services.common.core import open_model
from services.engine.config import EngineConfig
from services.engine.core.build import Engine, build_engine
from services.engine.sampling import SamplingParams
from services.engine.scheduler.requests import EngineRequest, StopRules
from tests.engine.model.checkpoints import SPECS, VOCAB_SIZE, build_checkpoint


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The tiny models here are latency-bound: one intra-op thread avoids OpenMP barrier
    stalls when the test machine is shared (the engine's own default stays torch's)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def demo_source(demo_core):
    return open_model(demo_core, verify=())


@pytest.fixture(scope="session")
def source(tmp_path_factory):
    """The tiny random Qwen3 (QK-norm, sharded safetensors) that most runner tests drive (a
    module that needs another model defines its own `source`)."""
    return open_model(build_checkpoint(SPECS["qwen3-qknorm-sharded"],
                                       tmp_path_factory.mktemp("qwen3")))


def random_prompt(length: int, seed: int, vocab: int = VOCAB_SIZE) -> list[int]:
    """`length` token ids below `vocab`, the same for the same seed."""
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]


@pytest.fixture(scope="session")
def hf_demo(demo_model_dir):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(demo_model_dir,
                                                              dtype=torch.float32)
    return model.eval()


def make_engine(source, **overrides) -> Engine:
    values = dict(model=str(source.root), kv_cache_bytes=16 << 20, max_num_seqs=8,
                  prefill_chunk_size=64)
    values.update(overrides)
    return build_engine(EngineConfig(**values), source)


def greedy_request(request_id: str, prompt, max_tokens: int, *, logprobs: bool = False,
                   top_logprobs: int = 0, ends=(), n: int = 1, seed: int | None = 0,
                   **sampling) -> EngineRequest:
    """A request (greedy unless `temperature` is given) that ignores EOS."""
    params = SamplingParams.create(temperature=sampling.pop("temperature", 0.0),
                                   max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs,
                                   top_logprobs=top_logprobs, seed=seed, **sampling)
    return EngineRequest(
        request_id=request_id, prompt_token_ids=tuple(prompt), sampling=params,
        stop=StopRules(max_tokens=max_tokens, ignore_eos=True), seed=params.seed,
        logprobs=logprobs, top_logprobs=top_logprobs, checkpoint_token_ends=tuple(ends), n=n)


def hf_greedy(model, prompt, max_tokens: int):
    """transformers' greedy tokens and the logprob of each chosen token."""
    import torch

    ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        # an explicit mask: otherwise generate masks every prompt token equal to the pad id
        out = model.generate(ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False, output_scores=True, return_dict_in_generate=True,
                             pad_token_id=0)
    tokens = out.sequences[0, len(prompt):].tolist()
    logprobs = [torch.log_softmax(score[0].float(), -1)[t].item()
                for score, t in zip(out.scores, tokens, strict=True)]
    return tokens, logprobs


def serve(engine: Engine, requests):
    """Drive `requests` to completion as the engine loop does (submit while the runner's
    window has room, complete the oldest when it is full or nothing could be planned):
    (tokens, logprobs, last usage) per request id."""
    for request in requests:
        engine.scheduler.admit(request)
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list] = {}
    usage: dict[str, object] = {}
    scheduler, runner = engine.scheduler, engine.runner
    while scheduler.has_work:
        submitted = False
        if runner.outstanding < runner.window:
            plan = scheduler.plan()
            if plan is not None:
                runner.submit(scheduler.commit(plan, scheduler.state.resources.fences.next_fence))
                submitted = True
        if runner.outstanding and (runner.outstanding >= runner.window or not submitted):
            for update in scheduler.complete(runner.wait()):
                usage[update.request_id] = update.usage
                for delta in update.deltas:
                    tokens.setdefault(update.request_id, []).extend(delta.token_ids)
                    logprobs.setdefault(update.request_id, []).extend(delta.logprobs)
    return tokens, logprobs, usage

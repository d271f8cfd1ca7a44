"""Real models end to end: `helios run FILE.gguf` (all four services, the GGUF's cached core)
answers through the official `openai` client with exactly what transformers generates.

For each pinned file the reference is transformers' own GGUF loading in float32
(`AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=torch.float32)`) decoding
greedily with the same prompt ids and the same stop ids (the core's manifest). Helios runs the
engine on the CPU in float32 too, so greedy decoding must agree token for token: the tests
compare the exact text, the prompt and completion token counts and the finish reason.

- SmolLM2-135M-Instruct (llama, ChatML): chat completions over several conversations, its chat
  template rendered by the frontend; a factual question gets the right answer.
- Gemma 3 270M: the pinned file is the *base* model and carries no chat template, so chat is
  refused with a clear error and the comparison runs on text completions (BOS added, as
  transformers' tokenizer does); a factual prompt is completed correctly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import torch

from services.common.core import open_model
from tests.support.processes import HeliosRun, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
MAX_TOKENS = 20

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "List three primary colors."}],
    [{"role": "user", "content": "Hi! Who are you?"},
     {"role": "assistant", "content": "I am a helpful assistant."},
     {"role": "user", "content": "Write one sentence about the sea."}],
    [{"role": "user", "content": "Translate 'good morning' into Spanish and French."}],
]
PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small"]

# Small engine footprint on the shared CPU machine.
ENGINE_CONFIG = """\
engine:
  kv_cache_bytes: 67108864
  max_num_seqs: 4
"""


@contextlib.contextmanager
def helios_run(tmp_path: Path, gguf: Path) -> Iterator[HeliosRun]:
    runtime = tmp_path / "run"
    runtime.mkdir(parents=True)
    config = tmp_path / "helios.yaml"
    config.write_text(ENGINE_CONFIG)
    run = HeliosRun([str(gguf), "--config", str(config)], tmp_path / "helios-run.log", runtime,
                    free_port())
    try:
        run.wait_output("Helios is serving", timeout=900)
        yield run
    finally:
        run.stop()


def client(run: HeliosRun) -> openai.OpenAI:
    return openai.OpenAI(base_url=run.url + "/v1", api_key="k", max_retries=0, timeout=600)


@torch.inference_mode()
def greedy(model, prompt_ids: list[int], stop_ids: tuple[int, ...]) -> list[int]:
    """transformers' greedy continuation (the stop id included when it stops)."""
    inputs = torch.tensor([prompt_ids])
    output = model.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=False,
                            max_new_tokens=MAX_TOKENS, eos_token_id=list(stop_ids),
                            pad_token_id=stop_ids[0], top_p=None, top_k=None,
                            temperature=None)
    return output[0, len(prompt_ids):].tolist()


def check_same(choice, usage, generated: list[int], prompt_ids: list[int], tokenizer,
               stop_ids: tuple[int, ...], text: str) -> None:
    expected = tokenizer.decode(generated, skip_special_tokens=True)
    assert text == expected
    assert usage.prompt_tokens == len(prompt_ids)
    assert usage.completion_tokens == len(generated)
    stopped = generated[-1] in stop_ids
    assert choice.finish_reason == ("stop" if stopped else "length")


def test_smollm2_chat_equals_transformers_greedy(tmp_path, smollm2_gguf, transformers_gguf):
    model = transformers_gguf.model("smollm2")
    tokenizer = transformers_gguf.tokenizer("smollm2")
    with helios_run(tmp_path, smollm2_gguf) as run:
        manifest = open_model(smollm2_gguf, verify=()).manifest   # the core helios run serves
        api = client(run)
        assert [m.id for m in api.models.list().data] == [manifest.card_id]
        for conversation in CONVERSATIONS:
            chat_equals_greedy(api, manifest, model, tokenizer, conversation)
        answer = api.chat.completions.create(
            model=manifest.card_id, temperature=0, max_tokens=MAX_TOKENS,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in answer.choices[0].message.content
        check_block_reuse(api, manifest, model, tokenizer)
        assert run.terminate() == 0, run.output()[-4000:]


def chat_equals_greedy(api, manifest, model, tokenizer, conversation) -> tuple[list[int], int]:
    """One chat completion checked against transformers: (prompt ids, cached tokens)."""
    stop_ids = manifest.eos_token_ids
    reply = api.chat.completions.create(model=manifest.card_id, messages=conversation,
                                        temperature=0, max_tokens=MAX_TOKENS)
    prompt = tokenizer.apply_chat_template(conversation, tokenize=False,
                                           add_generation_prompt=True)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    generated = greedy(model, prompt_ids, stop_ids)
    choice = reply.choices[0]
    check_same(choice, reply.usage, generated, prompt_ids, tokenizer, stop_ids,
               choice.message.content)
    return prompt_ids, reply.usage.prompt_tokens_details.cached_tokens or 0


DOCUMENT = ("The lighthouse on the northern cape was built in 1871 from granite quarried on "
            "the island. Its keeper lived in a cottage beside it with two goats, a cat and a "
            "large collection of books about ships. Every evening he climbed the ninety-nine "
            "steps to light the lamp, and every morning he wrote the weather in a log. ") * 3


def check_block_reuse(api, manifest, model, tokenizer) -> None:
    """A RAG-shaped prompt: the same document, a different question, inside one user message
    (no message boundary is shared). The second request reuses every complete 64-token block
    the two prompts share, and still answers exactly what transformers does."""
    (first, _), (second, cached) = (
        chat_equals_greedy(api, manifest, model, tokenizer, [
            {"role": "user", "content": f"{DOCUMENT}\n\nQuestion: {question}"}])
        for question in ("Who lived beside the lighthouse?", "When was the lighthouse built?"))
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert shared >= 128 and cached == shared // 64 * 64


def test_gemma3_completions_equal_transformers_greedy(tmp_path, gemma3_gguf, transformers_gguf):
    model = transformers_gguf.model("gemma3")
    tokenizer = transformers_gguf.tokenizer("gemma3")
    with helios_run(tmp_path, gemma3_gguf) as run:
        manifest = open_model(gemma3_gguf, verify=()).manifest
        stop_ids = manifest.eos_token_ids
        assert manifest.architecture == "Gemma3ForCausalLM" and stop_ids == (1, 106)
        api = client(run)
        for prompt in PROMPTS:
            reply = api.completions.create(model=manifest.card_id, prompt=prompt,
                                           temperature=0, max_tokens=MAX_TOKENS)
            prompt_ids = tokenizer.encode(prompt)              # <bos> first
            assert prompt_ids[0] == 2
            generated = greedy(model, prompt_ids, stop_ids)
            choice = reply.choices[0]
            check_same(choice, reply.usage, generated, prompt_ids, tokenizer, stop_ids,
                       choice.text)
        # The plain question as a prompt: the base model answers it on the next line.
        fact = api.completions.create(model=manifest.card_id, prompt="What is the capital of "
                                      "France?", temperature=0, max_tokens=12)
        assert "Paris" in fact.choices[0].text
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            api.chat.completions.create(model=manifest.card_id, max_tokens=4, messages=[
                {"role": "user", "content": "Hello"}])
        assert run.terminate() == 0, run.output()[-4000:]

"""The real GGUF checkpoints quantized online to FP8 (`quantization: fp8`: every decoder
projection e4m3 with per-row scales, activations quantized per token) still answer the
factual question of tests/engine/service/test_real_models.py. The CPU path carries the FP8
rounding (model/fp8.py: activations and weights quantized and dequantized). SmolLM2 also
runs through the real four-service stack (`helios run FILE.gguf` with `quantization: fp8` in
its YAML) and answers through the official `openai` client.

The answer is asked for where the fact is decided: after the question, the model's own first
words "The capital of France is" are given and the next token must be " Paris". Left to start
the answer itself, SmolLM2-135M's first token is a near-tie even unquantized ("The" -1.88 vs
"L" -1.97 nats): FP8's rounding then picks either by machine-level float differences (one
CPU picked "L'Étoile de France, ..." with the whole prompt in one chunk and "The capital of
France is Paris." in chunks of 8, on identical weights), while " Paris" leads the next
token by more than 3.5 nats in every chunking, quantized or not. (With `kv_cache_dtype: fp8`
on top, unit KV scales, e4m3's 3-bit mantissa on its keys is too coarse for this small model;
the FP8 KV paths are checked against references in tests/kernels/test_fp8_kv.py and
tests/engine/runner/test_fp8_engine.py.)"""

from __future__ import annotations

import jinja2
import openai
import pytest
import torch
from tokenizers import Tokenizer

from services.common.core import open_model
from services.engine.model import load_model
from services.engine.model.layers.fp8_linear import Fp8Linear
from tests.engine.model.driver import PagedDriver
from tests.support.processes import HeliosRun, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
QUESTION = "What is the capital of France?"
ANSWER_START = "The capital of France is"


def _smollm2_chat(source) -> str:   # the core's own chat template, as the frontend renders it
    template = jinja2.Environment().from_string(source.chat_template())
    return template.render(messages=[{"role": "user", "content": QUESTION}],
                           add_generation_prompt=True)


def _answers(gguf, prompt_of, max_new_tokens: int, chunk_sizes=(64, 8, 1)) -> list[str]:
    """The FP8 model's greedy continuation, once per prefill chunk size."""
    source = open_model(gguf)
    model = load_model(source, quantization="fp8")
    projections = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert len(projections) == 4 * model.config.num_hidden_layers
    assert all(m.weight.dtype == torch.float8_e4m3fn for m in projections)
    tokenizer = Tokenizer.from_file(str(source.path(source.manifest.tokenizer_file)))
    ids = prompt_of(source, tokenizer)
    answers = []
    for chunk in chunk_sizes:
        driver = PagedDriver(model, num_pages=64, page_size=16)
        seq = driver.add(ids, max_new_tokens=max_new_tokens)
        driver.run(chunk_size=chunk)
        answers.append(tokenizer.decode(seq.generated))
    return answers


def test_smollm2_fp8_answers(smollm2_gguf) -> None:
    def chat(source, tokenizer):
        text = _smollm2_chat(source) + ANSWER_START
        return tokenizer.encode(text, add_special_tokens=False).ids

    for answer in _answers(smollm2_gguf, chat, 3):
        assert answer.startswith(" Paris"), answer


def test_gemma3_fp8_answers(gemma3_gguf) -> None:
    def completion(source, tokenizer):   # BOS + the plain question (a base model)
        text = f"{QUESTION}\n{ANSWER_START}"
        return [2, *tokenizer.encode(text, add_special_tokens=False).ids]

    # one chunking: Gemma's " Paris" has p ~ 0.7 in each (0.66-0.76 measured at 64, 8 and 1)
    for answer in _answers(gemma3_gguf, completion, 3, chunk_sizes=(64,)):
        assert answer.startswith(" Paris"), answer


def test_smollm2_fp8_through_helios_run(tmp_path, smollm2_gguf) -> None:
    config = tmp_path / "helios.yaml"
    config.write_text("engine:\n  kv_cache_bytes: 67108864\n  max_num_seqs: 4\n"
                      "  quantization: fp8\n")
    runtime = tmp_path / "run"
    runtime.mkdir()
    run = HeliosRun([str(smollm2_gguf), "--config", str(config)], tmp_path / "helios-run.log",
                    runtime, free_port())
    try:
        run.wait_output("Helios is serving", timeout=900)
        api = openai.OpenAI(base_url=run.url + "/v1", api_key="k", max_retries=0, timeout=600)
        source = open_model(smollm2_gguf, verify=())
        answer = api.completions.create(
            model=source.manifest.card_id, temperature=0, max_tokens=3,
            prompt=_smollm2_chat(source) + ANSWER_START)
        assert answer.choices[0].text.startswith(" Paris"), answer.choices[0].text
        assert "quantization=fp8-e4m3:online" in run.output()
        assert run.terminate() == 0, run.output()[-4000:]
    finally:
        run.stop()

"""The real GGUF checkpoints quantized online to FP8 (`quantization: fp8`: every decoder
projection e4m3 with per-row scales, activations quantized per token) still answer the
factual question of tests/engine/service/test_real_models.py. The CPU path carries the FP8
rounding (model/fp8.py: activations and weights quantized and dequantized)."""

from __future__ import annotations

import jinja2
import pytest
import torch
from tokenizers import Tokenizer

from services.common.core import open_model
from services.engine.model import load_model
from services.engine.model.layers.fp8_linear import Fp8Linear
from tests.engine.model.driver import PagedDriver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
QUESTION = "What is the capital of France?"


def _answer(gguf, prompt_of, max_new_tokens: int) -> str:
    source = open_model(gguf)
    model = load_model(source, quantization="fp8")
    projections = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert len(projections) == 4 * model.config.num_hidden_layers
    assert all(m.weight.dtype == torch.float8_e4m3fn for m in projections)
    tokenizer = Tokenizer.from_file(str(source.path(source.manifest.tokenizer_file)))
    ids = prompt_of(source, tokenizer)
    driver = PagedDriver(model, num_pages=64, page_size=16)
    seq = driver.add(ids, max_new_tokens=max_new_tokens)
    driver.run(chunk_size=64)
    return tokenizer.decode(seq.generated)


def test_smollm2_fp8_answers(smollm2_gguf) -> None:
    def chat(source, tokenizer):   # the core's own chat template, as the frontend renders it
        template = jinja2.Environment().from_string(source.chat_template())
        text = template.render(messages=[{"role": "user", "content": QUESTION}],
                               add_generation_prompt=True)
        return tokenizer.encode(text, add_special_tokens=False).ids

    assert "Paris" in _answer(smollm2_gguf, chat, 10)


def test_gemma3_fp8_answers(gemma3_gguf) -> None:
    def completion(source, tokenizer):   # BOS + the plain question (a base model)
        return [2, *tokenizer.encode(QUESTION, add_special_tokens=False).ids]

    assert "Paris" in _answer(gemma3_gguf, completion, 12)

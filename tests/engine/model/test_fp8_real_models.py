"""The real GGUF checkpoints quantized online to FP8 (`quantization: fp8`: every decoder
projection e4m3 with per-row scales, activations quantized per token) still answer the
factual question of tests/engine/service/test_real_models.py. The CPU path carries the FP8
rounding (model/fp8.py: activations and weights quantized and dequantized). SmolLM2 also
runs through the real four-service stack (`helios run FILE.gguf` with `quantization: fp8` in
its YAML) and answers through the official `openai` client. (With `kv_cache_dtype: fp8` on top,
unit KV scales, SmolLM2-135M answered "L'Étoile, the capital of France" in 10 tokens: e4m3's
3-bit mantissa on its keys is too coarse for this small model; the FP8 KV paths are checked
against references in tests/kernels/test_fp8_kv.py and tests/engine/runner/test_fp8_engine.py.)"""

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
        manifest = open_model(smollm2_gguf, verify=()).manifest
        answer = api.chat.completions.create(
            model=manifest.card_id, temperature=0, max_tokens=10,
            messages=[{"role": "user", "content": QUESTION}])
        assert "Paris" in answer.choices[0].message.content
        assert "quantization=fp8-e4m3:online" in run.output()
        assert run.terminate() == 0, run.output()[-4000:]
    finally:
        run.stop()

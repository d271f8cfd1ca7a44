"""lm-evaluation-harness against the real stack serving the real SmolLM2 GGUF.

`local-completions` scores loglikelihood tasks through `/v1/completions` with `echo`,
`logprobs` and `max_tokens: 1`, reading the prompt tokens' logprobs. Before Helios returned
them every loglikelihood was 0 and every perplexity 1.0 (with exit 0). Here a local task dir
(a few multiple-choice docs and a perplexity doc, JSON files, no hub) runs through the
harness and the loglikelihoods it reports equal transformers' float32 values on the same GGUF
weights.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from services.common.core import open_model
from tests.engine.service.test_real_models import helios_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
TOL = 0.01          # nats, per summed loglikelihood (dequantized float32 on both sides)

MC_DOCS = [
    {"question": "The capital of France is", "choices": [" Paris", " Berlin", " a banana"],
     "answer": 0},
    {"question": "Two plus two equals", "choices": [" four", " seven"], "answer": 0},
    {"question": "The opposite of hot is", "choices": [" cold", " loud", " green"],
     "answer": 0},
]
PPL_DOC = {"text": "The quick brown fox jumps over the lazy dog. It was a sunny day and the "
                   "children played in the park until the evening."}

MC_TASK = """\
task: helios_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
target_delimiter: ""
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""
PPL_TASK = """\
task: helios_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: bits_per_byte
"""


def _task_dir(root: Path) -> Path:
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in MC_DOCS))
    (tasks / "ppl.jsonl").write_text(json.dumps(PPL_DOC) + "\n")
    (tasks / "helios_mc.yaml").write_text(MC_TASK.format(path=tasks / "mc.jsonl"))
    (tasks / "helios_ppl.yaml").write_text(PPL_TASK.format(path=tasks / "ppl.jsonl"))
    return tasks


@torch.inference_mode()
def _loglikelihood(model, context: list[int], continuation: list[int]) -> float:
    ids = context + continuation
    logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return sum(logprobs[p - 1, ids[p]].item() for p in range(len(context), len(ids)))


def test_lm_eval_loglikelihoods_equal_transformers(tmp_path, smollm2_gguf, transformers_gguf,
                                                   monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    model = transformers_gguf.model("smollm2")
    tokenizer = transformers_gguf.tokenizer("smollm2")
    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer.save_pretrained(tokenizer_dir)      # the harness loads it from files, no hub
    tasks = _task_dir(tmp_path)
    manifest = open_model(smollm2_gguf, verify=()).manifest
    with helios_run(tmp_path, smollm2_gguf) as run:
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args={"base_url": run.url + "/v1/completions", "model": manifest.card_id,
                        "tokenizer": str(tokenizer_dir), "tokenizer_backend": "huggingface",
                        "num_concurrent": 1, "max_retries": 1, "max_length": 2048,
                        # the token a rolling window's first continuation is scored after
                        "custom_prefix_token_id": tokenizer.bos_token_id},
            tasks=["helios_mc", "helios_ppl"], task_manager=TaskManager(
                include_path=str(tasks)), log_samples=True, batch_size=1)
        assert run.terminate() == 0, run.output()[-4000:]
    assert results is not None
    encode = tokenizer.encode
    checked = 0
    for sample in results["samples"]["helios_mc"]:
        doc = sample["doc"]
        for choice, response in zip(doc["choices"], sample["resps"], strict=True):
            got = response[0][0]
            # the harness's pair encoding: the context's tokens, then the rest of the whole
            whole = encode(doc["question"] + choice)
            context = encode(doc["question"])
            want = _loglikelihood(model, context, whole[len(context):])
            assert got != 0.0
            assert abs(got - want) < TOL, (doc["question"], choice, got, want)
            checked += 1
    assert checked == sum(len(d["choices"]) for d in MC_DOCS)
    (sample,) = results["samples"]["helios_ppl"]
    got = sample["resps"][0][0]
    tokens = encode(PPL_DOC["text"])
    want = _loglikelihood(model, [tokenizer.bos_token_id], tokens)
    assert abs(got - want) < TOL, (got, want)
    perplexity = results["results"]["helios_ppl"]["word_perplexity,none"]
    words = len(PPL_DOC["text"].split())
    assert perplexity != 1.0
    assert math.isclose(perplexity, math.exp(-want / words), rel_tol=0.02)
    assert results["results"]["helios_mc"]["acc,none"] >= 0.0

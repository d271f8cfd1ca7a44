"""Embeddings through the real four services (`helios run --demo`) with the official clients.

openai's `client.embeddings.create` (base64 by default in the SDK), float and `dimensions`;
ollama's `embed` (string and list input, `dimensions`, `truncate`) and legacy `embeddings`;
`/api/pull` refused in Ollama's shape. The vectors equal transformers' final hidden state of
the last prompt token (float32, normalized) of the demo checkpoint.
"""

from __future__ import annotations

import base64
import struct

import httpx
import ollama
import openai
import pytest
import torch

from tests.support.processes import HeliosRun

MODEL = "helios-demo"
pytestmark = pytest.mark.timeout(600)
TOL = 1e-4


@pytest.fixture(scope="module")
def olla(stack):
    return ollama.Client(host=stack.url, timeout=120)


@pytest.fixture(scope="module")
def reference(demo_model_dir):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(demo_model_dir,
                                                              dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(demo_model_dir)

    def embedding(prompt: str | list[int], dimensions: int | None = None) -> torch.Tensor:
        ids = prompt if isinstance(prompt, list) else tokenizer.encode(prompt)
        with torch.no_grad():
            hidden = model.model(torch.tensor([ids])).last_hidden_state[0, -1]
        hidden = hidden[:dimensions] if dimensions else hidden
        return torch.nn.functional.normalize(hidden, dim=0)
    return embedding


def _close(got, want: torch.Tensor) -> None:
    got = torch.tensor(list(got), dtype=torch.float32)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=TOL), (got - want).abs().max()


def test_openai_embeddings(oai, stack, reference):
    texts = ["The quick brown fox", "jumps over the lazy dog. " * 20]
    reply = oai.embeddings.create(model=MODEL, input=texts)      # the SDK asks for base64
    assert [d.index for d in reply.data] == [0, 1]
    for item, text in zip(reply.data, texts, strict=True):
        _close(item.embedding, reference(text))
    assert reply.usage.prompt_tokens == reply.usage.total_tokens > 20
    ids = [1000 + 7 * i for i in range(70)]
    floats = oai.embeddings.create(model=MODEL, input=[ids, ids[:5]], encoding_format="float",
                                   dimensions=16)
    _close(floats.data[0].embedding, reference(ids, 16))
    _close(floats.data[1].embedding, reference(ids[:5], 16))
    assert floats.usage.prompt_tokens == 75
    # the raw base64 is little-endian float32
    raw = httpx.post(stack.url + "/v1/embeddings", json={
        "model": MODEL, "input": ids, "encoding_format": "base64"}, timeout=60).json()
    data = base64.b64decode(raw["data"][0]["embedding"])
    _close(struct.unpack(f"<{len(data) // 4}f", data), reference(ids))
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        oai.embeddings.create(model=MODEL, input="hi", dimensions=4096)
    with pytest.raises(openai.BadRequestError):
        oai.embeddings.create(model=MODEL, input=[])
    with pytest.raises(openai.NotFoundError):
        oai.embeddings.create(model="no-such-model", input="hi")


def test_ollama_embed_and_embeddings(olla, reference):
    one = olla.embed(model=MODEL, input="Why is the sky blue?")
    assert len(one.embeddings) == 1 and one.prompt_eval_count > 0
    _close(one.embeddings[0], reference("Why is the sky blue?"))
    many = olla.embed(model=MODEL, input=["first", "second one"], dimensions=8)
    assert len(many.embeddings) == 2
    _close(many.embeddings[1], reference("second one", 8))
    long = "word " * 5000                                          # past the 4096 context
    cut = olla.embed(model=MODEL, input=long)                      # truncate defaults to true
    assert cut.prompt_eval_count == 4096
    with pytest.raises(ollama.ResponseError) as refused:
        olla.embed(model=MODEL, input=long, truncate=False)
    assert refused.value.status_code == 400
    legacy = olla.embeddings(model=MODEL, prompt="Why is the sky blue?")
    _close(legacy.embedding, reference("Why is the sky blue?"))


def test_ollama_pull_is_refused(olla):
    with pytest.raises(ollama.ResponseError, match="does not download models") as refused:
        olla.pull(MODEL)
    assert refused.value.status_code == 400


def test_qwen3_embedding_checkpoint_served(tmp_path, demo_model_dir):
    """`helios run` of a Qwen3-Embedding-layout directory (Qwen3Model, no lm_head,
    sentence-transformers pooling files): openai and ollama clients get its vectors."""
    from tests.support.embedding_checkpoint import build_embedding_checkpoint
    from tests.support.processes import free_port

    model_dir, model = build_embedding_checkpoint(tmp_path, demo_model_dir, mode="last")
    config = tmp_path / "helios.yaml"
    config.write_text("engine:\n  kv_cache_bytes: 16777216\n  max_num_seqs: 4\n")
    runtime = tmp_path / "run"
    runtime.mkdir()
    run = HeliosRun([str(model_dir), "--config", str(config)], tmp_path / "helios-run.log",
                    runtime, free_port())
    try:
        run.wait_output("Helios is serving", timeout=300)
        client = openai.OpenAI(base_url=run.url + "/v1", api_key="k", max_retries=0,
                               timeout=120)
        (card,) = client.models.list().data
        ids = [2000 + 13 * i for i in range(30)]
        with torch.no_grad():
            hidden = model(torch.tensor([ids])).last_hidden_state[0, -1]
        reply = client.embeddings.create(model=card.id, input=[ids])
        _close(reply.data[0].embedding, torch.nn.functional.normalize(hidden, dim=0))
        vectors = ollama.Client(host=run.url, timeout=120).embed(
            model=card.id, input=["a question", "another one"]).embeddings
        assert len(vectors) == 2 and len(vectors[0]) == 48
        assert abs(sum(v * v for v in vectors[0]) - 1.0) < 1e-4
        assert run.terminate() == 0, run.output()[-4000:]
    finally:
        run.stop()

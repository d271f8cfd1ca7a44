"""The embedding routes' shapes against the scripted fake frontend (every embedding is the
unit vector EMBEDDING): what each input becomes (one embed request with max_tokens 0 per
input), `dimensions` (truncated, renormalized), base64 float32, usage, Ollama's shapes and
`truncate`, `/api/pull` refused in Ollama's error shape. Values against a real model:
test_embeddings_e2e.py."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import ollama
import openai
import pytest

from tests.gateway.fake_frontend import EMBEDDING, MODEL_ID


@pytest.fixture(scope="module")
def oai(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="k", max_retries=0)


def test_openai_inputs_become_embed_requests(oai, frontend):
    reply = oai.embeddings.create(model=MODEL_ID, input=["a", "b"])        # SDK: base64
    assert [d.embedding for d in reply.data] == [pytest.approx(EMBEDDING)] * 2
    assert reply.usage.prompt_tokens == 22 and reply.usage.total_tokens == 22
    sent = frontend.requests[-2:]
    assert [r.completion.text for r in sent] == ["a", "b"]
    assert all(r.embed and r.sampling.max_tokens == 0 and r.sampling.HasField("max_tokens")
               for r in sent)
    oai.embeddings.create(model=MODEL_ID, input=[[5, 6, 7], [8]], encoding_format="float")
    assert [list(r.completion.token_ids.ids) for r in frontend.requests[-2:]] == [[5, 6, 7], [8]]
    oai.embeddings.create(model=MODEL_ID, input=[9, 10], encoding_format="float")
    assert list(frontend.requests[-1].completion.token_ids.ids) == [9, 10]


def test_dimensions_and_base64(gateway):
    body = {"model": MODEL_ID, "input": "x", "dimensions": 1, "encoding_format": "float"}
    reply = httpx.post(gateway.url + "/v1/embeddings", json=body).json()
    assert reply["object"] == "list" and reply["data"][0]["object"] == "embedding"
    assert reply["data"][0]["embedding"] == [1.0]                    # 0.6 renormalized
    body.update(dimensions=3, encoding_format="base64")
    raw = base64.b64decode(httpx.post(gateway.url + "/v1/embeddings", json=body).json()
                           ["data"][0]["embedding"])
    values = struct.unpack("<3f", raw)
    assert values == pytest.approx([0.6, 0.0, 0.8])
    assert math.isclose(sum(v * v for v in values), 1.0, rel_tol=1e-6)
    for bad in ({"dimensions": 5}, {"dimensions": 0}, {"input": []}, {"input": [[]]},
                {"input": ""}, {"encoding_format": "int8"}):
        response = httpx.post(gateway.url + "/v1/embeddings",
                              json={"model": MODEL_ID, "input": "x", **bad})
        assert response.status_code == 400, (bad, response.text)
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_ollama_embed_embeddings_and_pull(gateway, frontend):
    client = ollama.Client(host=gateway.url)
    reply = client.embed(model=MODEL_ID + ":latest", input=["one", "two"], dimensions=3)
    assert reply.embeddings == [pytest.approx([0.6, 0.0, 0.8])] * 2
    assert reply.prompt_eval_count == 22
    assert [r.model for r in frontend.requests[-2:]] == [MODEL_ID] * 2
    assert client.embeddings(model=MODEL_ID, prompt="hi").embedding == pytest.approx(EMBEDDING)
    assert client.embeddings(model=MODEL_ID, prompt="").embedding == []
    long = "word " * 5000                     # the fake counts a token per word: past 4096
    client.embed(model=MODEL_ID, input=long)
    assert len(frontend.requests[-1].completion.token_ids.ids) == 4096   # truncated
    client.embed(model=MODEL_ID, input=long, truncate=False)
    assert frontend.requests[-1].completion.text == long
    with pytest.raises(ollama.ResponseError, match="does not download models") as refused:
        client.pull(MODEL_ID)
    assert refused.value.status_code == 400
    response = httpx.post(gateway.url + "/api/pull", json={"model": "llama3"})
    assert response.status_code == 400 and "llama3" in response.json()["error"]


def test_the_routes_have_their_own_metric_labels():
    from gateway.metrics import route_label

    for path in ("/v1/embeddings", "/api/embed", "/api/embeddings", "/api/pull"):
        assert route_label(path) == path

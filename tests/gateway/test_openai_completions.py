"""/v1/completions and /v1/models through the openai SDK."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway.fake_frontend import MODEL_ID, ROOT, script


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def test_text_prompt(client, frontend):
    reply = client.completions.create(model="m", prompt="Once upon", max_tokens=5)
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert reply.choices[0].text == "Hello from Helios"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.total_tokens == 14
    sent = frontend.requests[-1]
    assert sent.completion.text == "Once upon" and sent.sampling.max_tokens == 5
    assert sent.parse_reasoning is False and sent.parse_tool_calls is False


def test_default_max_tokens_is_16(client, frontend):
    client.completions.create(model="m", prompt="x")
    assert frontend.requests[-1].sampling.max_tokens == 16


def test_token_ids_and_batches(client, frontend):
    client.completions.create(model="m", prompt=[1, 2, 3])
    assert list(frontend.requests[-1].completion.token_ids.ids) == [1, 2, 3]
    reply = client.completions.create(model="m", prompt=["a", "b"], n=2)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.usage.prompt_tokens == 22          # summed over both prompts
    prompts = sorted(r.completion.text for r in frontend.requests[-2:])
    assert prompts == ["a", "b"]
    reply = client.completions.create(model="m", prompt=[[5, 6], [7]])
    assert len(reply.choices) == 2


def test_echo_prepends_the_prompt(client):
    reply = client.completions.create(model="m", prompt="Say:", echo=True, logprobs=1)
    assert reply.choices[0].text == "Say:Hello from Helios"
    lp = reply.choices[0].logprobs
    assert lp.tokens == ["Hello", " from", " Helios"]
    assert lp.text_offset == [4, 9, 14]
    assert lp.top_logprobs[0] == {"Hello": -0.5, "x": -1.5}


def test_stream(client):
    chunks = list(client.completions.create(model="m", prompt=["p", "q"], stream=True,
                                            stream_options={"include_usage": True}))
    texts: dict[int, str] = {}
    for chunk in chunks:
        assert chunk.object == "text_completion"
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {0: "Hello from Helios", 1: "Hello from Helios"}
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 22


def test_stream_echo(client):
    chunks = list(client.completions.create(model="m", prompt="Say:", echo=True, stream=True))
    assert chunks[0].choices[0].text == "Say:"
    assert "".join(c.choices[0].text for c in chunks) == "Say:Hello from Helios"


def test_suffix_and_best_of_are_refused_with_their_param(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="m", prompt="x", suffix="tail")
    assert info.value.body["param"] == "suffix"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="m", prompt="x", best_of=3)
    assert info.value.body["param"] == "best_of"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="m", prompt=[])


def test_length_finish(client):
    reply = client.completions.create(model="m", prompt=script(finish="length"))
    assert reply.choices[0].finish_reason == "length"


def test_models_list_and_retrieve(client, gateway):
    models = client.models.list()
    card = models.data[0]
    assert card.id == MODEL_ID and card.object == "model" and card.owned_by == "helios"
    extra = card.model_dump()
    assert extra["max_model_len"] == 4096 and extra["root"] == ROOT
    assert extra["capabilities"] == {"tools": True, "vision": False, "reasoning": True}
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    # Repository ids with slashes resolve to the same card.
    response = httpx.get(f"{gateway.url}/v1/models/{ROOT}")
    assert response.status_code == 200 and response.json()["id"] == MODEL_ID
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.body["code"] == "model_not_found"
    assert httpx.get(f"{gateway.url}/v1/models/a/b/c").status_code == 404

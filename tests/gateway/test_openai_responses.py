"""/v1/responses through the openai SDK: stream events, stored responses, previous_response_id."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from gateway.config import GatewayConfig
from tests.gateway.fake_frontend import script
from tests.gateway.harness import GatewayThread

TOOL = {"type": "function", "name": "lookup", "description": "look something up",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def test_create_and_retrieve(client):
    response = client.responses.create(model="m", input="hi", instructions="be brief")
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "completed" and response.output_text == "Hello from Helios"
    assert response.usage.input_tokens == 11 and response.usage.output_tokens == 3
    assert response.usage.total_tokens == 14
    message = response.output[0]
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    again = client.responses.retrieve(response.id)
    assert again.id == response.id and again.output_text == "Hello from Helios"
    items = client.responses.input_items.list(response.id)
    assert items.data[0].type == "message" and items.data[0].content[0].text == "hi"


def test_previous_response_id_continues_the_conversation(client, frontend):
    first = client.responses.create(model="m", input="my name is Ada", instructions="sys A")
    client.responses.create(model="m", input="what is my name?", instructions="sys B",
                            previous_response_id=first.id)
    sent = frontend.requests[-1].chat.messages
    # Instructions are not carried over; the earlier turn and its answer are.
    assert [(m.role, m.text) for m in sent] == [
        ("system", "sys B"), ("user", "my name is Ada"), ("assistant", "Hello from Helios"),
        ("user", "what is my name?")]


def test_unknown_previous_response_id_is_an_error(client, frontend):
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="m", input="x", previous_response_id="resp_nope")
    assert info.value.body["param"] == "previous_response_id"
    assert frontend.requests == []    # nothing ran


def test_delete_and_store_false(client):
    response = client.responses.create(model="m", input="x")
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(response.id)
    unstored = client.responses.create(model="m", input="x", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_stream_events_are_ordered_and_numbered(client):
    content = script(reasoning=["r1", "r2"], text=["a", "b"],
                     tools=[{"name": "lookup", "id": "call_9", "arguments": ['{"q":', '"x"}']}],
                     finish="tool_calls")
    with client.responses.stream(model="m", input=content, tools=[TOOL]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(events)))
    assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")
    assert kinds.count("response.function_call_arguments.delta") == 2
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    call = final.output[2]
    assert (call.call_id, call.name, json.loads(call.arguments)) == ("call_9", "lookup",
                                                                     {"q": "x"})
    assert final.output[0].content[0].text == "r1r2" and final.output_text == "ab"


def test_stream_has_no_done_sentinel(gateway):
    with httpx.stream("POST", gateway.url + "/v1/responses",
                      json={"model": "m", "input": "x", "stream": True}) as response:
        lines = list(response.iter_lines())
    assert "data: [DONE]" not in lines
    names = [line[len("event: "):] for line in lines if line.startswith("event: ")]
    datas = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in datas]


def test_function_call_output_round_trip(client, frontend):
    client.responses.create(model="m", tools=[TOOL], input=[
        {"role": "user", "content": "find x"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"q":"x"}'},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_text", "text": "found "}, {"type": "input_text",
                                                              "text": "it"}]},
    ])
    sent = frontend.requests[-1].chat
    assert sent.tools[0].name == "lookup"
    roles = [m.role for m in sent.messages]
    assert roles == ["user", "assistant", "tool"]
    assert sent.messages[1].tool_calls[0].id == "c1"
    assert sent.messages[2].tool_call_id == "c1" and sent.messages[2].text == "found it"


def test_codex_effort_max_and_json_schema(client, frontend):
    client.responses.create(model="m", input="x", reasoning={"effort": "max"},  # type: ignore[typeddict-item]
                            text={"format": {"type": "json_schema", "name": "s",
                                             "schema": {"type": "object"}}},
                            max_output_tokens=20)
    sent = frontend.requests[-1]
    assert json.loads(sent.chat.chat_template_kwargs_json) == {"reasoning_effort": "max"}
    assert json.loads(sent.response_format.schema_json) == {"type": "object"}
    assert sent.sampling.max_tokens == 20


def test_length_makes_an_incomplete_response(client):
    response = client.responses.create(model="m", input=script(finish="length"))
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"


def test_background_is_refused(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="m", input="x", background=True)
    assert info.value.body["param"] == "background"


def test_redis_store_is_shared_by_replicas(fake_frontend, redis_url):
    config = GatewayConfig(frontend_address=fake_frontend.address, redis_url=redis_url)
    with GatewayThread(config) as one, GatewayThread(config) as two:
        first = openai.OpenAI(base_url=one.url + "/v1", api_key="x", max_retries=0)
        second = openai.OpenAI(base_url=two.url + "/v1", api_key="x", max_retries=0)
        created = first.responses.create(model="m", input="remember me")
        assert second.responses.retrieve(created.id).output_text == "Hello from Helios"
        second.responses.create(model="m", input="next", previous_response_id=created.id)
        sent = fake_frontend.servicer.requests[-1].chat.messages
        assert [m.text for m in sent] == ["remember me", "Hello from Helios", "next"]
        second.responses.delete(created.id)
        with pytest.raises(openai.NotFoundError):
            first.responses.retrieve(created.id)


def test_logprobs_on_request(client, frontend):
    response = client.responses.create(model="m", input="x",
                                       include=["message.output_text.logprobs"])
    assert frontend.requests[-1].sampling.logprobs
    logprobs = response.output[0].content[0].logprobs
    assert [lp.token for lp in logprobs] == ["Hello", " from", " Helios"]
    assert logprobs[0].top_logprobs == []
    response = client.responses.create(model="m", input="x", top_logprobs=2)
    assert [t.token for t in response.output[0].content[0].logprobs[0].top_logprobs] == \
        ["Hello", "x"]
    plain = client.responses.create(model="m", input="x")
    assert plain.output[0].content[0].logprobs == []


def test_redis_outage_keeps_the_answer_and_fails_retrieval_with_503(fake_frontend, tmp_path):
    from tests.support.redis_server import RedisServer

    with RedisServer.start(tmp_path / "redis") as redis_server:
        config = GatewayConfig(frontend_address=fake_frontend.address,
                               redis_url=redis_server.url)
        with GatewayThread(config) as gw:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
            stored = client.responses.create(model="m", input="before")
            redis_server.stop()
            # Generation does not depend on the table: the answer still arrives.
            response = client.responses.create(model="m", input="during the outage")
            assert response.output_text == "Hello from Helios"
            with pytest.raises(openai.InternalServerError) as info:
                client.responses.retrieve(stored.id)
            assert info.value.status_code == 503
            assert info.value.response.headers["retry-after"]

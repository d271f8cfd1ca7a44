"""Structured outputs end to end: the official OpenAI, Anthropic and Ollama SDKs against the
real four services (`helios run --demo`).

The demo model has random weights: unconstrained, it writes gibberish. So every document below
that parses and validates, and every tool call whose arguments match its tool's schema, is the
grammar's doing. Schemas keep every value short (maxLength, enums, ranges): the model samples
about uniformly among the tokens a grammar allows, so an unbounded string could outlast any
token budget. Thinking is turned off where the template offers it (the grammar would allow a
thinking block first, which a random model may never close).
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import ollama
import openai
import pytest

MODEL = "helios-demo"
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "member": {"type": "boolean"}},
    "required": ["name", "age", "member"], "additionalProperties": False}
ORDER = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 1, "maximum": 999},
    "status": {"enum": ["open", "paid", "shipped"]},
    "lines": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
        "type": "object", "properties": {"sku": {"type": "string", "maxLength": 5},
                                         "qty": {"type": "integer", "minimum": 1,
                                                 "maximum": 9}},
        "required": ["sku", "qty"], "additionalProperties": False}}},
    "required": ["id", "status", "lines"], "additionalProperties": False}
SCALE = {"type": "object", "properties": {
    "ratio": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.125},
    "labels": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "minItems": 2,
               "maxItems": 2},
    "note": {"type": ["string", "null"], "maxLength": 4}},
    "required": ["ratio", "labels", "note"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {
    "city": {"enum": ["Oslo", "Lima", "Pune"]}, "days": {"type": "integer", "minimum": 1,
                                                          "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
TOOLS = {"get_weather": WEATHER, "place_order": ORDER}
pytestmark = pytest.mark.timeout(600)


def openai_tools():
    return [{"type": "function", "function": {"name": name, "parameters": schema,
                                              "strict": True}}
            for name, schema in TOOLS.items()]


def ask(oai, **fields):
    fields.setdefault("max_tokens", 250)
    fields.setdefault("extra_body", NO_THINK)
    return oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Answer."}], temperature=1.0,
        **fields)


def test_json_schema_outputs_validate_through_openai_chat(oai):
    for seed, schema in enumerate((PERSON, ORDER, SCALE)):
        reply = ask(oai, seed=seed, n=2, response_format={
            "type": "json_schema", "json_schema": {"name": "doc", "schema": schema,
                                                   "strict": True}})
        for choice in reply.choices:
            assert choice.finish_reason == "stop"
            jsonschema.validate(json.loads(choice.message.content), schema)
    chunks = list(ask(oai, seed=7, stream=True, response_format={
        "type": "json_schema", "json_schema": {"name": "doc", "schema": ORDER}}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), ORDER)


def test_json_object_mode_and_seeded_reproducibility(oai):
    reply = ask(oai, seed=3, n=4, max_tokens=150, response_format={"type": "json_object"})
    finished = [c for c in reply.choices if c.finish_reason == "stop"]
    assert finished
    for choice in finished:
        assert isinstance(json.loads(choice.message.content), dict)
    schema_format = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    first = ask(oai, seed=11, response_format=schema_format).choices[0].message.content
    again = ask(oai, seed=11, response_format=schema_format).choices[0].message.content
    other = ask(oai, seed=12, response_format=schema_format).choices[0].message.content
    assert first == again and first != other


def test_vllm_structured_outputs_regex_and_choice(oai):
    regex = ask(oai, seed=1, extra_body={**NO_THINK,
                                         "structured_outputs": {"regex": "[A-F]{3}-[0-9]{3}"}})
    text = regex.choices[0].message.content
    assert len(text) == 7 and text[3] == "-" and text[:3].isupper() and text[4:].isdigit()
    choice = ask(oai, seed=2, extra_body={**NO_THINK,
                                          "structured_outputs": {"choice": ["left", "right"]}})
    assert choice.choices[0].message.content in ("left", "right")


def check_call(name: str, arguments) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, TOOLS[name])


def test_openai_tool_choice_required_and_named(oai):
    reply = ask(oai, seed=4, tools=openai_tools(), tool_choice="required", max_tokens=300)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        check_call(call.function.name, call.function.arguments)
    named = ask(oai, seed=5, tools=openai_tools(), max_tokens=300,
                tool_choice={"type": "function", "function": {"name": "place_order"}})
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "place_order" and named.choices[0].finish_reason == "tool_calls"
    check_call("place_order", call.function.arguments)


def test_responses_text_format_and_required_tool_choice(oai):
    reply = oai.responses.create(
        model=MODEL, input="Answer.", temperature=1.0, max_output_tokens=250,
        reasoning={"effort": "none"},
        text={"format": {"type": "json_schema", "name": "p", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(reply.output_text), PERSON)
    calls = oai.responses.create(
        model=MODEL, input="Answer.", temperature=1.0, max_output_tokens=300,
        reasoning={"effort": "none"}, tool_choice="required",
        tools=[{"type": "function", "name": n, "parameters": s, "strict": True}
               for n, s in TOOLS.items()])
    items = [item for item in calls.output if item.type == "function_call"]
    assert items
    for item in items:
        check_call(item.name, item.arguments)


def test_anthropic_tool_choice_any_and_tool(claude):
    tools = [{"name": n, "description": n, "input_schema": s} for n, s in TOOLS.items()]
    # one call each (unseeded: the Messages API has no seed), so the budget always suffices
    for choice in ({"type": "any", "disable_parallel_tool_use": True},
                   {"type": "tool", "name": "get_weather"}):
        reply = claude.messages.create(
            model=MODEL, max_tokens=300, tools=tools, tool_choice=choice,
            thinking={"type": "disabled"}, messages=[{"role": "user", "content": "Go."}])
        uses = [block for block in reply.content if block.type == "tool_use"]
        assert reply.stop_reason == "tool_use" and len(uses) == 1
        for block in uses:
            check_call(block.name, block.input)
        if choice["type"] == "tool":
            assert [b.name for b in uses] == ["get_weather"]


def test_ollama_format_json_and_schema(stack):
    client = ollama.Client(host=stack.url)
    reply = client.chat(model=MODEL, messages=[{"role": "user", "content": "Answer."}],
                        format=SCALE, think=False, stream=False,
                        options={"seed": 6, "temperature": 1.0, "num_predict": 250})
    jsonschema.validate(json.loads(reply.message.content), SCALE)
    reply = client.chat(model=MODEL, messages=[{"role": "user", "content": "Answer."}],
                        format="json", think=False, stream=False,
                        options={"seed": 3, "temperature": 1.0, "num_predict": 150})
    if reply.done_reason == "stop":
        assert isinstance(json.loads(reply.message.content), dict)
    else:
        assert reply.message.content.startswith("{")


def test_invalid_schemas_are_bad_requests(oai, claude):
    with pytest.raises(openai.BadRequestError, match="objekt"):
        ask(oai, response_format={"type": "json_schema", "json_schema": {
            "name": "bad", "schema": {"type": "objekt"}}})
    with pytest.raises(openai.BadRequestError, match="regex"):
        ask(oai, extra_body={**NO_THINK, "structured_outputs": {"regex": "[a-"}})
    with pytest.raises(anthropic.BadRequestError, match="Unsatisfiable"):
        claude.messages.create(
            model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "Go."}],
            output_config={"format": {"type": "json_schema", "schema": {
                "type": "integer", "minimum": 3, "maximum": 1}}})
    # the stack still serves constrained and free requests afterwards
    assert ask(oai, seed=1, max_tokens=5).choices[0].finish_reason == "length"


def test_cut_off_forced_tool_call_is_partial_never_text(oai):
    """A forced call cut off by max_tokens: finish_reason length, the partial call as a tool
    call (its name so far, the arguments prefix), no `<tool_call>` text in content."""
    named = {"type": "function", "function": {"name": "place_order"}}
    reply = ask(oai, seed=21, tools=openai_tools(), max_tokens=8, tool_choice=named)
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 8
    assert not choice.message.content
    (call,) = choice.message.tool_calls
    assert "place_order".startswith(call.function.name)
    chunks = list(ask(oai, seed=21, tools=openai_tools(), max_tokens=8, tool_choice=named,
                      stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not "".join(d.content or "" for d in deltas)
    calls = [t for d in deltas for t in d.tool_calls or ()]
    assert calls and calls[0].function.name == call.function.name
    assert "".join(t.function.arguments or "" for t in calls) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "length"


def test_cut_off_tool_call_does_not_poison_the_conversation(oai):
    """Responses: the cut-off call is an `incomplete` function_call item; the next turn with
    previous_response_id (and a client replaying the output as input) still succeeds."""
    tools = [{"type": "function", "name": n, "parameters": s, "strict": True}
             for n, s in TOOLS.items()]
    forced = {"type": "function", "name": "place_order"}
    cut = oai.responses.create(model=MODEL, input="Order.", temperature=1.0,
                               max_output_tokens=10, reasoning={"effort": "none"},
                               tool_choice=forced, tools=tools)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    (item,) = [i for i in cut.output if i.type == "function_call"]
    assert item.status == "incomplete" and "place_order".startswith(item.name)
    assert cut.usage.output_tokens == 10
    follow = oai.responses.create(model=MODEL, previous_response_id=cut.id, input="Go on.",
                                  max_output_tokens=4, reasoning={"effort": "none"},
                                  tools=tools)
    assert follow.status in ("completed", "incomplete") and follow.usage.input_tokens > 0
    again = oai.responses.create(model=MODEL, previous_response_id=follow.id, input="More.",
                                 max_output_tokens=4, reasoning={"effort": "none"},
                                 tools=tools)
    assert again.usage.input_tokens > follow.usage.input_tokens
    replayed = oai.responses.create(
        model=MODEL, max_output_tokens=4, reasoning={"effort": "none"}, tools=tools,
        input=[{"role": "user", "content": "Order."},
               *[i.model_dump(exclude_none=True) for i in cut.output],
               {"role": "user", "content": "Go on."}])
    assert replayed.status in ("completed", "incomplete")
    with oai.responses.stream(model=MODEL, input="Order.", temperature=1.0,
                              max_output_tokens=10, reasoning={"effort": "none"},
                              tool_choice=forced, tools=tools) as stream:
        events = list(stream)
    done = [e for e in events if e.type == "response.output_item.done"]
    assert done[-1].item.type == "function_call" and done[-1].item.status == "incomplete"
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.usage.output_tokens == 10

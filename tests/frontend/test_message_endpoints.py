"""Message token endpoints: where the preamble and each complete message end, in tokens."""

from __future__ import annotations

import pytest
from google.protobuf import json_format

from services.common.api.chat import ChatInput, ChatMessage
from services.common.api.convert import chat_input_from_pb as chat_from_pb
from services.common.pb import frontend_pb2
from services.frontend.chat import template_data
from services.frontend.chat.endpoints import OffsetSpans, token_ends
from services.frontend.chat.renderer import ChatRenderer, ChatTemplateError
from services.frontend.chat.template import ChatTemplate
from tests.frontend.conftest import ASSET_NAMES, frontend_assets
from tests.frontend.fixtures.chat_cases import CASES

PAIRS = [(asset, case) for asset in ASSET_NAMES for case in CASES]


def _render(asset: str, case: dict):
    loaded = frontend_assets(asset)
    renderer = ChatRenderer(loaded.tokenizer, loaded.templates)
    chat = chat_from_pb(json_format.ParseDict(case, frontend_pb2.ChatInput()))
    return loaded, renderer, chat, renderer.render(chat)


@pytest.mark.parametrize(("asset", "case_name"), PAIRS)
def test_endpoints_are_clean_token_cuts(asset, case_name):
    try:
        loaded, _renderer, _chat, rendered = _render(asset, CASES[case_name])
    except ChatTemplateError:
        pytest.skip("the template rejects this case (covered by the parity test)")
    ids, ends = rendered.token_ids, rendered.message_token_ends
    assert list(ends) == sorted(set(ends))
    assert all(0 < k < len(ids) for k in ends)
    decode = loaded.tokenizer.decode
    offsets = loaded.tokenizer.encode_with_offsets(rendered.prompt).offsets
    full = decode(ids, skip_special_tokens=False)
    for k in ends:
        cut = offsets[k][0]
        assert all(end <= cut for _, end in offsets[:k])
        assert decode(ids[:k], skip_special_tokens=False) + decode(
            ids[k:], skip_special_tokens=False) == full
        # Tokenizing the prompt's head alone gives exactly the first k ids: no token crosses.
        assert loaded.tokenizer.encode(rendered.prompt[:cut]) == ids[:k]


@pytest.mark.parametrize(("asset", "case_name"), PAIRS)
def test_every_stable_message_prefix_is_an_endpoint(asset, case_name):
    """Slow reference: render each prefix of the conversation (ending in a non-system message)
    on its own. Where that text is a prefix of the full prompt and falls between tokens, its
    token count must be an endpoint."""
    try:
        loaded, renderer, chat, rendered = _render(asset, CASES[case_name])
    except ChatTemplateError:
        pytest.skip("the template rejects this case")
    if chat.continue_final_message:
        pytest.skip("continuation cuts the final message")
    if any(m.role == "tool" or m.tool_calls for m in chat.messages):
        pytest.skip("templates close tool-result groups in the next message's text")
    encoding = loaded.tokenizer.encode_with_offsets(rendered.prompt)
    expected = []
    for count in range(1, len(chat.messages)):
        if chat.messages[count - 1].role == "system":
            continue  # templates may merge system messages into one preamble
        head = ChatInput(messages=chat.messages[:count], tools=chat.tools,
                         tool_choice=chat.tool_choice, add_generation_prompt=False,
                         template_kwargs=chat.template_kwargs, documents=chat.documents)
        try:
            text, _ = renderer.render_text(head)
        except ChatTemplateError:
            continue
        if text and rendered.prompt.startswith(text) and len(text) < len(rendered.prompt):
            expected.extend(token_ends(encoding.spans, len(encoding.ids), [len(text)]))
    assert set(expected) <= set(rendered.message_token_ends)
    has_head = any(m.role != "system" for m in chat.messages[:-1])
    if asset in ("llama3_1", "gemma3", "deepseek_v3") and has_head:
        assert expected, "append-only templates must yield message endpoints"


def test_token_ends_drop_cuts_inside_tokens_and_shared_spans():
    # tokens: "ab" | "c" | emoji split over two tokens sharing the span 3..4 | "d"
    spans = OffsetSpans([(0, 2), (2, 3), (3, 4), (3, 4), (4, 5)])
    assert token_ends(spans, 5, [1, 2, 3, 4]) == (1, 2, 4)
    assert token_ends(spans, 5, [0, 5]) == ()          # not strictly inside
    assert token_ends(spans, 5, [2, 2, 3]) == (1, 2)   # unique
    assert token_ends(OffsetSpans([(0, 3)]), 1, [1]) == ()
    assert token_ends(OffsetSpans([]), 0, [1]) == ()
    # a character no token covers (dropped by normalization) gives no endpoint
    assert token_ends(OffsetSpans([(0, 1), (2, 3)]), 2, [1]) == ()


def _custom(source: str, messages: list[ChatMessage], **options):
    template = ChatTemplate(source)
    chat = ChatInput(messages=tuple(messages))
    return template, template.render(template_data.messages_data(chat), tools=None,
                                     documents=None, add_generation_prompt=False,
                                     continue_final_message=False, kwargs=options)


MESSAGES = [ChatMessage("system", "S"), ChatMessage("user", "U1"),
            ChatMessage("assistant", "A1"), ChatMessage("user", "U2")]


def test_marks_follow_aliases_and_skip_continue():
    source = ("{% if messages[0].role == 'system' %}[{{ messages[0].content }}]"
              "{% set loop_messages = messages[1:] %}{% else %}"
              "{% set loop_messages = messages %}{% endif %}"
              "{% for m in loop_messages %}{% if m.role == 'assistant' %}{% continue %}{% endif %}"
              "<{{ m.content }}>{% endfor %}!")
    template, rendered = _custom(source, MESSAGES)
    assert template.num_marked_loops == 1
    assert rendered.prompt == "[S]<U1><U2>!"
    # preamble end (3), after U1 (7), after U2 (11); the skipped assistant adds no mark
    assert rendered.char_ends == (3, 7, 11)


def test_marks_ignore_macros_captures_reversed_and_nested_loops():
    source = ("{% macro show(ms) %}{% for m in ms %}({{ m.content }}){% endfor %}{% endmacro %}"
              "{% set captured %}{% for m in messages %}{{ m.content }}{% endfor %}{% endset %}"
              "{% for m in messages[::-1] %}{{ m.content }}{% endfor %}"
              "|{{ show(messages) }}|{{ captured | lower }}|"
              "{% for m in messages %}{% for n in messages %}.{% endfor %}{{ m.role[0] }}"
              "{% endfor %}")
    template, rendered = _custom(source, MESSAGES)
    assert template.num_marked_loops == 1   # only the last, top-level, in-order loop
    prefix = "U2A1U1S|(S)(U1)(A1)(U2)|su1a1u2|"
    assert rendered.prompt == prefix + "....s....u....a....u"
    start = len(prefix)
    assert rendered.char_ends == (start, start + 5, start + 10, start + 15)


def test_generation_blocks_emit_their_body_only():
    source = ("{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
              "{% set inner = 'x' %}<{{ m.content }}>{% endgeneration %}{% else %}"
              "{{ m.content }}{% endif %}{% endfor %}{{ inner is defined }}")
    _, rendered = _custom(source, MESSAGES)
    assert rendered.prompt == "SU1<A1>U2False"
    assert rendered.char_ends == (1, 3, 7, 9)

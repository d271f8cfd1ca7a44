"""A tool call cut off by the length limit is a partial call, never raw text in content.

At the parsers (every chunking) and through `ChoiceProcessor` with the real Qwen3 tokenizer:
output that ends inside a call object becomes a tool-call delta with the name as far as it was
written and the arguments prefix; the same text ending normally (not truncated) still comes
back as text, as before.
"""

from __future__ import annotations

import pytest

from services.common.api.events import Finish, FinishReason, TextDelta, ToolCallDelta
from services.frontend.generate.choice import ChoiceProcessor
from services.frontend.generate.types import ChoiceStep, OutputOptions
from services.frontend.parsers.deepseek_v3 import DeepSeekV3ToolParser
from services.frontend.parsers.hermes import HermesToolParser
from services.frontend.parsers.llama3_json import Llama3JsonToolParser
from services.frontend.parsers.tool_calls import ContentText
from services.frontend.parsers.tool_calls import ToolCallDelta as Item
from tests.frontend.conftest import frontend_assets

TOOLS = frozenset({"get_weather", "search"})
B, SEP = "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"
CB = "<｜tool▁call▁begin｜>"


def parse(parser, text: str, cut: int | None, truncated: bool):
    chunks = [text] if cut is None else [text[:cut], text[cut:]]
    items = [item for chunk in chunks for item in parser.push(chunk)]
    items += parser.flush(truncated=truncated)
    content = "".join(i.text for i in items if isinstance(i, ContentText))
    calls = [i for i in items if isinstance(i, Item)]
    return content, calls, parser


@pytest.mark.parametrize(("make", "text", "name", "arguments"), [
    (HermesToolParser, "<tool_call>", "", ""),
    (HermesToolParser, '<tool_call>\n{"na', "", ""),
    (HermesToolParser, '<tool_call>\n{"name": "get_wea', "get_wea", ""),
    (HermesToolParser, '<tool_call>\n{"name": "search", "argu', "search", ""),
    (HermesToolParser, '<tool_call>\n{"name": "search", "arguments": {"q', "search", '{"q'),
    (Llama3JsonToolParser, '{"name": "search", "parameters": {"q": "x', "search", '{"q": "x'),
    (DeepSeekV3ToolParser, f"{B}{CB}function{SEP}get_w", "get_w", ""),
    (DeepSeekV3ToolParser, f"{B}{CB}sear", "sear", ""),
])
def test_cut_off_call_is_a_partial_call(make, text, name, arguments):
    for cut in (None, *range(1, len(text))):
        content, calls, parser = parse(make(TOOLS), text, cut, truncated=True)
        assert content == "", (cut, content)
        assert calls[0].name == name and calls[0].id.startswith("call_")
        assert "".join(c.arguments for c in calls) == arguments
        assert parser.num_calls == 1 and parser.completed_calls == 0


def test_same_text_not_truncated_is_still_text():
    text = '<tool_call>\n{"name": "get_wea'
    content, calls, _ = parse(HermesToolParser(TOOLS), text, None, truncated=False)
    assert content == text and calls == []


def test_cut_off_text_that_cannot_be_an_offered_call_stays_text():
    text = '<tool_call>\n{"name": "rm_r'
    content, calls, _ = parse(HermesToolParser(TOOLS), text, None, truncated=True)
    assert content == text and calls == []


def test_choice_cut_off_by_length_inside_a_forced_call():
    tokenizer = frontend_assets("qwen3").tokenizer
    ids = tokenizer.encode('<tool_call>\n{"name": "search", "arguments": {"q": "pa')
    options = OutputOptions(tool_parser="hermes", tool_names=TOOLS, logprobs=False)
    processor = ChoiceProcessor(0, tokenizer, options)
    events = processor.process(ChoiceStep(0, tuple(ids), finish_reason=FinishReason.LENGTH))
    assert not any(isinstance(e, TextDelta) and e.text for e in events)
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert calls[0].name == "search"
    assert "".join(c.arguments for c in calls) == '{"q": "pa'
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.reason is FinishReason.LENGTH

"""Content as a list of text parts: each template gets the form it reads (content_format.py).

Detection from the syntax tree (synthetic templates and every pinned one), and live parity
with transformers' apply_chat_template on the same multi-part conversation: templates that walk
parts get the list (compared with transformers on the list and on plain strings), string
templates get text parts joined with newlines (compared with transformers on that string).
"""

from __future__ import annotations

import pytest

from services.common.api.chat import ChatInput, ChatMessage, ImagePart, TextPart
from services.common.assets import PINNED, fetch
from services.frontend.chat.content_format import ContentFormat
from services.frontend.chat.renderer import ChatRenderer
from services.frontend.chat.template import ChatTemplate
from tests.frontend.conftest import ASSET_NAMES, frontend_assets
from tests.frontend.fixtures.chat_cases import CONTENT_FORMATS
from tests.frontend.test_vision import VL_TEMPLATE

OPENAI_TEMPLATES = [
    "{% for m in messages %}{% for c in m['content'] %}{{ c.text }}{% endfor %}{% endfor %}",
    "{% for m in messages %}{% for c in m.content | selectattr('type', 'equalto', 'text') %}"
    "{{ c.text }}{% endfor %}{% endfor %}",
    "{{ messages[0]['content'][0]['text'] }}",
    "{% for m in messages %}{% if m.content[0]['type'] == 'text' %}x{% endif %}{% endfor %}",
    "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% set c = m.content %}"
    "{% for p in c %}{{ p.text }}{% endfor %}{% endfor %}",
    "{% for m in messages | selectattr('role', 'equalto', 'user') %}"
    "{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endfor %}",
    VL_TEMPLATE,
]
STRING_TEMPLATES = [
    "{% for m in messages %}{{ m.role + ': ' + m.content }}{% endfor %}",
    "{% for m in messages %}{{ m['content'] | trim }}{% endfor %}",
    "{% for m in messages %}{% if '</think>' in m.content %}{{ m.content.split('</think>')[-1] }}"
    "{% endif %}{% endfor %}",
    # iterating over something else that is called content is not the message's content
    "{% set content = ['a', 'b'] %}{% for c in content %}{{ c }}{% endfor %}"
    "{% for m in messages %}{{ m.content }}{% endfor %}",
    "{% for m in messages %}{% for call in m.tool_calls %}{{ call.name }}{% endfor %}"
    "{{ m.content }}{% endfor %}",
]


@pytest.mark.parametrize("source", OPENAI_TEMPLATES)
def test_templates_that_walk_parts_are_openai(source):
    assert ChatTemplate(source).content_format is ContentFormat.OPENAI


@pytest.mark.parametrize("source", STRING_TEMPLATES)
def test_templates_that_read_strings_are_string(source):
    assert ChatTemplate(source).content_format is ContentFormat.STRING


def test_every_pinned_template_is_detected_as_specified():
    # gptoss is pinned for its tokenizer; its harmony template is our own (test_harmony.py)
    assert set(CONTENT_FORMATS) == set(PINNED) - {"gptoss"} == set(ASSET_NAMES)
    for asset in ASSET_NAMES:
        for template in frontend_assets(asset).templates.values():
            assert template.content_format.value == CONTENT_FORMATS[asset], asset


# guidellm, the Agents SDK, pydantic-ai and LangChain send every message's text as parts.
CONVERSATION = [
    ("system", ("You are terse.", "Answer in English.")),
    ("user", ("First question?",)),
    ("assistant", ("First", "answer.")),
    ("user", ("Part one.", " Part two ", "Part three ünïcödé.")),
]


def parts_chat() -> ChatInput:
    return ChatInput(messages=tuple(
        ChatMessage(role=role, content=tuple(TextPart(t) for t in texts))
        for role, texts in CONVERSATION))


def string_chat() -> ChatInput:
    return ChatInput(messages=tuple(ChatMessage(role=role, content="\n".join(texts))
                                    for role, texts in CONVERSATION))


def hf_messages(form: str) -> list[dict]:
    if form == "parts":
        return [{"role": role, "content": [{"type": "text", "text": t} for t in texts]}
                for role, texts in CONVERSATION]
    return [{"role": role, "content": "\n".join(texts)} for role, texts in CONVERSATION]


@pytest.fixture(scope="module")
def hf_tokenizers():
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    loaded: dict[str, object] = {}

    def get(asset: str):
        if asset not in loaded:
            loaded[asset] = AutoTokenizer.from_pretrained(str(fetch(asset)))
        return loaded[asset]
    return get


@pytest.mark.parametrize("asset", ASSET_NAMES)
def test_text_parts_render_as_transformers_does(asset, hf_tokenizers):
    loaded = frontend_assets(asset)
    renderer = ChatRenderer(loaded.tokenizer, loaded.templates)
    hf = hf_tokenizers(asset)
    ours_parts = renderer.render(parts_chat())
    if CONTENT_FORMATS[asset] == "openai":
        expected = hf.apply_chat_template(hf_messages("parts"), tokenize=False,
                                          add_generation_prompt=True)
        assert ours_parts.prompt == expected
        # and the string form of the same conversation, as transformers renders strings
        ours_string = renderer.render(string_chat())
        assert ours_string.prompt == hf.apply_chat_template(
            hf_messages("string"), tokenize=False, add_generation_prompt=True)
    else:
        expected = hf.apply_chat_template(hf_messages("string"), tokenize=False,
                                          add_generation_prompt=True)
        assert ours_parts.prompt == expected
        assert ours_parts.prompt == renderer.render(string_chat()).prompt
        assert "Part one.\n Part two \nPart three" in ours_parts.prompt
    assert ours_parts.token_ids == hf(ours_parts.prompt, add_special_tokens=False)["input_ids"]


def test_images_with_text_stay_parts_on_a_vision_template(qwen3):
    renderer = ChatRenderer(qwen3.tokenizer, {"default": ChatTemplate(VL_TEMPLATE)})
    chat = ChatInput(messages=(ChatMessage(role="user", content=(
        TextPart("Look:"), ImagePart(url="data:image/png;base64,AA=="), TextPart("What?"))),))
    rendered = renderer.render(chat)
    assert rendered.prompt == ("<|im_start|>userLook:<|vision_start|><|image_pad|>"
                               "<|vision_end|>What?<|im_end|>\n<|im_start|>assistant")
    assert rendered.num_images == 1


def test_the_real_smollm2_chatml_template_joins_text_parts(smollm2_gguf, hf_tokenizers):
    """The real GGUF checkpoint's ChatML template (tests/conftest.py) reads strings."""
    from transformers import AutoTokenizer

    from services.common.core import TOKENIZER_ROLES, open_model
    from services.frontend.assets import load_assets

    source = open_model(smollm2_gguf, verify=TOKENIZER_ROLES)
    loaded = load_assets(source)
    assert [t.content_format for t in loaded.templates.values()] == [ContentFormat.STRING]
    renderer = ChatRenderer(loaded.tokenizer, loaded.templates)
    hf = AutoTokenizer.from_pretrained(str(source.root))
    assert renderer.render(parts_chat()).prompt == hf.apply_chat_template(
        hf_messages("string"), tokenize=False, add_generation_prompt=True)

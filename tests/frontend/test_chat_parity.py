"""Chat rendering is byte-identical to transformers' apply_chat_template on the pinned templates.

Golden files (fixtures/chat/<asset>.json) were produced by fixtures/generate_chat_fixtures.py
with transformers; each case goes through the frontend's real path: proto JSON -> ChatInput
(convert.py) -> ChatRenderer -> prompt, token ids, decoded text, or the same template error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import json_format

from services.common.api.convert import chat_input_from_pb as chat_from_pb
from services.common.pb import frontend_pb2
from services.frontend.chat.renderer import ChatRenderer, ChatTemplateError
from tests.frontend.conftest import ASSET_NAMES, frontend_assets
from tests.frontend.fixtures.chat_cases import CASES, CONTENT_FORMATS

GOLDEN_DIR = Path(__file__).parent / "fixtures" / "chat"


def golden(asset: str) -> dict:
    return json.loads((GOLDEN_DIR / f"{asset}.json").read_text())


def chat_input(case: dict):
    return chat_from_pb(json_format.ParseDict(case, frontend_pb2.ChatInput()))


PAIRS = [(asset, case) for asset in ASSET_NAMES for case in CASES]


def test_goldens_cover_every_case_and_pinned_asset():
    from services.common.assets import PINNED

    for asset in ASSET_NAMES:
        data = golden(asset)
        assert set(data["cases"]) == set(CASES), "regenerate the fixtures"
        assert data["asset_sha256"] == PINNED[asset].sha256


@pytest.mark.parametrize(("asset", "case_name"), PAIRS)
def test_render_matches_transformers(asset: str, case_name: str):
    expected = golden(asset)["cases"][case_name]
    loaded = frontend_assets(asset)
    renderer = ChatRenderer(loaded.tokenizer, loaded.templates)
    chat = chat_input(CASES[case_name])
    if "error" in expected:
        with pytest.raises(ChatTemplateError) as info:
            renderer.render(chat)
        cause = info.value.__cause__
        assert type(cause).__name__ == expected["error"]["type"]
        assert str(cause) == expected["error"]["message"]
        assert info.value.param == "messages"
        return
    rendered = renderer.render(chat)
    assert rendered.prompt.encode() == expected["prompt"].encode()
    assert rendered.token_ids == expected["token_ids"]
    tokenizer = loaded.tokenizer
    assert tokenizer.decode(rendered.token_ids, skip_special_tokens=False) == expected["decoded"]
    assert tokenizer.decode(rendered.token_ids) == expected["decoded_skip_special"]
    streamed = tokenizer.detokenizer(skip_special_tokens=False)
    text = "".join(streamed.push(t) for t in rendered.token_ids) + streamed.flush()
    assert text == expected["decoded"]


@pytest.mark.parametrize("asset", ASSET_NAMES)
def test_goldens_are_what_transformers_renders_now(asset):
    """Live: the installed transformers still produces the committed goldens."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from services.common.assets import fetch
    from tests.frontend.fixtures.generate_chat_fixtures import render_case

    hf_logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(str(fetch(asset)))
    expected = golden(asset)["cases"]
    for case_name, case in CASES.items():
        assert render_case(tokenizer, case, CONTENT_FORMATS[asset]) == expected[case_name], \
            case_name

"""Asset loading: fingerprints over the bytes parsed, template choice, parser choice."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from services.common.api.chat import ChatInput, ChatMessage, ToolDefinition
from services.common.core import TOKENIZER_ROLES, open_model
from services.common.errors import ManifestError, ValidationError
from services.frontend.assets import load_assets
from services.frontend.chat import template_data
from services.frontend.config import FrontendConfig
from services.frontend.model import FrontendModel
from services.frontend.parsers.select import choose_reasoning_parser, choose_tool_parser
from tests.frontend.conftest import ASSET_NAMES, frontend_assets


@pytest.fixture
def core_copy(tmp_path, demo_core):
    target = tmp_path / "core"
    shutil.copytree(demo_core, target)
    return target


def test_fingerprints_match_the_manifest(demo_core):
    source = open_model(demo_core, verify=TOKENIZER_ROLES)
    loaded = load_assets(source)
    manifest = {fp.path: fp.sha256 for fp in source.manifest.files}
    assert loaded.fingerprints == {name: manifest[name]
                                   for name in ("tokenizer.json", "tokenizer_config.json")}
    assert set(loaded.templates) == {"default"}


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_file_changed_after_verification_is_refused(core_copy, name):
    source = open_model(core_copy, verify=TOKENIZER_ROLES)
    path = core_copy / name
    data = json.loads(path.read_text())
    data["tampered"] = True
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError) as info:
        load_assets(source)
    assert info.value.param == name and "fingerprint" in info.value.message


def test_named_templates_choose_tool_use_with_tools(tmp_path, demo_model_dir):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for item in demo_model_dir.iterdir():
        if item.name != "tokenizer_config.json":
            os.link(item, model_dir / item.name)
    config = json.loads((demo_model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": config["chat_template"]},
                               {"name": "tool_use", "template": "TOOLS {{ tools | length }}"}]
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    model = FrontendModel.load(open_model(model_dir))
    assert set(model.assets.templates) == {"default", "tool_use"}
    with_tools = ChatInput((ChatMessage("user", "x"),), tools=(ToolDefinition("f"),))
    assert model.renderer.render_text(with_tools)[0] == "TOOLS 1"
    plain = ChatInput((ChatMessage("user", "x"),))
    assert model.renderer.render_text(plain)[0].startswith("<|im_start|>user")


@pytest.mark.parametrize("asset", ASSET_NAMES)
def test_parser_choice_follows_the_template(asset):
    loaded = frontend_assets(asset)
    template = loaded.templates["default"].source
    model_type = {"qwen3": "qwen3", "llama3_1": "llama", "deepseek_v3": "deepseek_v3",
                  "gemma3": "gemma3_text"}[asset]
    tool = choose_tool_parser("auto", model_type=model_type, architecture="", template=template)
    reasoning = choose_reasoning_parser("auto", template=template,
                                        vocabulary=set(loaded.tokenizer.added_tokens.values()))
    assert tool == {"qwen3": "hermes", "llama3_1": "llama3_json", "deepseek_v3": "deepseek_v3",
                    "gemma3": ""}[asset]
    assert reasoning == ("think" if asset == "qwen3" else "")
    assert choose_tool_parser("none", model_type=model_type, architecture="",
                              template=template) == ""
    assert choose_tool_parser("hermes", model_type=model_type, architecture="",
                              template=template) == "hermes"
    with pytest.raises(ValidationError):
        choose_tool_parser("bogus", model_type="", architecture="", template="")


def test_template_kwargs_precedence():
    chat = ChatInput((ChatMessage("user", "x"),), template_kwargs={"enable_thinking": True})
    kwargs = template_data.template_kwargs(chat, {"bos_token": "<s>", "enable_thinking": "?"},
                                           {"enable_thinking": False, "custom": 1})
    assert kwargs == {"bos_token": "<s>", "enable_thinking": True, "custom": 1}
    with pytest.raises(ValidationError) as info:
        template_data.template_kwargs(ChatInput((), template_kwargs={"tools": []}), {}, {})
    assert info.value.param == "chat_template_kwargs"


def test_config_validates_default_template_kwargs():
    config = FrontendConfig(model="m", default_chat_template_kwargs='{"enable_thinking": false}')
    assert config.default_template_kwargs == {"enable_thinking": False}
    for bad in ("[1]", "{nope"):
        with pytest.raises(ValidationError):
            FrontendConfig(model="m", default_chat_template_kwargs=bad)

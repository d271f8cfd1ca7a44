"""Frontend fixtures: pinned tokenizer assets loaded as the frontend loads them."""

from __future__ import annotations

import pytest

from services.common import assets
from services.frontend.assets import FrontendAssets, load_tokenizer_dir
from services.frontend.chat.renderer import ChatRenderer

ASSET_NAMES = ("qwen3", "llama3_1", "deepseek_v3", "gemma3")
_LOADED: dict[str, FrontendAssets] = {}


def frontend_assets(name: str) -> FrontendAssets:
    """Pinned tokenizer + template, loaded once per test session."""
    if name not in _LOADED:
        _LOADED[name] = load_tokenizer_dir(assets.fetch(name))
    return _LOADED[name]


@pytest.fixture(params=ASSET_NAMES)
def asset_name(request) -> str:
    return request.param


@pytest.fixture
def qwen3() -> FrontendAssets:
    return frontend_assets("qwen3")


@pytest.fixture
def qwen3_renderer(qwen3) -> ChatRenderer:
    return ChatRenderer(qwen3.tokenizer, qwen3.templates)


@pytest.fixture(scope="session")
def demo_frontend_model(demo_core):
    """The demo core's FrontendModel, loaded once (the tokenizer takes ~1.5 s to parse)."""
    from services.common.core import TOKENIZER_ROLES, open_model
    from services.frontend.model import FrontendModel

    return FrontendModel.load(open_model(demo_core, verify=TOKENIZER_ROLES))

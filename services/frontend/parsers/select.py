"""Which reasoning and tool-call parsers a model uses.

Chosen from the manifest (architecture, model_type) and the chat template's text, overridable
by `FrontendConfig.tool_parser` / `reasoning_parser` ("auto" chooses, "none" disables):

| tool parser   | chosen when                                                             |
|---------------|-------------------------------------------------------------------------|
| `hermes`      | the template writes `<tool_call>` (Qwen 2.5/3, Hermes, many fine-tunes) |
| `deepseek_v3` | the template or model type is DeepSeek V3 (`<｜tool▁call▁begin｜>`)      |
| `llama3_json` | Llama 3.x (`<|start_header_id|>`, `<|python_tag|>`, model_type llama)   |
| `harmony`     | gpt-oss (the template writes `<|channel|>`, or model_type gpt_oss)     |

The reasoning parser `think` is chosen when the template or vocabulary knows `<think>`;
`harmony` (gpt-oss's analysis channel) with the `harmony` tool parser: one parser
(parsers/harmony.py) reads channels, reasoning and calls together.
"""

from __future__ import annotations

from collections.abc import Collection

from services.common.errors import ValidationError
from services.frontend.parsers.deepseek_v3 import DeepSeekV3ToolParser
from services.frontend.parsers.hermes import HermesToolParser
from services.frontend.parsers.llama3_json import Llama3JsonToolParser
from services.frontend.parsers.tool_parser import ToolCallParser

TOOL_PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "deepseek_v3": DeepSeekV3ToolParser,
}
HARMONY = "harmony"      # parsers/harmony.py: reasoning, content and tool calls in one
REASONING_PARSERS = ("think", HARMONY)


def _configured(setting: str, known: Collection[str], option: str, choices_lead: str) -> str:
    """An explicit setting (not "auto"): "none" is "", else it must name a known parser."""
    if setting == "none":
        return ""
    if setting not in known:
        raise ValidationError(f"unknown {option} {setting!r}; choose auto, none or "
                              f"{choices_lead}{', '.join(known)}", param=option)
    return setting


def choose_tool_parser(setting: str, *, model_type: str, architecture: str,
                       template: str) -> str:
    """The tool parser name ("" for none)."""
    if setting != "auto":
        return _configured(setting, (*TOOL_PARSERS, HARMONY), "tool_parser", "one of ")
    kind = model_type.lower()
    if is_harmony(template, model_type):
        return HARMONY
    if "<tool_call>" in template:
        return "hermes"
    if "tool▁call" in template or kind.startswith("deepseek_v3") or "DeepseekV3" in architecture:
        return "deepseek_v3"
    if ("<|python_tag|>" in template or "<|start_header_id|>" in template
            or kind in ("llama", "llama4")):
        return "llama3_json"
    return ""


def is_harmony(template: str, model_type: str) -> bool:
    return "<|channel|>" in template or model_type.lower() == "gpt_oss"


def choose_reasoning_parser(setting: str, *, template: str, vocabulary: set[str],
                            model_type: str = "") -> str:
    if setting != "auto":
        return _configured(setting, REASONING_PARSERS, "reasoning_parser", "")
    if is_harmony(template, model_type):
        return HARMONY
    return "think" if "<think>" in template or "<think>" in vocabulary else ""

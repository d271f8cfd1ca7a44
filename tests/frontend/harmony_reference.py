"""OpenAI's own harmony renderer (the `openai-harmony` package) as the reference for gpt-oss
prompts, offline.

openai-harmony reads its BPE ranks from `o200k_base.tiktoken` (downloaded on first use, checked
against a pinned SHA-256). Here the file is written from the pinned `gptoss` tokenizer.json
(its byte-level vocabulary is o200k's) into a cache directory, and openai-harmony's own hash
check proves it is the real one. `reference_prompt(chat)` renders a chat (the frontend's
domain objects) the way harmony renders the equivalent conversation.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from services.common import assets
from services.common.api.chat import ChatInput


def _byte_decoder() -> dict[str, int]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def harmony_encoding() -> Any:
    """openai-harmony's gpt-oss encoding, its vocabulary file derived from the pinned asset."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    directory = assets.cache_root() / "tiktoken"
    target = directory / "o200k_base.tiktoken"
    if not target.is_file():
        vocab = json.loads((assets.fetch("gptoss") / "tokenizer.json").read_text())["model"]["vocab"]
        decode = _byte_decoder()
        lines = [base64.b64encode(bytes(decode[ch] for ch in token)).decode() + f" {rank}"
                 for token, rank in sorted(vocab.items(), key=lambda item: item[1])]
        directory.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        partial.write_text("\n".join(lines) + "\n")
        partial.rename(target)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(directory)
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def reference_messages(chat: ChatInput, *, reasoning_effort: str = "medium") -> list[Any]:
    """The harmony conversation equivalent to `chat` (system -> developer instructions)."""
    from openai_harmony import (
        Author,
        DeveloperContent,
        Message,
        ReasoningEffort,
        Role,
        SystemContent,
        ToolDescription,
    )

    messages = list(chat.messages)
    system = SystemContent.new().with_reasoning_effort(ReasoningEffort(reasoning_effort.title()))
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
    instructions = ""
    if messages and messages[0].role in ("system", "developer"):
        instructions = str(messages.pop(0).content)
    tools = [ToolDescription.new(t.name, t.description, parameters=t.parameters)
             for t in chat.tools]
    if instructions or tools:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions(instructions)
        if tools:
            developer = developer.with_function_tools(tools)
        out.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    names: dict[str, str] = {}
    for message in messages:
        if message.role == "user":
            out.append(Message.from_role_and_content(Role.USER, str(message.content)))
        elif message.role == "assistant":
            if message.reasoning_content:
                out.append(Message.from_role_and_content(Role.ASSISTANT, message.reasoning_content)
                           .with_channel("analysis"))
            if message.tool_calls and message.content:
                out.append(Message.from_role_and_content(Role.ASSISTANT, str(message.content))
                           .with_channel("commentary"))
            for call in message.tool_calls:
                names[call.id] = call.name
                arguments = json.dumps(json.loads(call.arguments_json or "{}"),
                                       separators=(",", ":"), ensure_ascii=False)
                out.append(Message.from_role_and_content(Role.ASSISTANT, arguments)
                           .with_channel("commentary").with_recipient(f"functions.{call.name}")
                           .with_content_type("<|constrain|>json"))
            if not message.tool_calls and message.content is not None:
                out.append(Message.from_role_and_content(Role.ASSISTANT, str(message.content))
                           .with_channel("final"))
        elif message.role == "tool":
            name = names.get(message.tool_call_id, message.name)
            out.append(Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"),
                                                       str(message.content))
                       .with_channel("commentary").with_recipient("assistant"))
    return out


def reference_prompt(chat: ChatInput, *, reasoning_effort: str = "medium") -> str:
    """harmony's completion prompt for the assistant's next message, as text."""
    from openai_harmony import Conversation, Role

    encoding = harmony_encoding()
    conversation = Conversation.from_messages(reference_messages(
        chat, reasoning_effort=reasoning_effort))
    tokens = encoding.render_conversation_for_completion(conversation, Role.ASSISTANT)
    return str(encoding.decode(tokens))


def gptoss_dir() -> Path:
    """The pinned gptoss tokenizer files with Helios's harmony template beside them."""
    import shutil

    source = assets.fetch("gptoss")
    target = assets.cache_root() / "tokenizers" / "gptoss-harmony"
    template = Path(__file__).resolve().parents[2] / "services/frontend/chat/harmony.jinja"
    target.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (target / name).is_file():
            shutil.copy(source / name, target / name)
    shutil.copy(template, target / "chat_template.jinja")
    return target

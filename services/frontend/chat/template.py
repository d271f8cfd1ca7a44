"""ChatTemplate: one compiled, mark-annotated chat template and its `render`.

`render` follows transformers' `render_jinja_template` step for step (generation prompt and
continuation rules, the continuation tag and how it is cut off, the errors it raises), so the
prompt text is byte-identical to `apply_chat_template(..., tokenize=False)`. It also returns
the character positions where the preamble and each complete message end (see marks.py).

Errors are the template's own (jinja2.TemplateError from `raise_exception`, UndefinedError,
TypeError ...) or transformers' ValueErrors; the renderer wraps them in ValidationError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.meta

from services.frontend.chat import marks
from services.frontend.chat.content_format import ContentFormat, detect_content_format
from services.frontend.chat.environment import make_environment

CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


@dataclass(frozen=True, slots=True)
class RenderedChat:
    prompt: str
    char_ends: tuple[int, ...]   # mark positions: sorted, unique, strictly inside the prompt


class ChatTemplate:
    """A chat template compiled once (with marks); `render` is safe to call from any thread."""

    def __init__(self, source: str, *, name: str = "default") -> None:
        self.source = source
        self.name = name
        env = make_environment()
        tree = env.parse(source)
        self.variables = frozenset(jinja2.meta.find_undeclared_variables(tree))
        self.content_format: ContentFormat = detect_content_format(tree)
        self._sentinel = marks.new_sentinel()
        self.num_marked_loops = marks.annotate(tree, self._sentinel)
        self._template = env.from_string(tree)

    @property
    def uses_tools(self) -> bool:
        return "tools" in self.variables

    def render(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None,
               documents: list[Any] | None, add_generation_prompt: bool,
               continue_final_message: bool, kwargs: dict[str, Any]) -> RenderedChat:
        """Render like transformers; `messages` may be modified (pass fresh dicts)."""
        if not messages:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at "
                             "least one message.")
        if continue_final_message and add_generation_prompt:
            raise ValueError(
                "continue_final_message and add_generation_prompt are not compatible. Use "
                "continue_final_message when you want the model to continue the final message, "
                "and add_generation_prompt when you want to add a header that will prompt it to "
                "start a new assistant message instead.")
        if documents is not None and any(not isinstance(d, dict) for d in documents):
            raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
        final_text = self._tag_final_message(messages) if continue_final_message else None
        rendered = self._template.render(
            messages=messages, tools=tools, documents=documents,
            add_generation_prompt=add_generation_prompt, **kwargs)
        prompt, positions = marks.extract(rendered, self._sentinel)
        if final_text is not None:
            prompt = self._cut_continuation(prompt, final_text)
        ends = sorted({p for p in positions if 0 < p < len(prompt)})
        return RenderedChat(prompt, tuple(ends))

    def _tag_final_message(self, messages: list[dict[str, Any]]) -> str:
        """Append the continuation tag to the final message's (last text) content."""
        final = messages[-1].get("content")
        if final is None:
            raise ValueError('continue_final_message is set but the final message has no '
                             '"content" to continue!')
        if "content" not in self.source:
            raise ValueError('continue_final_message is set to "content" but this is not an '
                             'accepted field in the chat_template')
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if "text" in block:
                    text = block["text"]
                    block["text"] = text + CONTINUE_TAG
                    return text
            raise ValueError("continue_final_message is set but we could not find any text to "
                             "continue in the final message!")
        messages[-1]["content"] = final + CONTINUE_TAG
        return final

    @staticmethod
    def _cut_continuation(prompt: str, final_text: str) -> str:
        tag = CONTINUE_TAG.strip()
        if final_text.strip() not in prompt or tag not in prompt:
            raise ValueError(
                "continue_final_message is set but the final message does not appear in the chat "
                "after applying the chat template! This can happen if the chat template deletes "
                "portions of the final message. Please verify the chat template and final "
                "message in your chat to ensure they are compatible."
                f"Final message to continue: {final_text.strip()}\nRendered chat:\n{prompt}")
        at = prompt.rindex(tag)
        if prompt[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG:
            return prompt[:at]
        return prompt[:at].rstrip()


def select_template(templates: Mapping[str, object], *, has_tools: bool) -> str:
    """transformers' choice among named templates: tool_use with tools, else default."""
    if has_tools and "tool_use" in templates:
        return "tool_use"
    if "default" in templates:
        return "default"
    raise ValueError("This model has multiple chat templates with no default specified! "
                     f"Available template names are {sorted(templates)}.")

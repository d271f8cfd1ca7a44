"""ChatRenderer: chat input -> prompt text, token ids and message token endpoints.

The one entry point for chat rendering (Generate, RenderChat, Tokenize, CountTokens): choose
the named template, build the template data, render (template.py), tokenize the prompt once
with offsets and turn the message marks into token endpoints (endpoints.py). Template failures
become `ChatTemplateError` (a ValidationError) carrying the template's own exception as cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.common.api.chat import ChatInput
from services.common.errors import UnsupportedError, ValidationError
from services.frontend.chat import template_data
from services.frontend.chat.endpoints import token_ends
from services.frontend.chat.template import ChatTemplate, select_template
from services.frontend.tokenizer import Tokenizer


class ChatTemplateError(ValidationError):
    """The chat template (or transformers' rendering rules) rejected the conversation."""


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    prompt: str                           # exact rendered text
    token_ids: list[int]
    message_token_ends: tuple[int, ...]   # sorted, unique, strictly inside the prompt
    num_images: int = 0


class ChatRenderer:
    def __init__(self, tokenizer: Tokenizer, templates: dict[str, ChatTemplate],
                 default_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.templates = templates
        self.default_kwargs = dict(default_kwargs or {})

    @property
    def has_template(self) -> bool:
        return bool(self.templates)

    def template_for(self, chat: ChatInput) -> ChatTemplate:
        if not self.templates:
            raise UnsupportedError("this model has no chat template: send a completion prompt",
                                   param="messages")
        try:
            name = select_template(self.templates, has_tools=chat.offers_tools)
        except ValueError as exc:
            raise ChatTemplateError(str(exc), param="messages") from exc
        return self.templates[name]

    def render_text(self, chat: ChatInput) -> tuple[str, tuple[int, ...]]:
        """The prompt text and its message marks (character positions)."""
        template = self.template_for(chat)
        add_generation_prompt = chat.add_generation_prompt
        if add_generation_prompt is None:
            add_generation_prompt = not chat.continue_final_message
        kwargs = template_data.template_kwargs(chat, self.tokenizer.special_tokens,
                                               self.default_kwargs)
        try:
            rendered = template.render(
                template_data.messages_data(chat, template.content_format), tools=template_data.tools_data(chat),
                documents=chat.documents, add_generation_prompt=add_generation_prompt,
                continue_final_message=chat.continue_final_message, kwargs=kwargs)
        except Exception as exc:  # the template is untrusted code: any failure is the input's
            raise ChatTemplateError(f"chat template error: {exc}", param="messages") from exc
        return rendered.prompt, rendered.char_ends

    def count(self, chat: ChatInput) -> int:
        """The rendered prompt's token count, without holding its ids (CountTokens)."""
        prompt, _ = self.render_text(chat)
        return self.tokenizer.count_tokens(prompt)

    def render(self, chat: ChatInput, *, token_limit: int | None = None) -> RenderedPrompt:
        """Render and tokenize; past `token_limit` tokens raise PromptTooLong early."""
        prompt, char_ends = self.render_text(chat)
        encoding = self.tokenizer.encode_bounded(prompt, token_limit)
        ends = token_ends(encoding.spans, len(encoding.ids), char_ends)
        return RenderedPrompt(prompt, encoding.ids, ends, num_images=len(chat.images))

"""Request preparation: validate, render, tokenize (the CPU work run on the worker pool).

`prepare` checks everything that can be checked before the model runs and raises a typed error
naming the field at fault; it never touches the network. `resolve_max_tokens` is the context
check, done after image expansion (which lengthens the prompt).
"""

from __future__ import annotations

from services.common.api.chat import ToolChoiceMode
from services.common.api.generate import GenerateRequest, ResponseFormatType
from services.common.errors import ContextOverflowError, UnsupportedError, ValidationError
from services.frontend.bounded_encode import PromptTooLong
from services.frontend.generate.types import OutputOptions, PreparedRequest
from services.frontend.image_limits import check_image_limits
from services.frontend.model import FrontendModel
from services.frontend.parsers.reasoning import starts_in_reasoning
from services.frontend.parsers.select import HARMONY
from services.frontend.structured import build_grammar

MAX_N = 128
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 1024
MAX_TOP_LOGPROBS = 20


def validate(request: GenerateRequest) -> None:
    if request.input is None:
        raise ValidationError("the request has neither chat messages nor a prompt",
                              param="input")
    if not 1 <= request.num_choices <= MAX_N:
        raise ValidationError(f"n must be between 1 and {MAX_N}", param="n")
    if len(request.stop) > MAX_STOP_STRINGS:
        raise ValidationError(f"at most {MAX_STOP_STRINGS} stop strings", param="stop")
    for index, stop in enumerate(request.stop):
        if not stop or len(stop) > MAX_STOP_LENGTH:
            raise ValidationError(f"stop[{index}] must hold 1 to {MAX_STOP_LENGTH} characters",
                                  param=f"stop[{index}]")
    sampling = request.sampling
    scoring = request.prompt_logprobs is not None or request.embed
    if sampling.max_tokens is not None and sampling.max_tokens < (0 if scoring else 1):
        raise ValidationError("max_tokens must be at least 1 (0 only when the prompt is "
                              "scored: prompt_logprobs or echo with logprobs)",
                              param="max_tokens")
    if request.prompt_logprobs is not None and not 0 <= request.prompt_logprobs <= \
            MAX_TOP_LOGPROBS:
        raise ValidationError(f"prompt_logprobs must be between 0 and {MAX_TOP_LOGPROBS}",
                              param="prompt_logprobs")
    if request.embed and (request.completion is None or request.num_choices != 1 or
                          sampling.max_tokens != 0):
        raise ValidationError("an embedding request takes one raw input, n 1 and "
                              "max_tokens 0", param="input")
    if not 0 <= sampling.top_logprobs <= MAX_TOP_LOGPROBS:
        raise ValidationError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}",
                              param="top_logprobs")


LARGE_INPUT_CHARS = 1 << 20


def input_chars(request: GenerateRequest) -> int:
    """Characters of text the request carries (messages and prompt), before rendering."""
    if request.completion is not None:
        return len(request.completion.text or "") + len(request.completion.token_ids or ())
    if request.chat is None:
        return 0
    total = 0
    for message in request.chat.messages:
        content = message.content
        if isinstance(content, str):
            total += len(content)
        elif content:
            total += sum(len(getattr(part, "text", "")) for part in content)
        total += len(message.reasoning_content or "")
        total += sum(len(call.arguments_json) for call in message.tool_calls)
    return total


def is_large(request: GenerateRequest) -> bool:
    """Preparation copies the prompt several times: megabytes are a large job."""
    return input_chars(request) >= LARGE_INPUT_CHARS


def prompt_token_limit(requested: int | None, context: int) -> int:
    """The most prompt tokens that can fit: the context less the output (at least one)."""
    return max(0, context - (requested if requested is not None else 1))


def prompt_too_long(at_least: int, *, requested: int | None, context: int,
                    hint: str) -> ContextOverflowError:
    """A prompt refused before it was tokenized in full: its count is a lower bound."""
    output = f", and {requested} tokens were requested for the output" if requested else ""
    return ContextOverflowError(
        prompt_tokens=at_least, max_tokens=requested or 0, context_length=context,
        hint=hint, param="messages",
        message=f"This model's maximum context length is {context} tokens. However, the "
                f"prompt has at least {at_least} tokens (tokenization stopped there)"
                f"{output}.")


class RequestPreparer:
    def __init__(self, model: FrontendModel, *, context_hint: str = "") -> None:
        self.model = model
        self.context_hint = context_hint

    def prepare(self, request: GenerateRequest) -> PreparedRequest:
        validate(request)
        self.model.check_name(request.model)
        requested = request.sampling.max_tokens
        context = self.model.max_model_len
        limit = prompt_token_limit(requested, context)
        try:
            if request.chat is not None:
                return self._prepare_chat(request, limit)
            return self._prepare_completion(request, limit)
        except PromptTooLong as exc:
            at_least = exc.at_least   # raised below, free of the frames holding the prompt
        raise prompt_too_long(at_least, requested=requested, context=context,
                              hint=self.context_hint)

    def _prepare_chat(self, request: GenerateRequest, limit: int) -> PreparedRequest:
        chat = request.chat
        assert chat is not None
        model = self.model
        images = chat.images
        if images and not model.supports_vision:
            raise UnsupportedError(f"the model {model.name} does not accept images",
                                   param="messages")
        check_image_limits(images, model.manifest.image_limits)
        template = model.renderer.template_for(chat)
        if chat.offers_tools and not template.uses_tools:
            raise UnsupportedError(f"the chat template of {model.name} does not support tools",
                                   param="tools")
        rendered = model.renderer.render(chat, token_limit=limit)
        reasoning = (request.parse_reasoning if request.parse_reasoning is not None
                     else bool(model.reasoning_parser))
        reasoning = reasoning and bool(model.reasoning_parser)
        parse_tools = (request.parse_tool_calls if request.parse_tool_calls is not None
                       else chat.offers_tools)
        tool_parser = model.tool_parser if parse_tools and chat.offers_tools else ""
        harmony = HARMONY in (model.reasoning_parser, model.tool_parser)
        output = OutputOptions(
            stop=request.stop,
            include_stop_str_in_output=request.include_stop_str_in_output,
            skip_special_tokens=request.skips_special_tokens,
            reasoning=reasoning,
            starts_in_reasoning=reasoning and starts_in_reasoning(rendered.prompt),
            tool_parser=tool_parser,
            tool_names=frozenset(tool.name for tool in chat.tools) if tool_parser else None,
            harmony=harmony,
            parallel_tool_calls=chat.tool_choice.allows_parallel_calls,
            logprobs=request.sampling.logprobs,
        )
        forced = chat.tools and chat.tool_choice.mode in (ToolChoiceMode.REQUIRED,
                                                          ToolChoiceMode.FUNCTION)
        if harmony and (forced or request.response_format.type is not ResponseFormatType.TEXT):
            raise UnsupportedError(f"{model.name} writes the harmony format; forced tool calls "
                                   "and response formats are not enforced for it yet",
                                   param="tool_choice" if forced else "response_format")
        if forced and not model.tool_parser:
            raise UnsupportedError(f"tool_choice {chat.tool_choice.mode.value} needs the "
                                   f"model's tool-call format, and {model.name} has none",
                                   param="tool_choice")
        grammar = build_grammar(request, tokenizer=model.tokenizer,
                                tool_parser=model.tool_parser, prompt=rendered.prompt,
                                output=output)
        return PreparedRequest(request, rendered.prompt, rendered.token_ids,
                               rendered.message_token_ends, images, output, grammar=grammar)

    def _prepare_completion(self, request: GenerateRequest, limit: int) -> PreparedRequest:
        completion = request.completion
        assert completion is not None
        tokenizer = self.model.tokenizer
        if completion.token_ids is not None:
            ids = list(completion.token_ids)
            bad = next((t for t in ids if not tokenizer.is_valid_id(t)), None)
            if bad is not None:
                raise ValidationError(f"prompt token id {bad} is outside the vocabulary "
                                      f"(0..{tokenizer.vocab_size - 1})", param="prompt")
            text = tokenizer.decode(ids, skip_special_tokens=False)
        else:
            text = completion.text or ""
            ids = tokenizer.encode_bounded(text, limit, add_special_tokens=True).ids
        if not ids:
            raise ValidationError("the prompt is empty", param="prompt")
        output = OutputOptions(
            stop=request.stop,
            include_stop_str_in_output=request.include_stop_str_in_output,
            skip_special_tokens=request.skips_special_tokens,
            reasoning=bool(request.parse_reasoning) and bool(self.model.reasoning_parser),
            starts_in_reasoning=bool(request.parse_reasoning) and starts_in_reasoning(text),
            logprobs=request.sampling.logprobs,
        )
        grammar = build_grammar(request, tokenizer=tokenizer, tool_parser="", prompt=text,
                                output=output)
        return PreparedRequest(request, text, ids, (), (), output,
                               echo_text=text if completion.echo else "", grammar=grammar)


def resolve_max_tokens(*, prompt_tokens: int, requested: int | None, context: int,
                       hint: str, pool_tokens: int = 0) -> int:
    """The output budget: as requested, or the rest of the context; overflow is an error.

    `pool_tokens` (the engine's whole KV pool, when smaller than the context) bounds the
    default too: a request without a limit stops where the pool ends instead of asking for
    more than the engine could ever hold (a prompt that fills the pool is the engine's 400)."""
    if requested is None:
        if prompt_tokens >= context:
            raise ContextOverflowError(prompt_tokens=prompt_tokens, max_tokens=0,
                                       context_length=context, hint=hint, param="messages")
        if 0 < pool_tokens < context:
            return max(1, pool_tokens - prompt_tokens)
        return context - prompt_tokens
    if prompt_tokens + requested > context:
        raise ContextOverflowError(prompt_tokens=prompt_tokens, max_tokens=requested,
                                   context_length=context, hint=hint, param="max_tokens")
    return requested

"""ChoiceProcessor: one choice's token ids -> API-neutral events.

Each token goes through the same stages, in order:

    detokenizer (complete characters only) -> stop strings (held back while they may start a
    stop) -> reasoning parser (<think> blocks) -> tool-call parser (content only) -> events

Consecutive deltas of one kind are merged per engine message; each delta carries the logprobs of
the tokens whose text it holds (tokens whose text is still held back wait for the next delta;
tokens that produced no text at all go with the finish event). A stop string ends the choice at
once (`finished`; the caller cancels the engine request when every choice is done), as does the
first complete tool call when parallel tool calls are off. The EOS / stop token that ends a
choice is counted but not decoded unless `include_stop_str_in_output` asks for it (vLLM's rule).
"""

from __future__ import annotations

import dataclasses

from services.common.api.events import (
    Finish,
    FinishReason,
    OutputDelta,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
)
from services.frontend.generate.types import ChoiceStep, OutputOptions, SampledLogprob
from services.frontend.parsers.harmony import HarmonyItem, HarmonyParser, ReasoningText
from services.frontend.parsers.reasoning import ReasoningParser, Segment
from services.frontend.parsers.select import TOOL_PARSERS
from services.frontend.parsers.tool_calls import ContentText, ToolItem
from services.frontend.stop import StopMatcher
from services.frontend.tokenizer import Tokenizer

# What one choice emits: output deltas, then one finish.
ChoiceEvent = TextDelta | ReasoningDelta | ToolCallDelta | Finish


class ChoiceProcessor:
    def __init__(self, index: int, tokenizer: Tokenizer, options: OutputOptions) -> None:
        self.index = index
        self.options = options
        self._tokenizer = tokenizer
        # harmony (gpt-oss) reads its channels from special tokens: they stay in the text
        self._detok = tokenizer.detokenizer(
            skip_special_tokens=options.skip_special_tokens and not options.harmony)
        self._stop = StopMatcher(options.stop, include_in_output=options.include_stop_str_in_output)
        self._harmony = (HarmonyParser(options.tool_names, parse_tools=bool(options.tool_parser))
                         if options.harmony else None)
        self._reasoning = (ReasoningParser(in_reasoning=options.starts_in_reasoning)
                           if options.reasoning and not options.harmony else None)
        self._tools = (TOOL_PARSERS[options.tool_parser](options.tool_names)
                       if options.tool_parser and not options.harmony else None)
        self.finished = False
        self.finish: Finish | None = None
        self.num_tokens = 0
        self.num_reasoning_tokens = 0
        self._pending_logprobs: list[TokenLogprob] = []

    # -- public -------------------------------------------------------------------------------

    def process(self, step: ChoiceStep) -> list[ChoiceEvent]:
        """Events for the tokens of one engine message (and its finish, if it carries one)."""
        events: list[ChoiceEvent] = []
        token_ids = step.token_ids
        ends_on_stop_token = (step.finish_reason is FinishReason.STOP
                              and step.stop_token_id is not None and token_ids
                              and token_ids[-1] == step.stop_token_id
                              and not self.options.include_stop_str_in_output)
        for position, token_id in enumerate(token_ids):
            if self.finished:
                break
            self.num_tokens += 1
            if self.options.logprobs and position < len(step.logprobs):
                self._pending_logprobs.append(self._logprob(step.logprobs[position]))
            if ends_on_stop_token and position == len(token_ids) - 1:
                break  # the EOS / stop id ends the choice without adding text
            self._push_token(events, token_id)
        if step.finish_reason is not None and not self.finished:
            self._finalize(events, step.finish_reason, step.stop_token_id)
        return events

    @property
    def num_tool_calls(self) -> int:
        if self._harmony is not None:
            return self._harmony.num_calls
        return self._tools.num_calls if self._tools is not None else 0

    @property
    def _completed_calls(self) -> int:
        if self._harmony is not None:
            return self._harmony.completed_calls
        return self._tools.completed_calls if self._tools is not None else 0

    @property
    def _in_reasoning(self) -> bool:
        if self._harmony is not None:
            return self._harmony.in_reasoning
        return self._reasoning is not None and self._reasoning.in_reasoning

    # -- stages -------------------------------------------------------------------------------

    def _push_token(self, events: list[ChoiceEvent], token_id: int) -> None:
        was_reasoning = self._in_reasoning
        text = self._detok.push(token_id)
        result = self._stop.push(text) if text else None
        deltas = self._route(result.text) if result is not None else []
        if was_reasoning or self._in_reasoning:
            self.num_reasoning_tokens += 1
        self._collect(events, deltas)
        if result is not None and result.stop is not None:
            self._collect(events, self._flush_parsers())
            self._end(events, FinishReason.STOP_STRING, stop_sequence=result.stop)
        elif (self._tools is not None or self._harmony is not None) and (
                not self.options.parallel_tool_calls and self._completed_calls >= 1):
            self._collect(events, self._flush_parsers())
            self._end(events, FinishReason.TOOL_CALLS)
        elif self._harmony is not None and self._harmony.turn_ended:
            # <|call|> / <|return|> decoded (an engine without them as stop tokens): done
            self._collect(events, self._flush_parsers())
            self._end(events, FinishReason.TOOL_CALLS if self.num_tool_calls
                      else FinishReason.STOP)

    def _route(self, text: str) -> list[OutputDelta]:
        if not text:
            return []
        if self._harmony is not None:
            return self._harmony_deltas(self._harmony.push(text))
        segments = (self._reasoning.push(text) if self._reasoning is not None
                    else [Segment("content", text)])
        return self._route_segments(segments)

    def _harmony_deltas(self, items: list[HarmonyItem]) -> list[OutputDelta]:
        deltas: list[OutputDelta] = []
        for item in items:
            if isinstance(item, ReasoningText):
                deltas.append(ReasoningDelta(self.index, item.text))
            else:
                deltas.extend(self._tool_deltas([item]))
        return deltas

    def _route_segments(self, segments: list[Segment]) -> list[OutputDelta]:
        deltas: list[OutputDelta] = []
        for segment in segments:
            if segment.kind == "reasoning":
                deltas.append(ReasoningDelta(self.index, segment.text))
            elif self._tools is None:
                deltas.append(TextDelta(self.index, segment.text))
            else:
                deltas.extend(self._tool_deltas(self._tools.push(segment.text)))
        return deltas

    def _tool_deltas(self, items: list[ToolItem]) -> list[OutputDelta]:
        return [TextDelta(self.index, item.text) if isinstance(item, ContentText)
                else ToolCallDelta(self.index, item.tool_index, item.id, item.type, item.name,
                                   item.arguments)
                for item in items]

    def _flush_parsers(self, *, truncated: bool = False) -> list[OutputDelta]:
        """The end of the output; `truncated` (the length limit): a tool call in progress is
        sent as the partial call it is, never as its raw text."""
        deltas: list[OutputDelta] = []
        if self._harmony is not None:
            deltas.extend(self._harmony_deltas(self._harmony.flush()))
        if self._reasoning is not None:
            deltas.extend(self._route_segments(self._reasoning.flush()))
        if self._tools is not None:
            deltas.extend(self._tool_deltas(self._tools.flush(truncated=truncated)))
        return deltas

    def _finalize(self, events: list[ChoiceEvent], reason: FinishReason,
                  stop_token_id: int | None) -> None:
        result = self._stop.push(self._detok.flush())
        self._collect(events, self._route(result.text))
        if result.stop is not None:
            self._collect(events, self._flush_parsers())
            self._end(events, FinishReason.STOP_STRING, stop_sequence=result.stop)
            return
        self._collect(events, self._route(self._stop.flush()))
        self._collect(events, self._flush_parsers(truncated=reason is FinishReason.LENGTH))
        if reason is FinishReason.STOP and self.num_tool_calls:
            reason = FinishReason.TOOL_CALLS
        self._end(events, reason, stop_token_id=stop_token_id)

    def _end(self, events: list[ChoiceEvent], reason: FinishReason, *, stop_sequence: str = "",
             stop_token_id: int | None = None) -> None:
        """The finish event; it carries the logprobs of tokens that produced no text."""
        self.finished = True
        logprobs, self._pending_logprobs = tuple(self._pending_logprobs), []
        self.finish = Finish(self.index, reason, stop_sequence, stop_token_id, logprobs)
        events.append(self.finish)

    # -- events -------------------------------------------------------------------------------

    def _collect(self, events: list[ChoiceEvent], deltas: list[OutputDelta]) -> None:
        """Append deltas as events, merging with the previous event of the same kind; the
        pending logprobs go to the last event."""
        if not deltas:
            return
        for delta in deltas:
            merged = _merge(events[-1], delta) if events else None
            if merged is not None:
                events[-1] = merged
            else:
                events.append(delta)
        if self._pending_logprobs:
            last = events[-1]
            events[-1] = dataclasses.replace(
                last, logprobs=last.logprobs + tuple(self._pending_logprobs))
            self._pending_logprobs = []

    def _logprob(self, sampled: SampledLogprob) -> TokenLogprob:
        text, raw = self._tokenizer.token_piece(sampled.token_id)
        top = []
        for token_id, logprob in sampled.top:
            top_text, top_raw = self._tokenizer.token_piece(token_id)
            top.append(TopLogprob(token_id, top_text, top_raw, logprob))
        return TokenLogprob(sampled.token_id, text, raw, sampled.logprob, tuple(top))


def _merge(previous: ChoiceEvent, delta: OutputDelta) -> ChoiceEvent | None:
    """One delta for two consecutive deltas of the same kind (the first one's logprobs kept)."""
    if isinstance(previous, TextDelta) and isinstance(delta, TextDelta):
        return dataclasses.replace(previous, text=previous.text + delta.text)
    if isinstance(previous, ReasoningDelta) and isinstance(delta, ReasoningDelta):
        return dataclasses.replace(previous, text=previous.text + delta.text)
    if (isinstance(previous, ToolCallDelta) and isinstance(delta, ToolCallDelta)
            and previous.tool_index == delta.tool_index and not previous.name
            and not delta.name):
        return dataclasses.replace(previous, arguments=previous.arguments + delta.arguments)
    return None

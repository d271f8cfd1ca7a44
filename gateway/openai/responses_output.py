"""Response objects and their named stream events, built from generation events.

One builder serves both modes: it keeps the output items (reasoning, message, function_call)
and, for every generation event, returns the stream events it implies, each with the next
`sequence_number`. Items open and close as the output switches kind:

    output_item.added -> content_part.added -> output_text.delta* -> output_text.done
      -> content_part.done -> output_item.done            (message; reasoning is alike)
    output_item.added -> function_call_arguments.delta* -> .done -> output_item.done
"""

from __future__ import annotations

import time
from typing import Any

from gateway.errors import HttpError
from gateway.openai.format import cached_details, logprob_value, new_id
from gateway.openai.responses_schema import ResponsesRequest
from services.common.api.events import (
    Finish,
    FinishReason,
    GenerationEvent,
    ReasoningDelta,
    Started,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    Usage,
    UsageReport,
)

Event = dict[str, Any]


def _logprobs(logprobs: tuple[TokenLogprob, ...], top_n: int | None) -> list[dict[str, Any]]:
    if top_n is None:
        return []
    return [{"token": lp.token, "logprob": logprob_value(lp.logprob),
             "bytes": list(lp.token_bytes),
             "top_logprobs": [{"token": t.token, "logprob": logprob_value(t.logprob),
                               "bytes": list(t.token_bytes)} for t in lp.top[:top_n]]}
            for lp in logprobs]


def _error_code(error: HttpError) -> str:
    if error.status == 429:
        return "rate_limit_exceeded"
    if error.kind == "image_decode":
        return "invalid_image"
    if error.status < 500:
        return "invalid_prompt"
    return "server_error"


class ResponseBuilder:
    def __init__(self, body: ResponsesRequest, response_id: str) -> None:
        self.body = body
        self.id = response_id
        self.created_at = int(time.time())
        self.model = body.model
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None      # the item being streamed
        self.open_tool_index: int | None = None
        self.sequence = 0
        self.usage = Usage()
        self.finish: Finish | None = None
        self.status = "in_progress"
        self.error: dict[str, Any] | None = None

    # -- the response object -------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        body = self.body
        effort = body.reasoning.effort if body.reasoning else None
        text_format = body.text.format.model_dump(mode="json", by_alias=True, exclude_none=True) \
            if body.text and body.text.format else {"type": "text"}
        tool_choice = body.tool_choice.model_dump(mode="json") \
            if body.tool_choice is not None and not isinstance(body.tool_choice, str) \
            else (body.tool_choice or "auto")
        usage = self.usage
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": self.status, "background": False, "error": self.error,
            "incomplete_details": {"reason": "max_output_tokens"}
            if self.status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "model": self.model, "output": [dict(item) for item in self.items],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": effort, "summary": None},
            "store": body.store is not False, "temperature": body.temperature,
            "text": {"format": text_format}, "tool_choice": tool_choice,
            "tools": [t.model_dump(mode="json", exclude_none=True) for t in body.tools or ()],
            "top_p": body.top_p, "truncation": body.truncation or "disabled",
            "usage": {"input_tokens": usage.prompt_tokens,
                      "input_tokens_details": cached_details(usage),
                      "output_tokens": usage.completion_tokens,
                      "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
                      "total_tokens": usage.total_tokens}
            if self.status != "in_progress" else None,
            "user": body.user, "metadata": body.metadata or {},
        }

    def output_text(self) -> str:
        return "".join(part["text"] for item in self.items if item["type"] == "message"
                       for part in item["content"])

    # -- stream events ---------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def start_events(self) -> list[Event]:
        return [self._event("response.created", response=self.response()),
                self._event("response.in_progress", response=self.response())]

    def _ids(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.items) - 1}

    def _open(self, item: dict[str, Any]) -> list[Event]:
        self.items.append(item)
        self.open = item
        events = [self._event("response.output_item.added", output_index=len(self.items) - 1,
                              item=dict(item, content=[]) if "content" in item else dict(item))]
        if item["type"] == "message":
            events.append(self._event("response.content_part.added", **self._ids(),
                                      content_index=0, part={"type": "output_text", "text": "",
                                                             "annotations": []}))
        elif item["type"] == "reasoning":
            events.append(self._event("response.content_part.added", **self._ids(),
                                      content_index=0,
                                      part={"type": "reasoning_text", "text": ""}))
        return events

    def close_open(self, *, cut_off: bool = False) -> list[Event]:
        """Close the item being streamed: `incomplete` when the output limit cut it off."""
        item = self.open
        if item is None:
            return []
        ids = self._ids()
        self.open = None
        self.open_tool_index = None
        item["status"] = "incomplete" if cut_off else "completed"
        events: list[Event] = []
        if item["type"] == "message":
            part = item["content"][0]
            events += [self._event("response.output_text.done", **ids, content_index=0,
                                   text=part["text"], logprobs=part.get("logprobs", [])),
                       self._event("response.content_part.done", **ids, content_index=0,
                                   part=dict(part))]
        elif item["type"] == "reasoning":
            part = item["content"][0]
            events += [self._event("response.reasoning_text.done", **ids, content_index=0,
                                   text=part["text"]),
                       self._event("response.content_part.done", **ids, content_index=0,
                                   part=dict(part))]
        else:
            events.append(self._event("response.function_call_arguments.done", **ids,
                                      name=item["name"], arguments=item["arguments"]))
        events.append(self._event("response.output_item.done", output_index=ids["output_index"],
                                  item=dict(item)))
        return events

    def _ensure(self, kind: str, tool_index: int | None = None,
                delta: ToolCallDelta | None = None) -> list[Event]:
        if self.open is not None and self.open["type"] == kind and \
                (kind != "function_call" or self.open_tool_index == tool_index):
            return []
        events = self.close_open()
        if kind == "message":
            item = {"id": new_id("msg_"), "type": "message", "role": "assistant",
                    "status": "in_progress",
                    "content": [{"type": "output_text", "text": "", "annotations": [],
                                 "logprobs": []}]}
        elif kind == "reasoning":
            item = {"id": new_id("rs_"), "type": "reasoning", "summary": [],
                    "status": "in_progress",
                    "content": [{"type": "reasoning_text", "text": ""}]}
        else:
            assert delta is not None
            item = {"id": new_id("fc_"), "type": "function_call", "status": "in_progress",
                    "call_id": delta.id or new_id("call_"), "name": delta.name,
                    "arguments": ""}
            self.open_tool_index = tool_index
        return events + self._open(item)

    def add(self, event: GenerationEvent) -> list[Event]:
        """Fold one generation event in; return the stream events it produces."""
        if isinstance(event, Started):
            self.model = event.model or self.model
            self.usage = Usage(prompt_tokens=event.prompt_tokens,
                               cached_tokens=event.cached_tokens)
            return []
        if event.index != 0:
            return []   # the Responses API has one choice
        so_far = getattr(event, "usage_so_far", None)
        if so_far is not None:
            self.usage = so_far
        if isinstance(event, TextDelta):
            if not event.text:
                return self._message_logprobs(event.logprobs)
            events = self._ensure("message")
            part = self.open["content"][0]  # type: ignore[index]
            part["text"] += event.text
            logprobs = _logprobs(event.logprobs, self.body.logprobs_top)
            part["logprobs"].extend(logprobs)
            return [*events, self._event("response.output_text.delta", **self._ids(), content_index=0, delta=event.text, logprobs=logprobs)]
        if isinstance(event, ReasoningDelta):
            if not event.text:
                return []
            events = self._ensure("reasoning")
            self.open["content"][0]["text"] += event.text  # type: ignore[index]
            return [*events, self._event("response.reasoning_text.delta", **self._ids(), content_index=0, delta=event.text)]
        if isinstance(event, ToolCallDelta):
            events = self._ensure("function_call", event.tool_index, event)
            assert self.open is not None
            self.open["name"] = self.open["name"] or event.name
            if not event.arguments:
                return events
            self.open["arguments"] += event.arguments
            return [*events, self._event("response.function_call_arguments.delta", **self._ids(), delta=event.arguments)]
        if isinstance(event, Finish):
            self.finish = event
            cut_off = event.reason is FinishReason.LENGTH
            return [*self._message_logprobs(event.logprobs), *self.close_open(cut_off=cut_off)]
        return []

    def _message_logprobs(self, logprobs: tuple[TokenLogprob, ...]) -> list[Event]:
        """Logprobs of tokens without text (the EOS that ended the message) join the open
        message, as an empty `output_text.delta`; elsewhere (reasoning, a tool call) the API
        has no logprobs to carry them."""
        entries = _logprobs(logprobs, self.body.logprobs_top)
        if not entries or self.open is None or self.open["type"] != "message":
            return []
        self.open["content"][0]["logprobs"].extend(entries)
        return [self._event("response.output_text.delta", **self._ids(), content_index=0,
                            delta="", logprobs=entries)]

    def complete(self, report: UsageReport) -> list[Event]:
        """The terminal event: response.completed, or response.incomplete at the limit."""
        events = self.close_open()
        self.usage = report.usage
        length = self.finish is not None and self.finish.reason is FinishReason.LENGTH
        self.status = "incomplete" if length else "completed"
        kind = "response.incomplete" if length else "response.completed"
        return [*events, self._event(kind, response=self.response())]

    def fail(self, error: HttpError) -> list[Event]:
        """The stream ends early: `error` and `response.failed`, with one error code, and the
        usage so far (the prompt, the tokens generated until then)."""
        self.status = "failed"
        code = _error_code(error)
        self.error = {"code": code, "message": error.message}
        for item in self.items:
            if item.get("status") == "in_progress":
                item["status"] = "incomplete"
        self.open = None
        return [self._event("error", code=code, message=error.message, param=error.param),
                self._event("response.failed", response=self.response())]

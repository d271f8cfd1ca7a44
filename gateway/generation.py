"""One request's upstream feed: frontend Generate call(s) -> an unbounded event queue.

A pump task per call moves events into the queue as they arrive, so a paused reader never
blocks (or loses) the upstream: the queue grows to at most the request's output, which the
output budget bounds. Several calls serve one HTTP request when a completions body carries a
batch of prompts; their choice indices are offset (prompt p, choice j -> p * n + j) and their
usage is summed into one final `UsageReport`. `close()` cancels every call (client gone).

    async with EventStream(client, requests, trace_id=rid) as stream:
        await stream.wait_first(timeout_s)      # raises the typed error of an early failure
        async for event in stream.events(keepalive_s):
            ...                                  # KEEPALIVE when nothing arrived in time
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence

from gateway.collector import Collector
from gateway.frontend_client import FrontendClient, GenerateCall
from services.common.api.events import GenerationEvent, Usage, UsageReport
from services.common.api.generate import GenerateRequest
from services.common.errors import HeliosError, InternalError


class Keepalive:
    """Yielded by `events()` when the upstream was silent for the keep-alive interval."""


KEEPALIVE = Keepalive()


@dataclasses.dataclass(frozen=True, slots=True)
class _Done:
    call: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Failed:
    error: HeliosError


_Item = GenerationEvent | _Done | _Failed


class EventStream:
    def __init__(self, client: FrontendClient, requests: Sequence[GenerateRequest], *,
                 trace_id: str = "") -> None:
        if not requests:
            raise ValueError("EventStream needs at least one request")
        self._requests = list(requests)
        self._client = client
        self._trace_id = trace_id
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()   # unbounded on purpose
        self._pending: collections.deque[_Item] = collections.deque()
        self._calls: list[GenerateCall] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._usage: dict[int, Usage] = {}
        self._remaining = len(self._requests)
        self.created = time.time()
        self.first_event_at: float | None = None

    async def __aenter__(self) -> EventStream:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        for number, request in enumerate(self._requests):
            call = self._client.generate(request, trace_id=self._trace_id)
            self._calls.append(call)
            offset = number * request.num_choices
            self._tasks.append(asyncio.ensure_future(self._pump(number, call, offset)))

    async def _pump(self, number: int, call: GenerateCall, offset: int) -> None:
        try:
            async for event in call.events():
                if isinstance(event, UsageReport):
                    self._usage[number] = event.usage
                    continue
                if offset:
                    event = dataclasses.replace(event, index=event.index + offset)
                self._queue.put_nowait(event)
            self._queue.put_nowait(_Done(number))
        except HeliosError as exc:
            self._queue.put_nowait(_Failed(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or a malformed event: still a typed failure
            error = InternalError(f"gateway failed reading the frontend stream: {exc}",
                                  service="gateway")
            error.__cause__ = exc
            self._queue.put_nowait(_Failed(error))

    async def _next(self, timeout_s: float | None) -> _Item | None:
        if self._pending:
            return self._pending.popleft()
        if not self._queue.empty():           # the common case while tokens flow: no timer
            item = self._queue.get_nowait()
        else:
            try:
                async with asyncio.timeout(timeout_s):
                    item = await self._queue.get()
            except TimeoutError:
                return None
        if self.first_event_at is None and not isinstance(item, _Done):
            self.first_event_at = time.monotonic()
        return item

    async def wait_first(self, timeout_s: float | None) -> bool:
        """Wait for the first upstream event (at most `timeout_s`); raise its typed error if
        the request failed first. True when an event is ready, False on timeout."""
        item = await self._next(timeout_s)
        if item is None:
            return False
        if isinstance(item, _Failed):
            raise item.error
        self._pending.appendleft(item)
        return True

    async def events(self, keepalive_s: float | None = None
                     ) -> AsyncIterator[GenerationEvent | Keepalive]:
        """Every event in order, then one `UsageReport`; `KEEPALIVE` after each silent
        `keepalive_s`. Raises the typed error when the request fails."""
        while self._remaining:
            item = await self._next(keepalive_s)
            if item is None:
                yield KEEPALIVE
            elif isinstance(item, _Failed):
                await self.close()
                raise item.error
            elif isinstance(item, _Done):
                self._remaining -= 1
            else:
                yield item
        yield UsageReport(self.total_usage())

    def total_usage(self) -> Usage:
        parts = list(self._usage.values())
        return Usage(prompt_tokens=sum(u.prompt_tokens for u in parts),
                     completion_tokens=sum(u.completion_tokens for u in parts),
                     cached_tokens=sum(u.cached_tokens for u in parts),
                     reasoning_tokens=sum(u.reasoning_tokens for u in parts),
                     cached_tokens_host=sum(u.cached_tokens_host for u in parts))

    async def collect(self) -> Collector:
        """Run the request to the end and fold it (non-streaming responses)."""
        collector = Collector()
        async for event in self.events():
            if not isinstance(event, Keepalive):
                collector.add(event)
        return collector

    def abort(self, error: HeliosError) -> None:
        """End the request with `error` (shutdown): cancel the calls; the reader gets the
        events already received, then the error (a protocol error event, not a cut)."""
        for call in self._calls:
            if not call.done():
                call.cancel()
        for task in self._tasks:
            task.cancel()
        self._queue.put_nowait(_Failed(error))

    async def close(self) -> None:
        """Cancel whatever is still running (idempotent)."""
        for call in self._calls:
            if not call.done():
                call.cancel()
        for task in self._tasks:
            if not task.done():
                task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task

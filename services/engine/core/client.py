"""CoreClient: the servicer's handle on the engine-core process.

Starts the core (multiprocessing spawn), sends calls over the pipe, and dispatches what comes
back on the asyncio loop: replies resolve call futures, request updates go to their
`RequestStream`, block events to prefix-event subscribers. A reader thread does the blocking
reads, so the event loop never waits on the pipe. If the core fails or dies, every stream and
pending call fails with the typed error and `on_failure` is told (the service exits 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import pickle
import threading
from collections.abc import Callable
from typing import Any

from services.common.errors import HeliosError, PoisonedError, WorkerFailure
from services.engine.config import EngineConfig
from services.engine.core.messages import Call, Failed, Outgoing, Ready, Reply
from services.engine.core.process import core_main
from services.engine.core.streams import RequestStream
from services.engine.prefix.records import BlockEvent

log = logging.getLogger(__name__)


class CoreClient:
    def __init__(self, config: EngineConfig,
                 on_failure: Callable[[HeliosError], None] | None = None) -> None:
        self.config = config
        self.on_failure = on_failure
        self.ready: Ready | None = None
        self.failure: HeliosError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._process: Any = None
        self._connection: Any = None
        self._calls = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[str, RequestStream] = {}
        self._subscribers: list[Callable[[BlockEvent], None]] = []
        self._ready_future: asyncio.Future[Ready] | None = None
        self._send_lock = threading.Lock()
        self._closing = False

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> Ready:
        self._loop = asyncio.get_running_loop()
        self._ready_future = self._loop.create_future()
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe(duplex=True)
        self._process = context.Process(target=core_main, args=(self.config, child),
                                        name="helios-engine-core", daemon=True)
        self._process.start()
        child.close()
        self._connection = parent
        threading.Thread(target=self._read, name="core-reader", daemon=True).start()
        self.ready = await self._ready_future
        return self.ready

    async def close(self, timeout: float = 30.0) -> None:
        """Ask the core to stop (it cancels what is left and drains), then reap it."""
        self._closing = True
        if self._process is None:
            return
        if self._process.is_alive() and self.failure is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.call("shutdown"), timeout)
        await asyncio.to_thread(self._process.join, timeout)
        if self._process.is_alive():
            log.warning("engine core did not exit; killing it")
            self._process.kill()
            await asyncio.to_thread(self._process.join, 5)
        with contextlib.suppress(Exception):
            self._connection.close()

    @property
    def exitcode(self) -> int | None:
        return None if self._process is None else self._process.exitcode

    # -- calls and streams ------------------------------------------------------------------
    async def call(self, verb: str, args: Any = None) -> Any:
        if self.failure is not None:
            raise PoisonedError("the engine core failed earlier and cannot serve",
                                cause=self.failure.display_message)
        assert self._loop is not None
        call_id = next(self._calls)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._pending[call_id] = future
        data = pickle.dumps(Call(call_id, verb, args), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with self._send_lock:
                self._connection.send_bytes(data)
        except (OSError, ValueError) as exc:
            self._pending.pop(call_id, None)
            raise WorkerFailure(f"the engine core is unreachable: {exc}") from exc
        return await future

    def open_stream(self, request_id: str) -> RequestStream:
        stream = RequestStream(request_id)
        self._streams[request_id] = stream
        return stream

    def has_stream(self, request_id: str) -> bool:
        return request_id in self._streams

    def close_stream(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def subscribe(self, callback: Callable[[BlockEvent], None]) -> Callable[[], None]:
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) \
            if callback in self._subscribers else None

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    # -- receiving --------------------------------------------------------------------------
    def _read(self) -> None:
        assert self._loop is not None
        while True:
            try:
                message = pickle.loads(self._connection.recv_bytes())
            except (EOFError, OSError):
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._core_lost)
                return
            with contextlib.suppress(RuntimeError):        # the loop closed at shutdown
                self._loop.call_soon_threadsafe(self._dispatch, message)

    def _dispatch(self, message: Any) -> None:
        if isinstance(message, Outgoing):
            for reply in message.replies:
                self._resolve(reply)
            for update in message.updates:
                stream = self._streams.get(update.request_id)
                if stream is not None:
                    stream.push(update)
            for event in message.block_events:
                for subscriber in list(self._subscribers):
                    subscriber(event)
        elif isinstance(message, Ready):
            if self._ready_future is not None and not self._ready_future.done():
                self._ready_future.set_result(message)
        elif isinstance(message, Failed):
            self._fail(message.error.error())

    def _resolve(self, reply: Reply) -> None:
        future = self._pending.pop(reply.call_id, None)
        if future is None or future.done():
            return
        if reply.error is not None:
            future.set_exception(reply.error.error())
        else:
            future.set_result(reply.value)

    def _core_lost(self) -> None:
        if self._closing and self.failure is None:
            error: HeliosError = WorkerFailure("the engine core stopped")
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(error)
            for stream in self._streams.values():
                stream.fail(error)
            return
        code = self._process.exitcode if self._process is not None else None
        self._fail(WorkerFailure(f"the engine core process exited unexpectedly "
                                 f"(exit code {code})"))

    def _fail(self, error: HeliosError) -> None:
        if self.failure is not None:
            return
        self.failure = error
        log.error("engine core failed: %s", error.display_message)
        if self._ready_future is not None and not self._ready_future.done():
            self._ready_future.set_exception(error)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        for stream in self._streams.values():
            stream.fail(error)
        if self.on_failure is not None and not self._closing:
            self.on_failure(error)

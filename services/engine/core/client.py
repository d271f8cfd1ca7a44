"""CoreClient: the servicer's handle on the engine-core process.

Starts the core (multiprocessing spawn), sends calls over the pipe, and dispatches what comes
back on the asyncio loop: replies resolve call futures, request updates go to their
`RequestStream`, block events to prefix-event subscribers. One typed helper per verb
(`submit(request) -> Admitted`, `abort(ids) -> int`, `load(query) -> LoadSnapshot`,
`pause()`/`resume() -> AdmissionState`, `drain(timeout_s) -> DrainResult`,
`replay_prefix_blocks() -> tuple[BlockEvent, ...]`, `shutdown() -> bool`); a reply whose value
is not of the verb's declared type fails that call with a WorkerFailure naming both. A reader
thread does the blocking reads, so the event loop never waits on the pipe. If the core fails or
dies, every stream and pending call fails with the typed error and `on_failure` is told (the
service exits 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import pickle
import threading
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from typing import Any, TypeVar, cast

from services.common.errors import HeliosError, PoisonedError, WorkerFailure
from services.engine.config import EngineConfig
from services.engine.core.messages import (
    PROCEED,
    Abort,
    AdmissionState,
    Call,
    CallMessage,
    CoreCall,
    Drain,
    DrainResult,
    Failed,
    Outgoing,
    PauseAdmission,
    QueryLoad,
    Ready,
    ReplayPrefixBlocks,
    Reply,
    ResumeAdmission,
    Shutdown,
    Submit,
    check_reply,
)
from services.engine.core.streams import RequestStream
from services.engine.core.telemetry import LoadQuery, LoadSnapshot
from services.engine.prefix.records import BlockEvent
from services.engine.scheduler.requests import Admitted, EngineRequest

R = TypeVar("R")

log = logging.getLogger(__name__)


def run_core(config: EngineConfig, connection: Connection) -> None:
    """The spawned process's target: only the core imports the model stack (torch), the
    servicer that spawns it does not."""
    from services.engine.core.process import core_main

    core_main(config, connection)


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
        self._pending: dict[int, tuple[asyncio.Future[Any], CallMessage[Any]]] = {}
        self._streams: dict[str, RequestStream] = {}
        self._subscribers: list[Callable[[BlockEvent], None]] = []
        self._ready_future: asyncio.Future[Ready] | None = None
        self._send_lock = threading.Lock()
        self._closing = False
        self._spawned: Connection | None = None   # a spawned core's pipe until start()

    # -- lifecycle --------------------------------------------------------------------------
    def spawn(self) -> None:
        """Start the core process: it imports and initializes its device, then waits until
        `start()` says the model files are verified (so both can overlap)."""
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe(duplex=True)
        self._process = context.Process(target=run_core, args=(self.config, child),
                                        name="helios-engine-core", daemon=True)
        self._process.start()
        child.close()
        self._spawned = parent

    async def start(self) -> Ready:
        """Let the core (spawned now unless `spawn()` ran) load the verified model; its Ready."""
        if self._spawned is None:
            self.spawn()
        parent, self._spawned = self._spawned, None
        assert parent is not None
        # a core that failed already has sent Failed and gone: attach reads why
        with contextlib.suppress(OSError):
            parent.send_bytes(PROCEED)
        self.ready = await self.attach(parent)
        return self.ready

    async def attach(self, connection: Connection) -> Ready:
        """Read the core's messages from `connection` (start() passes the spawned core's
        pipe; tests pass one whose other end they drive) and wait for its Ready."""
        self._loop = asyncio.get_running_loop()
        self._ready_future = self._loop.create_future()
        self._connection = connection
        threading.Thread(target=self._read, name="core-reader", daemon=True).start()
        self.ready = await self._ready_future
        return self.ready

    async def close(self, timeout: float = 30.0) -> None:
        """Ask the core to stop (it cancels what is left and drains), then reap it."""
        self._closing = True
        if self._process is None:
            return
        if self._spawned is not None:          # never started: the closed pipe stops it
            self._spawned.close()
            self._spawned = None
        elif self._process.is_alive() and self.failure is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.shutdown(), timeout)
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

    # -- calls: one typed helper per verb ----------------------------------------------------
    async def submit(self, request: EngineRequest) -> Admitted:
        """Admit a request (answered after its grammar compiled, if it has one)."""
        return await self._call(Submit(request))

    async def abort(self, request_ids: Iterable[str]) -> int:
        """Cancel requests; how many were live."""
        return await self._call(Abort(tuple(request_ids)))

    async def load(self, query: LoadQuery | None = None) -> LoadSnapshot:
        return await self._call(QueryLoad(query or LoadQuery()))

    async def pause(self) -> AdmissionState:
        return await self._call(PauseAdmission())

    async def resume(self) -> AdmissionState:
        return await self._call(ResumeAdmission())

    async def drain(self, timeout_s: float) -> DrainResult:
        """Answered once the core drained (or could not confirm it)."""
        return await self._call(Drain(float(timeout_s)))

    async def replay_prefix_blocks(self) -> tuple[BlockEvent, ...]:
        return await self._call(ReplayPrefixBlocks())

    async def shutdown(self) -> bool:
        return await self._call(Shutdown())

    async def _call(self, message: CallMessage[R]) -> R:
        if self.failure is not None:
            raise PoisonedError("the engine core failed earlier and cannot serve",
                                cause=self.failure.display_message)
        assert self._loop is not None
        call_id = next(self._calls)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._pending[call_id] = (future, message)
        # every helper above passes one of CoreCall's types
        data = pickle.dumps(Call(call_id, cast(CoreCall, message)),
                            protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with self._send_lock:
                self._connection.send_bytes(data)
        except (OSError, ValueError) as exc:
            self._pending.pop(call_id, None)
            raise WorkerFailure(f"the engine core is unreachable: {exc}") from exc
        return await future

    # -- streams ----------------------------------------------------------------------------

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
        entry = self._pending.pop(reply.call_id, None)
        if entry is None or entry[0].done():
            return
        future, message = entry
        if reply.error is not None:
            future.set_exception(reply.error.error())
            return
        try:
            value = check_reply(message, reply.value)
        except WorkerFailure as exc:
            log.error("%s", exc.message)
            future.set_exception(exc)
            return
        future.set_result(value)

    def _core_lost(self) -> None:
        if self._closing and self.failure is None:
            error: HeliosError = WorkerFailure("the engine core stopped")
            for future, _ in self._pending.values():
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
        for future, _ in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        for stream in self._streams.values():
            stream.fail(error)
        if self.on_failure is not None and not self._closing:
            self.on_failure(error)

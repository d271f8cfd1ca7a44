"""Outbox: the core's sending side. The engine loop never blocks on a slow servicer.

The loop hands each step's request updates and block events to the outbox and goes on; a
sender thread pickles and writes one `Outgoing` message with everything gathered since its
last write. While the pipe is slow, updates for the same request coalesce into one (tokens
and logprobs concatenated per choice, the latest usage and finish state win).

A small step (at most INLINE_MAX_UPDATES updates, the low-concurrency case where latency
counts) is written by the loop itself when the sender is idle: the sender thread would wait
for the GIL until the loop blocks on the device, after it planned and launched the next step
(about 1 ms on the H100 host, benchmarks/trace_ttft.py). The inline write never blocks: it is
one non-blocking send of the framed message, and whatever the socket does not take at once is
left to the sender thread, which writes it before anything else.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import struct
import threading
from collections.abc import Iterable
from multiprocessing.connection import Connection
from typing import Any

from services.engine.core.messages import Outgoing, Reply
from services.engine.prefix.records import BlockEvent
from services.engine.scheduler.requests import ChoiceDelta, RequestUpdate

log = logging.getLogger(__name__)

# the most updates a step may carry for the loop to write it itself (module docstring)
INLINE_MAX_UPDATES = 8
# multiprocessing.Connection's framing: a big-endian int32 length, then the bytes
_FRAME_LIMIT = 0x7FFFFFFF


def _socket_of(connection: Connection) -> socket.socket | None:
    """A socket on the connection's descriptor for non-blocking sends (a duplex Pipe is a
    socketpair), or None (a one-way pipe: every write goes through the sender thread)."""
    try:
        sock = socket.socket(fileno=os.dup(connection.fileno()))
    except (OSError, ValueError):
        return None
    if sock.type != socket.SOCK_STREAM:
        sock.close()
        return None
    return sock


def merge_updates(old: RequestUpdate, new: RequestUpdate) -> RequestUpdate:
    """One update carrying everything `old` then `new` did."""
    by_index: dict[int, ChoiceDelta] = {d.index: d for d in old.deltas}
    for delta in new.deltas:
        prior = by_index.get(delta.index)
        if prior is None:
            by_index[delta.index] = delta
            continue
        by_index[delta.index] = ChoiceDelta(
            delta.request_id, delta.index, prior.token_ids + delta.token_ids,
            prior.logprobs + delta.logprobs, delta.finish_reason or prior.finish_reason,
            delta.stop_token_id if delta.stop_token_id is not None else prior.stop_token_id,
            delta.error or prior.error, prior.prompt_logprobs + delta.prompt_logprobs,
            delta.embedding or prior.embedding, delta.error_kind or prior.error_kind)
    return RequestUpdate(new.request_id, tuple(by_index.values()), new.usage,
                         old.finished or new.finished)


class Outbox:
    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._cond = threading.Condition()
        self._pending = Outgoing()
        self._updates: dict[str, RequestUpdate] = {}
        self._closed = False
        self._broken = False
        self._sending = False                    # a batch is being written
        self._write_lock = threading.Lock()      # one writer on the pipe at a time
        self._socket = _socket_of(connection)    # for the loop's non-blocking inline writes
        self._remainder = b""       # the unsent tail of an inline write (the sender's next)
        self.coalesced = 0          # updates merged into an unsent one (slow reader)
        self.inline_writes = 0      # messages the loop wrote itself
        self._thread = threading.Thread(target=self._run, name="core-outbox", daemon=True)
        self._thread.start()

    @property
    def broken(self) -> bool:
        """The servicer side is gone (the pipe broke)."""
        return self._broken

    def reply(self, reply: Reply) -> None:
        with self._cond:
            self._pending.replies.append(reply)
            self._cond.notify()

    def publish(self, updates: Iterable[RequestUpdate], events: Iterable[BlockEvent]) -> None:
        with self._cond:
            for update in updates:
                prior = self._updates.get(update.request_id)
                if prior is not None:
                    self.coalesced += 1
                    update = merge_updates(prior, update)
                self._updates[update.request_id] = update
            self._pending.block_events.extend(events)
            inline = (self._socket is not None and not self._sending and not self._remainder
                      and len(self._updates) <= INLINE_MAX_UPDATES
                      and self._write_lock.acquire(blocking=False))
            if not inline:
                self._cond.notify()
                return
            batch = self._take()
        try:
            self._write_inline(batch)
        finally:
            self._write_lock.release()
            with self._cond:
                self._sending = False
                self._cond.notify_all()

    def _write_inline(self, message: Any) -> None:
        """Send `message` without blocking; the sender thread finishes a partial send."""
        assert self._socket is not None
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > _FRAME_LIMIT:
            frame = struct.pack("!i", -1) + struct.pack("!Q", len(data)) + data
        else:
            frame = struct.pack("!i", len(data)) + data
        try:
            sent = self._socket.send(frame, socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._broke(exc)
            return
        self.inline_writes += 1
        if sent < len(frame):
            with self._cond:
                self._remainder = frame[sent:]

    def _take(self) -> Outgoing:
        """Everything pending, as one message (the caller holds the condition)."""
        batch = self._pending
        batch.updates = list(self._updates.values())
        self._pending = Outgoing()
        self._updates = {}
        self._sending = True
        return batch

    def send_now(self, message: Any) -> None:
        """Flush what is pending, then send `message` (Ready, Failed) from the caller."""
        self.flush()
        self._write(message)

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until everything handed over so far has been written."""
        with self._cond:
            self._cond.notify()
            self._cond.wait_for(
                lambda: (self._is_empty() and not self._sending) or self._broken, timeout)

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10)
        if self._socket is not None:
            self._socket.close()

    def _is_empty(self) -> bool:
        return not self._pending and not self._updates and not self._remainder

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or not self._is_empty())
                if self._is_empty() and self._closed:
                    return
                remainder, self._remainder = self._remainder, b""
                batch = self._take() if self._pending or self._updates else None
                self._sending = True
            if remainder:                 # an inline write's tail goes first
                self._write_raw(remainder)
            if batch is not None:
                self._write(batch)        # outside the condition: the loop never waits on it
            with self._cond:
                self._sending = False
                self._cond.notify_all()

    def _write(self, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._write_lock:
            try:
                self._connection.send_bytes(data)
            except (OSError, EOFError, ValueError) as exc:
                self._broke(exc)

    def _write_raw(self, frame: bytes) -> None:
        """The rest of a frame the loop began (blocking: this is the sender thread)."""
        assert self._socket is not None
        with self._write_lock:
            try:
                self._socket.sendall(frame)
            except OSError as exc:
                self._broke(exc)

    def _broke(self, exc: Exception) -> None:
        if not self._broken:
            log.warning("servicer pipe broke: %s", exc)
        self._broken = True

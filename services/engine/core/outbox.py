"""Outbox: the core's sending side. The engine loop never blocks on a slow servicer.

The loop hands each step's request updates and block events to the outbox and goes on; a
sender thread pickles and writes one `Outgoing` message with everything gathered since its
last write. While the pipe is slow, updates for the same request coalesce into one (tokens
and logprobs concatenated per choice, the latest usage and finish state win).
"""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Iterable
from multiprocessing.connection import Connection
from typing import Any

from services.engine.core.messages import Outgoing, Reply
from services.engine.prefix.records import BlockEvent
from services.engine.scheduler.requests import ChoiceDelta, RequestUpdate

log = logging.getLogger(__name__)


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
        self.coalesced = 0          # updates merged into an unsent one (slow reader)
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
            self._cond.notify()

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

    def _is_empty(self) -> bool:
        return not self._pending and not self._updates

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or not self._is_empty())
                if self._is_empty() and self._closed:
                    return
                batch = self._pending
                batch.updates = list(self._updates.values())
                self._pending = Outgoing()
                self._updates = {}
                self._sending = True
            self._write(batch)            # outside the condition: the loop never waits on it
            with self._cond:
                self._sending = False
                self._cond.notify_all()

    def _write(self, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._write_lock:
            try:
                self._connection.send_bytes(data)
            except (OSError, EOFError, ValueError) as exc:
                if not self._broken:
                    log.warning("servicer pipe broke: %s", exc)
                self._broken = True

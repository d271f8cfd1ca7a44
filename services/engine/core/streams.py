"""RequestStream: one Generate call's view of the core's updates (servicer side).

Updates from the core are merged into whatever the reader has not taken yet, so a slow gRPC
reader gets coalesced tokens and the core never waits for it. The stream ends with the update
that finishes the request, or with a typed error.
"""

from __future__ import annotations

import asyncio

from services.common.errors import HeliosError
from services.engine.core.outbox import merge_updates
from services.engine.scheduler.requests import RequestUpdate


class RequestStream:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._pending: RequestUpdate | None = None
        self._error: HeliosError | None = None
        self._finished = False
        self._event = asyncio.Event()
        self.coalesced = 0

    def push(self, update: RequestUpdate) -> None:
        if self._pending is not None:
            self.coalesced += 1
            update = merge_updates(self._pending, update)
        self._pending = update
        self._event.set()

    def fail(self, error: HeliosError) -> None:
        if self._error is None:
            self._error = error
        self._event.set()

    @property
    def done(self) -> bool:
        return self._finished

    async def next(self) -> RequestUpdate | None:
        """Everything since the last call, merged; None once the request has finished."""
        while True:
            if self._pending is not None:
                update, self._pending = self._pending, None
                self._event.clear()
                if update.finished:
                    self._finished = True
                return update
            if self._error is not None:
                self._finished = True
                raise self._error
            if self._finished:
                return None
            self._event.clear()
            await self._event.wait()

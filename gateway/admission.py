"""HTTP admission: at most `queue_capacity + max_active` requests reserved at once.

The reference design checks admission *before* any JSON body is read (the ingress layer calls
`check` on the raw ASGI scope: 429 + Retry-After when every permit is taken, and the body is
never read), and a request keeps its permit through the whole streamed response. The permit
itself is taken once the body is complete (`try_acquire`), so a client that sends its body
slowly holds only a `BodyReaders` permit, a pool of its own (`max_body_readers`) that bounds the
memory of bodies being read, under the ingress layer's body deadline. Embedders (and SIGTERM)
may pause admission: new requests then get 503 while admitted responses finish;
`wait_for_requests` waits for them.
"""

from __future__ import annotations

import asyncio
import enum

from services.common.errors import HeliosError, RateLimitedError, UnavailableError


class AdmissionState(enum.Enum):
    OPEN = "open"
    PAUSED = "paused"          # embedder paused it; resume_admission() reopens
    CLOSED = "closed"          # shutting down; never reopens


class Permit:
    """One reserved slot (admission or body reader); `release()` is idempotent."""

    __slots__ = ("_admission", "_released")

    def __init__(self, admission: Admission | BodyReaders) -> None:
        self._admission = admission
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._release()

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Admission:
    """Counts admitted HTTP requests against `limit`; all methods run on the event loop."""

    def __init__(self, limit: int, *, capacity_hint: str = "", retry_after_s: float = 1.0
                 ) -> None:
        if limit < 1:
            raise ValueError("admission limit must be >= 1")
        self.limit = limit
        self.capacity_hint = capacity_hint
        self.retry_after_s = retry_after_s
        self.state = AdmissionState.OPEN
        self.active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def accepting(self) -> bool:
        return self.state is AdmissionState.OPEN

    def try_acquire(self) -> Permit:
        """Reserve a permit or raise the typed rejection (429 full, 503 paused/closed)."""
        self.check()
        self.active += 1
        self._idle.clear()
        return Permit(self)

    def check(self) -> None:
        """Raise what `try_acquire` would raise now, reserving nothing."""
        if self.state is AdmissionState.CLOSED:
            raise UnavailableError("the gateway is shutting down; retry on another replica",
                                   retry_after_s=self.retry_after_s, service="gateway")
        if self.state is AdmissionState.PAUSED:
            raise UnavailableError("admission is paused", retry_after_s=self.retry_after_s,
                                   service="gateway")
        if self.active >= self.limit:
            raise RateLimitedError(
                f"too many requests: all {self.limit} HTTP admission permits are in use",
                hint=self.capacity_hint, retry_after_s=self.retry_after_s, service="gateway")

    def _release(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._idle.set()

    def pause(self) -> None:
        """New requests get 503 until `resume()`; admitted responses keep running."""
        if self.state is AdmissionState.OPEN:
            self.state = AdmissionState.PAUSED

    def resume(self) -> None:
        if self.state is AdmissionState.PAUSED:
            self.state = AdmissionState.OPEN

    def close(self) -> None:
        """Stop admission for good (shutdown)."""
        self.state = AdmissionState.CLOSED

    async def wait_for_requests(self, timeout_s: float | None = None) -> bool:
        """Wait until no admitted request remains; False if `timeout_s` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class BodyReaders:
    """Counts requests whose body is being read (`max_body_readers`), apart from admission:
    a slow sender holds one of these, never a generation permit."""

    def __init__(self, limit: int, *, retry_after_s: float = 1.0) -> None:
        if limit < 1:
            raise ValueError("body reader limit must be >= 1")
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.active = 0

    def try_acquire(self) -> Permit:
        """Reserve a reader slot or raise 429 (too many bodies in flight at once)."""
        if self.active >= self.limit:
            raise RateLimitedError(
                f"too many requests are sending their bodies at once (all {self.limit} body "
                "reader slots are in use)", hint="raise --max-body-readers (gateway)",
                retry_after_s=self.retry_after_s, service="gateway")
        self.active += 1
        return Permit(self)

    def _release(self) -> None:
        self.active -= 1


def rejection(error: HeliosError) -> str:
    """Metrics label for an admission rejection."""
    return "full" if isinstance(error, RateLimitedError) else "closed"

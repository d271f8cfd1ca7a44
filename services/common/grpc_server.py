"""The async gRPC server every service runs: health, reflection, typed errors, graceful shutdown.

A service supplies its servicer bindings and a `Lifecycle` (load, stop admission, drain, close);
`serve` does the rest the same way for all four services:

1. bind the listen address (host:port or unix:///path), start serving health NOT_SERVING;
2. `lifecycle.start(health)` loads the model / assets; once it returns the start-up heap is
   frozen (services/common/heap.py), then SERVING (a lifecycle with `dynamic_health = True`
   sets its own status, e.g. the frontend tracking its upstreams);
3. on SIGTERM/SIGINT: health NOT_SERVING (for good: a lifecycle's later SERVING is ignored),
   `stop_admission()`, `drain(grace_period_s)`, stop the server, `close()`, exit 0 (1 if the
   drain failed);
4. a failure reported through `health.fail(exc)` or raised by `start()` exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from services.common.config import ServiceConfig
from services.common.errors import ValidationError
from services.common.grpc_errors import ErrorInterceptor
from services.common.heap import freeze_startup_heap
from services.common.metrics import MetricsEndpoint, service_registry
from services.common.startup import startup_phases

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

# Generous message limits: prepared pixel tensors and long prompts travel over these channels.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
_MESSAGE_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
# Keepalive: clients ping every channel (idle ones too) at this interval, and servers accept
# pings that often. Both sides read the one value, so they cannot disagree: a server left at
# gRPC's default (pings at most every 5 minutes) counts every 30 s ping as a strike and answers
# GOAWAY too_many_pings, which ends every stream on the connection (the health watches) and
# fails requests racing the reconnect. `HELIOS_GRPC_KEEPALIVE_MS` changes it for a whole
# deployment (tests use 1 s); every service and the gateway must see the same value.
KEEPALIVE_ENV = "HELIOS_GRPC_KEEPALIVE_MS"
DEFAULT_KEEPALIVE_MS = 30_000
KEEPALIVE_TIMEOUT_MS = 20_000


def keepalive_ms() -> int:
    """The ping interval: `HELIOS_GRPC_KEEPALIVE_MS` if set (a positive integer), else 30 s."""
    raw = os.environ.get(KEEPALIVE_ENV, "").strip()
    if not raw:
        return DEFAULT_KEEPALIVE_MS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValidationError(f"{KEEPALIVE_ENV} must be a positive integer (milliseconds), "
                              f"got {raw!r}", param=KEEPALIVE_ENV)
    return value


def channel_options(interval_ms: int | None = None) -> tuple[tuple[str, int], ...]:
    """Client channel options: message limits and keepalive pings every `interval_ms`."""
    interval = interval_ms or keepalive_ms()
    return (
        *_MESSAGE_OPTIONS,
        ("grpc.keepalive_time_ms", interval),
        ("grpc.keepalive_timeout_ms", min(KEEPALIVE_TIMEOUT_MS, interval * 2)),
        ("grpc.keepalive_permit_without_calls", 1),
        # Keep pinging an idle connection (gRPC's default stops after 2 pings without data).
        ("grpc.http2.max_pings_without_data", 0),
    )


def server_options(interval_ms: int | None = None) -> tuple[tuple[str, int], ...]:
    """Server options: message limits, and pings accepted as often as the clients send them.

    The accepted interval is half the clients' so that timer and scheduling jitter (a ping a
    few milliseconds early) never counts as a strike."""
    interval = interval_ms or keepalive_ms()
    return (
        *_MESSAGE_OPTIONS,
        ("grpc.keepalive_time_ms", interval),          # servers ping too: dead peers show
        ("grpc.keepalive_timeout_ms", min(KEEPALIVE_TIMEOUT_MS, interval * 2)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", max(1, interval // 2)),
        ("grpc.http2.max_pings_without_data", 0),
    )


# The options at the default interval (for code that opens a channel without open_channel).
CHANNEL_OPTIONS = channel_options(DEFAULT_KEEPALIVE_MS)


@dataclass(frozen=True)
class ServiceBinding:
    """One gRPC service to host: its full proto name, servicer and generated `add_*` function."""

    name: str
    servicer: Any
    add_to_server: Callable[[Any, grpc.aio.Server], None]


class HealthReporter:
    """What a lifecycle may do to health: flip SERVING / NOT_SERVING, or report a fatal failure."""

    def __init__(self, servicer: health.aio.HealthServicer, names: Sequence[str]) -> None:
        self._servicer = servicer
        self._names = ("", *names)
        self.serving = False
        self.stopping = False
        self.fatal: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def set_serving(self, serving: bool) -> None:
        """Flip readiness; once the shutdown began (`stop()`) it stays NOT_SERVING."""
        if serving and self.stopping:
            return
        if serving != self.serving:
            log.info("health %s", "SERVING" if serving else "NOT_SERVING")
        self.serving = serving
        for name in self._names:
            await self._servicer.set(name, SERVING if serving else NOT_SERVING)

    async def stop(self) -> None:
        """NOT_SERVING for good: the shutdown began (before anything is torn down)."""
        self.stopping = True
        await self.set_serving(False)

    def fail(self, exc: BaseException) -> None:
        """Report an unrecoverable failure: the service drains and exits 1."""
        if not self.fatal.done():
            self.fatal.set_result(exc)


class Lifecycle(Protocol):
    dynamic_health: bool

    async def start(self, health: HealthReporter) -> None: ...
    async def stop_admission(self) -> None: ...
    async def drain(self, timeout_s: float) -> bool: ...
    async def close(self) -> None: ...


class BasicLifecycle:
    """A lifecycle with nothing to load or drain (override what a service needs)."""

    dynamic_health = False

    async def start(self, health: HealthReporter) -> None:
        return None

    async def stop_admission(self) -> None:
        return None

    async def drain(self, timeout_s: float) -> bool:
        return True

    async def close(self) -> None:
        return None


def _prepare_listen(address: str) -> None:
    if address.startswith("unix://"):
        path = Path(address.removeprefix("unix://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


async def serve(
    *,
    service: str,
    config: ServiceConfig,
    bindings: Sequence[ServiceBinding],
    lifecycle: Lifecycle,
    registry: CollectorRegistry | None = None,
    freeze_heap: bool = True,
) -> int:
    """Run one service until SIGTERM/SIGINT or a fatal failure; return the exit code.

    With `config.metrics_listen` set, `registry` (default: a registry with only the uptime
    gauge) is served as Prometheus text from the moment the listener is bound. `freeze_heap`
    (step 2) is for the service's own process; a test serving in its own process passes
    False."""
    startup_phases(service).record_process_start("start Python and import")
    server = grpc.aio.server(interceptors=[ErrorInterceptor(service)], options=server_options())
    for binding in bindings:
        binding.add_to_server(binding.servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [b.name for b in bindings]
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME],
        server,
    )
    reporter = HealthReporter(health_servicer, names)
    await reporter.set_serving(False)

    _prepare_listen(config.listen)
    try:
        port = server.add_insecure_port(config.listen)
    except RuntimeError as exc:
        log.error("cannot listen on %s: %s", config.listen, exc)
        return 1
    await server.start()
    metrics = None
    if config.metrics_listen:
        try:
            metrics = MetricsEndpoint.start(config.metrics_listen,
                                            registry or service_registry(service))
        except OSError as exc:
            log.error("cannot serve metrics on %s: %s", config.metrics_listen, exc)
            await server.stop(None)
            return 1
    log.info("%s listening", service, extra={"fields": {"listen": config.listen, "port": port,
                                                        "pid": os.getpid()}})

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    exit_code = 0
    start_task: asyncio.Future[Any] = asyncio.create_task(lifecycle.start(reporter),
                                                          name=f"{service}-start")
    stop_task: asyncio.Future[Any] = asyncio.create_task(stop.wait())
    fatal: asyncio.Future[Any] = reporter.fatal
    done, _ = await asyncio.wait({start_task, stop_task, fatal},
                                 return_when=asyncio.FIRST_COMPLETED)
    if start_task in done and start_task.exception() is not None:
        log.error("%s failed to start: %s", service, start_task.exception(),
                  exc_info=start_task.exception())
        exit_code = 1
    elif start_task in done:
        if freeze_heap:               # before SERVING: no request waits on the collection
            freeze_startup_heap(service)
        if not lifecycle.dynamic_health:
            await reporter.set_serving(True)
        log.info("%s ready", service)
        done, _ = await asyncio.wait({stop_task, fatal},
                                     return_when=asyncio.FIRST_COMPLETED)
    if reporter.fatal.done():
        failure = reporter.fatal.result()
        log.error("%s failed: %s", service, failure, exc_info=failure)
        exit_code = 1
    if not start_task.done():
        start_task.cancel()
        with contextlib.suppress(BaseException):
            await start_task

    log.info("%s shutting down", service)
    await reporter.stop()
    drained = True
    try:
        await lifecycle.stop_admission()
        drained = await lifecycle.drain(config.grace_period_s)
    except Exception:
        log.exception("%s drain failed", service)
        drained = False
    await server.stop(grace=1.0)
    try:
        await lifecycle.close()
    except Exception:
        log.exception("%s close failed", service)
        drained = False
    stop_task.cancel()
    if metrics is not None:
        metrics.stop()
    if not drained:
        exit_code = 1
    log.info("%s stopped", service, extra={"fields": {"exit_code": exit_code}})
    return exit_code

"""Engine service entrypoint: `run_engine(config)` and the gRPC servicer (the protobuf edge).

The servicer process starts the engine-core process (scheduler and runner, see
services/engine/core/), verifies the model files while the core imports and starts its device,
then lets the core load them, and relays: Generate submits a request and streams its
coalesced updates; a client cancel of the stream aborts the request. Health turns SERVING once
the core has loaded the model, NOT_SERVING while draining; a core failure fails every stream
with its typed error and the service exits 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence

from services.common.config import load_config
from services.common.core import ModelSource, open_model
from services.common.errors import (
    DrainFailure,
    ErrorStage,
    GrammarError,
    HeliosError,
    UnavailableError,
    ValidationError,
)
from services.common.grpc_server import BasicLifecycle, HealthReporter, ServiceBinding, serve
from services.common.logging import setup_logging
from services.common.metrics import service_registry
from services.common.pb import engine_pb2, engine_pb2_grpc
from services.common.startup import startup_phases
from services.engine import wire
from services.engine.config import EngineConfig
from services.engine.core.client import CoreClient
from services.engine.core.telemetry import LoadSnapshot
from services.engine.kv_events import KVEventPublisher
from services.engine.metrics import EngineMetrics
from services.engine.prefix.history import BLOCK_TOKENS
from services.engine.prefix.records import BlockEvent

SERVICE_NAME = "helios.v1.Engine"
DEFAULT_DRAIN_S = 5.0
SUBSCRIBER_BACKLOG = 10_000
METRICS_FETCH_TIMEOUT_S = 2.0

log = logging.getLogger(__name__)


class EngineLifecycle(BasicLifecycle):
    """Opens the model, runs the engine core; stop admission, drain and close through it."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model: ModelSource | None = None
        self.client: CoreClient | None = None
        self.health: HealthReporter | None = None
        self.metrics: EngineMetrics | None = None
        self.kv_events: KVEventPublisher | None = None

    async def start(self, health: HealthReporter) -> None:
        self.health = health
        phases = startup_phases("engine")
        # the core imports and starts its device while the files are verified; it reads
        # nothing of the model before start() tells it they are
        self.client = CoreClient(self.config, on_failure=health.fail)
        self.client.spawn()
        with phases.phase("verify model files"):
            self.model = await asyncio.to_thread(
                open_model, self.config.model,
                allow_missing_weights=self.config.load_format == "dummy")
        if self.metrics is not None:
            self.metrics.model_name = self.model.manifest.card_id
        await self.client.start()
        if self.config.kv_events_endpoint:
            self.kv_events = KVEventPublisher(
                self.config.kv_events_endpoint, self.config.kv_events_replay_endpoint,
                topic=self.config.kv_events_topic, buffer_batches=self.config.kv_events_buffer)
            self.client.subscribe(self.kv_events.deliver)

    def core(self) -> CoreClient:
        if self.client is None or self.client.ready is None:
            raise UnavailableError("the engine is still loading its model", retry_after_s=2.0)
        return self.client

    async def stop_admission(self) -> None:
        if self.client is not None and self.client.ready is not None:
            with contextlib.suppress(HeliosError):
                await self.client.pause()

    async def drain(self, timeout_s: float) -> bool:
        if self.client is None or self.client.ready is None:
            return self.client is None or self.client.failure is None
        try:
            result = await self.client.drain(timeout_s)
        except HeliosError as exc:
            log.error("drain failed: %s", exc)
            return False
        return result.drained

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.kv_events is not None:
            self.kv_events.close()


class EngineServicer(engine_pb2_grpc.EngineServicer):
    def __init__(self, config: EngineConfig, lifecycle: EngineLifecycle,
                 metrics: EngineMetrics) -> None:
        self.config = config
        self.lifecycle = lifecycle
        self.metrics = metrics
        self._event_sequence = 0
        self._aborts: set[asyncio.Task[None]] = set()   # keep fire-and-forget aborts alive

    async def Generate(self, request, context) -> AsyncIterator[engine_pb2.EngineGenerateResponse]:
        started = time.monotonic()
        first_token = True
        core = self.lifecycle.core()
        assert core.ready is not None
        engine_request = wire.request_from_pb(request, core.ready.info.vocab_size)
        request_id = engine_request.request_id
        if request.request_id and core.has_stream(request_id):
            raise ValidationError(f"request id {request_id!r} is already live",
                                  param="request_id")
        stream = core.open_stream(request_id)
        rejected = False
        try:
            try:
                admitted = await core.submit(engine_request)
            except HeliosError:
                rejected = True
                raise
            yield wire.admitted_to_pb(admitted)
            while (update := await stream.next()) is not None:
                if first_token and any(d.token_ids for d in update.deltas):
                    first_token = False
                    self.metrics.observe_first_token(time.monotonic() - started)
                if update.finished:
                    self.metrics.observe_finished(time.monotonic() - started)
                kind = next((d.error_kind for d in update.deltas if d.error), "")
                update, failure = wire.split_failure(update)
                if update is not None:
                    yield wire.update_to_pb(update)
                if failure and kind == "unavailable":   # its image's pixels are gone
                    raise UnavailableError(failure, stage=ErrorStage.EXECUTION)
                if failure:   # a choice's grammar could not continue: the request fails
                    raise GrammarError(failure, stage=ErrorStage.EXECUTION)
                if stream.done:
                    break
        finally:
            core.close_stream(request_id)
            # the caller went away (even while admission was in flight): stop the request
            if not rejected and not stream.done and core.failure is None:
                task = asyncio.get_running_loop().create_task(
                    self._abort_quietly(core, request_id))
                self._aborts.add(task)
                task.add_done_callback(self._aborts.discard)

    @staticmethod
    async def _abort_quietly(core: CoreClient, request_id: str) -> None:
        with contextlib.suppress(HeliosError):
            await core.abort((request_id,))

    async def Abort(self, request, context):
        count = await self.lifecycle.core().abort(request.request_ids)
        return engine_pb2.AbortResponse(num_aborted=count)

    async def GetModelInfo(self, request, context):
        core = self.lifecycle.core()
        assert self.lifecycle.model is not None and core.ready is not None
        return wire.model_info_to_pb(self.lifecycle.model.manifest, core.ready.info,
                                     self.config)

    async def GetLoad(self, request, context):
        load = await self.lifecycle.core().load(wire.load_query_from_pb(request))
        return wire.load_to_pb(load)

    async def PauseAdmission(self, request, context):
        return wire.admission_to_pb(await self.lifecycle.core().pause())

    async def ResumeAdmission(self, request, context):
        state = await self.lifecycle.core().resume()
        if self.lifecycle.health is not None and not state.draining:
            await self.lifecycle.health.set_serving(True)
        return wire.admission_to_pb(state)

    async def Drain(self, request, context):
        core = self.lifecycle.core()
        if self.lifecycle.health is not None:
            await self.lifecycle.health.set_serving(False)
        timeout = request.timeout_s if request.HasField("timeout_s") else DEFAULT_DRAIN_S
        result = await core.drain(max(0.0, timeout))
        if not result.drained:
            raise DrainFailure(f"{result.message} ({result.cancelled_requests} requests "
                               "cancelled)")
        return wire.drain_to_pb(result)

    async def SubscribePrefixEvents(self, request, context):
        core = self.lifecycle.core()
        assert core.ready is not None
        queue: asyncio.Queue[BlockEvent | None] = asyncio.Queue()

        def deliver(event: BlockEvent) -> None:
            if queue.qsize() >= SUBSCRIBER_BACKLOG:
                queue.put_nowait(None)           # fell behind: end the subscription
            else:
                queue.put_nowait(event)

        unsubscribe = core.subscribe(deliver)
        try:
            if request.replay_existing:
                for stored in await core.replay_prefix_blocks():
                    yield self._event(stored, core)
            while True:
                event = await queue.get()
                if event is None:
                    raise UnavailableError("the prefix-event subscriber fell behind; "
                                           "subscribe again with replay_existing")
                yield self._event(event, core)
        finally:
            unsubscribe()

    def _event(self, event: BlockEvent, core: CoreClient) -> engine_pb2.PrefixEvent:
        assert core.ready is not None
        self._event_sequence += 1
        return wire.prefix_event_to_pb(event, self._event_sequence, core.ready.session_id,
                                       BLOCK_TOKENS)


def _load_fetcher(lifecycle: EngineLifecycle, loop: asyncio.AbstractEventLoop
                  ) -> Callable[[], LoadSnapshot | None]:
    """Read the core's load snapshot from the metrics server's thread (None while loading)."""

    def fetch() -> LoadSnapshot | None:
        core = lifecycle.client
        if core is None or core.ready is None or core.failure is not None:
            return None
        future = asyncio.run_coroutine_threadsafe(core.load(), loop)
        try:
            return future.result(timeout=METRICS_FETCH_TIMEOUT_S)
        except Exception:  # a scrape during shutdown shows no engine values
            future.cancel()
            return None

    return fetch


async def _serve(config: EngineConfig) -> int:
    lifecycle = EngineLifecycle(config)
    registry = service_registry("engine")
    metrics = EngineMetrics(registry, "", _load_fetcher(lifecycle, asyncio.get_running_loop()),
                            page_size=config.page_size)
    lifecycle.metrics = metrics
    servicer = EngineServicer(config, lifecycle, metrics)
    binding = ServiceBinding(SERVICE_NAME, servicer, engine_pb2_grpc.add_EngineServicer_to_server)
    return await serve(service="engine", config=config, bindings=[binding], lifecycle=lifecycle,
                       registry=registry)


def run_engine(config: EngineConfig) -> int:
    setup_logging("engine", config.log_level, config.log_format)
    return asyncio.run(_serve(config))


def main(argv: Sequence[str] | None = None) -> int:
    config = load_config(EngineConfig, argv, section="engine", prog="helios serve engine")
    return run_engine(config)


if __name__ == "__main__":
    sys.exit(main())

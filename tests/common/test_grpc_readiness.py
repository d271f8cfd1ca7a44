"""Readiness at drain (issue 19): health answers NOT_SERVING before anything is torn down.

`serve()` stops every gRPC service (engine, frontend, imageprep): each hook of the teardown
(stop_admission, drain, close) asks the live health service what it answers at that moment.
The dynamic lifecycle keeps reporting SERVING from a background task the way the frontend's
upstream watches do; once the shutdown began, that must not turn readiness back on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.config import ServiceConfig
from services.common.grpc_server import NOT_SERVING, SERVING, BasicLifecycle, HealthReporter, serve


async def _status(address: str, name: str = "") -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=name), timeout=5)
    return reply.status


class RecordingLifecycle(BasicLifecycle):
    def __init__(self, address: str, *, dynamic: bool) -> None:
        self.address = address
        self.dynamic_health = dynamic
        self.health: HealthReporter | None = None
        self.seen: list[tuple[str, int]] = []
        self._refresher: asyncio.Task[None] | None = None

    async def start(self, health: HealthReporter) -> None:
        self.health = health
        if self.dynamic_health:
            self._refresher = asyncio.create_task(self._refresh())

    async def _refresh(self) -> None:
        while True:                      # an upstream watch that still sees its upstream up
            await self.health.set_serving(True)
            await asyncio.sleep(0.005)

    async def stop_admission(self) -> None:
        self.seen.append(("stop_admission", await _status(self.address)))
        await asyncio.sleep(0.05)        # the refresher gets its chances
        self.seen.append(("stop_admission, later", await _status(self.address)))

    async def drain(self, timeout_s: float) -> bool:
        self.seen.append(("drain", await _status(self.address)))
        return True

    async def close(self) -> None:
        assert self.health is not None
        self.seen.append(("close", SERVING if self.health.serving else NOT_SERVING))
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
async def test_health_is_not_serving_before_teardown_starts(tmp_path, dynamic):
    address = f"unix://{tmp_path}/s.sock"
    lifecycle = RecordingLifecycle(address, dynamic=dynamic)
    config = ServiceConfig(listen=address, grace_period_s=1.0)
    served = asyncio.create_task(serve(service="probe", config=config, bindings=[],
                                       lifecycle=lifecycle, freeze_heap=False))
    for _ in range(200):
        with contextlib.suppress(grpc.RpcError):
            if await _status(address) == SERVING:
                break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the service never served")
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(served, 30) == 0
    assert lifecycle.seen == [("stop_admission", NOT_SERVING),
                              ("stop_admission, later", NOT_SERVING),
                              ("drain", NOT_SERVING), ("close", NOT_SERVING)]


async def test_the_engine_drain_rpc_turns_not_serving_before_the_core_drains():
    """Engine.Drain (the admin verb) too: NOT_SERVING first, then the core's drain."""
    from grpc_health.v1 import health

    from services.common.pb import engine_pb2
    from services.engine.core.messages import DrainResult
    from services.engine.server import EngineServicer

    reporter = HealthReporter(health.aio.HealthServicer(), ["helios.v1.Engine"])
    await reporter.set_serving(True)
    seen: list[bool] = []

    class Core:
        async def drain(self, timeout_s: float) -> DrainResult:
            seen.append(reporter.serving)
            return DrainResult(True, 0, "drained")

    class Lifecycle:
        health = reporter

        def core(self) -> Core:
            return Core()

    servicer = EngineServicer(None, Lifecycle(), None)   # type: ignore[arg-type]
    reply = await servicer.Drain(engine_pb2.DrainRequest(timeout_s=1.0), None)
    assert reply.drained and seen == [False]

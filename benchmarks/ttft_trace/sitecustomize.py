"""Stage marks for benchmarks/trace_ttft.py: imported at start-up by every Python process of a
`helios run` stack whose PYTHONPATH puts this folder first (trace_ttft.py does so). Each
service (gateway, frontend, engine servicer, engine core) wraps a few of its own functions
and appends `<wall time> <mark>` lines to $HELIOS_TTFT_TRACE_DIR/<role>-<pid>.txt. Nothing
happens in a process that has no HELIOS_TTFT_TRACE_DIR or that is none of those services.
"""

from __future__ import annotations

import os
import sys
import time

_DIR = os.environ.get("HELIOS_TTFT_TRACE_DIR")


def _role(argv: str) -> str | None:
    if "multiprocessing" in argv:
        return "core"                     # the engine core, spawned by the engine servicer
    if "serve" not in argv:
        return None
    for name in ("frontend", "gateway", "engine"):
        if name in argv:
            return name
    return None


def _install(role: str) -> None:
    # open for the process's lifetime, line-buffered (a mark is on disk when written)
    log = open(os.path.join(_DIR, f"{role}-{os.getpid()}.txt"), "a", buffering=1)  # noqa: SIM115

    def mark(label: str) -> None:
        log.write(f"{time.time():.6f} {label}\n")

    def wrap_stream(owner, name: str, prefix: str) -> None:
        inner = getattr(owner, name)

        async def traced(self, *args, **kwargs):
            mark(f"{prefix}.enter")
            count = 0
            async for item in inner(self, *args, **kwargs):
                mark(f"{prefix}.yield{count}")
                count += 1
                yield item
        setattr(owner, name, traced)

    if role == "frontend":
        from services.frontend import server
        from services.frontend.generate import upstream

        wrap_stream(server.FrontendServicer, "Generate", "frontend.Generate")
        call = upstream.EngineStream.__aenter__
        read = upstream.EngineStream.__anext__

        async def aenter(self):
            mark("frontend.engine_call")
            return await call(self)

        async def anext_(self):
            step = await read(self)
            mark("frontend.engine_message")
            return step
        upstream.EngineStream.__aenter__ = aenter
        upstream.EngineStream.__anext__ = anext_
    elif role == "engine":
        from services.engine import server
        from services.engine.core import client

        wrap_stream(server.EngineServicer, "Generate", "engine.Generate")
        dispatch = client.CoreClient._dispatch

        def traced_dispatch(self, message):
            mark("engine.core_message")
            return dispatch(self, message)
        client.CoreClient._dispatch = traced_dispatch
    elif role == "core":
        from services.engine.core import loop, outbox

        complete, write = loop.EngineCore._complete, outbox.Outbox._write

        def traced_complete(self, completion):
            mark("core.step_completed")
            return complete(self, completion)

        def traced_write(self, message):
            result = write(self, message)
            mark("core.sent")
            return result
        loop.EngineCore._complete = traced_complete
        outbox.Outbox._write = traced_write
    mark("traced")


if _DIR:
    _role_name = _role(" ".join(sys.argv))
    if _role_name is not None:
        _install(_role_name)

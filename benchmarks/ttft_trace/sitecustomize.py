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


def _role(argv: list[str]) -> str | None:
    if any("multiprocessing" in word for word in argv):
        return "core"                     # the engine core, spawned by the engine servicer
    # `... serve <service> --flags`: the word after "serve" (a flag may name another service,
    # as the gateway's --frontend-address does)
    if "serve" not in argv[:-1]:
        return None
    name = argv[argv.index("serve") + 1]
    return name if name in ("frontend", "gateway", "engine", "imageprep") else None


def _install(role: str) -> None:
    # open for the process's lifetime, line-buffered (a mark is on disk when written)
    log = open(os.path.join(_DIR, f"{role}-{os.getpid()}.txt"), "a", buffering=1)  # noqa: SIM115

    def mark(label: str) -> None:
        log.write(f"{time.time():.6f} {label}\n")

    def wrap_call(owner, name: str, prefix: str) -> None:
        """Marks around a coroutine method (async) or a plain one."""
        import inspect

        inner = getattr(owner, name)
        if inspect.iscoroutinefunction(inner):
            async def traced(self, *args, **kwargs):
                mark(f"{prefix}.enter")
                try:
                    return await inner(self, *args, **kwargs)
                finally:
                    mark(f"{prefix}.exit")
        else:
            def traced(self, *args, **kwargs):
                mark(f"{prefix}.enter")
                try:
                    return inner(self, *args, **kwargs)
                finally:
                    mark(f"{prefix}.exit")
        setattr(owner, name, traced)

    def wrap_stream(owner, name: str, prefix: str, each: bool = True) -> None:
        """Marks at the stream's start, at each item (`each`) or the first, and its end."""
        inner = getattr(owner, name)

        async def traced(self, *args, **kwargs):
            mark(f"{prefix}.enter")
            count = 0
            async for item in inner(self, *args, **kwargs):
                if each or count == 0:
                    mark(f"{prefix}.yield{count}")
                count += 1
                yield item
            if not each:
                mark(f"{prefix}.end")
        setattr(owner, name, traced)

    if role == "gateway":
        from gateway import frontend_client, ingress

        wrap_stream(frontend_client.GenerateCall, "events", "gateway.event")
        enter, generate = ingress.Ingress.__call__, frontend_client.FrontendClient.generate

        async def traced_call(self, scope, receive, send):
            if scope.get("type") == "http" and scope.get("method") == "POST":
                mark("gateway.request")
                take = receive

                async def receive():     # the last body chunk read: the whole request is in
                    message = await take()
                    if message.get("type") == "http.request" and not message.get("more_body"):
                        mark("gateway.body_received")
                    return message
            return await enter(self, scope, receive, send)

        def traced_generate(self, *args, **kwargs):
            mark("gateway.frontend_call")
            return generate(self, *args, **kwargs)
        ingress.Ingress.__call__ = traced_call
        frontend_client.FrontendClient.generate = traced_generate
    elif role == "frontend":
        from services.frontend import server
        from services.frontend.generate import upstream

        wrap_stream(server.FrontendServicer, "Generate", "frontend.Generate")
        wrap_call(upstream.ImagePrepClient, "expand", "frontend.imageprep_prepare")
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
    elif role == "imageprep":
        from services.imageprep import server

        wrap_call(server.ImagePrepServicer, "Prepare", "imageprep.Prepare")
        wrap_stream(server.ImagePrepServicer, "FetchPixels", "imageprep.FetchPixels",
                    each=False)
    elif role == "core":
        from services.engine.core import loop, outbox
        from services.engine.vision import pixels, stage

        wrap_call(stage.VisionStage, "prefetch", "core.vision_prefetch")
        wrap_call(stage.VisionStage, "_encode", "core.vision_encode")
        wrap_call(pixels.PixelPrefetcher, "fetch", "core.vision_pixels")

        complete, write = loop.EngineCore._complete, outbox.Outbox._write
        write_inline = outbox.Outbox._write_inline

        def traced_complete(self, completion):
            mark("core.step_completed")
            return complete(self, completion)

        def traced_write(self, message):
            result = write(self, message)
            mark("core.sent")
            return result
        def traced_write_inline(self, message):
            result = write_inline(self, message)
            mark("core.sent")
            return result
        loop.EngineCore._complete = traced_complete
        outbox.Outbox._write = traced_write
        outbox.Outbox._write_inline = traced_write_inline
    mark("traced")


if _DIR:
    _role_name = _role(sys.argv)
    if _role_name is not None:
        _install(_role_name)

if _DIR and os.environ.get("HELIOS_TTFT_PROFILE") and _role_name in ("gateway", "frontend",
                                                                       "engine"):
    # HELIOS_TTFT_PROFILE=DIR: a cProfile of each service process, dumped into DIR at exit
    import atexit
    import cProfile

    _profile = cProfile.Profile()
    _profile.enable()
    atexit.register(lambda: _profile.dump_stats(
        os.path.join(os.environ["HELIOS_TTFT_PROFILE"], f"{_role_name}-{os.getpid()}.prof")))

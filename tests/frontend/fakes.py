"""In-process fakes of the frontend's upstreams, served over real gRPC.

`FakeEngine` implements `helios.v1.Engine` from a script: per choice, the token ids to stream
(in the chunks given: real ids from the real tokenizer, split arbitrarily), the finish reason,
logprobs; or a typed error to raise at admission or mid-stream; or to hang until cancelled. It
records every request it received and whether the caller cancelled the stream.
`FakeImagePrep` expands image placeholders like imageprep does. `FrontendHarness` runs the real
frontend servicer, lifecycle and error interceptor in-process against them.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from services.common.errors import HeliosError
from services.common.grpc_errors import ErrorInterceptor
from services.common.pb import (
    common_pb2,
    engine_pb2,
    engine_pb2_grpc,
    frontend_pb2_grpc,
    imageprep_pb2,
    imageprep_pb2_grpc,
)
from services.frontend.config import FrontendConfig
from services.frontend.model import FrontendModel
from services.frontend.server import FrontendLifecycle, FrontendServicer
from tests.support.processes import free_port


@dataclass
class ScriptedChoice:
    chunks: list[list[int]]                       # token ids per engine message
    finish: int = common_pb2.FINISH_REASON_STOP
    stop_token_id: int | None = None
    logprobs: bool = False                        # attach a made-up logprob per token


@dataclass
class Script:
    choices: list[ScriptedChoice] = field(default_factory=list)
    admission_error: HeliosError | None = None
    error_after_messages: int | None = None       # raise `stream_error` after this many
    stream_error: HeliosError | None = None
    hang_after_messages: int | None = None        # then wait until cancelled
    prompt_tokens: int | None = None
    cached_tokens: int = 0


class FakeEngine(engine_pb2_grpc.EngineServicer):
    def __init__(self, max_model_len: int = 4096, vision: bool = False) -> None:
        self.max_model_len = max_model_len
        self.vision = vision          # ModelInfo.capabilities.vision: the engine runs images
        self.script = Script()
        self.requests: list[engine_pb2.EngineGenerateRequest] = []
        self.cancelled = asyncio.Event()
        self.finished_normally = asyncio.Event()

    async def GetModelInfo(self, request, context):
        return engine_pb2.ModelInfo(model_id="fake", max_model_len=self.max_model_len,
                                    capabilities=common_pb2.Capabilities(vision=self.vision))

    async def Generate(self, request, context):
        self.requests.append(request)
        script = self.script
        if script.admission_error is not None:
            raise script.admission_error
        usage = common_pb2.Usage(prompt_tokens=script.prompt_tokens or
                                 len(request.prompt_token_ids),
                                 cached_tokens=script.cached_tokens)
        try:
            yield engine_pb2.EngineGenerateResponse(request_id=request.request_id, usage=usage)
            rounds = max((len(c.chunks) for c in script.choices), default=0)
            generated = 0
            for round_index in range(rounds):
                if script.error_after_messages == round_index:
                    raise script.stream_error or RuntimeError("scripted failure")
                if script.hang_after_messages == round_index:
                    await asyncio.Event().wait()
                outputs = []
                for index, choice in enumerate(script.choices):
                    if round_index >= len(choice.chunks):
                        continue
                    ids = choice.chunks[round_index]
                    generated += len(ids)
                    output = engine_pb2.EngineOutput(index=index, token_ids=ids)
                    if choice.logprobs:
                        output.logprobs.extend(
                            common_pb2.SampledLogprobs(
                                token_id=t, logprob=-0.5,
                                top=[common_pb2.TokenLogprob(token_id=t, logprob=-0.5),
                                     common_pb2.TokenLogprob(token_id=t + 1, logprob=-1.5)])
                            for t in ids)
                    if round_index == len(choice.chunks) - 1:
                        output.finish_reason = choice.finish
                        if choice.stop_token_id is not None:
                            output.stop_token_id = choice.stop_token_id
                    outputs.append(output)
                usage.completion_tokens = generated
                yield engine_pb2.EngineGenerateResponse(request_id=request.request_id,
                                                        outputs=outputs, usage=usage)
                await asyncio.sleep(0)
            self.finished_normally.set()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


class FakeImagePrep(imageprep_pb2_grpc.ImagePrepServicer):
    """Expands each placeholder into `tokens_per_image` copies; moves message ends."""

    def __init__(self, tokens_per_image: int = 4) -> None:
        self.tokens_per_image = tokens_per_image
        self.requests: list[imageprep_pb2.PrepareRequest] = []

    async def Prepare(self, request, context):
        self.requests.append(request)
        expanded: list[int] = []
        shift_at: list[tuple[int, int]] = []
        for position, token_id in enumerate(request.prompt_token_ids):
            if token_id == request.image_token_id:
                expanded.extend([token_id] * self.tokens_per_image)
                shift_at.append((position, self.tokens_per_image - 1))
            else:
                expanded.append(token_id)
        ends = [end + sum(extra for at, extra in shift_at if at < end)
                for end in request.message_token_ends]
        multimodal = common_pb2.MultimodalInputs(images=[
            common_pb2.ImageDescriptor(identity=bytes([i]) * 32, num_tokens=self.tokens_per_image,
                                       source_index=i) for i in range(len(request.images))])
        return imageprep_pb2.PrepareResponse(expanded_token_ids=expanded, multimodal=multimodal,
                                             message_token_ends=ends)


class UpstreamServer:
    """A grpc.aio server on 127.0.0.1 hosting fakes plus grpc.health (SERVING)."""

    def __init__(self, engine: FakeEngine | None = None,
                 imageprep: FakeImagePrep | None = None) -> None:
        self.engine = engine
        self.imageprep = imageprep
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.server = grpc.aio.server(interceptors=[ErrorInterceptor("engine")])
        if engine is not None:
            engine_pb2_grpc.add_EngineServicer_to_server(engine, self.server)
        if imageprep is not None:
            imageprep_pb2_grpc.add_ImagePrepServicer_to_server(imageprep, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), self.server)
        self.server.add_insecure_port(self.address)

    async def __aenter__(self) -> UpstreamServer:
        await self.server.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.server.stop(grace=None)


class _Health:
    """Stands in for the server's HealthReporter."""

    def __init__(self) -> None:
        self.serving = False
        self.changed = asyncio.Event()

    async def set_serving(self, serving: bool) -> None:
        self.serving = serving
        self.changed.set()

    def fail(self, exc: BaseException) -> None:
        raise exc


class FrontendHarness:
    """The real frontend servicer + lifecycle + interceptor on a local port."""

    def __init__(self, model: Path, engine_address: str, imageprep_address: str = "", *,
                 loaded: FrontendModel | None = None, **config: object) -> None:
        self.config = FrontendConfig(model=str(model), engine_address=engine_address,
                                     imageprep_address=imageprep_address, **config)
        if loaded is not None:  # a fresh copy of the mutable context limit per harness
            loaded.max_model_len = loaded.manifest.max_model_len
        self.lifecycle = FrontendLifecycle(self.config, loaded)
        self.health = _Health()
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.server = grpc.aio.server(interceptors=[ErrorInterceptor("frontend")])
        frontend_pb2_grpc.add_FrontendServicer_to_server(
            FrontendServicer(self.config, self.lifecycle), self.server)
        self.server.add_insecure_port(self.address)
        self.channel: grpc.aio.Channel | None = None

    async def __aenter__(self) -> FrontendHarness:
        await self.lifecycle.start(self.health)  # type: ignore[arg-type]
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(self.address)
        async with asyncio.timeout(20):
            while not self.health.serving:
                self.health.changed.clear()
                await self.health.changed.wait()
            if self.lifecycle._limits_task is not None:
                with contextlib.suppress(Exception):
                    await self.lifecycle._limits_task
        return self

    @property
    def stub(self) -> frontend_pb2_grpc.FrontendStub:
        assert self.channel is not None
        return frontend_pb2_grpc.FrontendStub(self.channel)

    async def __aexit__(self, *exc) -> None:
        if self.channel is not None:
            await self.channel.close()
        await self.server.stop(grace=None)
        await self.lifecycle.stop_admission()
        await self.lifecycle.close()

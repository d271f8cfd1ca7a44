"""Frontend service entrypoint: `run_frontend(config)`, its lifecycle and the gRPC servicer.

The servicer is the protobuf edge: it converts requests and events with the shared
`services.common.api.convert` (the same conversions the gateway's client uses), runs the domain
code on the preparation pool or the Generate pipeline, and converts results back.
Typed errors raised anywhere below become gRPC statuses in the shared ErrorInterceptor.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
from collections.abc import Sequence

import grpc
from prometheus_client import CollectorRegistry

from services.common.api.convert import (
    chat_input_from_pb,
    event_to_pb,
    generate_request_from_pb,
    model_card_to_pb,
)
from services.common.api.model_card import ModelCard
from services.common.config import load_config
from services.common.core import TOKENIZER_ROLES, open_model
from services.common.errors import ErrorKind, HeliosError, ValidationError
from services.common.grpc_client import UpstreamHealth, open_channel
from services.common.grpc_server import HealthReporter, ServiceBinding, serve
from services.common.logging import setup_logging
from services.common.metrics import service_registry
from services.common.pb import frontend_pb2, frontend_pb2_grpc
from services.common.startup import startup_phases
from services.frontend.config import FrontendConfig
from services.frontend.generate.pipeline import GeneratePipeline
from services.frontend.generate.prepare import input_chars
from services.frontend.generate.upstream import EngineClient, ImagePrepClient
from services.frontend.generate.workers import PreparationPool
from services.frontend.memory import MemoryReleaser, cap_mmap_threshold
from services.frontend.metrics import FrontendMetrics
from services.frontend.model import FrontendModel

SERVICE_NAME = "helios.v1.Frontend"
log = logging.getLogger(__name__)


class FrontendLifecycle:
    """Loads the model's assets; SERVING only while the engine (and imageprep) are SERVING."""

    dynamic_health = True

    def __init__(self, config: FrontendConfig, model: FrontendModel | None = None) -> None:
        """`model`: an already loaded model to serve (embedding, tests); else config.model."""
        self.config = config
        self.model: FrontendModel | None = model
        self.pool = PreparationPool(config.frontend_workers)
        self.memory = MemoryReleaser()    # malloc_trim after large requests
        cap_mmap_threshold()              # big blocks are unmapped when freed
        self.pipeline: GeneratePipeline | None = None
        self._health: HealthReporter | None = None
        self._upstreams: list[UpstreamHealth] = []
        self._channels: list[grpc.aio.Channel] = []
        self._engine: EngineClient | None = None
        self._limits_task: asyncio.Task[None] | None = None
        self.num_active = 0                  # Generate streams in flight
        self._idle = asyncio.Event()
        self._idle.set()

    def generation_started(self) -> None:
        self.num_active += 1
        self._idle.clear()

    def generation_ended(self) -> None:
        self.num_active -= 1
        if self.num_active == 0:
            self._idle.set()

    async def start(self, health: HealthReporter) -> None:
        self._health = health
        if self.model is None:
            with startup_phases("frontend").phase("load the tokenizer and chat template"):
                source = await asyncio.to_thread(open_model, self.config.model,
                                                 verify=TOKENIZER_ROLES)
                self.model = await asyncio.to_thread(
                    FrontendModel.load, source, tool_parser=self.config.tool_parser,
                    reasoning_parser=self.config.reasoning_parser,
                    default_template_kwargs=self.config.default_template_kwargs)
        engine_channel = open_channel(self.config.engine_address)
        self._channels.append(engine_channel)
        self._engine = EngineClient(engine_channel)
        imageprep = None
        self._upstreams.append(UpstreamHealth("engine", engine_channel, self._refresh))
        if self.config.imageprep_address:
            channel = open_channel(self.config.imageprep_address)
            self._channels.append(channel)
            imageprep = ImagePrepClient(channel)
            self._upstreams.append(UpstreamHealth("imageprep", channel, self._refresh))
        self.pipeline = GeneratePipeline(self.model, self.pool, self._engine, imageprep,
                                         context_hint=self.config.context_hint)
        for upstream in self._upstreams:
            upstream.start()

    async def _refresh(self) -> None:
        engine_up = bool(self._upstreams) and self._upstreams[0].serving
        if engine_up and (self._limits_task is None or self._limits_task.done()):
            self._limits_task = asyncio.create_task(self._fetch_limits())
        if self._health is not None:
            await self._health.set_serving(all(u.serving for u in self._upstreams))

    async def _fetch_limits(self) -> None:
        """Adopt the engine's effective context limit (it may be below the checkpoint's) and
        its admission bounds (reported on the model card)."""
        assert self._engine is not None and self.model is not None
        info = await self._engine.model_info()
        if info is None:
            return
        self.model.max_num_seqs = info.max_num_seqs
        self.model.max_waiting = info.max_waiting
        self.model.engine_vision = info.capabilities.vision
        if info.num_pages > 1:      # one page stays free for a snapshot restore
            self.model.kv_pool_tokens = (info.num_pages - 1) * info.page_size
        limit = info.max_model_len
        if limit and limit != self.model.max_model_len:
            log.info("engine context limit %d (checkpoint %d)", limit,
                     self.model.manifest.max_model_len)
            self.model.max_model_len = limit

    async def stop_admission(self) -> None:
        for upstream in self._upstreams:
            await upstream.stop()

    async def drain(self, timeout_s: float) -> bool:
        """Let active Generate streams finish (up to the grace period); the server stop that
        follows cancels the rest, and with them their engine requests."""
        if self.num_active:
            log.info("waiting up to %.1f s for %d active generation(s)", timeout_s,
                     self.num_active)
            try:
                await asyncio.wait_for(self._idle.wait(), timeout_s)
            except TimeoutError:
                log.warning("%d generation(s) still active after %.1f s: cancelling them",
                            self.num_active, timeout_s)
        return True

    async def close(self) -> None:
        if self._limits_task is not None:
            self._limits_task.cancel()
        for channel in self._channels:
            await channel.close()
        self.pool.shutdown()


class FrontendServicer(frontend_pb2_grpc.FrontendServicer):
    def __init__(self, config: FrontendConfig, lifecycle: FrontendLifecycle,
                 metrics: FrontendMetrics | None = None) -> None:
        self.config = config
        self.lifecycle = lifecycle
        self.metrics = metrics or FrontendMetrics(CollectorRegistry(), lifecycle.pool,
                                                  lambda: lifecycle.num_active)

    @property
    def model(self) -> FrontendModel:
        assert self.lifecycle.model is not None, "the frontend is not started"
        return self.lifecycle.model

    async def Generate(self, request, context):
        assert self.lifecycle.pipeline is not None
        timer = self.metrics.request()
        self.lifecycle.generation_started()
        large = False
        try:
            try:
                domain = generate_request_from_pb(request)
            except HeliosError:     # refused: its traceback's cycles hold the message
                large = self.lifecycle.memory.started(request.ByteSize())
                raise
            # what preparation copies is the text (ByteSize would encode the whole message,
            # a megabyte image's included, to measure it); an image's encoded bytes are single
            # blocks above the mmap threshold, unmapped when freed (memory.py)
            large = self.lifecycle.memory.started(input_chars(domain))
            async for event in self.lifecycle.pipeline.run(domain):
                timer.event(event)
                yield event_to_pb(event)
            timer.completed()
        except HeliosError as exc:
            if exc.kind is ErrorKind.CANCELLED:
                timer.cancelled()
            else:
                timer.failed(exc.kind.value)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            timer.cancelled()
            raise
        except Exception:
            timer.failed(ErrorKind.INTERNAL.value)
            raise
        finally:
            self.lifecycle.generation_ended()
            if large:
                self.lifecycle.memory.ended()

    async def RenderChat(self, request, context):
        self.model.check_name(request.model)
        chat = chat_input_from_pb(request.chat)
        rendered = await self.lifecycle.pool.run(self.model.renderer.render, chat)
        return frontend_pb2.RenderChatResponse(
            prompt=rendered.prompt, token_ids=rendered.token_ids,
            message_token_ends=list(rendered.message_token_ends),
            num_images=rendered.num_images)

    async def _token_ids(self, request, *, add_special_tokens: bool) -> list[int]:
        self.model.check_name(request.model)
        which = request.WhichOneof("input")
        if which == "chat":
            chat = chat_input_from_pb(request.chat)
            rendered = await self.lifecycle.pool.run(self.model.renderer.render, chat)
            return rendered.token_ids
        if which == "text":
            return await self.lifecycle.pool.run(self._encode, request.text, add_special_tokens)
        raise ValidationError("give text or chat messages", param="input")

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.model.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    async def Tokenize(self, request, context):
        add_special = (request.add_special_tokens if request.HasField("add_special_tokens")
                       else True)
        ids = await self._token_ids(request, add_special_tokens=add_special)
        strings = self.model.tokenizer.token_strings(ids) if request.return_token_strings else []
        return frontend_pb2.TokenizeResponse(token_ids=ids, token_strings=strings,
                                             max_model_len=self.model.max_model_len)

    async def CountTokens(self, request, context):
        """Counted in chunks, so a huge input never holds all its ids (docs/frontend.md)."""
        self.model.check_name(request.model)
        which = request.WhichOneof("input")
        if which not in ("chat", "text"):
            raise ValidationError("give text or chat messages", param="input")
        large = self.lifecycle.memory.started(request.ByteSize())
        try:
            if which == "chat":
                count = await self.lifecycle.pool.run(
                    self.model.renderer.count, chat_input_from_pb(request.chat), large=large)
            else:
                count = await self.lifecycle.pool.run(
                    functools.partial(self.model.tokenizer.count_tokens, add_special_tokens=True),
                    request.text, large=large)
        finally:
            if large:
                self.lifecycle.memory.ended()
        return frontend_pb2.CountTokensResponse(input_tokens=count)

    async def Detokenize(self, request, context):
        self.model.check_name(request.model)
        tokenizer = self.model.tokenizer
        bad = next((t for t in request.token_ids if not tokenizer.is_valid_id(t)), None)
        if bad is not None:
            raise ValidationError(f"token id {bad} is outside the vocabulary "
                                  f"(0..{tokenizer.vocab_size - 1})", param="token_ids")
        skip = request.skip_special_tokens if request.HasField("skip_special_tokens") else True
        decode = functools.partial(tokenizer.decode, skip_special_tokens=skip)
        text = await self.lifecycle.pool.run(decode, list(request.token_ids))
        return frontend_pb2.DetokenizeResponse(text=text)

    async def ListModels(self, request, context):
        model = self.model
        manifest = model.manifest
        caps = manifest.capabilities
        card = ModelCard(
            id=manifest.card_id,
            aliases=tuple(manifest.names()),
            root=manifest.model_id,
            max_model_len=model.max_model_len,
            tools=caps.tools,
            vision=model.supports_vision,
            reasoning=caps.reasoning,
            created=manifest.created_at,
            owned_by="helios",
            architecture=manifest.architecture,
            family=manifest.model_type,
            num_parameters=manifest.num_parameters,
            dtype=manifest.dtype,
            size_bytes=manifest.weight_bytes,
            digest=manifest.identity,
            chat_template=model.chat_template,
            max_num_seqs=model.max_num_seqs,
            max_waiting=model.max_waiting,
            max_images=manifest.image_limits.max_images,
            max_image_bytes=manifest.image_limits.max_image_bytes,
            max_image_pixels=manifest.image_limits.max_image_pixels,
        )
        return frontend_pb2.ListModelsResponse(models=[model_card_to_pb(card)])


async def _serve(config: FrontendConfig) -> int:
    lifecycle = FrontendLifecycle(config)
    registry = service_registry("frontend")
    metrics = FrontendMetrics(registry, lifecycle.pool, lambda: lifecycle.num_active)
    servicer = FrontendServicer(config, lifecycle, metrics)
    binding = ServiceBinding(SERVICE_NAME, servicer,
                             frontend_pb2_grpc.add_FrontendServicer_to_server)
    return await serve(service="frontend", config=config, bindings=[binding], lifecycle=lifecycle,
                       registry=registry)


def run_frontend(config: FrontendConfig) -> int:
    setup_logging("frontend", config.log_level, config.log_format)
    return asyncio.run(_serve(config))


def main(argv: Sequence[str] | None = None) -> int:
    config = load_config(FrontendConfig, argv, section="frontend", prog="helios serve frontend")
    return run_frontend(config)


if __name__ == "__main__":
    sys.exit(main())

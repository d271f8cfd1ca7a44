"""Imageprep service entrypoint: `run_imageprep(config)` and the gRPC servicer.

FetchPixels is registered by `add_servicer` rather than the generated add function: its stream
yields PixelChunks already serialised (convert.chunk_to_wire, one copy of the tensor bytes
instead of three), so its response serializer passes bytes through.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import torch
from prometheus_client import CollectorRegistry

from services.common.config import load_config
from services.common.errors import UnavailableError
from services.common.grpc_server import HealthReporter, ServiceBinding, serve
from services.common.logging import setup_logging
from services.common.metrics import service_registry
from services.common.pb import imageprep_pb2, imageprep_pb2_grpc
from services.common.startup import startup_phases
from services.imageprep.cache.disk import DiskTier
from services.imageprep.cache.memory import MemoryTier
from services.imageprep.cache.redis_tier import RedisTier
from services.imageprep.cache.retention import LowerTier, RetentionCache
from services.imageprep.config import ImagePrepConfig
from services.imageprep.convert import (
    chunk_to_wire,
    prepare_request_from_pb,
    prepare_result_to_pb,
)
from services.imageprep.metrics import ImagePrepMetrics
from services.imageprep.model_profile import ProfileResolver
from services.imageprep.service import ImagePrepService, pixel_dtype_of

SERVICE_NAME = "helios.v1.ImagePrep"

log = logging.getLogger(__name__)


def build_cache(config: ImagePrepConfig) -> RetentionCache:
    lower: list[LowerTier] = []
    if config.disk_cache_dir:
        lower.append(DiskTier(Path(config.disk_cache_dir), config.disk_cache_bytes))
    if config.redis_url:
        redis_tier = RedisTier(config.redis_url, config.redis_ttl_s)
        redis_tier.check()
        lower.append(redis_tier)
    if config.memory_cache_bytes == 0 and not lower:
        log.warning("no retention tier: FetchPixels will not find prepared images")
    return RetentionCache(MemoryTier(config.memory_cache_bytes), lower)


class ImagePrepServicer(imageprep_pb2_grpc.ImagePrepServicer):
    """Thin servicer: protobuf in, ImagePrepService, protobuf out (errors: the interceptor)."""

    def __init__(self, lifecycle: ImagePrepLifecycle) -> None:
        self._lifecycle = lifecycle

    async def Prepare(self, request: imageprep_pb2.PrepareRequest,
                      context: grpc.aio.ServicerContext) -> imageprep_pb2.PrepareResponse:
        service = self._lifecycle.service()
        result = await service.prepare(prepare_request_from_pb(request))
        return prepare_result_to_pb(result)

    async def FetchPixels(self, request: imageprep_pb2.FetchPixelsRequest,  # type: ignore[override]
                          context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Serialised PixelChunks (see add_servicer)."""
        service = self._lifecycle.service()
        pixel_dtype = pixel_dtype_of(request.pixel_dtype)
        images = await service.fetch(list(request.identities))
        async for chunk in service.stream(images, pixel_dtype):
            yield chunk_to_wire(chunk)


def _serialized(message: bytes) -> bytes:
    return message


def add_servicer(servicer: ImagePrepServicer, server: grpc.aio.Server) -> None:
    """The generated add_ImagePrepServicer_to_server, but FetchPixels sends serialised bytes."""
    handlers = {
        "Prepare": grpc.unary_unary_rpc_method_handler(
            servicer.Prepare, request_deserializer=imageprep_pb2.PrepareRequest.FromString,
            response_serializer=imageprep_pb2.PrepareResponse.SerializeToString),
        "FetchPixels": grpc.unary_stream_rpc_method_handler(
            servicer.FetchPixels,
            request_deserializer=imageprep_pb2.FetchPixelsRequest.FromString,
            response_serializer=_serialized),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME,
                                                                          handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


class ImagePrepLifecycle:
    """Builds the service (torch threads, profile, cache tiers) at start; drains on SIGTERM."""

    dynamic_health = False

    def __init__(self, config: ImagePrepConfig, registry: CollectorRegistry | None = None
                 ) -> None:
        self.config = config
        self._service: ImagePrepService | None = None
        self.metrics = ImagePrepMetrics(
            registry or CollectorRegistry(), capacity=config.max_pending_images,
            pending=lambda: self._service.pending_images if self._service else 0,
            memory=lambda: self._service.cache.memory_stats() if self._service else None)

    def service(self) -> ImagePrepService:
        if self._service is None:
            raise UnavailableError("imageprep is starting", retry_after_s=1.0)
        return self._service

    async def start(self, health: HealthReporter) -> None:
        if self.config.torch_threads:
            torch.set_num_threads(self.config.torch_threads)
        with startup_phases("imageprep").phase("load the image profiles and cache"):
            resolver = await asyncio.to_thread(ProfileResolver.from_model, self.config.model)
            cache = await asyncio.to_thread(build_cache, self.config)
        self._service = ImagePrepService(self.config, resolver, cache, self.metrics)
        log.info("imageprep ready", extra={"fields": {
            "workers": self.config.num_workers, "torch_threads": torch.get_num_threads(),
            "default_profile": resolver.default_profile or "-",
            "tiers": ",".join(["memory", *(type(t).__name__ for t in cache.lower)])}})

    async def stop_admission(self) -> None:
        if self._service is not None:
            self._service.stop_admission()

    async def drain(self, timeout_s: float) -> bool:
        return True if self._service is None else await self._service.drain(timeout_s)

    async def close(self) -> None:
        if self._service is not None:
            await asyncio.to_thread(self._service.close)


async def _serve(config: ImagePrepConfig) -> int:
    registry = service_registry("imageprep")
    lifecycle = ImagePrepLifecycle(config, registry)
    binding = ServiceBinding(SERVICE_NAME, ImagePrepServicer(lifecycle), add_servicer)
    return await serve(service="imageprep", config=config, bindings=[binding],
                       lifecycle=lifecycle, registry=registry)


def run_imageprep(config: ImagePrepConfig) -> int:
    setup_logging("imageprep", config.log_level, config.log_format)
    return asyncio.run(_serve(config))


def main(argv: Sequence[str] | None = None) -> int:
    config = load_config(ImagePrepConfig, argv, section="imageprep", prog="helios serve imageprep")
    return run_imageprep(config)


if __name__ == "__main__":
    sys.exit(main())

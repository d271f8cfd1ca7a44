"""ImagePrepConfig: one frozen dataclass for the imageprep service."""

from __future__ import annotations

import os
from dataclasses import dataclass

from PIL import Image

from services.common.config import ServiceConfig, option
from services.common.errors import ValidationError
from services.common.grpc_server import MAX_MESSAGE_BYTES

MIB = 1024 * 1024
MAX_AUTO_WORKERS = 16
# Pillow raises DecompressionBombError above twice its MAX_IMAGE_PIXELS (a process global that
# imageprep leaves alone), so a larger configured limit could never be reached.
PILLOW_BOMB_PIXELS = 2 * (Image.MAX_IMAGE_PIXELS or 0) or 2**62


@dataclass(frozen=True)
class ImagePrepConfig(ServiceConfig):
    listen: str = option("127.0.0.1:50053", "gRPC listen address: host:port or unix:///path")
    model: str = option("", "prepared core or model directory whose image_profile and "
                            "preprocessor_config.json set the default profile ('' = none)")
    max_encoded_bytes: int = option(20 * MIB, "largest encoded image accepted (bytes)")
    max_decoded_pixels: int = option(64 * MIB, "largest decoded image (width x height)")
    max_progressive_scans: int = option(100, "most scans a progressive JPEG may have")
    max_images_per_request: int = option(32, "most images in one Prepare request")
    workers: int = option(0, "preparation worker threads (decode, resize, patchify); 0 = one "
                             "per available CPU, at most 16")
    max_pending_images: int = option(64, "images queued or in preparation before Prepare "
                                         "answers capacity")
    torch_threads: int = option(1, "torch intra-op threads (0 = torch's default); parallelism "
                                   "comes from the workers, so 1 avoids oversubscription")
    fetch_chunk_bytes: int = option(4 * MIB, "largest PixelChunk payload FetchPixels sends")
    memory_cache_bytes: int = option(1024 * MIB, "retention cache: memory tier budget")
    disk_cache_dir: str = option("", "retention cache: disk tier directory ('' = off)")
    disk_cache_bytes: int = option(16 * 1024 * MIB, "retention cache: disk tier budget")
    redis_url: str = option("", "retention cache: Redis tier URL ('' = off)")
    redis_ttl_s: int = option(3600, "retention cache: Redis entry lifetime (seconds)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_encoded_bytes < 1 or self.max_decoded_pixels < 1:
            raise ValidationError("image limits must be positive")
        if self.max_decoded_pixels > PILLOW_BOMB_PIXELS:
            raise ValidationError(
                f"max_decoded_pixels may be at most {PILLOW_BOMB_PIXELS} (Pillow refuses larger "
                "images as decompression bombs)", param="max_decoded_pixels")
        if self.max_progressive_scans < 1:
            raise ValidationError("max_progressive_scans must be >= 1",
                                  param="max_progressive_scans")
        for name in ("max_images_per_request", "max_pending_images", "redis_ttl_s"):
            if getattr(self, name) < 1:
                raise ValidationError(f"{name} must be >= 1", param=name)
        for name in ("workers", "torch_threads"):
            if getattr(self, name) < 0:
                raise ValidationError(f"{name} must be >= 0", param=name)
        if not 1024 <= self.fetch_chunk_bytes <= MAX_MESSAGE_BYTES // 2:
            raise ValidationError(
                f"fetch_chunk_bytes must be within 1 KiB and {MAX_MESSAGE_BYTES // 2} bytes",
                param="fetch_chunk_bytes")
        if self.memory_cache_bytes < 0:
            raise ValidationError("memory_cache_bytes must be >= 0", param="memory_cache_bytes")
        if self.disk_cache_bytes < 0:
            raise ValidationError("disk_cache_bytes must be >= 0", param="disk_cache_bytes")

    @property
    def num_workers(self) -> int:
        """Worker threads: `workers`, or one per CPU this process may run on (at most 16)."""
        if self.workers:
            return self.workers
        return max(1, min(MAX_AUTO_WORKERS, len(os.sched_getaffinity(0))))

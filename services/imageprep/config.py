"""ImagePrepConfig: one frozen dataclass for the imageprep service."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import ServiceConfig, option
from services.common.errors import ValidationError


@dataclass(frozen=True)
class ImagePrepConfig(ServiceConfig):
    listen: str = option("127.0.0.1:50053", "gRPC listen address: host:port or unix:///path")
    max_encoded_bytes: int = option(20 * 1024 * 1024, "largest encoded image accepted (bytes)")
    max_decoded_pixels: int = option(64 * 1024 * 1024, "largest decoded image (width x height)")
    memory_cache_bytes: int = option(1024 * 1024 * 1024, "retention cache: memory tier budget")
    disk_cache_dir: str = option("", "retention cache: disk tier directory ('' = off)")
    redis_url: str = option("", "retention cache: Redis tier URL ('' = off)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_encoded_bytes < 1 or self.max_decoded_pixels < 1:
            raise ValidationError("image limits must be positive")
        if self.memory_cache_bytes < 0:
            raise ValidationError("memory_cache_bytes must be >= 0", param="memory_cache_bytes")

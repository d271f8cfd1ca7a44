"""Imageprep service entrypoint: `run_imageprep(config)` and the gRPC servicer."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from services.common.config import load_config
from services.common.grpc_server import BasicLifecycle, ServiceBinding, serve
from services.common.logging import setup_logging
from services.common.pb import imageprep_pb2_grpc
from services.imageprep.config import ImagePrepConfig

SERVICE_NAME = "helios.v1.ImagePrep"


class ImagePrepServicer(imageprep_pb2_grpc.ImagePrepServicer):
    def __init__(self, config: ImagePrepConfig) -> None:
        self.config = config


async def _serve(config: ImagePrepConfig) -> int:
    binding = ServiceBinding(SERVICE_NAME, ImagePrepServicer(config),
                             imageprep_pb2_grpc.add_ImagePrepServicer_to_server)
    return await serve(service="imageprep", config=config, bindings=[binding],
                       lifecycle=BasicLifecycle())


def run_imageprep(config: ImagePrepConfig) -> int:
    setup_logging("imageprep", config.log_level, config.log_format)
    return asyncio.run(_serve(config))


def main(argv: Sequence[str] | None = None) -> int:
    config = load_config(ImagePrepConfig, argv, section="imageprep", prog="helios serve imageprep")
    return run_imageprep(config)


if __name__ == "__main__":
    sys.exit(main())

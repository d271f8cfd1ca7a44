"""Frontend service entrypoint: `run_frontend(config)` and the gRPC servicer (protobuf edge)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

import grpc

from services.common.config import load_config
from services.common.core import TOKENIZER_ROLES, ModelSource, open_model
from services.common.grpc_client import UpstreamHealth, open_channel
from services.common.grpc_server import HealthReporter, ServiceBinding, serve
from services.common.logging import setup_logging
from services.common.pb import common_pb2, frontend_pb2, frontend_pb2_grpc
from services.frontend.config import FrontendConfig

SERVICE_NAME = "helios.v1.Frontend"


class FrontendLifecycle:
    """Loads the tokenizer assets; SERVING only while the engine (and imageprep) are SERVING."""

    dynamic_health = True

    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self.model: ModelSource | None = None
        self._health: HealthReporter | None = None
        self._upstreams: list[UpstreamHealth] = []
        self._channels: list[grpc.aio.Channel] = []

    async def start(self, health: HealthReporter) -> None:
        self._health = health
        self.model = await asyncio.to_thread(open_model, self.config.model,
                                             verify=TOKENIZER_ROLES)
        addresses = {"engine": self.config.engine_address,
                     "imageprep": self.config.imageprep_address}
        for name, address in addresses.items():
            if address:
                channel = open_channel(address)
                self._channels.append(channel)
                self._upstreams.append(UpstreamHealth(name, channel, self._refresh))
        for upstream in self._upstreams:
            upstream.start()

    async def _refresh(self) -> None:
        if self._health is not None:
            await self._health.set_serving(all(u.serving for u in self._upstreams))

    async def stop_admission(self) -> None:
        for upstream in self._upstreams:
            await upstream.stop()

    async def drain(self, timeout_s: float) -> bool:
        return True

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


class FrontendServicer(frontend_pb2_grpc.FrontendServicer):
    def __init__(self, config: FrontendConfig, lifecycle: FrontendLifecycle) -> None:
        self.config = config
        self.lifecycle = lifecycle

    async def ListModels(self, request, context):
        assert self.lifecycle.model is not None
        manifest = self.lifecycle.model.manifest
        caps = manifest.capabilities
        card = frontend_pb2.ModelCard(
            id=manifest.card_id,
            aliases=list(manifest.names()),
            root=manifest.model_id,
            max_model_len=manifest.max_model_len,
            capabilities=common_pb2.Capabilities(tools=caps.tools, vision=caps.vision,
                                                 reasoning=caps.reasoning),
            created=manifest.created_at,
            owned_by="helios",
            architecture=manifest.architecture,
            family=manifest.model_type,
            num_parameters=manifest.num_parameters,
            dtype=manifest.dtype,
            size_bytes=manifest.weight_bytes,
            digest=manifest.identity,
            chat_template=self.lifecycle.model.chat_template() or "",
        )
        return frontend_pb2.ListModelsResponse(models=[card])


async def _serve(config: FrontendConfig) -> int:
    lifecycle = FrontendLifecycle(config)
    servicer = FrontendServicer(config, lifecycle)
    binding = ServiceBinding(SERVICE_NAME, servicer,
                             frontend_pb2_grpc.add_FrontendServicer_to_server)
    return await serve(service="frontend", config=config, bindings=[binding], lifecycle=lifecycle)


def run_frontend(config: FrontendConfig) -> int:
    setup_logging("frontend", config.log_level, config.log_format)
    return asyncio.run(_serve(config))


def main(argv: Sequence[str] | None = None) -> int:
    config = load_config(FrontendConfig, argv, section="frontend", prog="helios serve frontend")
    return run_frontend(config)


if __name__ == "__main__":
    sys.exit(main())

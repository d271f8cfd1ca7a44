"""Engine service entrypoint: `run_engine(config)` and the gRPC servicer (the protobuf edge)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from services.common.config import load_config
from services.common.core import ModelSource, open_model
from services.common.grpc_server import BasicLifecycle, HealthReporter, ServiceBinding, serve
from services.common.logging import setup_logging
from services.common.pb import common_pb2, engine_pb2, engine_pb2_grpc
from services.engine.config import EngineConfig

SERVICE_NAME = "helios.v1.Engine"


class EngineLifecycle(BasicLifecycle):
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model: ModelSource | None = None

    async def start(self, health: HealthReporter) -> None:
        self.model = await asyncio.to_thread(open_model, self.config.model)


class EngineServicer(engine_pb2_grpc.EngineServicer):
    def __init__(self, config: EngineConfig, lifecycle: EngineLifecycle) -> None:
        self.config = config
        self.lifecycle = lifecycle

    async def GetModelInfo(self, request, context):
        assert self.lifecycle.model is not None
        manifest = self.lifecycle.model.manifest
        caps = manifest.capabilities
        return engine_pb2.ModelInfo(
            model_id=manifest.model_id,
            served_names=list(manifest.served_names),
            identity=manifest.identity_bytes,
            architecture=manifest.architecture,
            dtype=manifest.dtype,
            max_model_len=self.config.max_model_len or manifest.max_model_len,
            vocab_size=manifest.vocab_size,
            eos_token_ids=list(manifest.eos_token_ids),
            capabilities=common_pb2.Capabilities(tools=caps.tools, vision=caps.vision,
                                                 reasoning=caps.reasoning),
            max_num_seqs=self.config.max_num_seqs,
            prefill_chunk_size=self.config.prefill_chunk_size,
            context_hint=self.config.context_hint,
            capacity_hint=self.config.capacity_hint,
            num_parameters=manifest.num_parameters,
            weight_bytes=manifest.weight_bytes,
        )


async def _serve(config: EngineConfig) -> int:
    lifecycle = EngineLifecycle(config)
    servicer = EngineServicer(config, lifecycle)
    binding = ServiceBinding(SERVICE_NAME, servicer, engine_pb2_grpc.add_EngineServicer_to_server)
    return await serve(service="engine", config=config, bindings=[binding], lifecycle=lifecycle)


def run_engine(config: EngineConfig) -> int:
    setup_logging("engine", config.log_level, config.log_format)
    return asyncio.run(_serve(config))


def main(argv: Sequence[str] | None = None) -> int:
    config = load_config(EngineConfig, argv, section="engine", prog="helios serve engine")
    return run_engine(config)


if __name__ == "__main__":
    sys.exit(main())

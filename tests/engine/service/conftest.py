"""A real engine process (demo core) and gRPC helpers."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from services.common.grpc_errors import error_from_rpc
from services.common.pb import common_pb2, engine_pb2, engine_pb2_grpc
from tests.support.processes import ServiceProcess


@dataclass
class RunningEngine:
    process: ServiceProcess
    address: str
    channel: grpc.Channel
    stub: engine_pb2_grpc.EngineStub

    def load(self, **kwargs) -> engine_pb2.LoadSnapshot:
        return self.stub.GetLoad(engine_pb2.GetLoadRequest(**kwargs), timeout=10)

    def wait_idle(self, timeout: float = 60.0) -> engine_pb2.LoadSnapshot:
        """Wait until every slot is free and every page is free or cached."""
        deadline = time.monotonic() + timeout
        while True:
            load = self.load()
            if (load.slots_free == load.slots_total and load.num_running == 0 and
                    load.num_waiting == 0 and
                    load.pages_free + load.pages_cached == load.pages_total):
                return load
            assert time.monotonic() < deadline, f"engine never became idle: {load}"
            time.sleep(0.05)




@contextlib.contextmanager
def start_engine(tmp_path, *extra: str, name: str = "engine",
                 model: str | None = None) -> Iterator[RunningEngine]:
    """An engine process serving `model` (a model directory; default: the demo core)."""
    from services.cli.demo_model import demo_core

    address = f"unix://{tmp_path}/{name}.sock"
    args = ["serve", "engine", "--listen", address, "--model", model or str(demo_core()),
            "--kv-cache-bytes", str(32 << 20), "--max-num-seqs", "8", "--cpu-threads", "1",
            *extra]
    with ServiceProcess.start(args, tmp_path / f"{name}.log") as process:
        process.wait_grpc_serving(address, timeout=180)
        channel = grpc.insecure_channel(address)
        try:
            yield RunningEngine(process, address, channel, engine_pb2_grpc.EngineStub(channel))
        finally:
            channel.close()


@pytest.fixture(scope="module")
def engine(tmp_path_factory, demo_core) -> Iterator[RunningEngine]:
    with start_engine(tmp_path_factory.mktemp("engine")) as running:
        yield running


def generate_request(request_id: str, prompt, max_tokens: int | None = 8, **fields
                     ) -> engine_pb2.EngineGenerateRequest:
    sampling = dict(temperature=0.0, ignore_eos=True)
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    sampling.update(fields.pop("sampling", {}))
    return engine_pb2.EngineGenerateRequest(
        request_id=request_id, prompt_token_ids=list(prompt),
        sampling=common_pb2.SamplingParams(**sampling), **fields)


def typed_error(call):
    """Run `call`, expect an RpcError, return (status code, typed HeliosError)."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), error_from_rpc(info.value)

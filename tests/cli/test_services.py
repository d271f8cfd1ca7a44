"""Each service starts as its own process, answers health and reflection, exits 0 on SIGTERM."""

from __future__ import annotations

import signal

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.support.processes import ServiceProcess, free_port, grpc_status


def _list_services(address: str) -> set[str]:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        for response in responses:
            return {s.name for s in response.list_services_response.service}
    return set()


@pytest.mark.parametrize("service, proto_name, extra", [
    ("imageprep", "helios.v1.ImagePrep", []),
    ("engine", "helios.v1.Engine", ["--model", "{core}"]),
])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_grpc_service_health_reflection_and_clean_exit(tmp_path, demo_core, service, proto_name,
                                                        extra, sig):
    address = f"unix://{tmp_path}/{service}.sock"
    args = ["serve", service, "--listen", address, *[a.format(core=demo_core) for a in extra]]
    with ServiceProcess.start(args, tmp_path / f"{service}.log") as proc:
        proc.wait_grpc_serving(address)
        assert grpc_status(address, proto_name) == health_pb2.HealthCheckResponse.SERVING
        assert proto_name in _list_services(address)
        assert "grpc.health.v1.Health" in _list_services(address)
        assert proc.terminate(sig) == 0, proc.output()


def test_frontend_serves_only_while_its_upstreams_do(tmp_path, demo_core):
    engine_addr = f"unix://{tmp_path}/engine.sock"
    frontend_addr = f"unix://{tmp_path}/frontend.sock"
    frontend_args = ["serve", "frontend", "--listen", frontend_addr, "--model", str(demo_core),
                     "--engine-address", engine_addr, "--imageprep-address", ""]
    with ServiceProcess.start(frontend_args, tmp_path / "frontend.log") as frontend:
        frontend.wait_output("frontend ready")
        assert grpc_status(frontend_addr) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert "helios.v1.Frontend" in _list_services(frontend_addr)
        with ServiceProcess.start(["serve", "engine", "--listen", engine_addr, "--model",
                                   str(demo_core)], tmp_path / "engine.log") as engine:
            frontend.wait_grpc_serving(frontend_addr)
            assert engine.terminate() == 0
        # the engine went away: the frontend stops reporting SERVING
        frontend.wait_output("health NOT_SERVING")
        assert grpc_status(frontend_addr) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert frontend.terminate() == 0


def test_gateway_health_is_503_without_a_serving_frontend(tmp_path):
    port = free_port()
    args = ["serve", "gateway", "--port", str(port),
            "--frontend-address", f"unix://{tmp_path}/missing.sock"]
    with ServiceProcess.start(args, tmp_path / "gateway.log") as gateway:
        gateway.wait_http(f"http://127.0.0.1:{port}/health", status=503)
        response = httpx.get(f"http://127.0.0.1:{port}/health")
        assert response.headers["retry-after"]
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 200
        assert gateway.terminate() == 0


def test_bad_config_exits_nonzero(tmp_path):
    with ServiceProcess.start(["serve", "engine", "--listen", f"unix://{tmp_path}/e.sock"],
                              tmp_path / "engine.log") as proc:
        assert proc.proc.wait(timeout=60) != 0
        assert "model" in proc.output()


def test_engine_with_tampered_core_fails_to_start(tmp_path, demo_core):
    import shutil

    core = tmp_path / "core"
    shutil.copytree(demo_core, core, copy_function=shutil.copyfile)
    (core / "tokenizer.json").write_bytes(b"{}")
    with ServiceProcess.start(["serve", "engine", "--listen", f"unix://{tmp_path}/e.sock",
                               "--model", str(core)], tmp_path / "engine.log") as proc:
        assert proc.proc.wait(timeout=60) == 1
        assert "tokenizer.json" in proc.output()
        # the core started before the verification, and waited for it: it loaded nothing
        assert "import the engine core" in proc.output()
        assert "load weights" not in proc.output()

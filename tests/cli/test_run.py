"""`helios run --demo` brings all four services up, serves /health, and stops cleanly."""

from __future__ import annotations

import re
import signal

import grpc
import httpx
import pytest

from services.common.pb import engine_pb2, engine_pb2_grpc
from tests.support.processes import HeliosRun


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_demo_up_and_down(tmp_path, demo_core, sig):
    with HeliosRun.start_demo(tmp_path) as run:
        assert httpx.get(run.url + "/health").status_code == 200
        with grpc.insecure_channel(run.addresses["engine"]) as channel:
            info = engine_pb2_grpc.EngineStub(channel).GetModelInfo(
                engine_pb2.GetModelInfoRequest(), timeout=10)
        assert info.architecture == "Qwen3ForCausalLM"
        assert "helios-demo" in info.served_names
        # start-up progress on a non-terminal: each phase as a log line, then the summary
        output = run.output()
        for line in ("engine: verify model files", "engine: start the engine core",
                     "engine: load weights", "engine: allocate the KV cache",
                     "frontend: load the tokenizer and chat template",
                     "imageprep: load the image profiles and cache", "engine is SERVING after"):
            assert line in output, (line, output)
        summary = next(line for line in output.splitlines() if "start-up: " in line)
        for name in ("imageprep", "engine", "frontend", "gateway"):
            assert f"{name} " in summary.split("start-up: ", 1)[1], summary
            assert f"{name}: start Python and import" in output, output
        # the phases cover each service's whole wait, from `helios run` to SERVING (the rest
        # is the launcher's 0.2 s health polling and the hand-offs between phases, longer on
        # a loaded machine: 0.5 s + 5 % of the wait)
        for part in summary.split("start-up: ", 1)[1].split("; "):
            found = re.match(r"(\w+) (\d+\.\d+) s .*unaccounted (\d+\.\d+) s", part)
            if found:
                assert float(found[3]) <= 0.5 + 0.05 * float(found[2]), summary
        assert "engine: import the engine core" in output
        assert run.terminate(sig) == 0, run.output()
        for name in ("gateway", "frontend", "engine", "imageprep"):
            assert f"{name} stopped" in run.output() or name == "gateway"
        assert "exit_code=1" not in run.output()


def test_run_exits_1_when_a_service_dies(tmp_path, demo_core):
    with HeliosRun.start_demo(tmp_path) as run:
        engine_pid = None
        import subprocess

        out = subprocess.run(["pgrep", "-f", f"serve engine .*--listen {run.addresses['engine']}"],
                             capture_output=True, text=True)
        engine_pid = int(out.stdout.split()[0])
        import os

        os.kill(engine_pid, signal.SIGKILL)
        assert run.proc.wait(timeout=60) == 1
        assert "engine exited unexpectedly" in run.output()

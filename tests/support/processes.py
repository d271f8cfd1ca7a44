"""Start real Helios processes for tests and stop them the way production does (SIGTERM).

    with ServiceProcess.start("engine", ["--model", core, "--listen", addr]) as engine:
        engine.wait_grpc_serving(addr)
    assert engine.returncode == 0   # exited cleanly on SIGTERM

    with HeliosRun.start_demo(tmp_path) as run:   # all four services, like `helios run --demo`
        httpx.get(run.url + "/health")
        run.addresses["engine"]                    # unix socket of the engine
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def grpc_status(address: str, service: str = "", timeout: float = 2.0) -> int | None:
    """The health status of `service` at `address`, or None when unreachable."""
    try:
        with grpc.insecure_channel(address) as channel:
            return health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout).status
    except grpc.RpcError:
        return None


class ServiceProcess:
    """One `helios ...` child process with its output captured to a log file."""

    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None):
        self.args = list(args)
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", *self.args],
            cwd=REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        )

    @classmethod
    @contextlib.contextmanager
    def start(cls, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None
              ) -> Iterator[ServiceProcess]:
        process = cls(args, log_path, env)
        try:
            yield process
        finally:
            process.stop()

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def _check_alive(self, what: str) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"{' '.join(self.args)} exited with {self.proc.returncode} while waiting for "
                f"{what}:\n{self.output()[-6000:]}")

    def wait_grpc_serving(self, address: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while grpc_status(address) != health_pb2.HealthCheckResponse.SERVING:
            self._check_alive(f"SERVING at {address}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{address} not SERVING after {timeout}s:\n"
                                     f"{self.output()[-6000:]}")
            time.sleep(0.1)

    def wait_http(self, url: str, status: int = 200, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive(f"{url} -> {status}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2.0).status_code == status:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} did not answer {status} in {timeout}s:\n"
                                     f"{self.output()[-6000:]}")
            time.sleep(0.1)

    def wait_output(self, text: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            self._check_alive(repr(text))
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not printed in {timeout}s:\n{self.output()}")
            time.sleep(0.1)

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send `sig` and wait for the exit code (kills after `timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"{' '.join(self.args)} ignored signal {sig} for "
                                     f"{timeout}s:\n{self.output()[-6000:]}") from None
        return self.proc.returncode

    def stop(self) -> None:
        with contextlib.suppress(AssertionError):
            self.terminate()
        self._log.close()


class HeliosRun(ServiceProcess):
    """`helios run` with a known runtime dir (sockets) and HTTP port."""

    def __init__(self, args: Sequence[str], log_path: Path, runtime_dir: Path, port: int,
                 env: dict[str, str] | None = None) -> None:
        self.runtime_dir = runtime_dir
        self.port = port
        super().__init__(["run", *args, "--port", str(port), "--runtime-dir", str(runtime_dir)],
                         log_path, env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def addresses(self) -> dict[str, str]:
        return {name: f"unix://{self.runtime_dir / (name + '.sock')}"
                for name in ("imageprep", "engine", "frontend")}

    @classmethod
    @contextlib.contextmanager
    def start_demo(cls, tmp_path: Path, *extra: str, timeout: float = 300.0,
                   env: dict[str, str] | None = None) -> Iterator[HeliosRun]:
        runtime = tmp_path / "run"
        runtime.mkdir(parents=True, exist_ok=True)
        run = cls(["--demo", *extra], tmp_path / "helios-run.log", runtime, free_port(), env)
        try:
            run.wait_output("Helios is serving", timeout=timeout)
            yield run
        finally:
            run.stop()


def engine_load(run: HeliosRun):
    """The engine's `GetLoad` snapshot of a running stack."""
    from services.common.pb import engine_pb2, engine_pb2_grpc

    with grpc.insecure_channel(run.addresses["engine"]) as channel:
        return engine_pb2_grpc.EngineStub(channel).GetLoad(engine_pb2.GetLoadRequest(),
                                                           timeout=10)


def wait_for(condition, timeout: float = 60.0, interval: float = 0.01) -> None:
    """Poll `condition()` until it holds: a liveness bound, not a speed assertion
    (AssertionError after `timeout` s)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(interval)

"""`helios run`: start the four services as child processes on local sockets.

imageprep, engine and frontend listen on unix sockets in a private runtime directory; the
gateway listens on HTTP. The launcher waits until every service reports SERVING and the
gateway's /health answers 200, prints the URL, forwards SIGINT/SIGTERM, and stops the services
in dependency order (gateway first, so active responses finish while the rest still serve).
It exits 0 after a clean drain, 1 if a service failed or did not stop cleanly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.cli.progress import StartupProgress
from services.common.processes import die_with_parent
from services.common.startup import ENV as STARTUP_ENV

log = logging.getLogger("helios.run")

# Start order; shutdown goes the other way (gateway first).
SERVICE_ORDER = ("imageprep", "engine", "frontend", "gateway")
# Whose SERVING each one's readiness follows (the frontend's health tracks its upstreams, the
# gateway's /health its frontend): the start-up summary names that wait.
WAITS_FOR = {"frontend": ("engine", "imageprep"), "gateway": ("frontend",)}


@dataclass(frozen=True)
class RunOptions:
    model: str                      # core or model directory
    host: str = "127.0.0.1"
    port: int = 8000
    config_file: str = ""           # YAML with per-service sections
    api_key: str = ""
    startup_timeout_s: float = 900.0
    stop_timeout_s: float = 60.0
    runtime_dir: str = ""           # where the sockets go ('' = a fresh temporary directory)
    dashboard: bool = False         # show `helios dashboard` once serving (services log to files)
    log_dir: str = ""               # where services log while the dashboard owns the terminal
    extra: dict[str, list[str]] = field(default_factory=dict)  # per-service extra flags


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _set_parent_death_signal() -> None:
    """Child preexec: own process group (the terminal's Ctrl-C reaches only the launcher, which
    stops services in order) and SIGTERM when the launcher dies (Linux prctl)."""
    os.setpgrp()
    die_with_parent(signal.SIGTERM)


class Launcher:
    def __init__(self, options: RunOptions) -> None:
        self.options = options
        self._own_runtime_dir = not options.runtime_dir
        self.runtime_dir = Path(options.runtime_dir or tempfile.mkdtemp(prefix="helios-"))
        self.addresses = {
            name: f"unix://{self.runtime_dir / (name + '.sock')}"
            for name in ("imageprep", "engine", "frontend")
        }
        # Each gRPC service serves Prometheus text on a loopback port; the gateway's /metrics
        # appends them, so one scrape of the gateway shows the whole single-node picture.
        self.metrics_ports = {name: _free_port() for name in self.addresses}
        self.processes: dict[str, subprocess.Popen] = {}
        self._stop = threading.Event()
        self._first_signal_at: float | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.options.host in ("0.0.0.0", "") else self.options.host
        return f"http://{host}:{self.options.port}"

    def _command(self, name: str) -> list[str]:
        o = self.options
        cmd = [sys.executable, "-m", "services.cli.main", "serve", name]
        if o.config_file:
            cmd += ["--config", o.config_file]
        if name in self.metrics_ports:
            cmd += ["--metrics-listen", f"127.0.0.1:{self.metrics_ports[name]}"]
        if name == "imageprep":
            # the core's image profile and preprocessor_config.json apply (only those are read)
            cmd += ["--listen", self.addresses["imageprep"], "--model", o.model]
        elif name == "engine":
            cmd += ["--listen", self.addresses["engine"], "--model", o.model,
                    "--imageprep-address", self.addresses["imageprep"]]
        elif name == "frontend":
            cmd += ["--listen", self.addresses["frontend"], "--model", o.model,
                    "--engine-address", self.addresses["engine"],
                    "--imageprep-address", self.addresses["imageprep"]]
        else:
            upstreams = ",".join(f"http://127.0.0.1:{port}/metrics"
                                 for port in self.metrics_ports.values())
            cmd += ["--host", o.host, "--port", str(o.port),
                    "--frontend-address", self.addresses["frontend"],
                    "--metrics-upstreams", upstreams]
            if o.api_key:
                cmd += ["--api-key", o.api_key]
        return cmd + list(o.extra.get(name, []))

    def _spawn(self, name: str) -> None:
        cmd = self._command(name)
        log.info("starting %s: %s", name, " ".join(cmd))
        output = None
        if self.options.dashboard:
            log_dir = Path(self.options.log_dir)
            log_dir.mkdir(parents=True, exist_ok=True)
            output = (log_dir / f"{name}.log").open("ab")
        env = dict(os.environ, **{STARTUP_ENV: str(self._progress_file(name))})
        self.processes[name] = subprocess.Popen(cmd, preexec_fn=_set_parent_death_signal,
                                                stdout=output, stderr=output, env=env)
        if output is not None:
            output.close()  # the child holds its own descriptor

    def _progress_file(self, name: str) -> Path:
        """Where `name` appends its start-up phases (services/common/startup.py)."""
        return self.runtime_dir / f"startup-{name}.jsonl"

    def _grpc_serving(self, name: str) -> bool:
        try:
            with grpc.insecure_channel(self.addresses[name]) as channel:
                response = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=2.0)
                return response.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    def _gateway_ready(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _failed_child(self) -> str | None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                return name
        return None

    def _wait_ready(self) -> bool:
        """Wait for every service to serve, showing their start-up phases as they go: live
        lines on the terminal when the services log to files (the dashboard will own the
        terminal), log lines among the services' own otherwise."""
        progress = StartupProgress(
            {name: self._progress_file(name) for name in SERVICE_ORDER},
            terminal=sys.stderr.isatty() and self.options.dashboard, waits_for=WAITS_FOR)
        try:
            return self._poll_ready(progress)
        finally:
            progress.close()

    def _poll_ready(self, progress: StartupProgress) -> bool:
        deadline = time.monotonic() + self.options.startup_timeout_s
        pending = list(SERVICE_ORDER)
        serving: dict[str, bool] = {}
        while pending and not self._stop.is_set():
            failed = self._failed_child()
            if failed:
                progress.update(serving)
                log.error("%s exited with %s during startup", failed,
                          self.processes[failed].returncode)
                return False
            name = pending[0]
            ready = self._gateway_ready() if name == "gateway" else self._grpc_serving(name)
            if ready:
                serving[name] = True
                pending.pop(0)
                progress.update(serving)
                continue
            progress.update(serving)
            if time.monotonic() > deadline:
                log.error("startup timed out waiting for %s", name)
                return False
            time.sleep(0.2)
        return not pending

    def _handle_signal(self, signum: int, _frame) -> None:
        # A second signal at least a second after the first kills the services (impatient
        # Ctrl-C); duplicates arriving together (a signal sent to the whole group) do not.
        now = time.monotonic()
        if self._first_signal_at is None:
            self._first_signal_at = now
        elif now - self._first_signal_at > 1.0:
            log.warning("second signal: killing services")
            for proc in self.processes.values():
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        self._stop.set()

    def _stop_all(self) -> bool:
        """Stop services gateway-first; True when each exited 0 on its own."""
        clean = True
        for name in reversed(SERVICE_ORDER):
            proc = self.processes.get(name)
            if proc is None:
                continue
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=self.options.stop_timeout_s)
                except subprocess.TimeoutExpired:
                    log.error("%s did not stop in %.0f s; killing it", name,
                              self.options.stop_timeout_s)
                    proc.kill()
                    proc.wait()
            if proc.returncode != 0:
                log.error("%s exited with %s", name, proc.returncode)
                clean = False
        return clean

    def _watch_children(self, failed: threading.Event) -> None:
        while not self._stop.wait(0.5):
            child = self._failed_child()
            if child:
                log.error("%s exited unexpectedly with %s", child,
                          self.processes[child].returncode)
                failed.set()
                self._stop.set()

    def _show_dashboard(self) -> None:
        from services.dashboard.app import Dashboard
        from services.dashboard.sample import EngineSource

        Dashboard(EngineSource(self.addresses["engine"]), stop=self._stop).run()
        self._stop.set()  # leaving the dashboard (q) stops the server too

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._handle_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        failed = threading.Event()
        try:
            for name in SERVICE_ORDER:
                self._spawn(name)
            if self._wait_ready():
                print(f"Helios is serving {self.options.model} at {self.url} "
                      f"(OpenAI {self.url}/v1, Anthropic {self.url}/v1/messages, "
                      f"Ollama {self.url}/api)", flush=True)
                watcher = threading.Thread(target=self._watch_children, args=(failed,),
                                           daemon=True)
                watcher.start()
                if self.options.dashboard:
                    self._show_dashboard()
                    print(f"service logs: {self.options.log_dir}", flush=True)
                watcher.join()
            elif not self._stop.is_set():
                failed.set()  # startup failed or timed out (not interrupted by a signal)
            clean = self._stop_all()
            return 0 if clean and not failed.is_set() else 1
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._own_runtime_dir:
                shutil.rmtree(self.runtime_dir, ignore_errors=True)

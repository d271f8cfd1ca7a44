"""`helios dashboard` in a real terminal (tmux): both panes, scrolling, and a clean exit."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from tests.support.processes import REPO_ROOT, ServiceProcess

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    def __init__(self, command: str, width: int = 120, height: int = 40) -> None:
        self.name = f"helios-{uuid.uuid4().hex[:8]}"
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", str(width),
                        "-y", str(height), "-c", str(REPO_ROOT),
                        f"{command}; echo DASHBOARD-EXIT=$?; sleep 60"], check=True)

    def screen(self) -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name],
                              capture_output=True, text=True, check=True).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if text in screen:
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not on screen after {timeout}s:\n{screen}")
            time.sleep(0.2)

    def wait_until(self, predicate, what: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if predicate(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not on screen after {timeout}s:\n{screen}")
            time.sleep(0.2)

    def kill(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], check=False)


@pytest.fixture
def fake_engine(tmp_path):
    address = f"unix://{tmp_path}/engine.sock"
    proc = subprocess.Popen([sys.executable, "-m", "tests.dashboard.fake_engine", "--listen",
                             address, "--requests", "40"], cwd=REPO_ROOT)
    try:
        from tests.support.processes import grpc_status

        deadline = time.monotonic() + 30
        while grpc_status(address) is None and time.monotonic() < deadline:
            # the fake has no health service: any answer other than "unreachable" will do
            if (tmp_path / "engine.sock").exists():
                break
            time.sleep(0.1)
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_dashboard_panes_scrolling_and_exit(fake_engine):
    tmux = Tmux(f"{sys.executable} -m services.cli.main dashboard --engine {fake_engine}")
    try:
        screen = tmux.wait_for("Throughput")
        assert "fake-demo" in screen
        tmux.wait_for("generation 160 tok/s")          # counter deltas over the window
        screen = tmux.wait_for("rows 1-")
        assert "0.1" in screen and "decode" in screen
        assert "prompt" in screen and "bursts" in screen  # 120 columns: the wide table
        tmux.wait_for("DDDD")                           # decode history cells fill in

        tmux.keys("Tab")
        screen = tmux.wait_for("calls/2s")
        assert "b1 t512" in screen and "b8" in screen and "b16" in screen
        assert "req/call" in screen

        first_rows = tmux.screen().split("rows ")[1].split(" ")[0]
        tmux.keys("Down", "Down", "Down")
        screen = tmux.wait_for("rows 4-")
        assert first_rows.startswith("1-")
        tmux.keys("Up")
        tmux.wait_for("rows 3-")

        tmux.keys("Right")
        tmux.wait_for("Throughput")
        tmux.keys("q")
        tmux.wait_for("DASHBOARD-EXIT=0")
    finally:
        tmux.kill()


def test_dashboard_shows_an_unreachable_engine_and_ctrl_c_exits(tmp_path):
    tmux = Tmux(f"{sys.executable} -m services.cli.main dashboard "
                f"--engine unix://{tmp_path}/nothing.sock")
    try:
        tmux.wait_for("unreachable")
        tmux.keys("C-c")
        tmux.wait_for("DASHBOARD-EXIT=0")
    finally:
        tmux.kill()


def test_dashboard_against_a_running_demo(tmp_path, demo_core):
    """The real engine's telemetry: traffic shows up in both panes; scrolling; clean exit."""
    import threading

    import openai

    from tests.support.processes import HeliosRun

    with HeliosRun.start_demo(tmp_path) as run:
        tmux = Tmux(f"{sys.executable} -m services.cli.main dashboard "
                    f"--runtime-dir {run.runtime_dir}")
        stop = threading.Event()

        def traffic() -> None:
            client = openai.OpenAI(base_url=run.url + "/v1", api_key="x", max_retries=0)
            while not stop.is_set():
                client.chat.completions.create(
                    model="helios-demo", messages=[{"role": "user", "content": "Hello"}],
                    max_tokens=64, extra_body={"ignore_eos": True})

        workers = [threading.Thread(target=traffic, daemon=True) for _ in range(3)]
        try:
            screen = tmux.wait_for("Throughput")
            assert "helios-demo" in screen
            for worker in workers:
                worker.start()
            tmux.wait_for("decode", timeout=60)           # request rows from the engine
            history = re.compile(r"[·PDs]{9}D")            # decode completions in the history
            tmux.wait_until(history.search, "a decode history cell", timeout=60)
            tmux.keys("Tab")
            screen = tmux.wait_for("calls/2s")
            assert "decode" in screen.split("calls/2s", 1)[1]
            tmux.keys("Down", "Up")
            tmux.keys("Left")
            screen = tmux.wait_for("Throughput")
            stop.set()
            for worker in workers:
                worker.join(timeout=60)
            def completed(screen: str) -> int:
                found = re.search(r"completed ([\d,]+)", screen)
                return int(found.group(1).replace(",", "")) if found else 0

            tmux.wait_until(lambda screen: completed(screen) >= 3, "3 completed requests")
            tmux.keys("q")
            tmux.wait_for("DASHBOARD-EXIT=0")
        finally:
            stop.set()
            tmux.kill()
        assert run.terminate() == 0


def test_run_without_a_terminal_keeps_plain_logs(tmp_path, demo_core):
    # Under pytest stderr is a pipe: `helios run` must not start the dashboard.
    from tests.support.processes import HeliosRun

    with HeliosRun.start_demo(tmp_path) as run:
        assert "Helios is serving" in run.output()
        assert "service logs go to" not in run.output()
        assert run.terminate() == 0
    assert isinstance(ServiceProcess, type)

"""A real `redis-server` on loopback for tests (Debian's package; `.ci/run` installs it).

    @pytest.fixture
    def redis_url(tmp_path):
        with RedisServer.start(tmp_path) as server:
            yield server.url
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.processes import free_port


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.port = free_port()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def wait_ready(self, timeout: float = 20.0) -> None:
        import redis

        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port)
        while True:
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    @classmethod
    @contextlib.contextmanager
    def start(cls, workdir: Path) -> Iterator[RedisServer]:
        server = cls(workdir)
        try:
            server.wait_ready()
            yield server
        finally:
            server.stop()

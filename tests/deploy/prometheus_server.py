"""A real Prometheus (Debian's `prometheus` package, which .ci/run installs) on loopback, scraping
its targets every second, to run the dashboard's queries the way Grafana would.

Targets come from a file (file_sd), so Prometheus can start first: its scrape manager applies
target changes on a five-second tick, which then overlaps whatever starts the targets."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.processes import free_port

SCRAPE_INTERVAL_S = 1


def binary(name: str = "prometheus") -> str | None:
    return shutil.which(name)


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen
    log: Path
    targets_file: Path

    def scrape(self, *targets: str) -> None:
        """Scrape these host:port targets (path /metrics) from now on."""
        staged = self.targets_file.with_suffix(".tmp")
        staged.write_text(json.dumps([{"targets": list(targets)}]))
        staged.replace(self.targets_file)      # atomic: Prometheus never reads half a file

    def query(self, expr: str) -> dict[str, Any]:
        """The instant-query API's `data` ({resultType, result}); AssertionError with
        Prometheus' own message when it refuses the query."""
        response = httpx.post(self.url + "/api/v1/query", data={"query": expr}, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            raise AssertionError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def wait_for_samples(self, metric: str, count: int, timeout: float = 30.0) -> None:
        """Until `metric` has `count` samples in its latest minute (enough for rate())."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(f"count_over_time({metric}[1m])")["result"]
            if result and max(float(r["value"][1]) for r in result) >= count:
                return
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise AssertionError(f"{metric}: fewer than {count} samples after {timeout}s\n"
                                     + self.log.read_text(errors="replace")[-3000:])
            time.sleep(0.25)


@contextlib.contextmanager
def run_prometheus(workdir: Path, job: str = "helios") -> Iterator[Prometheus]:
    """Prometheus with one scrape job, every second; `scrape()` names its targets."""
    executable = binary()
    if executable is None:
        raise FileNotFoundError("prometheus is not installed (apt-get install prometheus)")
    workdir.mkdir(parents=True, exist_ok=True)
    targets_file = workdir / "targets.json"
    targets_file.write_text("[]")
    config = {"global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                         "scrape_timeout": f"{SCRAPE_INTERVAL_S}s"},
              "scrape_configs": [{"job_name": job, "file_sd_configs": [
                  {"files": [str(targets_file)], "refresh_interval": "1s"}]}]}
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [executable, f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"], stdout=out, stderr=subprocess.STDOUT)
    server = Prometheus(f"http://127.0.0.1:{port}", process, log, targets_file)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(server.url + "/-/ready", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline or process.poll() is not None:
                raise AssertionError("prometheus did not start\n" + log.read_text())
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

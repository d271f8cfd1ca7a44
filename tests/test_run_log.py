"""tests/support/run_log.py: a failure's traceback reaches HELIOS_FAILURE_LOG while the run
goes on (a pass writes nothing there), and every test phase's seconds reach
HELIOS_DURATION_LOG."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_failures_are_written_as_they_happen(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "def test_fails():\n    assert 1 + 1 == 3, 'the sum'\n\n"
        "def test_passes():\n    pass\n\n"
        "def test_errors_in_setup(missing_fixture):\n    pass\n")
    log = tmp_path / "failures.txt"
    durations = tmp_path / "durations.txt"
    env = {**os.environ, "HELIOS_FAILURE_LOG": str(log), "HELIOS_DURATION_LOG": str(durations),
           "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-p", "tests.support.run_log", "-o", "addopts=",
                          str(tmp_path / "test_sample.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    text = log.read_text()
    assert "==== test_sample.py::test_fails (call)" in text and "the sum" in text
    assert "==== test_sample.py::test_errors_in_setup (setup)" in text
    assert "missing_fixture" in text and "test_passes" not in text
    lines = [line.split(" ", 2) for line in durations.read_text().splitlines()]
    phases = {(nodeid, when) for _, when, nodeid in lines}
    assert ("test_sample.py::test_passes", "call") in phases
    assert ("test_sample.py::test_fails", "teardown") in phases
    assert ("test_sample.py::test_errors_in_setup", "setup") in phases
    assert all(float(seconds) >= 0 for seconds, _, _ in lines)

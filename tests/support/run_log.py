"""A pytest plugin that writes what a run learns as it happens, for runs a time limit may cut
off before pytest's own summary (the GPU suite on the device: `--durations` and the failure
tracebacks print only at the end). Under xdist the controller receives every worker's reports,
so one process writes each file. tests/conftest.py loads it; `pytest -p tests.support.run_log`
elsewhere.

- `HELIOS_FAILURE_LOG=path`: each failure's traceback, appended when it happens.
- `HELIOS_DURATION_LOG=path`: one line per test phase, `seconds phase nodeid` (setup holds a
  module fixture's engine build), so a cut run still says which tests took its time:
  `awk '{s[$3] += $1} END {for (t in s) print s[t], t}' path | sort -rn | head`."""

from __future__ import annotations

import os

import pytest


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    failures = os.environ.get("HELIOS_FAILURE_LOG")
    if failures and report.failed:
        with open(failures, "a", encoding="utf-8") as log:
            log.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
    durations = os.environ.get("HELIOS_DURATION_LOG")
    if durations:
        with open(durations, "a", encoding="utf-8") as log:
            log.write(f"{report.duration:.3f} {report.when} {report.nodeid}\n")

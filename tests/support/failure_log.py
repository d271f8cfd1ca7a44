"""A pytest plugin: HELIOS_FAILURE_LOG=path appends each failure's traceback to `path` as it
happens. Under xdist the controller receives every worker's reports, so a GPU run cut off by
its time limit still shows why the tests that failed before the cut failed (pytest prints
them only at the end). tests/conftest.py loads it; `pytest -p tests.support.failure_log`
elsewhere."""

from __future__ import annotations

import os

import pytest


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("HELIOS_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")

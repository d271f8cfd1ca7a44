"""The start-up phase records and `helios run`'s progress display."""

from __future__ import annotations

import io

import pytest

from services.cli.progress import StartupProgress
from services.common.startup import StartupPhases, read_events


def test_phases_are_recorded_in_order_with_their_durations(tmp_path):
    path = tmp_path / "engine.jsonl"
    phases = StartupPhases("engine", path)
    with phases.phase("verify model files"):
        pass
    phases.start("load weights")
    phases.start("allocate the KV cache")      # ends "load weights"
    phases.finish()
    phases.start("capture CUDA graphs")
    phases.fail()
    events, offset = read_events(path)
    assert [(e.phase, e.state) for e in events] == [
        ("verify model files", "running"), ("verify model files", "done"),
        ("load weights", "running"), ("load weights", "done"),
        ("allocate the KV cache", "running"), ("allocate the KV cache", "done"),
        ("capture CUDA graphs", "running"), ("capture CUDA graphs", "failed")]
    assert [name for name, _ in phases.done] == ["verify model files", "load weights",
                                                 "allocate the KV cache"]
    assert read_events(path, offset) == ([], offset)
    with path.open("a") as out:
        out.write('{"service": "engine", "phase": "half')     # a line being written
    assert read_events(path, offset) == ([], offset)


def test_a_phase_that_raises_is_failed_and_the_error_propagates(tmp_path):
    phases = StartupPhases("engine", tmp_path / "p.jsonl")
    with pytest.raises(ValueError), phases.phase("load weights"):
        raise ValueError("bad checkpoint")
    events, _ = read_events(tmp_path / "p.jsonl")
    assert events[-1].state == "failed" and phases.done == []


def test_the_terminal_display_redraws_one_line_per_service(tmp_path):
    files = {name: tmp_path / f"{name}.jsonl" for name in ("engine", "gateway")}
    out = io.StringIO()
    progress = StartupProgress(files, terminal=True, out=out)
    StartupPhases("engine", files["engine"]).start("load weights")
    progress.update({})
    assert "engine     load weights ..." in out.getvalue() and "gateway    starting" in \
        out.getvalue()
    phases = StartupPhases("engine", files["engine"])
    with phases.phase("capture CUDA graphs"):
        pass
    progress.update({"engine": True})
    drawn = out.getvalue()
    assert "\x1b[2F" in drawn and "engine     SERVING after" in drawn
    assert "capture CUDA graphs" in progress.summary()
    assert "gateway not serving" in progress.summary()

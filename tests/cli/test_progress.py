"""The start-up phase records and `helios run`'s progress display."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.cli.progress import StartupProgress
from services.common.startup import PhaseEvent, StartupPhases, read_events


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


def _done(path, service, phase, start, end):
    StartupPhases(service, path)._write(PhaseEvent(service, phase, "done", end, end - start))


def test_the_summary_accounts_for_the_whole_wait_of_each_service(tmp_path):
    files = {name: tmp_path / f"{name}.jsonl" for name in ("engine", "frontend")}
    progress = StartupProgress(files, terminal=False, started=100.0,
                               waits_for={"frontend": ("engine",)})
    _done(files["engine"], "engine", "start Python and import", 100.5, 102.0)
    _done(files["engine"], "engine", "import the engine core", 102.0, 104.0)
    _done(files["engine"], "engine", "verify model files", 102.2, 103.0)   # overlaps
    _done(files["engine"], "engine", "load weights", 105.0, 107.0)         # 1 s gap before
    _done(files["frontend"], "frontend", "start Python and import", 100.6, 101.0)
    _done(files["frontend"], "frontend", "load the tokenizer and chat template", 101.0, 102.0)
    progress.update({})
    for service, at in (("engine", 107.2), ("frontend", 107.5)):
        progress.services[service].serving_after = at - 100.0
        progress.services[service].serving_at = at
    assert progress.account("engine") == [
        "start Python and import 1.5 s", "import the engine core 2.0 s",
        "verify model files 0.8 s in parallel", "load weights 2.0 s", "unaccounted 1.2 s"]
    assert progress.account("frontend") == [
        "start Python and import 0.4 s", "load the tokenizer and chat template 1.0 s",
        "wait for engine 5.2 s", "unaccounted 0.3 s"]
    summary = progress.summary()
    assert summary.startswith("start-up: helios run 0.5 s; engine 7.2 s (")


def test_without_gaps_nothing_is_unaccounted(tmp_path):
    files = {"imageprep": tmp_path / "imageprep.jsonl"}
    progress = StartupProgress(files, terminal=False, started=10.0)
    _done(files["imageprep"], "imageprep", "start Python and import", 10.2, 11.0)
    _done(files["imageprep"], "imageprep", "load the image profiles and cache", 11.0, 12.0)
    progress.update({})
    progress.services["imageprep"].serving_after = 2.02
    progress.services["imageprep"].serving_at = 12.02
    assert progress.account("imageprep") == ["start Python and import 0.8 s",
                                             "load the image profiles and cache 1.0 s"]


def test_a_process_knows_when_it_started(tmp_path):
    """The first phase of every service counts from its process start (interpreter and
    imports included), read from /proc, not from the first line of its code."""
    code = ("import time; time.sleep(0.6); from services.common.startup import "
            "process_started_at; print(time.time() - process_started_at())")
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    after = time.time()
    age = float(out.stdout)
    assert 0.6 <= age <= after - before + 0.05


def test_helios_run_on_a_model_directory_does_not_import_torch(tmp_path):
    """The launcher's own start (before any service is spawned) stays light: the GGUF
    conversion code, which imports torch, is loaded only for a GGUF file."""
    code = ("import sys; import services.cli.main as main; import services.cli.launcher; "
            f"main._resolve_model({str(tmp_path)!r}); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False", out.stderr

"""Start-up phases: each service times what it does before it serves, logs every phase as it
ends, and (under `helios run`) appends it to a progress file that the launcher displays.

    phases = startup_phases("engine")
    with phases.phase("load weights"):
        ...
    phases.start("allocate KV cache")   # or laps: ends the running phase, starts the next
    ...
    phases.finish()

The progress file is named by the environment variable `HELIOS_STARTUP_FILE` (the launcher
sets one per service in its runtime directory); each line is one JSON object:

    {"service": "engine", "phase": "load weights", "state": "running" | "done" | "failed",
     "t": <wall-clock seconds>, "seconds": <duration, done/failed only>}

A process spawned by the service (the engine core) inherits the variable and appends to the
same file. Without the variable only the log lines are written.

`record_process_start(name)` names the time from the process's own start (the kernel's start
time: interpreter start-up and imports included) to now, so a service's phases cover its whole
start, from the launcher's spawn to SERVING.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ENV = "HELIOS_STARTUP_FILE"
log = logging.getLogger("services.startup")


@dataclass(frozen=True, slots=True)
class PhaseEvent:
    service: str
    phase: str
    state: str            # running, done, failed
    t: float              # wall-clock seconds (time.time())
    seconds: float = 0.0  # the phase's duration (done, failed)


@dataclass(slots=True)
class StartupPhases:
    service: str
    path: Path | None = None
    done: list[tuple[str, float]] = field(default_factory=list)
    _lap: contextlib.ExitStack | None = None

    def start(self, name: str) -> None:
        """End the phase `start` began last (if any) and begin `name`."""
        self.finish()
        stack = contextlib.ExitStack()
        stack.enter_context(self.phase(name))
        self._lap = stack

    def finish(self) -> None:
        """End the phase `start` began last."""
        lap, self._lap = self._lap, None
        if lap is not None:
            lap.close()

    def fail(self) -> None:
        """The running lap failed (its start is recorded as failed)."""
        lap, self._lap = self._lap, None
        if lap is not None:
            lap.__exit__(RuntimeError, RuntimeError("start-up failed"), None)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        self._write(PhaseEvent(self.service, name, "running", time.time()))
        try:
            yield
        except BaseException:
            self._write(PhaseEvent(self.service, name, "failed", time.time(),
                                   time.perf_counter() - started))
            raise
        seconds = time.perf_counter() - started
        self.done.append((name, seconds))
        self._write(PhaseEvent(self.service, name, "done", time.time(), seconds))
        log.info("start-up phase %s: %.2f s", name, seconds,
                 extra={"fields": {"service": self.service, "phase": name,
                                   "seconds": round(seconds, 3)}})

    def record_process_start(self, name: str) -> None:
        """A done phase `name` from this process's start (process_started_at) to now."""
        started = process_started_at()
        now = time.time()
        seconds = max(0.0, now - started)
        self._write(PhaseEvent(self.service, name, "running", started))
        self.done.append((name, seconds))
        self._write(PhaseEvent(self.service, name, "done", now, seconds))
        log.info("start-up phase %s: %.2f s", name, seconds,
                 extra={"fields": {"service": self.service, "phase": name,
                                   "seconds": round(seconds, 3)}})

    def _write(self, event: PhaseEvent) -> None:
        if self.path is None:
            return
        line = json.dumps({"service": event.service, "phase": event.phase,
                           "state": event.state, "t": event.t,
                           "seconds": round(event.seconds, 4)})
        # progress is advisory: never fail a start over it
        with contextlib.suppress(OSError), self.path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")


def process_started_at() -> float:
    """The wall-clock time (time.time()) this process started: its start tick in
    /proc/self/stat against CLOCK_BOOTTIME (10 ms resolution); the time of the first call
    where /proc is not there."""
    global _started_fallback
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])     # field 22: starttime
        since_boot = ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (OSError, ValueError, IndexError, AttributeError):
        if _started_fallback is None:
            _started_fallback = time.time()
        return _started_fallback


_started_fallback: float | None = None


def startup_phases(service: str) -> StartupPhases:
    """The phases of `service`, written to $HELIOS_STARTUP_FILE when it is set."""
    path = os.environ.get(ENV)
    return StartupPhases(service, Path(path) if path else None)


def read_events(path: Path, offset: int = 0) -> tuple[list[PhaseEvent], int]:
    """The complete lines of a progress file from byte `offset`: (events, next offset)."""
    try:
        with path.open("rb") as source:
            source.seek(offset)
            data = source.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for raw in data[:end].splitlines():
        try:
            item = json.loads(raw)
            events.append(PhaseEvent(str(item["service"]), str(item["phase"]),
                                     str(item["state"]), float(item["t"]),
                                     float(item.get("seconds", 0.0))))
        except (ValueError, KeyError, TypeError):
            continue
    return events, offset + end

"""`helios run`'s start-up progress: every service's phases as it reports them
(services/common/startup.py), as live lines on a terminal the services do not write to (they
log to files when the dashboard will own it), as log lines otherwise.

    display = StartupProgress(files, terminal=sys.stderr.isatty())
    display.update(ready)        # poll: new phases, which services serve
    display.close()              # the summary line: each service's time to SERVING and phases
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from services.common.startup import PhaseEvent, read_events

log = logging.getLogger("helios")


@dataclass(slots=True)
class _Service:
    path: Path
    offset: int = 0
    running: str = ""                  # the phase in progress
    running_since: float = 0.0
    done: list[tuple[str, float]] = field(default_factory=list)
    serving_after: float | None = None
    failed: str = ""


class StartupProgress:
    def __init__(self, files: dict[str, Path], *, terminal: bool,
                 out: TextIO | None = None) -> None:
        self.started = time.time()
        self.terminal = terminal
        self.out = out or sys.stderr
        self.services = {name: _Service(path) for name, path in files.items()}
        self._drawn = 0

    def update(self, ready: dict[str, bool]) -> None:
        """Read new phase events; `ready` says which services answer SERVING now."""
        now = time.time()
        for name, service in self.services.items():
            events, service.offset = read_events(service.path, service.offset)
            for event in events:
                self._apply(name, service, event)
            if ready.get(name) and service.serving_after is None:
                service.serving_after = now - self.started
                if not self.terminal:
                    log.info("%s is SERVING after %.1f s", name, service.serving_after)
        if self.terminal:
            self._draw(now)

    def _apply(self, name: str, service: _Service, event: PhaseEvent) -> None:
        if event.state == "running":
            service.running, service.running_since = event.phase, event.t
            return
        service.running = ""
        if event.state == "failed":
            service.failed = event.phase
            if not self.terminal:
                log.error("%s: start-up phase %s failed after %.1f s", name, event.phase,
                          event.seconds)
            return
        service.done.append((event.phase, event.seconds))
        if not self.terminal:
            log.info("%s: %s %.2f s", name, event.phase, event.seconds)

    def _status(self, service: _Service, now: float) -> str:
        if service.failed:
            return f"failed in {service.failed}"
        if service.serving_after is not None:
            return f"SERVING after {service.serving_after:.1f} s"
        if service.running:
            return f"{service.running} ... {now - service.running_since:.1f} s"
        if service.done:
            phase, seconds = service.done[-1]
            return f"{phase} done in {seconds:.1f} s"
        return "starting"

    def _draw(self, now: float) -> None:
        lines = [f"  {name:<10} {self._status(service, now)}"
                 for name, service in self.services.items()]
        if self._drawn:
            self.out.write(f"\x1b[{self._drawn}F")        # back to the block's first line
        self.out.write("".join(f"\x1b[2K{line}\n" for line in lines))
        self.out.flush()
        self._drawn = len(lines)

    def summary(self) -> str:
        parts = []
        for name, service in self.services.items():
            phases = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in service.done)
            ready = f"{service.serving_after:.1f} s" if service.serving_after is not None \
                else "not serving"
            parts.append(f"{name} {ready}" + (f" ({phases})" if phases else ""))
        return "start-up: " + "; ".join(parts)

    def close(self) -> None:
        if self.terminal:
            self._draw(time.time())
        log.info("%s", self.summary())

"""`helios run`'s start-up progress: every service's phases as it reports them
(services/common/startup.py), as live lines on a terminal the services do not write to (they
log to files when the dashboard will own it), as log lines otherwise.

    display = StartupProgress(files, terminal=sys.stderr.isatty(),
                              waits_for={"frontend": ("engine",)})
    display.update(ready)        # poll: new phases, which services serve
    display.close()              # the summary line: each service's time to SERVING and phases

Times count from `helios run`'s own process start. The summary accounts for each service's
whole wait: the launcher's start before the service's process began ("helios run", once at the
head), the service's phases (those overlapping an earlier one marked "in parallel"), the time
it then waited for the services it needs to serve ("wait for engine": from its last phase to
their SERVING), and whatever no phase covers ("unaccounted", shown from 0.05 s).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from services.common.startup import PhaseEvent, process_started_at, read_events

log = logging.getLogger("helios")


@dataclass(slots=True)
class _Service:
    path: Path
    offset: int = 0
    running: str = ""                  # the phase in progress
    running_since: float = 0.0
    done: list[tuple[str, float]] = field(default_factory=list)
    spans: list[tuple[str, float, float]] = field(default_factory=list)  # phase, start, end
    serving_after: float | None = None
    serving_at: float = 0.0            # wall-clock time it was seen SERVING
    failed: str = ""


class StartupProgress:
    def __init__(self, files: dict[str, Path], *, terminal: bool,
                 out: TextIO | None = None, started: float | None = None,
                 waits_for: dict[str, tuple[str, ...]] | None = None) -> None:
        self.started = process_started_at() if started is None else started
        self.waits_for = waits_for or {}
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
                service.serving_at = now
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
        service.spans.append((event.phase, event.t - event.seconds, event.t))
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
        launcher = min((start for service in self.services.values()
                        for _, start, _ in service.spans), default=self.started)
        if launcher > self.started:
            parts.append(f"helios run {launcher - self.started:.1f} s")
        for name, service in self.services.items():
            if service.serving_after is None:
                phases = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in service.done)
                parts.append(f"{name} not serving" + (f" ({phases})" if phases else ""))
                continue
            phases = ", ".join(self.account(name))
            parts.append(f"{name} {service.serving_after:.1f} s" +
                         (f" ({phases})" if phases else ""))
        return "start-up: " + "; ".join(parts)

    def account(self, name: str) -> list[str]:
        """A serving service's phases in start order, its wait for the services it needs and
        the unaccounted rest of its time since `helios run` started."""
        service = self.services[name]
        spans = sorted(service.spans, key=lambda span: span[1])
        upstreams = [self.services[u].serving_at for u in self.waits_for.get(name, ())
                     if u in self.services and self.services[u].serving_after is not None]
        last = max((end for _, _, end in spans), default=self.started)
        if upstreams and max(upstreams) > last:
            waited = ", ".join(self.waits_for[name])
            spans.append((f"wait for {waited}", last, min(max(upstreams), service.serving_at)))
        items: list[str] = []
        first = min((start for _, start, _ in spans), default=service.serving_at)
        covered = min(first, service.serving_at) - self.started    # the launcher's start
        covered_to = max(self.started, first)
        for phase, start, end in spans:
            parallel = start < covered_to - 0.05
            items.append(f"{phase} {end - start:.1f} s" + (" in parallel" if parallel else ""))
            end = min(end, service.serving_at)
            covered += max(0.0, end - max(start, covered_to))
            covered_to = max(covered_to, end)
        rest = service.serving_at - self.started - covered
        if rest >= 0.05:
            items.append(f"unaccounted {rest:.1f} s")
        return items

    def close(self) -> None:
        if self.terminal:
            self._draw(time.time())
        log.info("%s", self.summary())

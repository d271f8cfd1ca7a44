"""The runner interface the engine loop drives (CPU now; CUDA graphs and two frames later).

    fence = runner.submit(step)      # enqueue a committed step; never blocks on earlier work
    completion = runner.poll()       # the oldest finished step, or None
    completion = runner.wait()       # block until the oldest outstanding step finishes
    runner.drain() -> bool           # confirm every submitted step finished

Completions arrive in fence order. A runner that failed is poisoned: every later call raises
`PoisonedError` carrying the first failure as its cause.
"""

from __future__ import annotations

from typing import Protocol

from services.engine.scheduler.plan import Completion, Step


class Runner(Protocol):
    def submit(self, step: Step) -> int: ...
    def poll(self) -> Completion | None: ...
    def wait(self) -> Completion: ...
    def drain(self) -> bool: ...

    @property
    def outstanding(self) -> int: ...

"""The runner interface the engine loop drives (TorchRunner on the CPU, GraphRunner on CUDA).

    fence = runner.submit(step)      # enqueue a committed step; never blocks on earlier work
    completion = runner.poll()       # the oldest finished step, or None
    completion = runner.wait()       # block until the oldest outstanding step finishes
    runner.drain() -> bool           # confirm every submitted step finished
    runner.window                    # how many submitted steps may be outstanding at once

Completions arrive in fence order. A runner that failed is poisoned: every later call raises
`PoisonedError` carrying the first failure as its cause. With a window of 2 (two-frame
execution) the loop plans and submits step N+1 while step N runs; with 1 it completes each
step before planning the next.
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

    @property
    def window(self) -> int: ...

"""The Helios stack a benchmark measures: `helios run --demo` on the CPU, or `helios run CORE
--config YAML` (all four services) for a model core, until the block ends.

    add_stack_arguments(parser)           # --serve / --config / --model / --startup-timeout
    with measured_stack(args, tmp) as run:    # run.url, run.addresses["engine"], run.proc
        ...
    with serve_stack(core, config, log_path, startup_timeout) as run: ...
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """--serve / --config / --model / --startup-timeout: the stack a script measures
    (`measured_stack`: the CPU demo unless --serve names a core)."""
    parser.add_argument("--serve", type=Path, help="a model core to serve (default: the demo)")
    parser.add_argument("--config", type=Path)
    parser.add_argument("--model", default="helios-demo", help="model name for HTTP requests")
    parser.add_argument("--startup-timeout", type=float, default=600.0)


@contextlib.contextmanager
def measured_stack(args: argparse.Namespace, tmp: Path):
    """`helios run --demo`, or `helios run SERVE --config CONFIG` (add_stack_arguments)."""
    from tests.support.processes import HeliosRun

    if args.serve is None:
        with HeliosRun.start_demo(tmp) as run:
            yield run
    else:
        with serve_stack(args.serve, args.config, tmp / "helios-run.log",
                         args.startup_timeout) as run:
            yield run


@contextlib.contextmanager
def serve_stack(model: Path, config: Path | None, log_path: Path, startup_timeout: float):
    """`helios run MODEL --config YAML` (all four services) until the block ends."""
    import tempfile

    from tests.support.processes import HeliosRun, free_port

    with tempfile.TemporaryDirectory() as tmp:
        runtime = Path(tmp) / "run"
        runtime.mkdir()
        extra = ["--config", str(config)] if config else []
        run = HeliosRun([str(model), *extra], log_path, runtime, free_port())
        try:
            started = time.perf_counter()
            run.wait_output("Helios is serving", timeout=startup_timeout)
            print(f"stack ready in {time.perf_counter() - started:.1f} s", flush=True)
            yield run
        finally:
            run.stop()

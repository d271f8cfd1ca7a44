"""The engine-core process: started by the servicer with the spawn method, talks over one pipe.

    core_main(config, connection)
        initialize the device (CUDA context), then wait for PROCEED: the servicer verifies the
        model files meanwhile and sends it once they are verified (a closed pipe: exit 0)
        load the model and build the engine  -> Ready(info)   (or Failed(error), exit 1)
        EngineCore(...).run()                -> exit 0, or 1 after a failure

The servicer starts the core before it verifies the files, so the core's imports and device
start overlap the verification; nothing is read from the model before PROCEED.

The core ignores SIGINT/SIGTERM: the servicer owns shutdown and asks for it over the pipe. If
the servicer dies, the pipe closes and the core stops (and Linux also sends it SIGKILL through
the parent-death signal).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from multiprocessing.connection import Connection
from typing import NoReturn

from services.common.core import open_model
from services.common.errors import HeliosError, WorkerFailure
from services.common.heap import GcPauses, freeze_startup_heap
from services.common.logging import setup_logging
from services.common.processes import die_with_parent
from services.common.startup import startup_phases
from services.engine.config import EngineConfig
from services.engine.core.build import build_engine, resolve_device, start_compile_pool
from services.engine.core.loop import EngineCore
from services.engine.core.messages import PROCEED, ErrorInfo, Failed, Ready
from services.engine.core.outbox import Outbox

log = logging.getLogger("services.engine.core")


def _initialize_device(config: EngineConfig) -> None:
    """Create the CUDA context now (it would be at the first weight copy), while the servicer
    still verifies the files."""
    device = resolve_device(config.device)
    if device.type == "cuda":
        import torch

        torch.empty(0, device=device)


def _refuse(outbox: Outbox, exc: Exception) -> NoReturn:
    """Tell the servicer why the core cannot start (Failed) and exit 1."""
    error = exc if isinstance(exc, HeliosError) else WorkerFailure(
        f"engine core failed to start: {type(exc).__name__}: {exc}")
    if error is not exc:
        error.__cause__ = exc
    log.error("engine core failed to start: %s", error, exc_info=exc)
    outbox.send_now(Failed(ErrorInfo.of(error)))
    outbox.close()
    sys.exit(1)


def core_main(config: EngineConfig, connection: Connection) -> None:
    """Process entry point (multiprocessing spawn target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent()
    setup_logging("engine", config.log_level, config.log_format)
    GcPauses.install()                      # the core's pauses travel in its load snapshot
    phases = startup_phases("engine")
    phases.record_process_start("import the engine core")     # the spawn: Python, torch
    # forked first: before CUDA is initialised and before the outbox starts its thread
    with phases.phase("start the kernel compile workers"):
        compile_pool = start_compile_pool(config)
    outbox = Outbox(connection)
    if config.cpu_threads:
        import torch

        torch.set_num_threads(config.cpu_threads)
    try:
        with phases.phase("initialize the device"):
            _initialize_device(config)
        with phases.phase("wait for the verified model files"):
            proceed = connection.recv_bytes()
    except (EOFError, OSError):
        log.info("the servicer went away before the model was verified; stopping")
        sys.exit(0)
    except Exception as exc:
        _refuse(outbox, exc)
    if proceed != PROCEED:
        log.info("the servicer did not send PROCEED; stopping")
        sys.exit(0)
    phases.start("start the engine core")       # the model's files, the model's config
    try:
        source = open_model(config.model, verify=(),   # the servicer verified the files
                            allow_missing_weights=config.load_format == "dummy")
        engine = build_engine(config, source, phases, compile_pool)
    except Exception as exc:
        phases.fail()
        if compile_pool is not None:
            compile_pool.close()
        _refuse(outbox, exc)
    freeze_startup_heap("engine core")     # torch, the model: skipped by collections
    session_id = uuid.uuid4().hex
    log.info("engine core ready", extra={"fields": {"pid": os.getpid(),
                                                    "session": session_id}})
    outbox.send_now(Ready(engine.info, session_id))
    code = EngineCore(engine, connection, outbox, session_id).run()
    outbox.close()
    connection.close()
    sys.exit(code)

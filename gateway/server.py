"""Gateway entrypoint: `run_gateway(config)` serves the FastAPI app with uvicorn.

Shutdown follows the reference design: on SIGTERM/SIGINT the gateway stops admission (new
requests get 503 and /health turns 503), gives active responses `grace_period_s` (five seconds by
default) to finish, then closes the listener and exits 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Generator, Sequence

import uvicorn

from gateway.app import create_app
from gateway.config import GatewayConfig
from services.common.config import load_config
from services.common.errors import UnavailableError
from services.common.logging import setup_logging
from services.common.startup import startup_phases

log = logging.getLogger(__name__)

ABORT_FLUSH_S = 1.0   # after aborting leftover streams, time for their error events to go out


class GatewayServer(uvicorn.Server):
    """uvicorn with Helios' shutdown: stop admission, grace period, then exit (status 0)."""

    def __init__(self, config: uvicorn.Config, gateway_config: GatewayConfig) -> None:
        super().__init__(config)
        self.gateway_config = gateway_config
        self._shutdown_task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    def _on_signal(self) -> None:
        if self._shutdown_task is not None:
            log.warning("second signal: closing now")
            self.should_exit = True
            self.force_exit = True
            return
        self._shutdown_task = asyncio.get_running_loop().create_task(self._graceful())

    async def _graceful(self) -> None:
        app_state = self.config.app.state  # type: ignore[union-attr]
        admission = app_state.admission
        admission.close()
        log.info("admission stopped; waiting for %d active responses", admission.active)
        if not await admission.wait_for_requests(self.gateway_config.grace_period_s):
            # Past the grace period: end what is left with the protocol's error event (not a
            # silent cut), which also cancels the engine requests behind them.
            state = getattr(app_state, "gateway", None)
            aborted = state.abort_streams(UnavailableError(
                "the gateway is shutting down; retry the request", retry_after_s=1.0,
                service="gateway")) if state is not None else 0
            log.warning("%d responses still active after %.1f s; ended %d generations",
                        admission.active, self.gateway_config.grace_period_s, aborted)
            await admission.wait_for_requests(ABORT_FLUSH_S)
        self.should_exit = True


async def _serve(config: GatewayConfig) -> int:
    startup_phases("gateway").record_process_start("start Python and import")
    app = create_app(config, freeze_heap=True)
    server = GatewayServer(uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=1,
        timeout_keep_alive=max(1, round(config.keep_alive_s)),
        lifespan="on",
    ), config)
    log.info("gateway listening", extra={"fields": {"url": f"http://{config.host}:{config.port}"}})
    await server.serve()
    return 0 if server.started else 1


class _DropColorMessage(logging.Filter):
    """uvicorn attaches an ANSI-coloured copy of each message; keep our log lines plain."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.pop("color_message", None)
        return True


def run_gateway(config: GatewayConfig) -> int:
    setup_logging("gateway", config.log_level, config.log_format)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).addFilter(_DropColorMessage())
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(_serve(config))


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (Linux, macOS): a faster loop for many concurrent streams;
    asyncio's own loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: Sequence[str] | None = None) -> int:
    config = load_config(GatewayConfig, argv, section="gateway", prog="helios serve gateway")
    return run_gateway(config)


if __name__ == "__main__":
    sys.exit(main())

"""Run the real gateway app under uvicorn in a background thread (its own event loop).

    with GatewayThread(GatewayConfig(frontend_address=fake.address)) as gw:
        openai.OpenAI(base_url=gw.url + "/v1", api_key="x")
        gw.run(gw.admission.wait_for_requests(5))   # coroutines run on the gateway's loop
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import httpx
import uvicorn

from gateway.app import create_app
from gateway.config import GatewayConfig
from tests.support.processes import free_port


class GatewayThread:
    def __init__(self, config: GatewayConfig) -> None:
        if config.port in (0, 8000):
            config = dataclasses.replace(config, port=free_port())
        self.config = config
        self.app = create_app(config)
        self.admission = self.app.state.admission
        self.server = uvicorn.Server(uvicorn.Config(
            self.app, host="127.0.0.1", port=config.port, log_config=None, access_log=False,
            lifespan="on", timeout_graceful_shutdown=2))
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="gateway")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}"

    @property
    def state(self):
        return self.app.state.gateway

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve())

    def run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, *, wait_healthy: bool = True) -> GatewayThread:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise AssertionError("gateway did not start")
            time.sleep(0.02)
        while wait_healthy and httpx.get(self.url + "/health").status_code != 200:
            if time.monotonic() > deadline:
                raise AssertionError("gateway /health never turned 200")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> GatewayThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

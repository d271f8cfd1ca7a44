"""Gateway fixtures: a scripted fake frontend and the real gateway app in a thread."""

from __future__ import annotations

import pytest

from gateway.config import GatewayConfig
from tests.gateway.fake_frontend import FakeFrontendServer
from tests.gateway.harness import GatewayThread


@pytest.fixture(scope="session")
def fake_frontend():
    server = FakeFrontendServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(fake_frontend):
    config = GatewayConfig(frontend_address=fake_frontend.address, sse_keepalive_s=5.0)
    with GatewayThread(config) as gw:
        yield gw


@pytest.fixture
def frontend(fake_frontend):
    """The fake's servicer, with its request log cleared for this test."""
    servicer = fake_frontend.servicer
    servicer.requests.clear()
    servicer.metadata.clear()
    servicer.max_active = servicer.active
    return servicer

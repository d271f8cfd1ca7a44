"""Gateway fixtures: a scripted fake frontend and the real gateway app in a thread; the real
four services (`helios run --demo`, one stack per module that asks: a module may define its own
`stack`) and the official SDK clients of whichever `stack` the module has."""

from __future__ import annotations

import anthropic
import openai
import pytest

from gateway.config import GatewayConfig
from tests.gateway.fake_frontend import FakeFrontendServer
from tests.gateway.harness import GatewayThread
from tests.support.processes import HeliosRun


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


@pytest.fixture(scope="module")
def stack(tmp_path_factory, demo_core):
    with HeliosRun.start_demo(tmp_path_factory.mktemp("demo")) as run:
        yield run


@pytest.fixture(scope="module")
def oai(stack):
    return openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(stack):
    return anthropic.Anthropic(base_url=stack.url, api_key="k", max_retries=0, timeout=120)

"""Slow request bodies (slowloris) against the real app under uvicorn.

Raw asyncio connections send their headers, then trickle the body a byte a second (or fast
enough but too long). They must hold only body-reader slots, never admission permits: normal
requests keep succeeding while they trickle, the slow ones get 408 in their protocol's shape
and a closed connection, a full body-reader pool is a clear 429, and every slot comes back.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from gateway.config import GatewayConfig
from services.common.config import load_config
from services.common.errors import ValidationError
from tests.gateway.fake_frontend import script
from tests.gateway.harness import GatewayThread

pytestmark = pytest.mark.timeout(120)

GRACE_S = 3.5      # body_grace_s: the minimum rate applies after this
DEADLINE_S = 6.0   # body_timeout_s: the whole body, however fast it trickles
MIN_RATE = 20      # body_min_rate (bytes/s)
READERS = 5        # max_body_readers


@pytest.fixture(scope="module")
def slow_gw(fake_frontend):
    """Two admission permits (max_active 1 + queue 1) and five body-reader slots."""
    config = GatewayConfig(frontend_address=fake_frontend.address, max_active=1,
                           queue_capacity=1, max_body_readers=READERS,
                           body_timeout_s=DEADLINE_S, body_min_rate=MIN_RATE,
                           body_grace_s=GRACE_S)
    with GatewayThread(config) as gw:
        yield gw


class SlowSender:
    """One raw connection: headers at once, then `chunk` bytes every `interval_s` seconds."""

    def __init__(self, port: int, path: str, *, length: int, chunk: int = 1,
                 interval_s: float = 1.0) -> None:
        self.port, self.path, self.length = port, path, length
        self.chunk, self.interval_s = chunk, interval_s
        self.sent = 0
        self.status = 0
        self.body: dict = {}
        self.closed_by_server = False
        self.elapsed_s = 0.0

    async def run(self) -> SlowSender:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        started = time.monotonic()
        writer.write(f"POST {self.path} HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                     f"content-type: application/json\r\ncontent-length: {self.length}\r\n"
                     "\r\n".encode())
        trickle = asyncio.ensure_future(self._trickle(writer))
        try:
            # Without a body deadline no answer would come for 1000 s: fail well before that.
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            self.elapsed_s = time.monotonic() - started
            lines = head.decode("latin-1").split("\r\n")
            self.status = int(lines[0].split()[1])
            headers = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
            self.body = json.loads(await reader.readexactly(int(headers["content-length"])))
            self.closed_by_server = await asyncio.wait_for(reader.read(1), 10) == b""
        finally:
            trickle.cancel()
            writer.close()
        return self

    async def _trickle(self, writer: asyncio.StreamWriter) -> None:
        body = b'{"model": "m", "messages": [], "pad": "' + b"x" * self.length
        try:
            while self.sent < self.length:
                writer.write(body[self.sent:self.sent + self.chunk])
                await writer.drain()
                self.sent += self.chunk
                await asyncio.sleep(self.interval_s)
        except (ConnectionError, OSError):
            pass


async def wait_until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.02)


def test_slow_senders_hold_no_admission_permit_and_get_408(slow_gw):
    gw = slow_gw
    readers = gw.app.state.body_readers
    port = gw.config.port
    chat = [{"role": "user", "content": "hi"}]

    async def scenario() -> None:
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0,
                                    timeout=30)
        # Four slowloris connections, a byte a second: below the minimum rate after the grace.
        trickling = [SlowSender(port, path, length=1000) for path in (
            "/v1/chat/completions", "/v1/messages", "/api/chat", "/v1/completions")]
        slow_tasks = [asyncio.ensure_future(s.run()) for s in trickling]
        await wait_until(lambda: readers.active == 4 and all(s.sent >= 1 for s in trickling))
        # They hold body-reader slots only: the two admission permits are free, and normal
        # requests (more of them than there are permits) still succeed while they trickle.
        assert gw.admission.active == 0
        for _ in range(4):
            reply = await client.chat.completions.create(model="m", messages=chat)
            assert reply.choices[0].message.content == "Hello from Helios"
        async with httpx.AsyncClient(timeout=30) as http:
            ollama_reply = await http.post(gw.url + "/api/chat", json={
                "model": "m", "messages": chat, "stream": False})
            assert ollama_reply.status_code == 200
            assert not any(t.done() for t in slow_tasks)   # still trickling all along

            # A fifth sender, fast enough (200 bytes/s) but with a body too long for the
            # whole-body deadline, fills the body-reader pool: the next POST is refused.
            long_body = SlowSender(port, "/v1/chat/completions", length=100_000, chunk=50,
                                   interval_s=0.25)
            long_task = asyncio.ensure_future(long_body.run())
            await wait_until(lambda: readers.active == READERS)
            refused = await http.post(gw.url + "/v1/chat/completions",
                                      json={"model": "m", "messages": chat})
            assert refused.status_code == 429 and refused.headers["retry-after"]
            assert "--max-body-readers" in refused.json()["error"]["message"]

            # The byte-a-second senders are cut by the minimum rate (before the deadline).
            for sender in await asyncio.gather(*slow_tasks):
                assert sender.status == 408, sender.body
                assert sender.closed_by_server
                assert GRACE_S <= sender.elapsed_s < DEADLINE_S
            shapes = [s.body for s in trickling]
            assert shapes[0]["error"]["code"] == "request_timeout"
            assert "slower than 20 bytes/s" in shapes[0]["error"]["message"]
            assert shapes[1]["type"] == "error"
            assert shapes[1]["error"]["type"] == "timeout_error"
            assert "--body-min-rate" in shapes[2]["error"]               # Ollama: a string
            assert shapes[3]["error"]["type"] == "invalid_request_error"

            # Their slots came back while the long one still sends: POSTs succeed again.
            await wait_until(lambda: readers.active == 1)
            assert (await http.post(gw.url + "/v1/chat/completions", json={
                "model": "m", "messages": chat})).status_code == 200
            assert not long_task.done()

            # The long one meets the whole-body deadline, well above the minimum rate.
            sender = await long_task
            assert sender.status == 408 and sender.closed_by_server
            assert sender.sent < sender.length
            assert f"did not arrive within {DEADLINE_S:g} s" in sender.body["error"]["message"]
            assert sender.elapsed_s >= DEADLINE_S - 0.2
            await wait_until(lambda: readers.active == 0 and gw.admission.active == 0)
            metrics = (await http.get(gw.url + "/metrics")).text
        await client.close()
        assert 'helios_gateway_admission_rejected_total{reason="body_readers"} 1.0' in metrics
        assert 'helios_gateway_errors_total{kind="request_timeout"} 5.0' in metrics
        assert "helios_gateway_body_readers 0.0" in metrics

    asyncio.run(scenario())


def test_a_complete_body_is_not_timed_out(slow_gw):
    """A body that arrives in bursts within the limits (above the rate, before the deadline)
    is read whole and served; a client that leaves mid-body frees its slot."""

    async def scenario() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", slow_gw.config.port)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                           "pad": "y" * 1700}).encode()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        for start in range(0, len(body), 100):   # 100 bytes every 0.25 s: ~4.5 s, past the grace
            writer.write(body[start:start + 100])
            await writer.drain()
            await asyncio.sleep(0.25)
        response = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        assert response.startswith(b"HTTP/1.1 200"), response[:200]
        assert b"Hello from Helios" in response

        # A sender that disconnects while trickling releases its body-reader slot.
        readers = slow_gw.app.state.body_readers
        reader, writer = await asyncio.open_connection("127.0.0.1", slow_gw.config.port)
        writer.write(b"POST /api/generate HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n{")
        await wait_until(lambda: readers.active == 1)
        writer.close()
        await wait_until(lambda: readers.active == 0)

    asyncio.run(scenario())


def test_the_admission_permit_is_taken_when_the_body_is_complete(slow_gw, frontend):
    """A body that was still arriving when the permits ran out gets the 429 once it is
    complete (admission is checked before the body and taken after it)."""
    hang = json.dumps({"model": "m", "stream": True, "messages": [
        {"role": "user", "content": script(hang=True)}]}).encode()

    async def scenario() -> None:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]})
        reader, writer = await asyncio.open_connection("127.0.0.1", slow_gw.config.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body[:10].encode()))
        await writer.drain()
        await wait_until(lambda: slow_gw.app.state.body_readers.active == 1)
        async with httpx.AsyncClient(timeout=30) as http:
            streams = [http.stream("POST", slow_gw.url + "/v1/chat/completions", content=hang)
                       for _ in range(2)]
            for stream in streams:
                assert (await stream.__aenter__()).status_code == 200
            await wait_until(lambda: slow_gw.admission.active == 2)
            writer.write(body[10:].encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            assert head.startswith(b"HTTP/1.1 429"), head
            for stream in streams:
                await stream.__aexit__(None, None, None)
        writer.close()
        await wait_until(lambda: slow_gw.admission.active == 0 and frontend.active == 0)

    asyncio.run(scenario())


def test_body_phase_settings():
    config = load_config(GatewayConfig, ["--max-body-readers", "8", "--body-timeout-s", "2.5"],
                         env={"HELIOS_BODY_MIN_RATE": "0", "HELIOS_BODY_GRACE_S": "1"})
    assert (config.max_body_readers, config.body_timeout_s, config.body_min_rate,
            config.body_grace_s) == (8, 2.5, 0, 1.0)
    for bad in ({"max_body_readers": 0}, {"body_timeout_s": 0}, {"body_min_rate": -1},
                {"body_grace_s": -1}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            GatewayConfig(**bad)

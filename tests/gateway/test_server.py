"""The gateway as a real process (`helios serve gateway`): SIGTERM stops admission, lets active
responses finish within the grace period, cancels what outlives it, and exits 0."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx

from tests.gateway.fake_frontend import script
from tests.support.processes import ServiceProcess, free_port


def _start(tmp_path, fake_frontend, *extra: str) -> tuple[ServiceProcess, str]:
    port = free_port()
    process = ServiceProcess(["serve", "gateway", "--port", str(port), "--frontend-address",
                              fake_frontend.address, *extra], tmp_path / "gateway.log")
    url = f"http://127.0.0.1:{port}"
    process.wait_http(url + "/health")
    return process, url


def _stream(url: str, content: str, out: dict) -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": content}]}
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                          timeout=60) as response:
            out["status"] = response.status_code
            out["lines"] = [line for line in response.iter_lines() if line]
    except httpx.HTTPError as exc:      # cut off by the shutdown
        out["error"] = exc


def test_idle_keep_alive_connection_is_kept_past_client_pool_expiry(tmp_path, fake_frontend):
    """A pooled connection idle for longer than httpx's 5 s expiry (uvicorn's default
    keep-alive, which raced it) is still open: the next request on it succeeds."""
    import socket

    process, url = _start(tmp_path, fake_frontend)
    port = int(url.rsplit(":", 1)[1])
    request = (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n")

    def response(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data                 # closed by the server
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        while len(body) < length:
            body += conn.recv(65536)
        return head

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            for wait_s in (0.0, 6.0):
                time.sleep(wait_s)
                conn.sendall(request)
                head = response(conn)
                assert head.startswith(b"HTTP/1.1 200"), (wait_s, head[:200])
    finally:
        process.stop()


def test_sigterm_drains_active_responses_then_exits_0(tmp_path, fake_frontend):
    servicer = fake_frontend.servicer
    process, url = _start(tmp_path, fake_frontend)
    try:
        out: dict = {}
        before = servicer.active
        reader = threading.Thread(target=_stream, args=(
            url, script(numbered=[15, 1], delay_s=0.1), out))
        reader.start()
        deadline = time.monotonic() + 30
        while servicer.active == before and time.monotonic() < deadline:
            time.sleep(0.01)
        process.proc.send_signal(signal.SIGTERM)
        # Admission is closed at once: new work gets 503 + Retry-After, /health turns 503.
        response = httpx.post(url + "/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert response.status_code == 503 and response.headers["retry-after"]
        assert httpx.get(url + "/health").status_code == 503
        reader.join(timeout=30)
        assert process.proc.wait(timeout=30) == 0, process.output()
    finally:
        process.stop()
    assert out["status"] == 200 and out["lines"][-1] == "data: [DONE]"
    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                   for line in out["lines"][:-1] if json.loads(line[6:])["choices"])
    assert text.count("<") == 15                        # the whole response arrived


def test_responses_outliving_the_grace_period_are_cancelled(tmp_path, fake_frontend):
    servicer = fake_frontend.servicer
    process, url = _start(tmp_path, fake_frontend, "--grace-period-s", "0.5")
    try:
        cancelled = servicer.cancelled
        out: dict = {}
        reader = threading.Thread(target=_stream, args=(url, script(hang=True), out))
        reader.start()
        deadline = time.monotonic() + 30
        while not servicer.active and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process.terminate(signal.SIGTERM) == 0, process.output()
        reader.join(timeout=30)
        deadline = time.monotonic() + 30
        while servicer.cancelled == cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        assert servicer.cancelled == cancelled + 1      # the engine request was let go
    finally:
        process.stop()
    # The client got the protocol's error event, not a silent cut.
    assert out["status"] == 200, out
    last = json.loads(out["lines"][-1][len("data: "):])
    assert "shutting down" in last["error"]["message"]


def test_responses_stream_cut_off_by_shutdown_reports_usage_and_one_code(tmp_path,
                                                                         fake_frontend):
    """A long Responses stream ended by SIGTERM: `error` and `response.failed` carry the same
    code, and the failed response counts the prompt and the tokens streamed so far."""
    servicer = fake_frontend.servicer
    process, url = _start(tmp_path, fake_frontend, "--grace-period-s", "0.5")
    out: dict = {}

    def read() -> None:
        body = {"model": "m", "stream": True,
                "input": script(numbered=[2000, 1], delay_s=0.01, prompt_tokens=23)}
        with httpx.stream("POST", url + "/v1/responses", json=body, timeout=60) as response:
            out["lines"] = [line for line in response.iter_lines() if line]

    try:
        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 30
        while not servicer.active and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)                                  # some text has streamed
        assert process.terminate(signal.SIGTERM) == 0, process.output()
        reader.join(timeout=30)
    finally:
        process.stop()
    events = [json.loads(line[6:]) for line in out["lines"] if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    error, failed = events[-2:]
    assert (error["type"], failed["type"]) == ("error", "response.failed")
    assert 0 < len(deltas) < 2000
    assert error["code"] == failed["response"]["error"]["code"] == "server_error"
    assert "shutting down" in error["message"]
    usage = failed["response"]["usage"]
    assert usage["input_tokens"] == 23
    assert usage["output_tokens"] == len(deltas)
    assert usage["total_tokens"] == 23 + len(deltas)

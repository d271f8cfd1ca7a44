"""CORS (issue 20 item 5): browser clients on allowed origins can call the gateway.

A real headless Chromium loads pages from a local web server under three origins: loopback
(`http://127.0.0.1:P`, allowed by default), a non-loopback one named in `--allowed-origins`
(`http://app.test:P`) and one that is not (`http://evil.test:P`); Chromium resolves `*.test` to
127.0.0.1. The pages call the gateway with fetch the way the browser SDKs do (Authorization,
JSON, the openai SDK's x-stainless-* headers), which makes the browser send a preflight.
"""

from __future__ import annotations

import http.server
import shutil
import threading

import httpx
import pytest

from gateway.config import GatewayConfig
from gateway.cors import OriginPolicy
from services.common.config import load_config
from services.common.errors import ValidationError
from tests.gateway.harness import GatewayThread
from tests.support.processes import free_port

KEY = "sekrit"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def page_port():
    """A tiny page server on 127.0.0.1 (reached as 127.0.0.1, app.test and evil.test)."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<!doctype html><title>client</title><p>client page</p>"
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def cors_gw(fake_frontend, page_port):
    config = GatewayConfig(frontend_address=fake_frontend.address, api_key=KEY,
                           max_active=1, queue_capacity=0,
                           allowed_origins=(f"http://app.test:{page_port}",
                                            "https://*.example.com"))
    with GatewayThread(config) as gw:
        yield gw


def preflight(gw, origin: str, headers: str = "authorization,content-type") -> httpx.Response:
    return httpx.options(gw.url + "/v1/chat/completions", headers={
        "origin": origin, "access-control-request-method": "POST",
        "access-control-request-headers": headers})


def test_preflight_is_answered_before_auth_and_admission(cors_gw):
    cors_gw.admission.pause()               # admission closed: preflights still answered
    try:
        asked = "authorization,content-type,x-stainless-lang,x-stainless-retry-count"
        response = preflight(cors_gw, "http://localhost:5173", asked)
    finally:
        cors_gw.admission.resume()
    assert response.status_code == 204
    headers = response.headers
    assert headers["access-control-allow-origin"] == "http://localhost:5173"
    assert headers["access-control-allow-headers"] == asked
    assert "POST" in headers["access-control-allow-methods"]
    assert "Origin" in headers["vary"] and int(headers["access-control-max-age"]) > 0
    for origin in ("http://127.0.0.1:3000", "https://[::1]:8443", "https://localhost",
                   "https://chat.example.com"):
        assert preflight(cors_gw, origin).headers["access-control-allow-origin"] == origin
    # Not a preflight (no Origin): the route's own 405, as before.
    assert httpx.options(cors_gw.url + "/v1/chat/completions", headers={
        "authorization": f"Bearer {KEY}"}).status_code == 405


def test_disallowed_origins_get_403_and_no_cors_headers(cors_gw, frontend):
    for origin in ("http://evil.test:8000", "https://example.com", "http://localhost.evil.com",
                   "null"):
        response = preflight(cors_gw, origin)
        assert response.status_code == 403, origin
        assert "access-control-allow-origin" not in response.headers
    # A "simple" request (no preflight) from a disallowed page is refused before it runs.
    response = httpx.post(cors_gw.url + "/api/generate", content=b'{"model": "m"}',
                          headers={"origin": "http://evil.test:1", "content-type": "text/plain",
                                   "authorization": f"Bearer {KEY}"})
    assert response.status_code == 403 and "--allowed-origins" in response.json()["error"]
    assert "access-control-allow-origin" not in response.headers
    assert frontend.requests == []
    # Same-origin (the gateway's own /docs page): Origin names the gateway's host.
    host = cors_gw.url.removeprefix("http://")
    response = httpx.get(cors_gw.url + "/v1/models", headers={
        "origin": "http://" + host.replace("127.0.0.1", "gateway.internal"),
        "host": host.replace("127.0.0.1", "gateway.internal"),
        "authorization": f"Bearer {KEY}"})
    assert response.status_code == 200


def test_cors_headers_on_errors_and_streams(cors_gw):
    origin = {"origin": "http://localhost:3000"}
    unauthorized = httpx.post(cors_gw.url + "/v1/chat/completions", json=CHAT, headers=origin)
    assert unauthorized.status_code == 401
    assert unauthorized.headers["access-control-allow-origin"] == "http://localhost:3000"
    exposed = unauthorized.headers["access-control-expose-headers"]
    assert "x-request-id" in exposed and "retry-after" in exposed
    auth = {**origin, "authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", cors_gw.url + "/v1/chat/completions", headers=auth,
                      json={**CHAT, "stream": True}) as stream:
        assert stream.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert stream.headers["vary"] == "Origin"
        assert "data: [DONE]" in list(stream.iter_lines())
    cors_gw.admission.pause()
    try:
        refused = httpx.post(cors_gw.url + "/v1/messages", headers=auth, json=CHAT)
    finally:
        cors_gw.admission.resume()
    assert refused.status_code == 503
    assert refused.headers["access-control-allow-origin"] == "http://localhost:3000"
    plain = httpx.get(cors_gw.url + "/health")       # no Origin: no CORS headers
    assert "access-control-allow-origin" not in plain.headers


def test_origin_patterns_and_the_setting(tmp_path):
    policy = OriginPolicy(["https://*.example.com", "chrome-extension://*",
                           "http://intranet:8080"])
    assert policy.allows("https://a.b.example.com")
    assert policy.allows("chrome-extension://abcdefghijklmnop")
    assert policy.allows("HTTP://Intranet:8080")
    assert not policy.allows("https://example.com")
    assert not policy.allows("https://a.example.com.evil.net")
    assert not policy.allows("http://intranet:8081")
    assert not policy.allows("http://localhost:99999")            # malformed port
    assert OriginPolicy(["*"]).allows("https://anything.net")
    assert OriginPolicy([]).allows("vscode-webview://1a2b3c")        # desktop apps, as Ollama
    assert not OriginPolicy([]).allows("chrome-extension://abcdefghijklmnop")
    flags = load_config(GatewayConfig, ["--allowed-origins", "https://a.net,https://*.b.net"],
                        env={})
    assert flags.allowed_origins == ("https://a.net", "https://*.b.net")
    env = load_config(GatewayConfig, [], env={"HELIOS_ALLOWED_ORIGINS": "*"})
    assert env.allowed_origins == ("*",)
    (tmp_path / "helios.yaml").write_text(
        "gateway:\n  allowed_origins: [https://a.net, chrome-extension://*]\n")
    yaml = load_config(GatewayConfig, ["--config", str(tmp_path / "helios.yaml")], env={},
                       section="gateway")
    assert yaml.allowed_origins == ("https://a.net", "chrome-extension://*")
    with pytest.raises(ValidationError, match="not an origin"):
        GatewayConfig(allowed_origins=("https://a.net/path",))


def find_browser() -> str:
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    pytest.fail("no Chromium found (looked for chromium, chromium-browser, google-chrome): "
                "install the Debian package `chromium` (`make install` does)")


CALL_API = """async ({url, key}) => {
  const headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json",
                   "x-stainless-lang": "js", "x-stainless-retry-count": "0"};
  const chat = {model: "m", messages: [{role: "user", content: "hi"}]};
  try {
    const reply = await fetch(url + "/v1/chat/completions",
                              {method: "POST", headers, body: JSON.stringify(chat)});
    const json = await reply.json();
    const stream = await fetch(url + "/v1/chat/completions", {method: "POST", headers,
        body: JSON.stringify({...chat, stream: true})});
    const reader = stream.body.getReader();
    const decoder = new TextDecoder();
    let text = "";
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      text += decoder.decode(value, {stream: true});
    }
    const denied = await fetch(url + "/v1/messages", {method: "POST", body: "{}", headers: {
        "x-api-key": "wrong", "anthropic-version": "2023-06-01", "content-type": "application/json"}});
    return {status: reply.status, content: json.choices[0].message.content,
            requestId: reply.headers.get("x-request-id"), streamStatus: stream.status,
            stream: text, deniedStatus: denied.status, denied: await denied.json()};
  } catch (error) {
    return {error: String(error)};
  }
}"""


def test_browser_fetch_from_allowed_and_disallowed_origins(cors_gw, page_port, frontend):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=find_browser(), headless=True,
            args=["--host-resolver-rules=MAP *.test 127.0.0.1"])
        try:
            page = browser.new_page()
            for host in ("127.0.0.1", "app.test"):           # loopback, and configured
                page.goto(f"http://{host}:{page_port}/")
                result = page.evaluate(CALL_API, {"url": cors_gw.url, "key": KEY})
                assert "error" not in result, (host, result)
                assert result["status"] == 200
                assert result["content"] == "Hello from Helios"
                assert result["requestId"]                          # an exposed header
                assert result["streamStatus"] == 200
                assert "Hello" in result["stream"] and "data: [DONE]" in result["stream"]
                assert result["deniedStatus"] == 401                # error replies readable
                assert result["denied"]["error"]["type"] == "authentication_error"
            served = len(frontend.requests)
            assert served == 4

            page.goto(f"http://evil.test:{page_port}/")
            result = page.evaluate(CALL_API, {"url": cors_gw.url, "key": KEY})
            assert result == {"error": "TypeError: Failed to fetch"}
            # A preflight-free request from that page is sent by the browser but refused by
            # the gateway before anything runs (and its answer stays unreadable).
            simple = page.evaluate("""async (url) => {
                try {
                  await fetch(url + "/api/generate", {method: "POST",
                      body: JSON.stringify({model: "m", prompt: "hi", stream: false})});
                  return "read";
                } catch (error) { return String(error); }
            }""", cors_gw.url)
            assert simple == "TypeError: Failed to fetch"
            assert len(frontend.requests) == served
        finally:
            browser.close()

"""Multi-part message content through the real four services (`helios run --demo`).

guidellm's chat benchmark, the OpenAI Agents SDK, pydantic-ai, the Vercel AI SDK, LangChain
and LiteLLM send `"content": [{"type": "text", "text": ...}]`; on the demo's Qwen3 template
(which reads content as a string) that was a 400 "chat template error". Now the parts render
as the template reads them: text parts joined with newlines, so a conversation in parts has
exactly the prompt tokens of the same conversation with the texts joined. Driven with the
official OpenAI JS SDK in Node (pinned in tests/gateway/node/package.json, installed by the
fixture into a cache dir) and the Python SDKs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import anthropic
import openai
import pytest

from services.common.assets import cache_root

MODEL = "helios-demo"
NODE_DIR = Path(__file__).parent / "node"
EXACT = {"temperature": 0, "ignore_eos": True,
         "chat_template_kwargs": {"enable_thinking": False}}
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def node_clients() -> Path:
    """The npm prefix holding the pinned JS SDKs: installed once per package.json (npm install
    --prefix into the Helios cache); an existing install is used as is, offline too."""
    manifest = (NODE_DIR / "package.json").read_bytes()
    wanted = json.loads(manifest)["dependencies"]
    prefix = cache_root() / "npm" / f"e2e-{hashlib.sha256(manifest).hexdigest()[:16]}"

    def installed() -> bool:
        for name, version in wanted.items():
            found = prefix / "node_modules" / name / "package.json"
            if not found.is_file() or json.loads(found.read_text())["version"] != version:
                return False
        return True

    if not installed():
        npm, node = shutil.which("npm"), shutil.which("node")
        assert npm and node, "node and npm are needed (make test installs them)"
        prefix.mkdir(parents=True, exist_ok=True)
        (prefix / "package.json").write_bytes(manifest)
        proc = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit",
                               "--no-fund", "--no-save"], capture_output=True, text=True,
                              timeout=300, check=False)
        assert proc.returncode == 0 and installed(), f"npm install failed: {proc.stderr[-2000:]}"
    return prefix


def test_openai_js_sdk_sends_multi_part_content(stack, node_clients):
    proc = subprocess.run(["node", str(NODE_DIR / "multipart_chat.cjs"), str(node_clients),
                           stack.url + "/v1", MODEL], capture_output=True, text=True,
                          timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["sdk"] == json.loads((NODE_DIR / "package.json").read_text())[
        "dependencies"]["openai"]
    parts, joined = out["parts"], out["joined"]
    assert parts["finish"] == "length" and parts["usage"]["completion_tokens"] == 4
    # The parts rendered as the texts joined with newlines: the same prompt, the same output.
    assert parts["usage"]["prompt_tokens"] == joined["usage"]["prompt_tokens"]
    assert parts["text"] == joined["text"] == out["stream"]["text"]
    assert out["stream"]["usage"]["prompt_tokens"] == parts["usage"]["prompt_tokens"]
    assert out["responses"]["status"] in ("completed", "incomplete")
    assert out["responses"]["usage"]["output_tokens"] <= 4
    assert out["empty"]["status"] == 400
    assert out["empty"]["message"].startswith("messages[0].content: must not be an empty list")
    assert out["empty"]["param"] == "messages[0].content"


def test_python_sdks_send_multi_part_content(stack):
    oai = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0, timeout=120)
    texts = ["Describe the sea.", "Use two words."]
    parts = [{"type": "text", "text": t} for t in texts]
    whole = oai.chat.completions.create(model=MODEL, max_tokens=3, extra_body=EXACT,
                                        messages=[{"role": "user", "content": parts}])
    plain = oai.chat.completions.create(model=MODEL, max_tokens=3, extra_body=EXACT,
                                        messages=[{"role": "user", "content": "\n".join(texts)}])
    assert whole.usage.prompt_tokens == plain.usage.prompt_tokens
    assert whole.choices[0].message.content == plain.choices[0].message.content
    response = oai.responses.create(model=MODEL, max_output_tokens=3, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": t} for t in texts]}])
    same = oai.responses.create(model=MODEL, max_output_tokens=3, temperature=0,
                                input="\n".join(texts))
    assert response.usage.input_tokens == same.usage.input_tokens
    claude = anthropic.Anthropic(base_url=stack.url, api_key="k", max_retries=0, timeout=120)
    blocks = claude.messages.create(model=MODEL, max_tokens=3, messages=[
        {"role": "user", "content": [{"type": "text", "text": t} for t in texts]}])
    joined = claude.messages.create(model=MODEL, max_tokens=3, messages=[
        {"role": "user", "content": "\n".join(texts)}])
    assert blocks.usage.input_tokens + (blocks.usage.cache_read_input_tokens or 0) == \
        joined.usage.input_tokens + (joined.usage.cache_read_input_tokens or 0)
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model=MODEL, max_tokens=3,
                               messages=[{"role": "user", "content": []}])
    assert "messages[0].content: must not be an empty list" in str(info.value)

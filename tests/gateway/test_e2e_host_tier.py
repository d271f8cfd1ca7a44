"""The host-memory KV tier through the real four services (`helios run --demo` with a small GPU
pool and `kv_offload_gib`), with the official SDKs: a prompt evicted from the GPU comes back
from host memory, and usage says so per tier (`cached_tokens` counts both tiers, the
`cached_tokens_host` / `cache_read_input_tokens_host` extensions the host tier's part)."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.support.processes import HeliosRun, engine_load

MODEL = "helios-demo"
# the demo model: 8 KiB pages of 16 tokens; about 40 pages hold one long prompt, not three
KV_BYTES = 40 * 8192 + 2 * 2 * (8192 + 64 * 4)
pytestmark = pytest.mark.timeout(600)


def _text(topic: str) -> str:
    return f"Write down everything about the {topic} and the people around it. " * 26


@pytest.fixture(scope="module")
def stack(tmp_path_factory, demo_core):
    tmp = tmp_path_factory.mktemp("host-tier")
    config = tmp / "helios.yaml"
    config.write_text(f"engine:\n  max_num_seqs: 2\n  kv_cache_bytes: {KV_BYTES}\n"
                      "  kv_offload_gib: 0.004\n")
    with HeliosRun.start_demo(tmp, "--config", str(config)) as run:
        yield run


def test_usage_reports_the_host_tier(stack):
    oai = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0, timeout=120)

    def completion(prompt: str):
        return oai.completions.create(model=MODEL, prompt=prompt, max_tokens=2,
                                      temperature=0).usage

    first = completion(_text("lighthouse"))
    assert first.prompt_tokens > 300 and first.prompt_tokens_details.cached_tokens == 0
    completion(_text("harbour"))                   # two other long prompts evict it
    completion(_text("mountain pass"))
    again = completion(_text("lighthouse"))
    details = again.prompt_tokens_details.model_dump()
    assert details["cached_tokens_host"] >= 256, details
    assert details["cached_tokens"] >= details["cached_tokens_host"]
    assert engine_load(stack).host_tier.hits >= 1

    claude = anthropic.Anthropic(base_url=stack.url, api_key="k", max_retries=0, timeout=120)

    def message(topic: str):
        return claude.messages.create(model=MODEL, max_tokens=2, messages=[
            {"role": "user", "content": _text(topic)}]).usage

    assert message("old mill").cache_read_input_tokens == 0
    message("river delta")
    message("glacier")
    usage = message("old mill").model_dump()
    assert usage["cache_read_input_tokens_host"] >= 256, usage
    assert usage["cache_read_input_tokens"] >= usage["cache_read_input_tokens_host"]

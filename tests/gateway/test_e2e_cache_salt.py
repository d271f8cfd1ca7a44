"""`cache_salt` (vLLM's field) separates prefix-cache tenants, through the real four services
(`helios run --demo`) with the official SDKs: a repeated prompt hits the cache only under the
same salt, on OpenAI chat, completions and Responses and on Anthropic messages."""

from __future__ import annotations

import anthropic
import openai
import pytest

MODEL = "helios-demo"
PROMPT = "Tell me about the lighthouse on the northern cape and its keeper. " * 8
pytestmark = pytest.mark.timeout(600)


def test_salts_never_share_cached_prompts(stack):
    oai = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0, timeout=120)

    def chat(salt: str | None, text: str = PROMPT) -> int:
        extra = {"chat_template_kwargs": {"enable_thinking": False}}
        if salt is not None:
            extra["cache_salt"] = salt
        reply = oai.chat.completions.create(model=MODEL, max_tokens=2, temperature=0,
                                            messages=[{"role": "user", "content": text}],
                                            extra_body=extra)
        return reply.usage.prompt_tokens_details.cached_tokens or 0

    assert chat("tenant-a") == 0
    assert chat("tenant-a") > 64                    # the same tenant reuses its prompt
    assert chat("tenant-b") == 0                    # another tenant does not
    assert chat(None) == 0                          # nor does the unsalted cache
    assert chat(None) > 64

    def completion(salt: str) -> int:
        reply = oai.completions.create(model=MODEL, prompt=PROMPT + " (completion)",
                                       max_tokens=2, temperature=0,
                                       extra_body={"cache_salt": salt})
        return reply.usage.prompt_tokens_details.cached_tokens or 0

    assert (completion("c1"), completion("c1"), completion("c2")) == (0, completion("c1"), 0)
    assert completion("c1") > 64

    def responses(salt: str) -> int:
        reply = oai.responses.create(model=MODEL, input=PROMPT + " (responses)",
                                     max_output_tokens=2, extra_body={"cache_salt": salt})
        return reply.usage.input_tokens_details.cached_tokens

    assert responses("r1") == 0 and responses("r1") > 64 and responses("r2") == 0

    claude = anthropic.Anthropic(base_url=stack.url, api_key="k", max_retries=0, timeout=120)

    def message(salt: str) -> int:
        reply = claude.messages.create(model=MODEL, max_tokens=2, extra_body={
            "cache_salt": salt}, messages=[{"role": "user", "content": PROMPT + " (claude)"}])
        return reply.usage.cache_read_input_tokens or 0

    assert message("m1") == 0 and message("m1") > 64 and message("m2") == 0

    with pytest.raises(openai.BadRequestError, match="cache_salt"):
        chat("x" * 257)

"""200 concurrent streams through one gateway: none lost, truncated, duplicated or mixed up."""

from __future__ import annotations

import asyncio
import re

import anthropic
import openai

from tests.gateway.fake_frontend import script

STREAMS = 200
PIECES = 40


async def _openai_stream(client: openai.AsyncOpenAI, number: int) -> str:
    content = script(numbered=[PIECES, 4], prefix=f"s{number}", delay_s=0.002)
    stream = await client.chat.completions.create(
        model="m", stream=True, messages=[{"role": "user", "content": content}])
    text = ""
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    return text


async def _anthropic_stream(client: anthropic.AsyncAnthropic, number: int) -> str:
    content = script(numbered=[PIECES, 4], prefix=f"s{number}", delay_s=0.002)
    async with client.messages.stream(model="m", max_tokens=64, messages=[
            {"role": "user", "content": content}]) as stream:
        message = await stream.get_final_message()
    return message.content[0].text


def test_200_concurrent_streams(gateway, frontend):
    async def main() -> list[str]:
        oai = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="k", max_retries=0,
                                 timeout=120)
        claude = anthropic.AsyncAnthropic(base_url=gateway.url, api_key="k", max_retries=0,
                                          timeout=120)
        jobs = [_openai_stream(oai, i) if i % 2 == 0 else _anthropic_stream(claude, i)
                for i in range(STREAMS)]
        try:
            return await asyncio.gather(*jobs)
        finally:
            await oai.close()
            await claude.close()

    texts = asyncio.run(main())
    for number, text in enumerate(texts):
        found = re.findall(r"s(\d+)<(\d{6})>", text)
        assert found == [(str(number), f"{i:06d}") for i in range(PIECES)], number
    assert frontend.max_active > 10         # they really overlapped upstream
    assert gateway.admission.active == 0

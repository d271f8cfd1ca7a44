"""Every generated token's logprob comes out of `ChoiceProcessor` exactly once, in order.

Property-tested over random token streams on a byte-level (Qwen3) and a sentencepiece
(Gemma 3) tokenizer: tokens that split UTF-8 characters, special tokens, stop strings cut
across tokens, the EOS / a stop token at the end, reasoning and tool-call parsing, and any
split of the tokens into engine messages. The logprobs of all events of a choice (deltas and
the finish, which carries the tokens that produced no text) must be those of the first
`num_tokens` tokens (the ones the choice consumed, up to a stop), each once.
"""

from __future__ import annotations

import functools
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.api.events import Finish, FinishReason
from services.frontend.generate.choice import ChoiceProcessor
from services.frontend.generate.types import ChoiceStep, OutputOptions, SampledLogprob
from tests.frontend.conftest import frontend_assets

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
ASSETS = ("qwen3", "gemma3")


@functools.cache
def pools(asset: str) -> tuple[list[int], list[int], list[int]]:
    """(ids whose bytes are an incomplete UTF-8 sequence, special ids, ordinary ids)."""
    tokenizer = frontend_assets(asset).tokenizer
    partial = []
    for token_id in range(tokenizer.vocab_size):
        _, raw = tokenizer.token_piece(token_id)
        if raw and raw[0] >= 0x80 and len(raw) <= 2:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                partial.append(token_id)
    ordinary = tokenizer.encode("Hello wörld, 漢字 😀 <think>hm</think> <tool_call>{\"name\": "
                                "\"f\", \"arguments\": {\"a\": 1}}</tool_call> stop here.")
    return partial, sorted(tokenizer.special_ids), ordinary


def run_choice(asset: str, ids: list[int], cuts: list[int], options: OutputOptions,
               finish: FinishReason, stop_token_id: int | None):
    processor = ChoiceProcessor(0, frontend_assets(asset).tokenizer, options)
    events = []
    bounds = [0, *sorted(set(cuts)), len(ids)]
    for k, (start, end) in enumerate(itertools.pairwise(bounds)):
        last = k == len(bounds) - 2
        step = ChoiceStep(0, tuple(ids[start:end]),
                          tuple(SampledLogprob(t, -float(i) - 0.5, ((t, -0.25),))
                                for i, t in enumerate(ids[start:end], start)),
                          finish if last else None, stop_token_id if last else None)
        events += processor.process(step)
        if processor.finished:
            break
    return processor, events


@pytest.mark.parametrize("asset", ASSETS)
@SETTINGS
@given(data=st.data())
def test_every_token_logprob_exactly_once(asset, data):
    partial, special, ordinary = pools(asset)
    tokenizer = frontend_assets(asset).tokenizer
    token = st.one_of(st.sampled_from(ordinary), st.sampled_from(partial),
                      st.sampled_from(special), st.integers(0, tokenizer.vocab_size - 1))
    ids = data.draw(st.lists(token, min_size=0, max_size=30), label="ids")
    natural = data.draw(st.booleans(), label="ends on EOS")
    eos = tokenizer.token_to_id("<|im_end|>" if asset == "qwen3" else "<eos>")
    if natural:
        ids.append(eos)
    text = tokenizer.decode(ids)
    stop: tuple[str, ...] = ()
    if text and data.draw(st.booleans(), label="stop string"):
        start = data.draw(st.integers(0, len(text) - 1))
        stop = (text[start:start + data.draw(st.integers(1, 4))],)
    options = OutputOptions(
        stop=stop, include_stop_str_in_output=data.draw(st.booleans()),
        skip_special_tokens=data.draw(st.booleans()),
        reasoning=data.draw(st.booleans()), starts_in_reasoning=data.draw(st.booleans()),
        tool_parser="hermes" if data.draw(st.booleans()) else "",
        tool_names=frozenset({"f"}), parallel_tool_calls=data.draw(st.booleans()),
        logprobs=True)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=6), label="message cuts")
    reason = FinishReason.STOP if natural else FinishReason.LENGTH
    processor, events = run_choice(asset, ids, cuts, options, reason,
                                   eos if natural else None)

    assert processor.finished and isinstance(events[-1], Finish)
    assert sum(isinstance(e, Finish) for e in events) == 1
    consumed = processor.num_tokens
    if not stop and (options.parallel_tool_calls or not options.tool_parser):
        assert consumed == len(ids)           # nothing ends the choice early
    got = [lp for event in events for lp in event.logprobs]
    assert [lp.token_id for lp in got] == ids[:consumed]
    assert [lp.logprob for lp in got] == [-float(i) - 0.5 for i in range(consumed)]
    assert all(lp.token_bytes == tokenizer.token_piece(lp.token_id)[1] for lp in got)


@pytest.mark.parametrize("asset", ASSETS)
def test_eos_after_held_back_bytes_keeps_both_logprobs(asset):
    """The last text token holds half a character and the EOS follows in the same message:
    the flushed character and the EOS each keep their logprob."""
    tokenizer = frontend_assets(asset).tokenizer
    eos = tokenizer.token_to_id("<|im_end|>" if asset == "qwen3" else "<eos>")
    ids = [*tokenizer.encode("ok"), pools(asset)[0][0], eos]
    processor, events = run_choice(asset, ids, [], OutputOptions(logprobs=True),
                                   FinishReason.STOP, eos)
    assert [lp.token_id for e in events for lp in e.logprobs] == ids
    assert processor.num_tokens == len(ids)

"""Generate over gRPC against a real engine process: streaming, usage, logprobs, n, prefix
hits, client cancel and Abort mid-stream (slot and pages come back, seen through GetLoad)."""

from __future__ import annotations

import threading
import time

import grpc

from services.common.pb import common_pb2, engine_pb2
from tests.engine.service.conftest import generate_request

PROMPT = list(range(1000, 1130))      # 130 tokens: two complete 64-token blocks


def _collect(responses):
    messages = list(responses)
    tokens: dict[int, list[int]] = {}
    finish: dict[int, int] = {}
    for message in messages[1:]:
        for output in message.outputs:
            tokens.setdefault(output.index, []).extend(output.token_ids)
            if output.finish_reason:
                finish[output.index] = output.finish_reason
    return messages, tokens, finish


def test_stream_usage_logprobs_and_finish(engine):
    request = generate_request("g1", PROMPT, 6, sampling=dict(logprobs=True, top_logprobs=2))
    messages, tokens, finish = _collect(engine.stub.Generate(request, timeout=120))
    first = messages[0]
    assert first.request_id == "g1" and not first.outputs
    assert first.usage.prompt_tokens == 130 and first.usage.completion_tokens == 0
    assert len(tokens[0]) == 6 and finish == {0: common_pb2.FINISH_REASON_LENGTH}
    completions = [m.usage.completion_tokens for m in messages]
    assert completions == sorted(completions) and completions[-1] == 6   # cumulative
    logprobs = [lp for m in messages for o in m.outputs for lp in o.logprobs]
    assert [lp.token_id for lp in logprobs] == tokens[0]
    assert all(len(lp.top) == 2 and lp.top[0].token_id == lp.token_id for lp in logprobs)
    # the same prompt again is a full prefix hit, reported in the first message
    messages, again, _ = _collect(engine.stub.Generate(
        generate_request("g2", PROMPT, 6), timeout=120))
    assert messages[0].usage.cached_tokens == 130 and again[0] == tokens[0]
    engine.wait_idle()


def test_n_choices_and_seeded_sampling(engine):
    request = generate_request("g3", PROMPT[:40], 5, n=3,
                               sampling=dict(temperature=1.0, seed=42))
    _, tokens, finish = _collect(engine.stub.Generate(request, timeout=120))
    assert sorted(tokens) == [0, 1, 2] and all(len(t) == 5 for t in tokens.values())
    assert len({tuple(t) for t in tokens.values()}) == 3 and len(finish) == 3
    _, again, _ = _collect(engine.stub.Generate(
        generate_request("g4", PROMPT[:40], 5, n=3, sampling=dict(temperature=1.0, seed=42)),
        timeout=120))
    assert again == tokens


def test_client_cancel_mid_stream_returns_slot_and_pages(engine):
    idle = engine.wait_idle()
    call = engine.stub.Generate(generate_request("long", PROMPT, 3000), timeout=300)
    received = 0
    for message in call:
        received += sum(len(o.token_ids) for o in message.outputs)
        if received >= 3:
            break
    busy = engine.load(include_requests=True)
    assert busy.slots_live == 1 and busy.requests[0].phase == "decode"
    call.cancel()
    after = engine.wait_idle()
    assert after.requests_cancelled == idle.requests_cancelled + 1
    assert after.slots_free == after.slots_total


def test_abort_mid_stream_ends_the_stream_cancelled(engine):
    engine.wait_idle()
    call = engine.stub.Generate(generate_request("to-abort", PROMPT[:20], 3000), timeout=300)
    messages = []
    aborted = threading.Event()
    for message in call:
        messages.append(message)
        if len(messages) == 3 and not aborted.is_set():
            reply = engine.stub.Abort(engine_pb2.AbortRequest(request_ids=["to-abort", "nope"]))
            assert reply.num_aborted == 1
            aborted.set()
    last = messages[-1].outputs[-1]
    assert last.finish_reason == common_pb2.FINISH_REASON_CANCELLED
    again = engine.stub.Abort(engine_pb2.AbortRequest(request_ids=["to-abort"]))
    assert again.num_aborted == 0                   # idempotent
    load = engine.wait_idle()
    assert load.slots_free == load.slots_total


def test_a_reader_that_stops_reading_blocks_nobody(engine):
    """One stream's reader stalls (with large logprob payloads flowing); another request still
    runs to completion, and the stalled stream later receives every token, coalesced into
    fewer messages than tokens wherever the transport pushed back."""
    stalled = engine.stub.Generate(generate_request(
        "stalled", PROMPT[:10], 150, sampling=dict(logprobs=True, top_logprobs=20)),
        timeout=300)
    assert not next(stalled).outputs
    _, tokens, finish = _collect(engine.stub.Generate(generate_request("other", PROMPT, 12),
                                                      timeout=120))
    assert len(tokens[0]) == 12 and finish[0] == common_pb2.FINISH_REASON_LENGTH
    rest = list(stalled)
    received = [t for m in rest for o in m.outputs for t in o.token_ids]
    logprobs = [lp for m in rest for o in m.outputs for lp in o.logprobs]
    assert len(received) == 150 and len(logprobs) == 150
    assert [lp.token_id for lp in logprobs] == received
    assert rest[-1].outputs[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH


def test_concurrent_streams(engine):
    results: dict[str, list[int]] = {}

    def run(rid: str, prompt):
        _, tokens, _ = _collect(engine.stub.Generate(generate_request(rid, prompt, 8),
                                                     timeout=120))
        results[rid] = tokens[0]

    threads = [threading.Thread(target=run, args=(f"c{i}", PROMPT[i:i + 30 + 7 * i]))
               for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(6):      # batched results equal a request run alone
        _, alone, _ = _collect(engine.stub.Generate(
            generate_request(f"solo{i}", PROMPT[i:i + 30 + 7 * i], 8), timeout=120))
        assert results[f"c{i}"] == alone[0]


def test_model_info(engine):
    info = engine.stub.GetModelInfo(engine_pb2.GetModelInfoRequest(), timeout=10)
    assert info.architecture == "Qwen3ForCausalLM" and "helios-demo" in info.served_names
    assert info.device == "cpu" and info.dtype == "float32"
    assert info.page_size == 16 and info.num_pages > 100 and info.max_num_seqs == 8
    assert len(info.identity) == 32 and info.max_model_len == 4096


def test_duplicate_live_request_id_is_refused(engine):
    call = engine.stub.Generate(generate_request("dup", PROMPT, 3000), timeout=300)
    next(call)
    try:
        second = engine.stub.Generate(generate_request("dup", PROMPT, 3), timeout=30)
        try:
            list(second)
            raise AssertionError("a duplicate live id was accepted")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        call.cancel()
    engine.wait_idle()


def test_cancel_before_the_first_message_leaks_nothing(engine):
    """A caller that leaves while admission is in flight must not leave a request running
    (a leaked one would generate all of its 3000 tokens before the engine is idle again)."""
    before = engine.wait_idle()
    for i in range(5):
        call = engine.stub.Generate(generate_request(f"early{i}", PROMPT, 3000), timeout=300)
        time.sleep(0.002 * i)
        call.cancel()
    load = engine.wait_idle(timeout=300)
    assert load.generation_tokens - before.generation_tokens < 3000
    assert load.requests_admitted == (load.requests_completed + load.requests_cancelled +
                                      load.requests_failed)

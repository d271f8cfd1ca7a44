"""Coalescing: a slow reader gets merged updates; the engine loop never blocks on it."""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import threading
import time

from services.engine.core.messages import Outgoing
from services.engine.core.outbox import Outbox, merge_updates
from services.engine.core.streams import RequestStream
from services.engine.scheduler.requests import (
    ChoiceDelta,
    FinishReason,
    RequestUpdate,
    SampledLogprobs,
    Usage,
)


def update(token: int, *, index: int = 0, finish: FinishReason | None = None,
           rid: str = "a") -> RequestUpdate:
    delta = ChoiceDelta(rid, index, (token,), (SampledLogprobs(token, -0.5),), finish,
                        token if finish else None)
    return RequestUpdate(rid, (delta,), Usage(10, token, 0), finish is not None)


def test_merge_concatenates_per_choice_and_keeps_the_latest_state():
    merged = merge_updates(merge_updates(update(1), update(2, index=1)),
                           update(3, finish=FinishReason.STOP))
    by_index = {d.index: d for d in merged.deltas}
    assert by_index[0].token_ids == (1, 3) and by_index[1].token_ids == (2,)
    assert [lp.token_id for lp in by_index[0].logprobs] == [1, 3]
    assert by_index[0].finish_reason is FinishReason.STOP and by_index[0].stop_token_id == 3
    assert merged.usage.completion_tokens == 3 and merged.finished


def test_request_stream_coalesces_for_a_slow_consumer():
    async def scenario():
        stream = RequestStream("a")
        for token in range(5):
            stream.push(update(token))
        first = await stream.next()
        stream.push(update(5, finish=FinishReason.LENGTH))
        last = await stream.next()
        return first, last, await stream.next(), stream.coalesced

    first, last, end, coalesced = asyncio.run(scenario())
    assert first.deltas[0].token_ids == (0, 1, 2, 3, 4) and coalesced == 4
    assert last.finished and last.deltas[0].token_ids == (5,) and end is None


def test_outbox_never_blocks_the_publisher_and_coalesces_while_the_pipe_is_full():
    reader, writer = multiprocessing.Pipe(duplex=True)
    outbox = Outbox(writer)
    big = tuple(range(2000))                  # a large payload fills the OS pipe buffer
    started = time.monotonic()
    for token in range(400):
        delta = ChoiceDelta("a", 0, (token,), tuple(SampledLogprobs(t, -1.0) for t in big[:50]))
        outbox.publish([RequestUpdate("a", (delta,), Usage(1, token + 1, 0), False)], ())
    publish_time = time.monotonic() - started
    assert publish_time < 5.0                  # nothing waited for the reader
    received: list[int] = []
    messages = 0

    def drain():
        nonlocal messages
        while len(received) < 400:
            batch: Outgoing = pickle.loads(reader.recv_bytes())
            messages += 1
            for item in batch.updates:
                received.extend(item.deltas[0].token_ids)

    thread = threading.Thread(target=drain)
    thread.start()
    thread.join(30)
    outbox.close()
    assert received == list(range(400))
    assert messages < 400 and outbox.coalesced > 0
    # the first publishes went out inline, until the socket was full: one of them was cut
    # mid-frame and the sender thread finished it (else the reader could not decode)
    assert 0 < outbox.inline_writes < 400


def test_a_small_step_is_written_by_the_publisher_itself():
    reader, writer = multiprocessing.Pipe(duplex=True)
    outbox = Outbox(writer)
    outbox.publish([update(7)], ())     # decided under the outbox's lock: no race with the thread
    assert reader.poll(5)
    batch: Outgoing = pickle.loads(reader.recv_bytes())
    assert [u.deltas[0].token_ids for u in batch.updates] == [(7,)]
    assert outbox.inline_writes == 1
    # a step of many requests goes to the sender thread (it pickles outside the loop)
    outbox.publish([update(i, rid=f"r{i}") for i in range(20)], ())
    assert reader.poll(5)
    batch = pickle.loads(reader.recv_bytes())
    assert len(batch.updates) == 20 and outbox.inline_writes == 1
    outbox.close()

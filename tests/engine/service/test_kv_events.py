"""KV events in vLLM's wire format: a real engine process publishes its prefix cache on ZMQ,
and a subscriber decodes every batch with the schema vLLM's consumers use (msgspec structs,
`array_like`, tagged), as llm-d's KV-cache indexer and Dynamo's KV router read vLLM."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import zmq

from services.common.pb import engine_pb2
from services.engine.kv_events import END_OF_REPLAY, block_hash
from services.engine.prefix.history import PrefixHistory
from tests.engine.service.conftest import generate_request, start_engine
from tests.support.processes import free_port


# The consumer's schema: vLLM's KV-event types (vllm.distributed.kv_events) as its published
# subscriber example declares them.
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)
SHARED = list(range(3000, 3150))


def receive(sub: zmq.Socket, batches: list[tuple[int, bytes]], until, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        if sub.poll(100):
            topic, sequence, payload = sub.recv_multipart()
            assert topic == b"helios"
            batches.append((int.from_bytes(sequence, "big"), payload))
    assert until(), f"expected events never arrived: {[DECODER.decode(p) for _, p in batches]}"


def events_of(batches: list[tuple[int, bytes]]) -> list[KVCacheEvent]:
    return [event for _, payload in batches for event in DECODER.decode(payload).events]


def test_prefix_cache_events_in_vllm_format_with_replay(tmp_path, demo_core):
    port, replay_port = free_port(), free_port()
    with start_engine(tmp_path, "--kv-events-endpoint", f"tcp://127.0.0.1:{port}",
                      "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay_port}",
                      "--kv-events-topic", "helios") as engine:
        identity = engine.stub.GetModelInfo(engine_pb2.GetModelInfoRequest()).identity
        context = zmq.Context()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"helios")
        sub.connect(f"tcp://127.0.0.1:{port}")
        replay = context.socket(zmq.DEALER)
        replay.connect(f"tcp://127.0.0.1:{replay_port}")
        try:
            time.sleep(0.5)                      # ZMQ's slow joiner: let the SUB attach
            first = [*SHARED, *range(10)]
            second = [*SHARED, *range(50, 70)]  # shares two complete blocks (128 tokens)
            other = list(range(7000, 7200))
            for rid, prompt in (("a", first), ("b", second), ("c", other)):
                list(engine.stub.Generate(generate_request(rid, prompt, 2), timeout=60))
            live: list[tuple[int, bytes]] = []
            receive(sub, live, lambda: sum(isinstance(e, BlockStored)
                                           for e in events_of(live)) >= 2)
            stored = [e for e in events_of(live) if isinstance(e, BlockStored)]
            keys = PrefixHistory(identity, first)
            assert stored[0].block_hashes == [block_hash(keys.block_key(b)) for b in range(2)]
            assert stored[0].parent_block_hash is None and stored[0].token_ids == SHARED[:128]
            assert stored[0].block_size == 64 and stored[0].medium == "GPU"
            assert stored[0].lora_id is None
            # the second prompt reused the shared blocks: nothing new was stored for it
            assert len(stored) == 2 and stored[1].token_ids == other[:192]
            assert all(isinstance(h, int) and 0 <= h < 2**64 for h in stored[1].block_hashes)

            # a late subscriber replays from sequence 0: the session's opening all-cleared,
            # then the very batches published live
            replay.send_multipart([b"", (0).to_bytes(8, "big")])
            replayed: list[tuple[int, bytes]] = []
            while True:
                assert replay.poll(10_000), "no replay answer"
                _, sequence, payload = replay.recv_multipart()
                if sequence == END_OF_REPLAY:
                    assert payload == b""
                    break
                replayed.append((int.from_bytes(sequence, "big"), payload))
            assert replayed[0][0] == 0
            assert isinstance(DECODER.decode(replayed[0][1]).events[0], AllBlocksCleared)
            assert [s for s, _ in replayed] == list(range(len(replayed)))
            assert set(live) <= set(replayed)

            # drain empties the cache: one AllBlocksCleared, live
            engine.stub.Drain(engine_pb2.DrainRequest(timeout_s=1), timeout=60)
            receive(sub, live, lambda: isinstance(events_of(live)[-1], AllBlocksCleared))
            sequences = [s for s, _ in live]
            assert sequences == sorted(set(sequences))
        finally:
            sub.close(0)
            replay.close(0)
            context.term()
        assert engine.process.terminate() == 0

"""KV events in vLLM's wire format over ZMQ, so that the Kubernetes routing layer (llm-d's
KV-cache indexer and precise prefix scorer, Dynamo's KV router) reads Helios' prefix cache
unchanged.

Sockets (engine settings `kv_events_endpoint`, `kv_events_replay_endpoint`):

- PUB: every batch is the multipart message `[topic, sequence, payload]`, the sequence an
  8-byte big-endian counter from 0 (a subscriber that sees a gap asks the replay socket);
- ROUTER (replay): a request whose last frame is an 8-byte big-endian start sequence is
  answered with `[sequence, payload]` for every buffered batch from there, then the end marker
  `[-1 (8 bytes, signed), b""]`, behind the request's envelope (REQ and DEALER clients both
  work).

The payload is msgpack `KVEventBatch`: `[ts, [event, ...]]`, each event a tagged array, as
msgspec encodes vLLM's `array_like` structs:

    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
    ["BlockRemoved", block_hashes, medium]
    ["AllBlocksCleared"]

Block hashes are the 64-bit integer form of the 16-byte `PrefixHistory` block keys (their
last 8 bytes, big-endian); `block_size` is 64 (Helios' block, not its page); `token_ids` are
the stored blocks' tokens; `medium` is "GPU" for device pages and "CPU" for the host tier
(`--kv-offload-gib`: a block evicted from the GPU and kept in host memory is stored on CPU,
and removed from CPU when the host tier evicts it). The first batch of a session is AllBlocksCleared, so a subscriber
that followed an earlier engine on this endpoint drops what it held.

One thread owns both sockets (ZMQ sockets are not thread-safe): `deliver` (the engine's event
loop, through `CoreClient.subscribe`) only queues; the thread batches whatever is queued,
publishes it and answers replay requests.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import Any

from services.engine.prefix.history import BLOCK_TOKENS
from services.engine.prefix.records import BlockEvent

log = logging.getLogger(__name__)

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
MAX_BATCH_EVENTS = 1024
POLL_S = 0.02


def block_hash(key: bytes) -> int:
    """The 64-bit external form of a 16-byte block key."""
    return int.from_bytes(key[-8:], "big")


def encode_event(event: BlockEvent) -> list[Any]:
    """One event in vLLM's array form; `medium` is the tier (GPU, or CPU: the host tier)."""
    if event.cleared:
        return ["AllBlocksCleared"]
    hashes = [block_hash(key) for key in event.block_keys]
    if not event.stored:
        return ["BlockRemoved", hashes, event.medium]
    parent = block_hash(event.parent_key) if event.parent_key else None
    return ["BlockStored", hashes, parent, list(event.token_ids), BLOCK_TOKENS, None,
            event.medium]


def encode_batch(events: list[BlockEvent], ts: float) -> bytes:
    import msgpack

    return msgpack.packb([ts, [encode_event(e) for e in events]], use_bin_type=True)


class KVEventPublisher:
    """Publishes block events on a ZMQ PUB socket, keeps the last `buffer_batches` for replay."""

    def __init__(self, endpoint: str, replay_endpoint: str = "", *, topic: str = "",
                 buffer_batches: int = 10_000) -> None:
        import zmq

        self._topic = topic.encode()
        self._queue: queue.SimpleQueue[BlockEvent] = queue.SimpleQueue()
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(
            maxlen=max(1, buffer_batches))
        self._sequence = 0
        self._stop = threading.Event()
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        self._replay = None
        if replay_endpoint:
            self._replay = self._context.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
        self._queue.put(BlockEvent.all_cleared())
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        log.info("KV events (vLLM format) on %s%s", endpoint,
                 f", replay on {replay_endpoint}" if replay_endpoint else "")

    def deliver(self, event: BlockEvent) -> None:
        """Queue one event (any thread; never blocks)."""
        self._queue.put(event)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pub.close()
        if self._replay is not None:
            self._replay.close()
        self._context.term()

    # -- the socket thread ------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                events = [self._queue.get(timeout=POLL_S)]
            except queue.Empty:
                events = []
            while events and len(events) < MAX_BATCH_EVENTS:
                try:
                    events.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                if events:
                    self._publish(events)
                self._serve_replays()
            except Exception:  # a socket failure must not take the engine down
                log.exception("KV event publishing failed")

    def _publish(self, events: list[BlockEvent]) -> None:
        payload = encode_batch(events, time.time())
        sequence = self._sequence
        self._sequence += 1
        self._buffer.append((sequence, payload))
        self._pub.send_multipart([self._topic, sequence.to_bytes(8, "big"), payload])

    def _serve_replays(self) -> None:
        import zmq

        while self._replay is not None and self._replay.poll(0, zmq.POLLIN):
            frames = self._replay.recv_multipart()
            envelope, start = frames[:-1], int.from_bytes(frames[-1], "big")
            for sequence, payload in list(self._buffer):
                if sequence >= start:
                    self._replay.send_multipart([*envelope, sequence.to_bytes(8, "big"),
                                                 payload])
            self._replay.send_multipart([*envelope, END_OF_REPLAY, b""])

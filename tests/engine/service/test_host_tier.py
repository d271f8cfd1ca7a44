"""The host-memory KV tier in a real engine process (the demo core, the torch runner).

A small GPU pool holds about one long prompt; evicting it copies its blocks to the host tier,
and the same prompt later comes back from there: the greedy tokens equal the cold run's, the
usage and GetLoad count the host tier's tokens, and the KV events announce the blocks on CPU.
"""

from __future__ import annotations

import time

import pytest
import zmq

from services.common.pb import engine_pb2
from services.engine.kv_events import block_hash
from services.engine.prefix.history import PrefixHistory
from tests.engine.service.conftest import generate_request, start_engine
from tests.engine.service.test_kv_events import BlockStored, events_of, receive
from tests.support.processes import free_port

LONG = 400          # prompt tokens: six complete blocks and a tail


def _run(engine, rid: str, prompt: list[int]
         ) -> tuple[list[tuple[int, float]], engine_pb2.EngineGenerateResponse]:
    """Greedy tokens with their logprobs (which any change in the KV read would move)."""
    messages = list(engine.stub.Generate(generate_request(
        rid, prompt, 6, sampling=dict(logprobs=True)), timeout=120))
    return [(lp.token_id, lp.logprob) for m in messages for o in m.outputs
            for lp in o.logprobs], messages[-1]


def test_evicted_prompt_comes_back_from_the_host_tier(tmp_path, demo_core):
    port = free_port()
    # 8 KiB pages (demo core: 2 layers x 2 KV heads x 16 dims, float32, 16 tokens): the pool
    # holds about 50 pages, one 400-token prompt and a little more
    with start_engine(tmp_path, "--kv-cache-bytes", str(480 << 10), "--max-num-seqs", "1",
                      "--kv-offload-gib", "0.004", "--kv-events-topic", "helios",
                      "--kv-events-endpoint", f"tcp://127.0.0.1:{port}") as engine:
        context = zmq.Context()
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"helios")
        sub.connect(f"tcp://127.0.0.1:{port}")
        try:
            time.sleep(0.5)                       # ZMQ's slow joiner
            load = engine.load()
            assert load.HasField("host_tier") and load.host_tier.pages_total >= 24
            prompt = [(i * 37 + 11) % 500 + 3 for i in range(LONG)]
            cold, _ = _run(engine, "cold", prompt)
            for i in range(2):                    # unrelated prompts evict it
                _run(engine, f"other{i}", [(i * 101 + j * 13) % 500 + 3 for j in range(LONG)])
            load = engine.wait_idle()
            assert load.host_tier.blocks_offloaded >= 6, load.host_tier
            warm, last = _run(engine, "warm", prompt)
            assert [t for t, _ in warm] == [t for t, _ in cold] and len(cold) == 6
            assert [lp for _, lp in warm] == pytest.approx([lp for _, lp in cold], abs=1e-4)
            usage = last.usage
            assert usage.cached_tokens_host >= 5 * 64 and usage.cached_tokens >= \
                usage.cached_tokens_host
            load = engine.wait_idle()
            assert load.host_tier.hits == 1
            assert load.host_tier.reused_tokens == usage.cached_tokens_host
            live: list[tuple[int, bytes]] = []
            receive(sub, live, lambda: any(isinstance(e, BlockStored) and e.medium == "CPU"
                                           for e in events_of(live)))
            identity = engine.stub.GetModelInfo(engine_pb2.GetModelInfoRequest()).identity
            keys = PrefixHistory(identity, prompt)
            on_cpu = {h for e in events_of(live) if isinstance(e, BlockStored) and
                      e.medium == "CPU" for h in e.block_hashes}
            assert block_hash(keys.block_key(0)) in on_cpu
        finally:
            sub.close(0)
            context.term()
        assert engine.process.terminate() == 0

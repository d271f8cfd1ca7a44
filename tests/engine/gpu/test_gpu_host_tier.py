"""The host-memory KV tier on a CUDA device: the pinned store's copies (staging chunks, runs of
host pages, the copy stream) and the graph runner serving evicted prompts from host memory."""

from __future__ import annotations

import gc
import random

import pytest
import torch

from services.common.core import open_model
from services.engine.model.attention import KVCache
from services.engine.prefix.history import BLOCK_TOKENS
from services.engine.runner.graph_runner import GraphRunner
from services.engine.runner.host_kv import HostKVStore
from services.engine.scheduler.plan import KVTransfers
from tests.engine.model.checkpoints import SPECS, VOCAB_SIZE, build_checkpoint
from tests.engine.runner.conftest import greedy_request, make_engine, serve

pytestmark = pytest.mark.gpu


def test_host_store_round_trip_on_cuda():
    generator = torch.Generator(device="cuda").manual_seed(0)
    shape = (300, 16, 4, 64)
    kv = KVCache(
        k_caches=tuple(torch.randn(shape, device="cuda", generator=generator,
                                   dtype=torch.bfloat16) for _ in range(3)),
        v_caches=tuple(torch.randn(shape, device="cuda", generator=generator,
                                   dtype=torch.bfloat16) for _ in range(3)))
    original = [t.clone() for t in (*kv.k_caches, *kv.v_caches)]
    store = HostKVStore(kv, 256, staging_pages=16)
    assert store.store.is_pinned()          # registered: the copies never block the host
    rng = random.Random(1)
    gpu = rng.sample(range(300), 150)                      # more than nine staging chunks
    host = list(range(10, 60)) + rng.sample(range(60, 256), 100)   # runs and scattered ids
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        store.run(KVTransfers(offload=tuple(zip(gpu, host, strict=True))), stream)
        for cache in (*kv.k_caches, *kv.v_caches):         # the model stream reuses the pages
            cache[torch.tensor(gpu, device="cuda")] = 0
        back = rng.sample(range(300), 150)
        store.run(KVTransfers(onload=tuple(zip(host, back, strict=True))), stream)
    torch.cuda.synchronize()
    for cache, before in zip((*kv.k_caches, *kv.v_caches), original, strict=True):
        assert torch.equal(cache[torch.tensor(back, device="cuda")],
                           before[torch.tensor(gpu, device="cuda")])
    assert store.offloaded_pages == store.onloaded_pages == 150
    store.close()
    assert not store.registered and not store.store.is_pinned()
    store.close()                           # idempotent


def test_a_store_dropped_unclosed_unpins_its_memory_first():
    """An engine built and dropped (every GPU test) never closes its host tier; its memory must
    still be unregistered before it is freed, or a later CUDA call in the process crashes."""
    kv = KVCache(k_caches=(torch.zeros((8, 16, 2, 64), device="cuda"),),
                 v_caches=(torch.zeros((8, 16, 2, 64), device="cuda"),))
    store = HostKVStore(kv, 32, staging_pages=4)
    pinned = store.store
    assert store.registered and pinned.is_pinned()
    del store
    gc.collect()
    assert not pinned.is_pinned()


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB_SIZE) for _ in range(length)]


def _serve(engine, request):
    tokens, logprobs, usage = serve(engine, [request])
    rid = request.request_id
    return tokens[rid], [lp.logprob for lp in logprobs.get(rid, ())], usage[rid]


def test_graph_runner_serves_an_evicted_prompt_from_host_memory(tmp_path):
    source = open_model(build_checkpoint(SPECS["qwen3-qknorm-sharded"], tmp_path))
    # 16 KiB pages of 16 tokens: about 24 pages, one 212-token prompt (the checkpoint's
    # context is 256) with its output fits, two do not
    settings = dict(page_size=16, max_num_seqs=1, kv_cache_bytes=26 << 14, device="cuda",
                    dtype="float32", prefill_chunk_size=128, max_num_batched_tokens=160)
    engine = make_engine(source, kv_offload_gib=0.02, **settings)
    assert isinstance(engine.runner, GraphRunner) and engine.runner.host_kv is not None
    res = engine.scheduler.state.resources
    length = 3 * BLOCK_TOKENS + 20
    assert res.pages.capacity * res.page_size < 2 * length
    prompt = _prompt(length, 7)
    cold, cold_lp, _ = _serve(engine, greedy_request("cold", prompt, 8, logprobs=True))
    for i in range(2):
        _serve(engine, greedy_request(f"other{i}", _prompt(length, 100 + i), 4))
    assert res.host is not None and res.host.counters.offloaded >= length // BLOCK_TOKENS
    warm, warm_lp, usage = _serve(engine, greedy_request("warm", prompt, 8, logprobs=True))
    assert usage.cached_tokens_host >= (length // BLOCK_TOKENS - 1) * BLOCK_TOKENS
    assert warm == cold
    assert warm_lp == pytest.approx(cold_lp, abs=1e-2)
    assert engine.runner.host_kv.onloaded_pages > 0 and engine.runner.graph_steps > 0

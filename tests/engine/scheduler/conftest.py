"""Scheduler fixtures: a scheduler over small pools and the fake runner."""

from __future__ import annotations

import hashlib

from services.engine.scheduler.requests import EngineRequest, StopRules
from services.engine.scheduler.resources import KVResources
from services.engine.scheduler.scheduler import Scheduler
from services.engine.scheduler.state import SchedulerConfig
from tests.engine.fakes import FakeRunner

IDENTITY = hashlib.blake2b(b"fake model", digest_size=32).digest()
VOCAB = 1000


def make_engine(*, num_pages: int = 256, page_size: int = 4, num_snapshots: int = 32,
                eos: frozenset[int] = frozenset(), grammars=None, host_pages: int = 0,
                **config) -> tuple[Scheduler, FakeRunner]:
    defaults = dict(max_num_seqs=4, max_waiting=64, prefill_chunk_size=64,
                    max_num_batched_tokens=128, max_model_len=4096, vocab_size=VOCAB,
                    eos_token_ids=eos, capacity_hint="add pages", context_hint="longer context")
    defaults.update(config)
    resources = KVResources(num_pages=num_pages, page_size=page_size,
                            num_snapshots=num_snapshots, host_pages=host_pages)
    scheduler = Scheduler(SchedulerConfig(**defaults), resources, IDENTITY, grammars)
    runner = FakeRunner(num_pages=num_pages, page_size=page_size, num_snapshots=num_snapshots,
                        vocab=defaults["vocab_size"])
    return scheduler, runner


def request(request_id: str, prompt, max_tokens: int | None = 8, *, seed: int = 0,
            ends=(), n: int = 1, priority: int = 0, ignore_eos: bool = True,
            min_tokens: int = 0, stop_ids=()) -> EngineRequest:
    return EngineRequest(
        request_id=request_id, prompt_token_ids=tuple(prompt), sampling=None,
        stop=StopRules(max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos,
                       stop_token_ids=frozenset(stop_ids)),
        seed=seed, checkpoint_token_ends=tuple(ends), n=n, priority=priority)


def prompt_of(length: int, salt: int = 0) -> list[int]:
    return [(salt * 7919 + i * 31) % VOCAB for i in range(length)]

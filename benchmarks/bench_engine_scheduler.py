"""Scheduler overhead per engine step: plan + commit + complete with a runner that does no work.

The GPU path hides host work behind device time only if the scheduler's per-step cost stays
well below a decode step (about 4 ms for Qwen3-8B at batch 1 on an H200, PERFORMANCE.md). This
measures the pure-Python scheduler at several batch sizes and context lengths, in steady decode
(every sequence resident, one token each) and including prefill and admission.

    python benchmarks/bench_engine_scheduler.py [--batches 1,16,64,256] [--contexts 512,2048]

Prints a table last and writes benchmarks/out/engine_scheduler.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.engine.scheduler.plan import Completion, SeqResult, Step
from services.engine.scheduler.requests import EngineRequest, StopRules
from services.engine.scheduler.resources import KVResources
from services.engine.scheduler.scheduler import Scheduler
from services.engine.scheduler.state import SchedulerConfig

IDENTITY = hashlib.blake2b(b"bench", digest_size=32).digest()


class NullRunner:
    """Answers every step at once: token 7 for each sampling row."""

    def __init__(self) -> None:
        self.done: deque[Completion] = deque()

    def submit(self, step: Step) -> int:
        results = tuple(SeqResult(s.handle, s.sample_from + 1, (7,)) if s.sample else
                        SeqResult(s.handle, s.end) for s in step.seqs)
        self.done.append(Completion(step.fence, results, 0.0))
        return step.fence

    def poll(self) -> Completion | None:
        return self.done.popleft() if self.done else None


def run(batch: int, context: int, output: int, page_size: int) -> dict[str, float]:
    # long enough outputs that every sequence decodes together for `output` steps
    output += -(-batch * context // 512)
    pages = batch * (-(-(context + output) // page_size) + 2) + 64
    config = SchedulerConfig(max_num_seqs=batch, max_waiting=4 * batch, prefill_chunk_size=512,
                             max_num_batched_tokens=512 + batch, max_model_len=context + output,
                             vocab_size=1000)
    scheduler = Scheduler(config, KVResources(num_pages=pages, page_size=page_size,
                                              num_snapshots=2 * batch), IDENTITY)
    runner = NullRunner()
    admit_started = time.perf_counter()
    for i in range(batch):
        prompt = tuple((i * 7919 + j) % 1000 for j in range(context))
        scheduler.admit(EngineRequest(f"r{i}", prompt, None,
                                      StopRules(max_tokens=output, ignore_eos=True), seed=i))
    admit_s = time.perf_counter() - admit_started
    decode_times: list[float] = []
    total_started = time.perf_counter()
    steps = 0
    while scheduler.has_work:
        started = time.perf_counter()
        plan = scheduler.plan()
        if plan is None:
            break
        step = scheduler.commit(plan, scheduler.state.resources.fences.next_fence)
        runner.submit(step)
        while (completion := runner.poll()) is not None:
            scheduler.complete(completion)
        elapsed = time.perf_counter() - started
        steps += 1
        if step.kind == "decode" and len(step.seqs) == batch:
            decode_times.append(elapsed)
    total_s = time.perf_counter() - total_started
    return {
        "batch": batch, "context": context, "output": output, "steps": steps,
        "admit_us_per_request": admit_s / batch * 1e6,
        "decode_step_us_p50": statistics.median(decode_times) * 1e6,
        "decode_step_us_p99": sorted(decode_times)[int(0.99 * (len(decode_times) - 1))] * 1e6,
        "decode_us_per_seq": statistics.median(decode_times) / batch * 1e6,
        "all_steps_ms": total_s * 1e3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--contexts", default="512,2048")
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" /
                                             "engine_scheduler.json"))
    args = parser.parse_args()
    rows = [run(b, c, args.output, args.page_size)
            for c in map(int, args.contexts.split(",")) for b in map(int, args.batches.split(","))]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "python": sys.version.split()[0],
                               "page_size": args.page_size, "rows": rows}, indent=2))
    print(f"scheduler overhead per step (no device work), page size {args.page_size}")
    print("| batch | context | decode step p50 us | p99 us | us / sequence | admit us / request |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['context']} | {r['decode_step_us_p50']:.0f} | "
              f"{r['decode_step_us_p99']:.0f} | {r['decode_us_per_seq']:.1f} | "
              f"{r['admit_us_per_request']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

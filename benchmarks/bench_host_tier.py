"""Host-tier copy bandwidth on the GPU: HostKVStore's offloads and onloads against one plain
pinned-memory copy of the same bytes (the limit the PCIe link gives in this run).

    python benchmarks/bench_host_tier.py --out benchmarks/out/host_tier.json

A Qwen3-8B-shape KV cache (36 layers, 8 KV heads, head_dim 128, bf16, 16-token pages): for
each staging size and page pattern (a contiguous run of host pages, scattered host pages),
the time to copy `--pages` pages down and back, as GB/s and as a fraction of the plain
copy's GB/s in each direction. It also reports whether torch sees the registered store as
pinned (if not, every copy would block the host).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.engine.model.attention import KVCache
from services.engine.runner.host_kv import HostKVStore
from services.engine.scheduler.plan import KVTransfers


def timed(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=256)
    parser.add_argument("--device-pages", type=int, default=2048)
    parser.add_argument("--host-pages", type=int, default=4096)
    parser.add_argument("--staging", default="64,256")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    shape = (args.device_pages, 16, 8, 128)
    kv = KVCache(tuple(torch.randn(shape, device="cuda", dtype=torch.bfloat16)
                       for _ in range(36)),
                 tuple(torch.randn(shape, device="cuda", dtype=torch.bfloat16)
                       for _ in range(36)))
    page_bytes = kv.num_bytes // kv.num_pages
    moved = args.pages * page_bytes
    device_block = torch.empty(moved, dtype=torch.uint8, device="cuda")
    host_block = torch.empty(moved, dtype=torch.uint8).pin_memory()
    limit = {
        "d2h": moved / timed(lambda: host_block.copy_(device_block, non_blocking=True),
                             args.repeats) / 1e9,
        "h2d": moved / timed(lambda: device_block.copy_(host_block, non_blocking=True),
                             args.repeats) / 1e9}
    print(f"plain pinned copy of {moved / 2**20:.0f} MiB: D2H {limit['d2h']:.1f} GB/s, "
          f"H2D {limit['h2d']:.1f} GB/s", flush=True)
    rng = random.Random(0)
    gpu = rng.sample(range(args.device_pages), args.pages)
    back = rng.sample(range(args.device_pages), args.pages)
    patterns = {"contiguous": list(range(100, 100 + args.pages)),
                "scattered": rng.sample(range(args.host_pages), args.pages)}
    rows = []
    stream = torch.cuda.current_stream()
    for staging in (int(s) for s in args.staging.split(",")):
        store = HostKVStore(kv, args.host_pages, staging_pages=staging)
        pinned = store.store.is_pinned()
        for name, host in patterns.items():
            down = KVTransfers(offload=tuple(zip(gpu, host, strict=True)))
            up = KVTransfers(onload=tuple(zip(host, back, strict=True)))
            d2h = moved / timed(lambda down=down, s=store: s.run(down, stream),
                                args.repeats) / 1e9
            h2d = moved / timed(lambda up=up, s=store: s.run(up, stream), args.repeats) / 1e9
            torch.cuda.synchronize()
            start = time.perf_counter()
            store.run(up, stream)
            enqueue_ms = (time.perf_counter() - start) * 1e3
            torch.cuda.synchronize()
            rows.append({"staging": staging, "pattern": name, "pinned": pinned,
                         "offload_gb_s": d2h, "onload_gb_s": h2d,
                         "offload_fraction": d2h / limit["d2h"],
                         "onload_fraction": h2d / limit["h2d"], "enqueue_ms": enqueue_ms})
            print(f"staging {staging:>4} {name:<10} pinned={pinned} offload {d2h:6.1f} GB/s "
                  f"({d2h / limit['d2h']:.2f} of the plain copy), onload {h2d:6.1f} GB/s "
                  f"({h2d / limit['h2d']:.2f}), host enqueue {enqueue_ms:.2f} ms", flush=True)
        store.close()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"limit_gb_s": limit, "page_bytes": page_bytes,
                                        "pages": args.pages, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

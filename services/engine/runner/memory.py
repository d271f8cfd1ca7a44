"""Sizing the KV page pool and the snapshot rows from a memory budget.

The budget is an explicit byte count, or a fraction of the device memory free after the model
loaded (on the CPU: of MemAvailable, capped at `CPU_DEFAULT_CAP_BYTES` unless given in bytes).
A snapshot row costs one page of KV plus one hidden state; rows default to two per slot.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from services.common.errors import CapacityError

CPU_DEFAULT_CAP_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class KVLayout:
    num_pages: int
    page_size: int
    num_snapshots: int
    page_bytes: int
    snapshot_bytes: int
    budget_bytes: int

    @property
    def num_tokens(self) -> int:
        return self.num_pages * self.page_size


def free_device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def plan_layout(*, device: torch.device, page_bytes: int, page_size: int, hidden_bytes: int,
                budget_bytes: int, memory_fraction: float, num_snapshots: int,
                max_num_seqs: int, min_tokens: int, capacity_hint: str = "") -> KVLayout:
    """Pages and snapshot rows that fit the budget; at least `min_tokens` tokens of pages (the
    caller caps the context to what the pool holds)."""
    if budget_bytes <= 0:
        budget_bytes = int(free_device_memory(device) * memory_fraction)
        if device.type == "cpu":
            budget_bytes = min(budget_bytes, CPU_DEFAULT_CAP_BYTES)
    snapshot_bytes = page_bytes + hidden_bytes
    rows = num_snapshots if num_snapshots > 0 else 2 * max_num_seqs
    pages = (budget_bytes - rows * snapshot_bytes) // page_bytes
    needed = -(-min_tokens // page_size) + 1
    if pages < needed:
        raise CapacityError(
            f"the KV budget of {budget_bytes} bytes holds {max(pages, 0)} pages of {page_size} "
            f"tokens; at least {needed} are needed for one {min_tokens}-token sequence",
            hint=capacity_hint)
    return KVLayout(num_pages=int(pages), page_size=page_size, num_snapshots=rows,
                    page_bytes=page_bytes, snapshot_bytes=snapshot_bytes,
                    budget_bytes=budget_bytes)

"""Sizing the page pool and snapshot rows from a byte budget or a fraction of free memory."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import CapacityError
from services.engine.runner.memory import CPU_DEFAULT_CAP_BYTES, plan_layout


def layout(**overrides):
    values = dict(device=torch.device("cpu"), page_bytes=8192, page_size=16, hidden_bytes=256,
                  budget_bytes=10 * 8448 + 100 * 8192, memory_fraction=0.9, num_snapshots=10,
                  max_num_seqs=4, min_tokens=64, capacity_hint="raise the budget")
    values.update(overrides)
    return plan_layout(**values)


def test_pages_fill_the_budget_after_the_snapshot_rows():
    plan = layout()
    assert (plan.num_pages, plan.num_snapshots) == (100, 10)
    assert plan.snapshot_bytes == 8192 + 256 and plan.num_tokens == 1600


def test_snapshot_rows_default_to_two_per_slot():
    plan = layout(num_snapshots=0)
    assert plan.num_snapshots == 8 and plan.num_pages == 100 + (2 * 8448) // 8192


def test_a_fraction_of_free_memory_capped_on_the_cpu():
    plan = layout(budget_bytes=0, memory_fraction=0.5)
    assert plan.budget_bytes <= CPU_DEFAULT_CAP_BYTES and plan.num_pages > 1000


def test_a_budget_too_small_for_one_chunk_is_a_capacity_error():
    with pytest.raises(CapacityError, match="at least 5") as info:
        layout(budget_bytes=10 * 8448 + 3 * 8192)
    assert info.value.hint == "raise the budget"

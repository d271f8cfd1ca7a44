"""Checkpoint endpoint selection: prompt end, last and first boundary, extras by allowance."""

from __future__ import annotations

from services.engine.scheduler.checkpoints import select_checkpoint_ends


def test_prompt_end_then_last_then_first_boundary():
    assert select_checkpoint_ends(prompt_len=500, message_ends=[], reused=0) == [500]
    assert select_checkpoint_ends(prompt_len=500, message_ends=[100], reused=0) == [500, 100]
    assert select_checkpoint_ends(prompt_len=500, message_ends=[100, 200, 300], reused=0) == \
        [500, 300, 100]


def test_only_endpoints_beyond_the_reused_prefix():
    assert select_checkpoint_ends(prompt_len=500, message_ends=[100, 200, 300], reused=250) \
        == [500, 300]
    assert select_checkpoint_ends(prompt_len=500, message_ends=[100], reused=500) == []


def test_earlier_boundaries_compete_for_the_extra_work_allowance():
    ends = list(range(1000, 20000, 1000))          # 19 boundaries in a 20k-token prompt
    chosen = select_checkpoint_ends(prompt_len=20000, message_ends=ends, reused=0)
    # 5% of 20k uncached tokens at 64 tokens per capture: 15 extras beyond the three
    assert chosen[:3] == [20000, 19000, 1000] and len(chosen) == 3 + 15
    assert chosen[3:] == ends[1:16]
    none = select_checkpoint_ends(prompt_len=20000, message_ends=ends, reused=0,
                                  extra_fraction=0.0)
    assert none == [20000, 19000, 1000]

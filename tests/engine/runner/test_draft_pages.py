"""runner/draft_pages.round_inputs: a drafting round's forward inputs, uploaded at once, are
the metadata `build_metadata` gives for the same rows (catch-up chunks, then one-row chained
forwards at the following positions), with the fed ids and extra values, and every field
starts on a 16-byte boundary."""

from __future__ import annotations

import torch

from services.engine.model import build_metadata
from services.engine.runner.draft_pages import round_inputs


def _same(a, b) -> None:
    for name in ("query_start_loc", "seq_lens", "page_table", "slot_mapping"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert (a.max_query_len, a.max_seq_len) == (b.max_query_len, b.max_seq_len)


def test_round_inputs_are_build_metadata_for_each_forward():
    pages, page_size = [7, 2, 9, 4], 4
    feeds = [(3, [11, 12, 13, 14, 15], [50, 51, 52, 53, 54]), (8, [16, 17], [55, 56])]
    steps = round_inputs(pages, page_size, torch.device("cpu"), feeds, chained=3)
    assert len(steps) == 5
    rows = [(3, 5), (8, 2), (10, 1), (11, 1), (12, 1)]          # (start, rows) per forward
    for step, (start, n) in zip(steps, rows, strict=True):
        _same(step.meta, build_metadata([n], [start + n], [pages], page_size))
        assert step.positions.tolist() == list(range(start, start + n))
    assert [s.ids.tolist() for s in steps[:2]] == [[11, 12, 13, 14, 15], [16, 17]]
    assert [s.extra.tolist() for s in steps[:2]] == [[50, 51, 52, 53, 54], [55, 56]]
    assert all(s.ids is None and s.extra is None for s in steps[2:])
    fields = [t for s in steps for t in (s.meta.query_start_loc, s.meta.seq_lens,
                                         s.meta.page_table, s.meta.slot_mapping, s.positions,
                                         s.ids, s.extra) if t is not None]
    assert all(t.data_ptr() % 16 == 0 for t in fields)
    assert len({t.untyped_storage().data_ptr() for t in fields}) == 2   # two uploads


def test_a_round_without_chained_rows_and_without_extras():
    steps = round_inputs([0], 8, torch.device("cpu"), [(0, [5, 6, 7], None)], chained=0)
    assert len(steps) == 1 and steps[0].extra is None
    _same(steps[0].meta, build_metadata([3], [3], [[0]], 8))

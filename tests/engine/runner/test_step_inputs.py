"""Typed step inputs: buffers sized from the limits, decode-graph offsets fixed per capacity,
padding values, eager fields as long as their values, overflow named."""

from __future__ import annotations

import pytest
import torch

from services.engine.runner.frames import GraphPacking, InputFrames
from services.engine.runner.step_inputs import (
    ALIGN_VALUES,
    FIELDS,
    GraphPads,
    StepInputs,
    StepLimits,
    buffer_sizes,
)

LIMITS = StepLimits.for_runner(num_slots=4, max_num_batched_tokens=64, max_graph_batch=4,
                               table_width=9, vocab_size=100, init_ints=6, init_floats=6)
PADS = GraphPads(padding_row=4, trash_cell=44)


def _decode(n: int) -> StepInputs:
    values = StepInputs.empty()
    values.input_ids = list(range(10, 10 + n))
    values.positions = list(range(n))
    values.slot_mapping = list(range(100, 100 + n))
    values.pending_slot = [-1] * n
    values.seq_slots = list(range(n))
    values.query_start_loc = list(range(n + 1))
    values.seq_lens = [p + 1 for p in range(n)]
    values.init_slots = [0]
    values.init_ints = list(range(6))
    values.init_floats = [0.5] * 6
    return values


def test_buffers_hold_every_field_at_its_bound():
    frames = InputFrames(LIMITS, torch.device("cpu"))
    sizes = buffer_sizes(LIMITS)
    for kind, size in sizes.items():
        assert frames.buffers[kind].numel() == size
        bounds = [spec.bound(LIMITS) for _, spec in FIELDS if spec.kind == kind]
        # each field starts on a 16-byte boundary: at most (16 bytes - 1 value) of padding
        assert sum(bounds) <= size <= sum(bounds) + len(bounds) * (ALIGN_VALUES[kind] - 1)
    assert LIMITS.tokens == 64 + 64 and LIMITS.table_cells == 5 * 9
    assert LIMITS.bitmask_words == 4 * 4


def test_graph_packing_lands_at_the_capture_offsets():
    frames = InputFrames(LIMITS, torch.device("cpu"))
    first = frames.upload(_decode(1), GraphPacking(4, PADS)).views
    second = frames.upload(_decode(3), GraphPacking(4, PADS)).views
    for name, spec in FIELDS:
        a, b = getattr(first, name), getattr(second, name)
        if spec.graph is not None:                     # the graph's fields: same place
            assert a.data_ptr() == b.data_ptr() and a.numel() == b.numel() == spec.graph(GraphPacking(4, PADS))
    assert second.slot_mapping.tolist() == [100, 101, 102, -1]
    assert second.seq_slots.tolist() == [0, 1, 2, PADS.padding_row]
    assert second.query_start_loc.tolist() == [0, 1, 2, 3, 3]
    assert second.update_index.tolist() == [PADS.trash_cell] * 4
    assert second.init_ints.tolist() == list(range(6))           # after the graph's fields


def test_every_field_starts_on_a_16_byte_boundary():
    """Whatever the lengths before it (Triton specialises kernels on 16-byte pointer
    alignment: an unaligned field would compile new variants while serving)."""
    frames = InputFrames(LIMITS, torch.device("cpu"))
    for n in (1, 2, 3, 4):
        values = _decode(n)
        values.sample_rows = list(range(n))
        views = frames.upload(values).views
        for name, _ in FIELDS:
            view = getattr(views, name)
            assert (view.data_ptr() - frames.buffers[str(view.dtype).removeprefix(
                "torch.")].data_ptr()) % 16 == 0, (n, name)


def test_eager_fields_are_as_long_as_their_values():
    frames = InputFrames(LIMITS, torch.device("cpu"))
    values = _decode(3)
    values.sample_rows = [2]
    values.sample_slots = [1]
    views = frames.upload(values).views
    assert views.input_ids.tolist() == [10, 11, 12] and views.sample_rows.tolist() == [2]
    assert views.hidden_rows.numel() == 0 and views.init_floats.dtype == torch.float32
    assert views.query_start_loc.dtype == torch.int32


def test_a_field_past_its_bound_is_named():
    frames = InputFrames(LIMITS, torch.device("cpu"))
    values = StepInputs.empty()
    values.resume_ids = list(range(LIMITS.resumes + 1))
    with pytest.raises(OverflowError, match="resume_ids"):
        frames.upload(values)


def _check_values_then_pads(views: StepInputs, values: StepInputs, graph: GraphPacking,
                            rows: int) -> None:
    """Each graph field reads back as its values then its padding up to the graph's
    capacity; each eager-only field as its values."""
    for name, spec in FIELDS:
        got = getattr(views, name).tolist()
        given = list(getattr(values, name))
        if spec.graph is None:
            assert got == given, name
            continue
        pad = spec.pad(PADS, rows)
        assert got == given + [pad] * (spec.graph(graph) - len(given)), (rows, name)


@pytest.mark.parametrize("eager_values", [False, True])
@pytest.mark.parametrize("width", [1, 3])
def test_a_graph_step_reads_its_values_then_the_pads(width: int, eager_values: bool):
    """Every field of a graph step, read back through its device view: the values packed,
    then its padding up to the graph's capacity; eager-only fields as long as their values
    (none, the usual graph step, or a slot's init beside it). Two frames alternate, so each
    step is packed into the frame the one before last used."""
    limits = StepLimits.for_runner(num_slots=4, max_num_batched_tokens=64, max_graph_batch=4,
                                   table_width=9, vocab_size=100, init_ints=6, init_floats=6,
                                   width=3)
    frames = InputFrames(limits, torch.device("cpu"))
    graph = GraphPacking(4, PADS, width, 8 if width > 1 else 0)
    for n in (3, 1, 2):
        values = StepInputs.empty()
        rows = n * width
        values.input_ids = list(range(10, 10 + rows))
        values.positions = list(range(rows))
        values.slot_mapping = list(range(100, 100 + rows))
        values.pending_slot = [7] * rows
        values.seq_slots = list(range(n))
        values.update_index = [5, 6][:n]
        values.update_value = [50, 60][:n]
        values.query_start_loc = [width * i for i in range(n + 1)]
        values.seq_lens = [20 + i for i in range(n)]
        if width > 1:
            values.sample_slots = [i // width for i in range(rows)]
            values.sample_drafts = list(range(200, 200 + rows))
        if eager_values:
            values.init_slots = [1]
            values.init_floats = [0.25] * 6
        _check_values_then_pads(frames.upload(values, graph).views, values, graph, rows)
    values.input_ids = list(range(graph.tokens + 1))
    with pytest.raises(OverflowError, match="input_ids"):
        frames.upload(values, graph)


@pytest.mark.parametrize("eager_values", [False, True])
def test_a_prefill_graph_step_reads_its_values_then_the_pads(eager_values: bool):
    """A prefill graph's packing (ragged sequences in `rows` token rows): the fed rows, the
    sequences' fields, the sampled rows' slots and rows and the last-row cells each read back
    as packed, then padded to the graph's capacities (rows, sequences, update cells); the
    verification-only fields are absent. Steps of several mixes land at the same offsets."""
    limits = StepLimits.for_runner(num_slots=4, max_num_batched_tokens=64, max_graph_batch=4,
                                   table_width=9, vocab_size=100, init_ints=6, init_floats=6)
    frames = InputFrames(limits, torch.device("cpu"))
    graph = GraphPacking(4, PADS, cells=16 + 9, rows=16)
    assert graph.is_prefill and graph.tokens == 16 and graph.sampled_rows == 4
    offsets = None
    for lengths in ((5, 1, 1), (11,), (2, 3, 4, 1), (16,)):
        values = StepInputs.empty()
        rows = sum(lengths)
        values.input_ids = list(range(10, 10 + rows))
        values.positions = list(range(rows))
        values.slot_mapping = list(range(100, 100 + rows))
        values.pending_slot = [-1] * rows
        values.seq_slots = list(range(len(lengths)))
        values.update_index = list(range(rows // 2))
        values.update_value = list(range(50, 50 + rows // 2))
        starts = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
        values.query_start_loc = starts
        values.seq_lens = [30 + n for n in lengths]
        values.hidden_rows = [s - 1 for s in starts[1:]]
        values.hidden_cells = [2 * i + 1 for i in range(len(lengths))]
        values.sample_rows = values.hidden_rows[1:]          # the first is a middle chunk
        values.sample_slots = values.seq_slots[1:]
        if eager_values:
            values.init_slots = [1]
            values.init_floats = [0.25] * 6
        views = frames.upload(values, graph).views
        here = {name: getattr(views, name).data_ptr() for name, _ in FIELDS
                if getattr(views, name).numel()}
        assert offsets is None or {k: v for k, v in here.items() if k in offsets} == \
            {k: v for k, v in offsets.items() if k in here}
        offsets = offsets or here
        _check_values_then_pads(views, values, graph, rows)
        assert len(views.input_ids) == 16 and len(views.seq_slots) == 4
        assert len(views.sample_slots) == len(views.sample_rows) == 4
        assert len(views.hidden_cells) == 4 and len(views.update_index) == 25
        assert len(views.sample_drafts) == 0 and len(views.sample_offsets) == 0
        assert views.hidden_cells.tolist()[len(lengths):] == [PADS.padding_row * 2] * \
            (4 - len(lengths))

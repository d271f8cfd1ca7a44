"""Input frames: one step's typed inputs (step_inputs.StepInputs) packed into pinned host
buffers, uploaded in one copy per dtype into persistent device buffers that the step's
kernels (and CUDA graphs) read.

    frames = InputFrames(limits, device)        # buffers sized from StepLimits
    packed = frames.upload(values)              # eager: each field as long as its values,
                                                # from a 16-byte boundary
    packed = frames.upload(values, GraphPacking(capacity, pads))   # a decode graph's offsets
    packed.views.input_ids                      # device views at the packed offsets
    frames.copy(packed)                         # the same host bytes uploaded again

Two host frames alternate (two-frame execution): the host packs step N+1 into one while the
copy of step N from the other may still be queued on the model stream. A frame is packed again
only after the completion of the step that used it was consumed, which implies its upload ran.
The device buffers are never reallocated (captured graphs hold their addresses); data that
does not fit a bound (large sampling inits) goes through `BulkStaging` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from services.engine.runner.step_inputs import (
    F32,
    FIELDS,
    I32,
    I64,
    KINDS,
    GraphPacking,
    GraphPads,
    StepInputs,
    StepLimits,
    aligned,
    buffer_sizes,
)

VIEW_CACHE_SIZE = 4096     # distinct step shapes whose device views are kept
_DTYPES = {I64: (np.int64, torch.int64), I32: (np.int32, torch.int32),
           F32: (np.float32, torch.float32)}


@dataclass(slots=True)
class HostFrame:
    """Pinned host buffers (on the CPU: ordinary ones) for one step's inputs."""

    index: int
    tensors: dict[str, torch.Tensor]        # dtype -> 1-D host tensor
    arrays: dict[str, np.ndarray]           # numpy views of the same memory


def _host_frame(index: int, sizes: dict[str, int], pin: bool) -> HostFrame:
    tensors = {kind: torch.empty(max(1, size), dtype=_DTYPES[kind][1], pin_memory=pin)
               for kind, size in sizes.items()}
    return HostFrame(index, tensors, {kind: t.numpy() for kind, t in tensors.items()})


@dataclass(frozen=True, slots=True)
class _GraphLayout:
    """A graph's packing of the fields it reads: per dtype, (name, start, capacity, pad) of
    each field with a capacity; every field's capacity in order; the values used per dtype
    and the device views of a step that has no eager-only values (the usual graph step)."""

    regions: tuple[tuple[str, tuple[tuple[str, int, int, Callable[[GraphPads, int], float]],
                                    ...]], ...]
    capacities: tuple[int, ...]
    used: dict[str, int]
    views: StepInputs[torch.Tensor]


@dataclass(frozen=True, slots=True)
class PackedStep:
    frame: HostFrame
    used: dict[str, int]                    # dtype -> values packed
    views: StepInputs[torch.Tensor]         # device views of every field


class InputFrames:
    """Two host frames and the persistent device buffers they upload into."""

    def __init__(self, limits: StepLimits, device: torch.device) -> None:
        pin = device.type == "cuda"
        self.limits = limits
        self.device = device
        self.sizes = buffer_sizes(limits)
        self.bounds = tuple(spec.bound(limits) for _, spec in FIELDS)
        self.frames = (_host_frame(0, self.sizes, pin), _host_frame(1, self.sizes, pin))
        self.scratch = _host_frame(2, self.sizes, pin)     # graph capture inputs (synchronised)
        self.buffers = {kind: torch.zeros(max(1, size), dtype=_DTYPES[kind][1], device=device)
                        for kind, size in self.sizes.items()}
        self._next = 0
        self._view_cache: dict[tuple[int, ...], StepInputs[torch.Tensor]] = {}
        self._copy_pairs: dict[tuple[int, str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        # fields a graph reads come first (step_inputs.py); a graph step packs them at its
        # capacities' fixed offsets, computed once per graph
        self._graph_fields = sum(spec.graph is not None for _, spec in FIELDS)
        assert all(spec.graph is not None for _, spec in FIELDS[:self._graph_fields])
        self._graph_layouts: dict[GraphPacking, _GraphLayout] = {}
        self._all = [(name, spec.kind, bound)
                     for (name, spec), bound in zip(FIELDS, self.bounds, strict=True)]
        self._eager_only = self._all[self._graph_fields:]

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers.values())

    def upload(self, values: StepInputs[Sequence[int] | Sequence[float] | np.ndarray],
               graph: GraphPacking | None = None, *, scratch: bool = False) -> PackedStep:
        """Pack `values` into the next host frame (or the capture scratch frame) and copy
        the packed prefix of each dtype (non-blocking, current stream)."""
        if scratch:
            frame = self.scratch
        else:
            frame = self.frames[self._next]
            self._next ^= 1
        arrays = frame.arrays
        if graph is None:
            used = dict.fromkeys(KINDS, 0)
            capacities: list[int] = []
            rest = self._all
        else:
            layout = self._graph_layouts.get(graph)
            if layout is None:
                layout = self._graph_layouts[graph] = self._graph_layout(graph)
            count = len(values.input_ids)        # real rows (padding sequences start there)
            # one list per dtype, padded and aligned as the graph reads it, converted by one
            # numpy assignment (per-field assignments cost about 3 us each mid-serving)
            for kind, fields in layout.regions:
                flat: list[int | float] = []
                for name, start, capacity, pad in fields:
                    data = getattr(values, name)
                    length = len(data)
                    if length > capacity:
                        raise OverflowError(f"step input {name}: {length} values exceed its "
                                            f"graph capacity of {capacity}")
                    if len(flat) < start:            # the alignment gap before the field
                        flat.extend([0] * (start - len(flat)))
                    flat.extend(data)
                    if capacity > length:
                        flat.extend([pad(graph.pads, count)] * (capacity - length))
                arrays[kind][:len(flat)] = flat
            if not self._any_values(values, self._eager_only):
                packed = PackedStep(frame, layout.used, layout.views)
                self.copy(packed)
                return packed
            used = dict(layout.used)
            capacities = list(layout.capacities)
            rest = self._eager_only
        # fields no graph reads: each as long as its values, from a 16-byte boundary
        for name, kind, bound in rest:
            data = getattr(values, name)
            length = len(data)
            start = aligned(used[kind], kind)
            if length:
                if length > bound:
                    raise OverflowError(f"step input {name}: {length} values exceed its bound "
                                        f"of {bound}")
                arrays[kind][start:start + length] = data
            capacities.append(length)
            used[kind] = start + length
        packed = PackedStep(frame, used, self._views(tuple(capacities)))
        self.copy(packed)
        return packed

    @staticmethod
    def _any_values(values: StepInputs, fields: list[tuple[str, str, int]]) -> bool:
        return any(len(getattr(values, name)) for name, _, _ in fields)

    def _graph_layout(self, graph: GraphPacking) -> _GraphLayout:
        """Where a graph step's graph-read fields sit (fixed by the graph's capacities)."""
        used = dict.fromkeys(KINDS, 0)
        regions: dict[str, list[tuple[str, int, int, Callable[[GraphPads, int], float]]]] = {}
        capacities: list[int] = []
        for (name, spec), bound in zip(FIELDS[:self._graph_fields], self.bounds,
                                       strict=False):
            assert spec.graph is not None
            capacity = spec.graph(graph)
            if capacity > bound:
                raise OverflowError(f"step input {name}: a graph capacity of {capacity} "
                                    f"exceeds its bound of {bound}")
            start = aligned(used[spec.kind], spec.kind)
            if capacity:
                regions.setdefault(spec.kind, []).append((name, start, capacity, spec.pad))
            capacities.append(capacity)
            used[spec.kind] = start + capacity
        views = self._views(tuple(capacities) + (0,) * len(self._eager_only))
        return _GraphLayout(tuple((kind, tuple(fields)) for kind, fields in regions.items()),
                            tuple(capacities), used, views)

    def _views(self, capacities: tuple[int, ...]) -> StepInputs[torch.Tensor]:
        """Device views for fields of these capacities, in order (cached: steps of one shape
        repeat, and slicing tensors costs more than packing them)."""
        views = self._view_cache.get(capacities)
        if views is None:
            if len(self._view_cache) >= VIEW_CACHE_SIZE:
                self._view_cache.clear()
            offsets = dict.fromkeys(KINDS, 0)
            fields: dict[str, torch.Tensor] = {}
            for (name, spec), capacity in zip(FIELDS, capacities, strict=True):
                start = aligned(offsets[spec.kind], spec.kind)
                fields[name] = self.buffers[spec.kind][start:start + capacity]
                offsets[spec.kind] = start + capacity
            views = self._view_cache[capacities] = StepInputs(**fields)
        return views

    def copy(self, packed: PackedStep) -> None:
        """Upload a packed frame's bytes (again, e.g. after a graph capture used the buffers)."""
        index = packed.frame.index
        for kind, used in packed.used.items():
            if used:
                pair = self._copy_pairs.get((index, kind, used))
                if pair is None:     # slicing costs about as much as the copy's launch
                    if len(self._copy_pairs) >= VIEW_CACHE_SIZE:
                        self._copy_pairs.clear()
                    pair = self._copy_pairs[(index, kind, used)] = (
                        self.buffers[kind][:used], packed.frame.tensors[kind][:used])
                pair[0].copy_(pair[1], non_blocking=True)


class BulkStaging:
    """Rare, variable-size uploads (a new request's prompt ids for its repetition penalty, its
    logit bias, its output so far): one host frame per dtype per step, copied into freshly
    allocated device memory (never read by a captured graph). Like the input frames, a host
    frame is packed again only after the step that used it completed."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pin = device.type == "cuda"
        self.frames = [_host_frame(i, {I64: 1024, F32: 1024}, self.pin) for i in range(2)]
        self._next = 0

    def upload(self, i64: Sequence[Sequence[int]], f32: Sequence[Sequence[float]]
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Device copies of each int64 and float32 list, in order (one copy per dtype)."""
        index = self._next
        self._next ^= 1
        need = {I64: sum(len(v) for v in i64), F32: sum(len(v) for v in f32)}
        frame = self.frames[index]
        if any(frame.arrays[k].shape[0] < n for k, n in need.items()):
            sizes = {k: max(2 * need[k], frame.arrays[k].shape[0]) for k in frame.arrays}
            frame = self.frames[index] = _host_frame(index, sizes, self.pin)
        out: dict[str, list[torch.Tensor]] = {}
        for kind, lists in ((I64, i64), (F32, f32)):
            buffer = torch.empty(max(1, need[kind]), dtype=_DTYPES[kind][1], device=self.device)
            start = 0
            views = []
            for values in lists:
                frame.arrays[kind][start:start + len(values)] = values
                views.append(buffer[start:start + len(values)])
                start += len(values)
            if start:
                buffer[:start].copy_(frame.tensors[kind][:start], non_blocking=True)
            out[kind] = views
        return out[I64], out[F32]

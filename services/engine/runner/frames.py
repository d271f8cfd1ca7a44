"""Input frames: one step's host-side inputs packed into pinned buffers, uploaded in one copy
per dtype into persistent device buffers that the step's kernels (and CUDA graphs) read.

    frame = frames.next_frame()                 # the pinned frame not used by the last step
    packer = FramePacker(frame)
    ids = packer.i64("input_ids", tokens, capacity=8, pad=0)   # -> field offsets
    ...
    views = frames.upload(packer)               # non-blocking H2D on the current stream
    views.i64("input_ids")                      # a device view: the same offsets

Two host frames alternate (two-frame execution): the host packs step N+1 into one while the
copy of step N from the other may still be queued on the model stream. A frame is packed again
only after the completion of the step that used it was consumed, which implies its upload ran.
A step's fields are laid out in the order they are packed, each padded to its capacity, so a
decode step of graph capacity c always lands at the offsets the graph was captured with.
The device buffers are never reallocated (captured graphs hold their addresses); data that
does not fit (large sampling inits) goes through `BulkStaging` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

_DTYPES = {"i64": (np.int64, torch.int64), "i32": (np.int32, torch.int32),
           "f32": (np.float32, torch.float32)}


@dataclass(slots=True)
class HostFrame:
    """Pinned host buffers (on the CPU: ordinary ones) for one step's inputs."""

    index: int
    tensors: dict[str, torch.Tensor]        # kind -> 1-D host tensor
    arrays: dict[str, np.ndarray]           # numpy views of the same memory


def _host_frame(index: int, sizes: dict[str, int], pin: bool) -> HostFrame:
    tensors = {kind: torch.empty(size, dtype=_DTYPES[kind][1], pin_memory=pin)
               for kind, size in sizes.items()}
    return HostFrame(index, tensors, {kind: t.numpy() for kind, t in tensors.items()})


@dataclass(slots=True)
class FramePacker:
    """Writes named fields one after another into a host frame; remembers their offsets."""

    frame: HostFrame
    used: dict[str, int] = field(default_factory=lambda: {"i64": 0, "i32": 0, "f32": 0})
    offsets: dict[str, tuple[str, int, int]] = field(default_factory=dict)

    def put(self, kind: str, name: str, values: Sequence[int] | Sequence[float] | np.ndarray,
            capacity: int | None = None, pad: float = 0) -> None:
        length = len(values)
        capacity = length if capacity is None else capacity
        if length > capacity:
            raise ValueError(f"field {name}: {length} values exceed its capacity {capacity}")
        array = self.frame.arrays[kind]
        start = self.used[kind]
        if start + capacity > array.shape[0]:
            raise OverflowError(f"input frame ({kind}) holds {array.shape[0]} values; the step "
                                f"needs more than {start + capacity}")
        if length:
            array[start:start + length] = values
        if capacity > length:
            array[start + length:start + capacity] = pad
        self.offsets[name] = (kind, start, capacity)
        self.used[kind] = start + capacity

    def i64(self, name: str, values, capacity: int | None = None, pad: int = 0) -> None:
        self.put("i64", name, values, capacity, pad)

    def i32(self, name: str, values, capacity: int | None = None, pad: int = 0) -> None:
        self.put("i32", name, values, capacity, pad)

    def f32(self, name: str, values, capacity: int | None = None, pad: float = 0.0) -> None:
        self.put("f32", name, values, capacity, pad)


@dataclass(frozen=True, slots=True)
class DeviceViews:
    """Device views of one uploaded step's fields (the same offsets as in its host frame)."""

    buffers: dict[str, torch.Tensor]
    offsets: dict[str, tuple[str, int, int]]

    def get(self, name: str) -> torch.Tensor:
        kind, start, length = self.offsets[name]
        return self.buffers[kind][start:start + length]

    def has(self, name: str) -> bool:
        return name in self.offsets


class InputFrames:
    """Two host frames and the persistent device buffers they upload into."""

    def __init__(self, sizes: dict[str, int], device: torch.device) -> None:
        pin = device.type == "cuda"
        self.device = device
        self.sizes = dict(sizes)
        self.frames = (_host_frame(0, sizes, pin), _host_frame(1, sizes, pin))
        self.scratch = _host_frame(2, sizes, pin)     # graph capture inputs (synchronised)
        self.buffers = {kind: torch.zeros(size, dtype=_DTYPES[kind][1], device=device)
                        for kind, size in sizes.items()}
        self._next = 0

    def next_frame(self) -> HostFrame:
        frame = self.frames[self._next]
        self._next ^= 1
        return frame

    def views(self, offsets: dict[str, tuple[str, int, int]]) -> DeviceViews:
        return DeviceViews(self.buffers, dict(offsets))

    def upload(self, packer: FramePacker) -> DeviceViews:
        """Copy the packed prefix of each dtype (non-blocking, current stream)."""
        for kind, used in packer.used.items():
            if used:
                self.buffers[kind][:used].copy_(packer.frame.tensors[kind][:used],
                                                non_blocking=True)
        return self.views(packer.offsets)


class BulkStaging:
    """Rare, variable-size uploads (a new request's prompt ids for its repetition penalty, its
    logit bias, its output so far): packed per step into one of two growable host frames and
    copied into freshly allocated device memory (never read by a captured graph). Like the
    input frames, a host frame is packed again only after the step that used it completed."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pin = device.type == "cuda"
        self.frames = [_host_frame(i, {"i64": 1024, "f32": 1024}, self.pin) for i in range(2)]
        self._next = 0

    def packer(self, need: dict[str, int]) -> FramePacker:
        """A packer over the next host frame, grown to hold `need` values per dtype."""
        index = self._next
        self._next ^= 1
        frame = self.frames[index]
        if any(frame.arrays[k].shape[0] < n for k, n in need.items()):
            sizes = {k: max(2 * need.get(k, 0), frame.arrays[k].shape[0]) for k in frame.arrays}
            frame = self.frames[index] = _host_frame(index, sizes, self.pin)
        return FramePacker(frame)

    def upload(self, packer: FramePacker) -> DeviceViews:
        buffers = {}
        for kind, used in packer.used.items():
            if used:
                buffers[kind] = torch.empty(used, dtype=_DTYPES[kind][1], device=self.device)
                buffers[kind].copy_(packer.frame.tensors[kind][:used], non_blocking=True)
        return DeviceViews(buffers, dict(packer.offsets))

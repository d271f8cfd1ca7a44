"""EncoderGraphs: a vision tower's packed passes replayed from CUDA graphs, one per layout.

    encoder = EncoderGraphs(model.visual, max_layouts=4)   # engine setting vision_graphs
    features = encoder(images)      # list[ImageFeatures], what model.visual(images) gives

A pass is the tower's `plan(images)` (the layout: host work and small copies) and then its
`run(inputs, plan)` (device work only; model/vision/towers.py). Eagerly the Qwen2.5-VL-7B
shape's pass over one 1024x768 image took 33.2 ms on an H200, 27.7 of them the blocks' ~900
kernel launches, which run in 23.3 ms as one graph (RESULTS.md 2026-12-06, eighth session);
on a slower host the eager pass is host-bound for longer. A graph replays the whole run, and
its layout is built once.

A layout (the images' grids, the input dtypes and the attention backend) is captured the
second time a pass meets it: the first pass runs eagerly, which also settles the libraries'
per-shape choices before the capture, and an image size seen once costs no capture (the
capture adds about one eager pass of host time to the pass that makes it). Up to
`max_layouts` graphs are kept, the least recently used dropped first; each holds the memory
one eager pass of its layout peaks at (its private pool) and its static inputs. 0 (or a
device other than CUDA) runs every pass eagerly.

Replay: the pass's tensors are copied into the graph's static inputs on the current stream
(the runner's model stream), the graph replays there, and its outputs are cloned, since the
next replay overwrites them; the features then live in the feature cache like an eager
pass's.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from services.engine.model.vision.inputs import ImageFeatures, VisionInput
from services.engine.model.vision.towers import VisionTower

log = logging.getLogger(__name__)

SEEN_LAYOUTS = 64           # layouts met once, remembered so that a second meeting captures


@dataclass(slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]      # static: each pass's tensors are copied in
    outputs: list[torch.Tensor]     # static: overwritten by every replay
    plan: Any                       # the layout's tensors the graph reads


class EncoderGraphs:
    def __init__(self, tower: VisionTower, max_layouts: int) -> None:
        self.tower = tower
        self.max_layouts = max_layouts
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self._seen: OrderedDict[tuple, None] = OrderedDict()
        self._refused: set[tuple] = set()        # layouts whose capture failed: eager
        self._stream: torch.cuda.Stream | None = None       # the capture stream
        self.eager_passes = 0
        self.captures = 0
        self.replays = 0

    @property
    def enabled(self) -> bool:
        return self.max_layouts > 0 and self.tower.device.type == "cuda"

    @property
    def layouts(self) -> int:
        """Graphs kept now."""
        return len(self._graphs)

    @torch.inference_mode()
    def __call__(self, images: Sequence[VisionInput]) -> list[ImageFeatures]:
        if not images:
            return []
        tower = self.tower
        tower.check(images)
        inputs = tower.pass_inputs(images)
        if not self.enabled:
            return self._eager(inputs, images)
        key = (tower.attention_backend, tower.layout_key(images),
               tuple(t.dtype for t in inputs))
        entry = self._graphs.get(key)
        if entry is not None:
            self._graphs.move_to_end(key)
        elif key in self._seen:
            entry = self._capture(key, inputs, tower.plan(images))
            if entry is None:                  # not capturable: this layout stays eager
                return self._eager(inputs, images)
        else:
            if key not in self._refused:
                self._seen[key] = None
                while len(self._seen) > SEEN_LAYOUTS:
                    self._seen.popitem(last=False)
            return self._eager(inputs, images)
        for static, tensor in zip(entry.inputs, inputs, strict=True):
            static.copy_(tensor)
        entry.graph.replay()
        self.replays += 1
        return tower.features([output.clone() for output in entry.outputs], images)

    def _eager(self, inputs: list[torch.Tensor], images: Sequence[VisionInput]
               ) -> list[ImageFeatures]:
        self.eager_passes += 1
        return self.tower.features(self.tower.run(inputs, self.tower.plan(images)), images)

    def _capture(self, key: tuple, inputs: list[torch.Tensor], plan: Any) -> _Graph | None:
        """Capture the layout's run on a side stream (the current stream's work before it
        ordered first), keeping at most `max_layouts` graphs. A capture that fails (an op
        the stream capture refuses, memory) is logged once for the layout, which then runs
        eagerly from here on: the request does not fail for it."""
        del self._seen[key]
        while len(self._graphs) >= self.max_layouts:
            self._graphs.popitem(last=False)
        statics = [tensor.clone() for tensor in inputs]
        try:
            graph, outputs = self._record(statics, plan)
        except Exception as exc:
            self._refused.add(key)
            log.warning("vision encoder graph for the image layout %s failed to capture "
                        "(%s: %s); its passes run eagerly", key[1], type(exc).__name__, exc)
            return None
        entry = _Graph(graph, statics, outputs, plan)
        self._graphs[key] = entry
        self.captures += 1
        return entry

    def _record(self, statics: list[torch.Tensor], plan: Any
                ) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor]]:
        device = self.tower.device
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        current = torch.cuda.current_stream(device)
        self._stream.wait_stream(current)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the pixel prefetcher's thread may pin host memory meanwhile
        with torch.cuda.stream(self._stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                outputs = self.tower.run(statics, plan)
            finally:
                graph.capture_end()
        current.wait_stream(self._stream)
        return graph, outputs

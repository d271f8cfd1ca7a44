"""VisionStage: the image features a step's fed rows need, encoded only when not cached.

    stage = VisionStage(model, FeatureCache(budget), ImagePrepPixels(address), graphs=4)
    embeds = stage.embeds([(first_row, prompt, start, end), ...], fence)   # ImageEmbeds | None
    stage.complete(fence)

For each sequence the step feeds (its rows [first_row, first_row + end - start) hold
positions [start, end) of its prompt), the image spans among those positions need their
features. Rows of a cached prefix are never fed, so an image entirely inside a request's
cached prefix is never fetched nor encoded. Features come from the cache by identity; the
missing images of the whole step are fetched from imageprep in one call and encoded in one
packed tower pass, then retained for later requests. The scheduler never cuts an image span
between two prefill chunks, so an image is normally encoded in the step that consumes it;
a prefix hit that ends inside a span (64-token block reuse) consumes the rest of it, and the
features are sliced from the image's first feature row.

At admission `prefetch(prompt, cached)` starts fetching the pixels of the images past the
cached prefix that the cache lacks (vision/pixels.py PixelPrefetcher), so a step's encode
rarely waits on imageprep. On CUDA the encode runs on the runner's model stream (`stream`),
ordered before the step that reads its features, without a host synchronisation; its device
time is read from CUDA events once they complete (`take_step_work`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from services.engine.model.qwen_vl import QwenVLForConditionalGeneration
from services.engine.model.vision.inputs import ImageEmbeds, ImageFeatures, VisionInput
from services.engine.vision.encoder_graphs import EncoderGraphs
from services.engine.vision.features import FeatureCache
from services.engine.vision.pixels import ImageUnavailable, PixelPrefetcher, PixelSource
from services.engine.vision.prompt import MultimodalPrompt

log = logging.getLogger(__name__)


@dataclass(slots=True)
class VisionCounters:
    encoder_calls: int = 0       # packed tower passes
    images_encoded: int = 0
    patches_encoded: int = 0
    encoder_s: float = 0.0       # the passes' time: device time on CUDA (events), else host
    fetch_s: float = 0.0         # host time an encode waited for pixels (fetch or prefetch)
    graph_passes: int = 0        # passes replayed from an encoder graph (encoder_graphs.py)


class VisionStage:
    def __init__(self, model: QwenVLForConditionalGeneration, cache: FeatureCache,
                 pixels: PixelSource | None, graphs: int = 0) -> None:
        self.model = model
        # the tower's passes, from CUDA graphs per image layout (at most `graphs` of them)
        self.encoder = EncoderGraphs(model.visual, graphs)
        self.cache = cache
        self.pixels = pixels
        assert model.vl_config.vision is not None
        self.merge = model.vl_config.vision.spatial_merge_size
        self.counters = VisionCounters()
        self.stream: torch.cuda.Stream | None = None    # the runner's model stream (CUDA)
        self.ahead = PixelPrefetcher(lambda: self.pixels)
        self._timings: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] = []
        self._timed_images = 0           # images of the passes whose time is known
        self._reported: tuple[int, float] = (0, 0.0)
        # features prepared for a committed-but-not-completed step, by its fence
        self._prepared: dict[int, dict[bytes, ImageFeatures]] = {}

    def complete(self, fence: int) -> None:
        self.cache.complete(fence)
        self._prepared = {f: p for f, p in self._prepared.items() if f > fence}

    def prepare(self, images: Sequence[bytes], fence: int) -> None:
        """Before the step `fence` is committed: fetch and encode the images it will feed
        that the cache lacks, so a failure (ImageUnavailable) can fail those requests alone;
        the step then only reads features (kept for it even when the cache cannot)."""
        missing = []
        prepared = self._prepared.setdefault(fence, {})
        for identity in dict.fromkeys(images):
            features = self.cache.get(identity, fence)
            if features is None:
                missing.append(identity)
            else:
                prepared[identity] = features
        if missing:
            prepared.update(self._encode(missing, fence))

    def prefetch(self, prompt: MultimodalPrompt, cached: int) -> None:
        """At admission: start fetching the pixels of the images whose span lies past the
        `cached` prompt tokens and whose features are not cached."""
        self.ahead.start([image.identity for image in prompt.images
                          if image.end > cached and image.identity not in self.cache])

    def take_step_work(self) -> tuple[int, float]:
        """(images encoded, encoder seconds) since the last call: one step's share (on
        CUDA, of the passes whose events have completed: those before the step)."""
        pending = []
        for count, start, end in self._timings:
            if end.query():
                self._timed_images += count
                self.counters.encoder_s += start.elapsed_time(end) / 1e3
            else:
                pending.append((count, start, end))
        self._timings = pending
        done = (self._timed_images - self._reported[0],
                self.counters.encoder_s - self._reported[1])
        self._reported = (self._timed_images, self.counters.encoder_s)
        return done

    def embeds(self, rows: Sequence[tuple[int, MultimodalPrompt, int, int]], fence: int
               ) -> ImageEmbeds | None:
        wanted = [(first_row + lo_pos - start, image, first, count)
                  for first_row, prompt, start, end in rows
                  for image, first, count in prompt.spans_in(start, end)
                  for lo_pos in (image.offset + first,)]
        if not wanted:
            return None
        found: dict[bytes, ImageFeatures] = dict(self._prepared.get(fence, {}))
        missing: list[bytes] = []
        for _, image, _, _ in wanted:
            if image.identity in found or image.identity in missing:
                continue
            features = self.cache.get(image.identity, fence)
            if features is None:
                missing.append(image.identity)
            else:
                found[image.identity] = features
        if missing:
            found.update(self._encode(missing, fence))
        pieces = [(row, found[image.identity], first, count)
                  for row, image, first, count in wanted]
        return ImageEmbeds.gather(pieces, self.model.device)

    def _encode(self, identities: list[bytes], fence: int) -> dict[bytes, ImageFeatures]:
        import time

        if self.pixels is None:
            raise ImageUnavailable("this engine has no imageprep address to fetch image "
                                   "pixels from (engine setting imageprep_address)")
        started = time.perf_counter()
        tensors = self.ahead.fetch(identities)
        fetched = time.perf_counter()
        self.counters.fetch_s += fetched - started
        try:        # tensors this tower cannot take fail the requests that need them
            inputs = [VisionInput.from_tensors(identity, named, self.merge)
                      for identity, named in zip(identities, tensors, strict=True)]
            self.model.visual.check(inputs)
        except (KeyError, ValueError) as exc:
            raise ImageUnavailable(f"imageprep sent image tensors this model cannot use "
                                   f"({type(exc).__name__}: {exc}); is imageprep's profile "
                                   "this model's?") from exc
        if self.model.device.type == "cuda":
            # on the model stream, before the step that reads the features: no host wait
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            with torch.cuda.stream(self.stream or torch.cuda.current_stream(
                    self.model.device)):
                begin.record()
                features = self.encoder(inputs)
                end.record()
            self._timings.append((len(inputs), begin, end))
        else:
            features = self.encoder(inputs)
            self._timed_images += len(inputs)
            self.counters.encoder_s += time.perf_counter() - fetched
        self.counters.images_encoded += len(inputs)
        self.counters.encoder_calls += 1
        self.counters.graph_passes = self.encoder.replays
        self.counters.patches_encoded += sum(i.num_patches for i in inputs)
        result = {}
        for identity, feature in zip(identities, features, strict=True):
            self.cache.put(identity, feature, fence)
            result[identity] = feature
        return result


def step_positions(rows: Sequence[tuple[MultimodalPrompt | None, int, int]]) -> np.ndarray:
    """int64 [3, T] mRoPE positions of a step's fed rows, sequence by sequence: (the
    sequence's prompt, or None for a text-only one, and its fed positions [start, end))."""
    parts = []
    for prompt, start, end in rows:
        if prompt is None:
            parts.append(np.broadcast_to(np.arange(start, end, dtype=np.int64),
                                         (3, end - start)))
        else:
            parts.append(prompt.position_rows(start, end))
    if not parts:
        return np.zeros((3, 0), dtype=np.int64)
    return np.ascontiguousarray(np.concatenate(parts, axis=1), dtype=np.int64)

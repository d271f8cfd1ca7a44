"""Completion frames: each step's sampled ids (and logprobs) travel device -> pinned host on a
copy stream, behind the step's work on the model stream.

    index = frames.record(rows, logprobs)   # after the step's work was enqueued (model stream)
    frames.ready(index) / frames.wait(index)
    ids, logprobs, top_ids, top_logprobs = frames.read(index, rows, logprobs)

Two frames alternate. `record` copies the persistent outputs into the frame's device buffer on
the model stream (so the next step may overwrite the outputs at once), records a "produced"
event, and the copy stream waits for it and copies to pinned host memory, then records
"copied". Each step also gets two timing events around its device work: its GPU duration, the
cost model's measurement. On the CPU everything is immediate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.engine.runner.cuda_driver import event_done
from services.engine.runner.slot_sampler import SampleOutputs


@dataclass(slots=True)
class _Frame:
    device_ids: torch.Tensor       # [1 + K, R] int64
    device_logprobs: torch.Tensor  # [1 + K, R] float32
    host_ids: torch.Tensor         # pinned copies
    host_logprobs: torch.Tensor
    started: torch.cuda.Event | None
    finished: torch.cuda.Event | None
    copied: torch.cuda.Event | None


class CompletionFrames:
    def __init__(self, outputs: SampleOutputs, device: torch.device,
                 model_stream: torch.cuda.Stream | None,
                 copy_stream: torch.cuda.Stream | None) -> None:
        self.outputs = outputs
        self.device = device
        self.model_stream = model_stream
        self.copy_stream = copy_stream
        cuda = device.type == "cuda"
        shape = tuple(outputs.ids.shape)

        def event(timing: bool) -> torch.cuda.Event | None:
            return torch.cuda.Event(enable_timing=timing) if cuda else None

        self.frames = [
            _Frame(torch.zeros(shape, dtype=torch.int64, device=device),
                   torch.zeros(shape, dtype=torch.float32, device=device),
                   torch.zeros(shape, dtype=torch.int64, pin_memory=cuda),
                   torch.zeros(shape, dtype=torch.float32, pin_memory=cuda),
                   event(True), event(True), event(False))
            for _ in range(2)]
        self._next = 0

    def start(self) -> int:
        """Take the next frame and mark the start of a step's device work (model stream)."""
        index = self._next
        self._next ^= 1
        frame = self.frames[index]
        if frame.started is not None:
            frame.started.record(self.model_stream)
        return index

    def record(self, index: int, rows: int, logprobs: bool) -> None:
        """The step's work is enqueued: mark its end and send its outputs to the host."""
        frame = self.frames[index]
        if frame.finished is not None:
            frame.finished.record(self.model_stream)
        take = slice(None) if logprobs else slice(0, 1)
        frame.device_ids[take, :rows].copy_(self.outputs.ids[take, :rows])
        if logprobs:
            frame.device_logprobs[:, :rows].copy_(self.outputs.logprobs[:, :rows])
        if self.copy_stream is None:
            frame.host_ids.copy_(frame.device_ids)
            frame.host_logprobs.copy_(frame.device_logprobs)
            return
        assert frame.copied is not None and self.model_stream is not None
        produced = torch.cuda.Event()
        produced.record(self.model_stream)
        with torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(produced)
            frame.host_ids[take, :rows].copy_(frame.device_ids[take, :rows], non_blocking=True)
            if logprobs:
                frame.host_logprobs[:, :rows].copy_(frame.device_logprobs[:, :rows],
                                                    non_blocking=True)
            frame.copied.record(self.copy_stream)

    def ready(self, index: int) -> bool:
        copied = self.frames[index].copied
        return copied is None or event_done(copied)

    def wait(self, index: int) -> None:
        copied = self.frames[index].copied
        if copied is not None:
            copied.synchronize()

    def duration_s(self, index: int) -> float:
        """GPU time of the frame's step (valid once it completed); -1 on the CPU."""
        frame = self.frames[index]
        if frame.started is None or frame.finished is None:
            return -1.0
        return frame.started.elapsed_time(frame.finished) / 1e3

    def read(self, index: int, rows: int, logprobs: bool
             ) -> tuple[list[int], list[float], list[list[int]], list[list[float]]]:
        frame = self.frames[index]
        ids = frame.host_ids[0, :rows].tolist()
        if not logprobs:
            return ids, [], [], []
        top_ids = frame.host_ids[1:, :rows].t().tolist()
        top_logprobs = frame.host_logprobs[1:, :rows].t().tolist()
        return ids, frame.host_logprobs[0, :rows].tolist(), top_ids, top_logprobs

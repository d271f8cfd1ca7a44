"""GraphRunner: the CUDA runner (persistent device inputs, decode CUDA graphs, two frames).

    fence = runner.submit(step)    # pack -> upload -> (graph replay | eager body) -> enqueue
    completion = runner.poll()     # the oldest step whose outputs reached pinned host memory

Per step the host packs everything the device needs into a pinned input frame (fed tokens,
positions, KV slots, the new page-table entries only, sampling inits) and uploads it with one
copy per dtype on the model stream. A pure-decode step that fits a captured capacity replays
that capacity's graph; prefill, mixed, resume and snapshot steps run the same body eagerly.
Sampling happens on the device from per-slot state (`SlotState`); the sampled ids travel back
through a completion frame on the copy stream. A step that samples choices with a grammar
uploads their allowed-token bitmasks with its frame into the slots' persistent bitmask rows,
which the step's graph (the grammar variant of its capacity and mode) or body applies before
sampling. Nothing in `submit` waits for the device: the
engine loop plans and submits step N+1 while step N runs (window 2), and a decode planned
behind step N takes its input token from N's device-side output.

On the CPU the same code runs eagerly and synchronously (no graphs, no streams): the tests
compare it with TorchRunner token for token.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from services.common.errors import PoisonedError, WorkerFailure
from services.engine.model import CausalLM, KVCache
from services.engine.runner.completions import CompletionFrames
from services.engine.runner.decode_graphs import DecodeGraphs, capacities, pack_decode
from services.engine.runner.eager_pack import pack_eager
from services.engine.runner.frames import BulkStaging, GraphPacking, InputFrames
from services.engine.runner.layout import StepLayout, layout_step
from services.engine.runner.page_tables import PageTableMirror
from services.engine.runner.scoring import StepScores, score_step
from services.engine.runner.slot_sampler import SampleOutputs
from services.engine.runner.slot_state import FLOAT_FIELDS, INT_FIELDS, SlotInfo, SlotState
from services.engine.runner.snapshots import SnapshotStore
from services.engine.runner.step_body import StepBody
from services.engine.runner.step_inputs import GraphPads, StepInputs, StepLimits
from services.engine.scheduler.plan import Completion, SamplingInit, SeqResult, Step
from services.engine.scheduler.requests import SampledLogprobs, TokenLogprob

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GraphRunnerConfig:
    num_slots: int
    max_model_len: int               # the context limit (graphs serve every length up to it)
    max_num_batched_tokens: int
    graph_max_batch: int             # largest captured decode capacity (0: no graphs)
    overlap: bool                    # window 2 (two frames) or 1
    eos_token_ids: tuple[int, ...] = ()
    token_vocab: int | None = None   # the tokenizer's ids (logits past it masked; None: all)


@dataclass(slots=True)
class _InFlight:
    step: Step
    frame: int
    sampled: tuple[int, ...]         # index in step.seqs of each sampled row, in row order
    logprobs: bool
    graph: bool
    started: float
    scores: StepScores               # prompt scoring (eager steps that ask; else empty)


class GraphRunner:
    def __init__(self, model: CausalLM, kv: KVCache, snapshots: SnapshotStore,
                 config: GraphRunnerConfig) -> None:
        self.model = model
        self.kv = kv
        self.snapshots = snapshots
        self.config = config
        self.device = device = model.device
        self.page_size = kv.page_size
        self.is_cuda = device.type == "cuda"
        caps = capacities(min(config.graph_max_batch, config.num_slots))
        max_rows = max(config.num_slots, caps[-1] if caps else 0)
        width = -(-config.max_model_len // self.page_size) + 1
        self.mirror = PageTableMirror(config.num_slots, width)
        self.page_table = torch.zeros((config.num_slots + 1, width), dtype=torch.int32,
                                      device=device)
        hidden_size = model.config.hidden_size
        self.state = SlotState(config.num_slots, model.config.vocab_size, hidden_size,
                               snapshots.hidden.dtype, device, config.eos_token_ids,
                               token_vocab=config.token_vocab)
        self.outputs = SampleOutputs.allocate(max_rows, device)
        self.frames = InputFrames(StepLimits.for_runner(
            num_slots=config.num_slots, max_num_batched_tokens=config.max_num_batched_tokens,
            max_graph_batch=max_rows, table_width=width,
            vocab_size=model.config.vocab_size, init_ints=len(INT_FIELDS),
            init_floats=len(FLOAT_FIELDS)), device)
        self.bulk = BulkStaging(device)
        self.model_stream = torch.cuda.Stream(device) if self.is_cuda else None
        self.copy_stream = torch.cuda.Stream(device) if self.is_cuda else None
        self.body = StepBody(model, kv, snapshots, self.state, self.page_table, self.outputs)
        self.pads = GraphPads(padding_row=self.state.padding_row,
                              trash_cell=self.mirror.trash_cell)
        self.graphs = DecodeGraphs(self.body, self.frames, self.mirror, caps,
                                   config.max_model_len, self.model_stream,
                                   self.pads)
        self.completions = CompletionFrames(self.outputs, device, self.model_stream,
                                            self.copy_stream)
        self._in_flight: deque[_InFlight] = deque()
        self._failure: BaseException | None = None
        self.graph_steps = 0
        self.eager_steps = 0

    def capture(self) -> None:
        """Capture the startup decode graphs (CUDA only)."""
        with torch.inference_mode():
            self.graphs.capture_startup()

    # -- the interface ----------------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return len(self._in_flight)

    @property
    def window(self) -> int:
        return 2 if self.config.overlap else 1

    def submit(self, step: Step) -> int:
        self._check_healthy()
        if len(self._in_flight) >= self.window:
            raise WorkerFailure(f"step {step.fence} submitted with {len(self._in_flight)} "
                                "steps outstanding (the window is full)")
        try:
            with torch.inference_mode():
                self._in_flight.append(self._enqueue(step))
        except Exception as exc:
            self._fail(exc, f"engine step {step.fence} ({step.kind}) failed")
        return step.fence

    def poll(self) -> Completion | None:
        self._check_healthy()
        if not self._in_flight or not self.completions.ready(self._in_flight[0].frame):
            return None
        return self._complete()

    def wait(self) -> Completion:
        self._check_healthy()
        if not self._in_flight:
            raise WorkerFailure("wait() with no step outstanding")
        try:
            self.completions.wait(self._in_flight[0].frame)
        except Exception as exc:
            self._fail(exc, f"engine step {self._in_flight[0].step.fence} failed on the device")
        return self._complete()

    def drain(self) -> bool:
        """Every submitted step finished on the device (both streams)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        return True

    def _check_healthy(self) -> None:
        if self._failure is not None:
            raise PoisonedError("the runner failed earlier and cannot continue",
                                cause=f"{type(self._failure).__name__}: {self._failure}")

    def _fail(self, exc: BaseException, message: str) -> None:
        self._failure = exc
        self.mirror.forget()
        log.exception(message)
        raise WorkerFailure(f"{message}: {type(exc).__name__}: {exc}") from exc

    # -- one step ---------------------------------------------------------------------------
    def _enqueue(self, step: Step) -> _InFlight:
        started = time.perf_counter()
        if any(seq.max_emit > 1 for seq in step.seqs):
            raise WorkerFailure(f"step {step.fence} verifies proposals (max_emit > 1): the graph "
                                "runner samples one token per sequence (speculative decoding "
                                "lands with its verification graphs)")
        state = self.state
        inits: list[tuple[SlotInfo, SamplingInit]] = []
        for seq in step.seqs:
            if seq.init is not None:
                inits.append((state.register(seq.handle, seq.init), seq.init))
        sampled = tuple(i for i, seq in enumerate(step.seqs) if seq.sample)
        for i in sampled:
            seq = step.seqs[i]
            state.check(seq.handle, seq.output_index).outputs += 1
        mode, logprobs = state.mode([step.seqs[i].handle.slot for i in sampled])
        bitmasks = [(step.seqs[i].handle.slot, step.seqs[i].allowed_tokens) for i in sampled
                    if step.seqs[i].allowed_tokens is not None]
        released = state.released_bitmasks(inits, {slot for slot, _ in bitmasks})
        grammar = bool(bitmasks)
        capacity = self._graph_capacity(step)
        layout = layout_step(step, self.page_size)
        values = StepInputs.empty()
        if capacity is not None:
            pack_decode(values, step, layout, self.mirror)
            shape = None
        else:
            shape = pack_eager(values, step, layout, self.mirror)
        state.pack_inits(values, inits)
        state.pack_bitmasks(values, bitmasks, released)
        stream = torch.cuda.stream(self.model_stream) if self.model_stream else nullcontext()
        with stream:
            frame = self.completions.start()
            packed = self.frames.upload(
                values, GraphPacking(capacity, self.pads) if capacity is not None else None)
            views = packed.views
            state.install(views)
            state.install_bitmasks(views)
            state.install_rows(self.bulk, inits)
            for seq in step.seqs:
                if seq.restore is not None:
                    r = seq.restore
                    self.snapshots.restore(r.snapshot_id, r.page_id, r.num_tokens)
            scores = StepScores()
            if capacity is not None:
                self.graphs.replay(packed, capacity, mode, logprobs, grammar)
                self._captures(step, layout, None)   # zero-token terminal captures ride along
                self.graph_steps += 1
                rows = capacity
            else:
                assert shape is not None
                hidden = self.body.run(views, shape, mode, logprobs, grammar)
                self._captures(step, layout, hidden)
                scores = score_step(self.model, step, layout, hidden, self.config.token_vocab)
                self.eager_steps += 1
                rows = len(sampled)
            self.completions.record(frame, rows, logprobs)
        return _InFlight(step, frame, sampled, logprobs, capacity is not None, started,
                         scores)

    def _graph_capacity(self, step: Step) -> int | None:
        """The decode capacity that serves `step`, or None (run it eagerly). Every sequence
        feeds one token and samples, or only saves a terminal checkpoint (no tokens: its
        capture copies state after the graph)."""
        if not self.graphs.capacities:
            return None
        fed = 0
        for seq in step.seqs:
            if seq.scores:
                return None                      # prompt scoring runs eagerly
            if not seq.token_ids:
                if (seq.sample or seq.capture is None or seq.restore is not None or
                        seq.resume_snapshot is not None):
                    return None
                continue
            if (len(seq.token_ids) != 1 or not seq.sample or seq.restore is not None or
                    seq.capture is not None or
                    self.mirror.pending(seq.handle, seq.page_ids) > 1):
                return None
            fed += 1
        if not fed or fed > self.graphs.max_capacity:
            return None
        return self.graphs.capacity_for(fed)

    def _captures(self, step: Step, layout: StepLayout, hidden: torch.Tensor | None) -> None:
        last_rows = dict(zip(layout.forward_seqs, layout.last_rows, strict=True))
        for index, seq in enumerate(step.seqs):
            capture = seq.capture
            if capture is None:
                continue
            if index in last_rows:
                assert hidden is not None
                saved = hidden[last_rows[index]]
            else:
                cell = seq.handle.slot * 2 + (capture.endpoint - 1) % 2
                saved = self.state.last_hidden[cell]
            self.snapshots.capture(capture.snapshot_id, capture.page_id, capture.num_tokens,
                                   saved)

    def _complete(self) -> Completion:
        flight = self._in_flight.popleft()
        step = flight.step
        ids, logprobs, top_ids, top_logprobs = self.completions.read(
            flight.frame, len(flight.sampled), flight.logprobs)
        if self.is_cuda:
            duration = self.completions.duration_s(flight.frame)
        else:
            duration = time.perf_counter() - flight.started
        tokens: dict[int, tuple[int, SampledLogprobs | None]] = {}
        for row, index in enumerate(flight.sampled):
            seq = step.seqs[index]
            info = self.state.info.get(seq.handle.slot)
            detail = None
            if info is not None and info.logprobs and logprobs:
                detail = SampledLogprobs(ids[row], logprobs[row], tuple(
                    TokenLogprob(t, lp) for t, lp in
                    zip(top_ids[row][:info.top_logprobs], top_logprobs[row][:info.top_logprobs],
                        strict=True)))
            tokens[index] = (ids[row], detail)
        scores = flight.scores.collect()     # the frame's event covers the scoring work
        results = []
        for index, seq in enumerate(step.seqs):
            prompt_logprobs, pooled = scores.get(index, ((), ()))
            if index in tokens:
                token, detail = tokens[index]
                results.append(SeqResult(seq.handle, seq.sample_from + 1, (token,),
                                         (detail,) if detail is not None else (),
                                         prompt_logprobs, pooled))
            else:
                results.append(SeqResult(seq.handle, seq.end, (),
                                         prompt_logprobs=prompt_logprobs, pooled=pooled))
        return Completion(step.fence, tuple(results), duration)

"""GraphRunner: the CUDA runner (persistent device inputs, decode CUDA graphs, two frames).

    fence = runner.submit(step)    # pack -> upload -> (graph replay | eager body) -> enqueue
    completion = runner.poll()     # the oldest step whose outputs reached pinned host memory

Per step the host packs everything the device needs into a pinned input frame (fed tokens,
positions, KV slots, the new page-table entries only, sampling inits) and uploads it with one
copy per dtype on the model stream. A pure-decode step that fits a captured capacity replays
that capacity's graph; a verification step (speculative decoding: sequences feeding their
pending token plus drafts, beside plain decodes) replays the verification graph of its
capacity and width (captured on first use), sampling every row with per-row inputs and
advancing each slot by its emitted prefix on the device; its emitted tokens are recomputed
on the host from the sampled ids (`verified_tokens`, the same rule). A prefill or mixed step
(prompt chunks beside decodes) replays the prefill graph of the smallest token capacity that
holds it (decode_graphs.py), restores and checkpoints at its sequences' ends included.
Resumes from snapshots, prompt scoring, image rows, verifications beside a prefill chunk and
steps past every graph run the same body eagerly.
Sampling happens on the device from per-slot state (`SlotState`); the sampled ids travel back
through a completion frame on the copy stream. A step that samples choices with a grammar
uploads their allowed-token bitmasks with its frame into the slots' persistent bitmask rows,
which the step's graph (the grammar variant of its capacity and mode) or body applies before
sampling. Nothing in `submit` waits for the device: the
engine loop plans and submits step N+1 while step N runs (window 2), and a decode planned
behind step N takes its input token from N's device-side output.

A vision-language model (mRoPE positions [3, T], image features) replays the same graphs
for its text rows (decodes past the images: each row's position offset rides in the frame,
runner/vision_rows.py); a step that feeds image rows runs eagerly with its [3, T] rows and
the image features the vision stage prepared (released when the step's completion is read).

On the CPU the same code runs eagerly and synchronously (no graphs, no streams): the tests
compare it with TorchRunner token for token.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter, deque
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from services.common.errors import PoisonedError, WorkerFailure
from services.engine.kernels.compile_pool import CompilePool, CompileReport
from services.engine.kernels.precompile import (
    Variant,
    current_target,
    discover_variants,
    record_compiled,
    remember,
)
from services.engine.model import CausalLM, KVCache
from services.engine.model.moe import expert_weight_bytes, warm_up_experts
from services.engine.runner.completions import CompletionFrames
from services.engine.runner.decode_graphs import (
    DecodeGraphs,
    capacities,
    pack_decode,
    prefill_capacities,
)
from services.engine.runner.eager_pack import pack_eager, pack_verify
from services.engine.runner.frames import BulkStaging, InputFrames
from services.engine.runner.graph_choice import GraphChoice
from services.engine.runner.host_kv import HostKVStore
from services.engine.runner.layout import StepLayout, layout_step, verified_tokens
from services.engine.runner.page_tables import PageTableMirror
from services.engine.runner.scoring import StepScores, score_step
from services.engine.runner.slot_sampler import SampleOutputs
from services.engine.runner.slot_state import (
    FLOAT_FIELDS,
    INT_FIELDS,
    SlotInfo,
    SlotState,
)
from services.engine.runner.snapshots import SnapshotStore
from services.engine.runner.step_body import StepBody
from services.engine.runner.step_inputs import GraphPads, StepInputs, StepLimits
from services.engine.runner.vision_rows import eager_rows, graph_offsets, step_embeds
from services.engine.runner.warm_up import warm_up_eager
from services.engine.scheduler.plan import Completion, SamplingInit, SeqResult, Step
from services.engine.scheduler.requests import SampledLogprobs, TokenLogprob
from services.engine.vision.prompt import MultimodalPrompt
from services.engine.vision.stage import VisionStage

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
    max_drafts: int = 0              # drafts a verification step feeds per sequence at most
    max_image_tokens: int = 0        # an image span a step may feed whole past the budget
    prefill_graphs: bool = True      # graphs for prefill and mixed steps (with decode graphs)


@dataclass(slots=True)
class _InFlight:
    step: Step
    frame: int
    sampled: tuple[int, ...]         # index in step.seqs of each sampled row, in row order
                                     # (a verification's sequence has several)
    logprobs: bool
    graph: bool
    started: float
    scores: StepScores               # prompt scoring (eager steps that ask; else empty)
    captured: bool = False           # its graph was captured first: the GPU time is no cost


class GraphRunner:
    def __init__(self, model: CausalLM, kv: KVCache, snapshots: SnapshotStore,
                 config: GraphRunnerConfig, host_kv: HostKVStore | None = None,
                 vision: VisionStage | None = None) -> None:
        self.model = model
        self.vision = vision              # image features of vision models (vision/stage.py)
        self.mrope = model.position_rows == 3
        self._multimodal: dict[int, MultimodalPrompt | None] = {}   # by slot
        self.kv = kv
        self.snapshots = snapshots
        self.host_kv = host_kv            # the host tier's pages (--kv-offload-gib)
        self.config = config
        self.device = device = model.device
        self.page_size = kv.page_size
        self.is_cuda = device.type == "cuda"
        caps = capacities(min(config.graph_max_batch, config.num_slots))
        max_rows = max(config.num_slots, caps[-1] if caps else 0)
        self.width = 1 + config.max_drafts      # rows per sequence of a verification step
        width = -(-config.max_model_len // self.page_size) + 1
        self.mirror = PageTableMirror(config.num_slots, width)
        self.page_table = torch.zeros((config.num_slots + 1, width), dtype=torch.int32,
                                      device=device)
        hidden_size = model.config.hidden_size
        self.state = SlotState(config.num_slots, model.config.vocab_size, hidden_size,
                               snapshots.hidden.dtype, device, config.eos_token_ids,
                               token_vocab=config.token_vocab, width=self.width)
        self.outputs = SampleOutputs.allocate(max_rows * self.width, device)
        self.frames = InputFrames(StepLimits.for_runner(
            num_slots=config.num_slots, max_num_batched_tokens=config.max_num_batched_tokens,
            max_graph_batch=max_rows, table_width=width,
            vocab_size=model.config.vocab_size, init_ints=len(INT_FIELDS),
            init_floats=len(FLOAT_FIELDS), width=self.width,
            max_image_tokens=config.max_image_tokens), device)
        self.bulk = BulkStaging(device)
        self.model_stream = torch.cuda.Stream(device) if self.is_cuda else None
        self.copy_stream = torch.cuda.Stream(device) if self.is_cuda else None
        if vision is not None:           # encodes go before the steps that read them
            vision.stream = self.model_stream
        self.body = StepBody(model, kv, snapshots, self.state, self.page_table, self.outputs)
        self.pads = GraphPads(padding_row=self.state.padding_row,
                              trash_cell=self.mirror.trash_cell)
        prefill_rows = prefill_capacities(config.max_num_batched_tokens,
                                          self.frames.limits.tokens) \
            if caps and config.prefill_graphs else ()
        self.graphs = DecodeGraphs(self.body, self.frames, self.mirror, caps,
                                   config.max_model_len, self.model_stream,
                                   self.pads, page_size=self.page_size,
                                   prefill_rows=prefill_rows,
                                   max_prefill_seqs=self.frames.limits.seqs,
                                   table_width=width)
        self.completions = CompletionFrames(self.outputs, device, self.model_stream,
                                            self.copy_stream)
        self._in_flight: deque[_InFlight] = deque()
        self._failure: BaseException | None = None
        self.graph_steps = 0
        self.eager_steps = 0
        self.verify_graph_steps = 0      # verification steps a graph served (of graph_steps)
        self.prefill_graph_steps = 0     # prefill and mixed steps a graph served (likewise)
        self.choice = GraphChoice(self.graphs, self.mirror,
                                  max_tokens=self.frames.limits.tokens,
                                  page_size=self.page_size)
        # why verification steps ran eagerly (no graph serves them), by reason: diagnostics
        self.eager_verify_reasons: Counter[str] = self.choice.eager_verify_reasons

    def precompile(self, compile_pool: CompilePool, *, submitted: bool = False
                   ) -> CompileReport | None:
        """Compile the start-up's Triton kernel variants in the pool's processes
        (kernels/precompile.py). `submitted`: a remembered variant list was handed to the
        pool already (build_engine does so before loading the weights); wait for it.
        Otherwise the start-up runs once with every uncompiled launch skipped and handed to
        the pool as it is met, and `capture` then loads them from Triton's cache. Nothing is
        discovered off CUDA, nor for MoE models, whose routing feeds indices to torch ops that
        must not read the garbage a skipped kernel leaves (their remembered lists still
        serve)."""
        if submitted:
            report = compile_pool.finish()
            unnamed = 0
        elif self.is_cuda and expert_weight_bytes(self.model) == 0:
            target = current_target()
            compile_pool.wait_for_driver_utils()    # the discovery touches Triton's driver
            with discover_variants(lambda variant: compile_pool.submit(variant, target)) \
                    as found:
                self._start_up(discover=True)
            report = compile_pool.finish()
            unnamed = found.unnamed
        else:
            return None
        log.info("compiled %d kernel variants in %.2f s in %d processes (%.1f s of "
                 "compilation; %d failed, %d launchers not built; %d of kernels outside a "
                 "module left to the capture)%s", report.variants, report.seconds,
                 compile_pool.workers, report.compile_seconds, report.failed,
                 report.launchers_missed, unnamed,
                 " from the remembered list" if submitted else "")
        return report

    def capture(self, remember_at: Path | None = None,
                known: Iterable[Variant] = ()) -> None:
        """Compile the MoE kernels' variants of every step size and the eager prefill and
        mixed step shapes' kernels (runner/warm_up.py), then capture the startup decode
        graphs (CUDA only). With `remember_at`, the kernel variants the start-up met are kept
        there for the next start (kernels/precompile.py), with the `known` ones, unless it met
        none beyond those."""
        if remember_at is None or not self.is_cuda:
            self._start_up(discover=False)
            return
        with record_compiled() as met:
            self._start_up(discover=False)
        known = list(known)
        if not set(met.variants.values()) <= set(known):     # new ones: keep both
            remember(remember_at, dict.fromkeys([*known, *met.variants.values()]))

    def _start_up(self, discover: bool) -> None:
        warm_up_experts(self.model, self.config.max_num_batched_tokens)
        warm_up_eager(self.model, self.kv, max_tokens=self.config.max_num_batched_tokens,
                      max_seqs=self.config.num_slots, max_model_len=self.config.max_model_len)
        with torch.inference_mode():
            self.graphs.capture_startup(self.width, discover=discover)

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
        state = self.state
        inits: list[tuple[SlotInfo, SamplingInit]] = []
        for seq in step.seqs:
            if seq.init is not None:
                inits.append((state.register(seq.handle, seq.init), seq.init))
                self._multimodal[seq.handle.slot] = seq.init.multimodal
        sampling = [i for i, seq in enumerate(step.seqs) if seq.sample]
        for i in sampling:
            seq = step.seqs[i]
            if seq.max_emit > self.width:
                raise WorkerFailure(f"step {step.fence}: slot {seq.handle} verifies "
                                    f"{seq.max_emit - 1} drafts, the runner was built for "
                                    f"{self.width - 1}")
            info = state.check(seq.handle, seq.output_index)
            if seq.max_emit == 1:        # a verification's count is known at completion
                info.outputs += 1
        mode, logprobs = state.mode([step.seqs[i].handle.slot for i in sampling])
        bitmasks = self._bitmask_rows(step, sampling)
        released = state.released_bitmasks(inits, {row for row, _ in bitmasks})
        grammar = bool(bitmasks)
        layout = layout_step(step, self.page_size)
        sampled = tuple(layout.sample_seqs)
        graph = self.choice.packing_for(step, mode, logprobs, grammar)
        values = StepInputs.empty()
        offsets = graph_offsets(step, layout, self._multimodal) \
            if self.mrope and graph is not None else None
        if self.mrope and offsets is None:
            graph = None                   # image rows (or unequal mRoPE rows): eager
        if graph is not None:
            if graph.is_prefill:
                pack_eager(values, step, layout, self.mirror, state.padding_row)
            else:
                pack_decode(values, step, layout, self.mirror)
                if graph.width > 1:
                    pack_verify(values, step, layout, state.padding_row)
            values.rope_offsets = offsets or []
            shape = None
        else:
            shape = pack_eager(values, step, layout, self.mirror, state.padding_row)
            if self.mrope:
                values.mrope_rows = eager_rows(step, layout, self._multimodal)
                shape = dataclasses.replace(shape, mrope_rows=True)
        state.pack_inits(values, inits)
        state.pack_bitmasks(values, bitmasks, released)
        stream = torch.cuda.stream(self.model_stream) if self.model_stream else nullcontext()
        with stream:
            frame = self.completions.start()
            packed = self.frames.upload(values, graph)
            views = packed.views
            state.install(views)
            state.install_bitmasks(views)
            state.install_rows(self.bulk, inits)
            if step.transfers:       # host-tier copies, on their stream, before the forward
                if self.host_kv is None:
                    raise WorkerFailure("a step moves host-tier pages but the runner has none")
                self.host_kv.run(step.transfers, self.model_stream)
            for seq in step.seqs:
                if seq.restore is not None:
                    r = seq.restore
                    self.snapshots.restore(r.snapshot_id, r.page_id, r.num_tokens)
            scores = StepScores()
            captured = False
            if graph is not None:
                captured = self.graphs.replay(packed, graph, mode, logprobs, grammar)
                # zero-token terminal captures ride along; a prefill graph's fed sequences
                # capture at their ends, from the hidden state the graph kept per slot
                self._captures(step, layout, None)
                self.graph_steps += 1
                self.verify_graph_steps += graph.width > 1
                self.prefill_graph_steps += graph.is_prefill
                rows = graph.sampled_rows
            else:
                assert shape is not None
                images = step_embeds(step, layout, self._multimodal, self.vision) \
                    if self.mrope and layout.num_tokens else None
                hidden = self.body.run(views, shape, mode, logprobs, grammar, images)
                self._captures(step, layout, hidden)
                scores = score_step(self.model, step, layout, hidden, self.config.token_vocab)
                self.eager_steps += 1
                rows = len(sampled)
            self.completions.record(frame, rows, logprobs)
        return _InFlight(step, frame, sampled, logprobs, graph is not None, started,
                         scores, captured)

    def _bitmask_rows(self, step: Step, sampling: list[int]) -> list[tuple[int, object]]:
        """(bitmask row, mask) for every grammar-masked sampled row: a decode's slot row, a
        verification's row per offset."""
        rows: list[tuple[int, object]] = []
        for i in sampling:
            seq = step.seqs[i]
            mask = seq.allowed_tokens
            if mask is None:
                continue
            if getattr(mask, "ndim", 1) == 2:
                rows.extend((self.state.bitmask_row(seq.handle.slot, o), mask[o])
                            for o in range(mask.shape[0]))
            else:
                rows.append((seq.handle.slot, mask))
        return rows

    def _captures(self, step: Step, layout: StepLayout, hidden: torch.Tensor | None) -> None:
        if all(seq.capture is None and not seq.tail_captures for seq in step.seqs):
            return                   # the usual step (the dict below costs ~10 us a round)
        for seq in step.seqs:        # boundaries a chunk ran past: their partial pages
            for tail in seq.tail_captures:
                self.snapshots.capture_tail(tail.snapshot_id, tail.page_id, tail.num_tokens)
        last_rows = dict(zip(layout.forward_seqs, layout.last_rows, strict=True)) \
            if hidden is not None else {}
        for index, seq in enumerate(step.seqs):
            capture = seq.capture
            if capture is None:
                continue
            if index in last_rows:
                assert hidden is not None
                saved = hidden[last_rows[index]]
            else:    # kept per slot: a terminal state, or a graph's last fed row
                cell = seq.handle.slot * 2 + (capture.endpoint - 1) % 2
                saved = self.state.last_hidden[cell]
            self.snapshots.capture(capture.snapshot_id, capture.page_id, capture.num_tokens,
                                   saved)

    def _complete(self) -> Completion:
        flight = self._in_flight.popleft()
        step = flight.step
        ids, logprobs, top_ids, top_logprobs = self.completions.read(
            flight.frame, len(flight.sampled), flight.logprobs)
        if flight.captured:
            duration = -1.0          # untimed: the cost model waits for a replay
        elif self.is_cuda:
            duration = self.completions.duration_s(flight.frame)
        else:
            duration = time.perf_counter() - flight.started
        rows_of: dict[int, list[int]] = {}
        for row, index in enumerate(flight.sampled):
            rows_of.setdefault(index, []).append(row)
        tokens: dict[int, tuple[tuple[int, ...], tuple[SampledLogprobs, ...]]] = {}
        for index, rows in rows_of.items():
            seq = step.seqs[index]
            info = self.state.info.get(seq.handle.slot)
            if info is not None and info.handle != seq.handle:
                info = None
            # the device advanced the slot by the same prefix (slot_sampler.VerifyRows)
            emitted = verified_tokens([ids[row] for row in rows], seq.draft_token_ids)
            if seq.max_emit > 1 and info is not None:
                info.outputs += len(emitted)
            details: tuple[SampledLogprobs, ...] = ()
            if info is not None and info.logprobs and logprobs:
                k = info.top_logprobs
                details = tuple(SampledLogprobs(ids[row], logprobs[row], tuple(
                    TokenLogprob(t, lp) for t, lp in
                    zip(top_ids[row][:k], top_logprobs[row][:k], strict=True)))
                    for row in rows[:len(emitted)])
            tokens[index] = (tuple(emitted), details)
        scores = flight.scores.collect()     # the frame's event covers the scoring work
        encoded, encoder_s = 0, 0.0
        if self.vision is not None:          # the device is done with the step's features
            self.vision.complete(step.fence)
            encoded, encoder_s = self.vision.take_step_work()
        results = []
        for index, seq in enumerate(step.seqs):
            prompt_logprobs, pooled = scores.get(index, ((), ()))
            if index in tokens:
                emitted_ids, details = tokens[index]
                results.append(SeqResult(seq.handle, seq.sample_from + len(emitted_ids),
                                         emitted_ids, details, prompt_logprobs, pooled))
            else:
                results.append(SeqResult(seq.handle, seq.end, (),
                                         prompt_logprobs=prompt_logprobs, pooled=pooled))
        return Completion(step.fence, tuple(results), duration, encoded, encoder_s)

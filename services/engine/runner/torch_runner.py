"""TorchRunner: executes steps with the model on one device (the CPU path; float32 exact).

Per step: run the host tier's copies (runner/host_kv.py), restore snapshot tails into pages, run the forward pass over the packed rows (writing
K/V), capture checkpoint snapshots, compute logits for the rows that sample (from the forward's
last rows or from a snapshot's saved hidden state) and sample them in one batch. Each slot's
sampling state (params with its resolved seed, prompt, generated tokens) is installed by the
step's `init` and extended with every token sampled here.

On the CPU the work is done inside `submit`; the completion is queued for `poll`/`wait`, so the
interface keeps the asynchronous shape the GPU runner (CUDA graphs, two frames) will fill.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from dataclasses import dataclass

import torch

from services.common.errors import PoisonedError, WorkerFailure
from services.engine.model import CausalLM, ForwardBatch, KVCache, build_metadata
from services.engine.runner.host_kv import HostKVStore
from services.engine.runner.layout import StepLayout, layout_step, verified_tokens
from services.engine.runner.scoring import score_step
from services.engine.runner.snapshots import SnapshotStore
from services.engine.sampling import Sampler, SamplingBatch, SamplingParams, SamplingRow
from services.engine.scheduler.plan import Completion, SeqResult, SeqStep, SlotHandle, Step
from services.engine.scheduler.requests import SampledLogprobs, TokenLogprob
from services.engine.vision.prompt import MultimodalPrompt
from services.engine.vision.stage import VisionStage, step_positions

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SlotSampling:
    handle: SlotHandle
    params: SamplingParams            # seed resolved
    prompt_token_ids: tuple[int, ...]
    output_token_ids: list[int]


class TorchRunner:
    def __init__(self, model: CausalLM, kv: KVCache, snapshots: SnapshotStore, *,
                 num_slots: int, eos_token_ids: tuple[int, ...] = (),
                 token_vocab: int | None = None, host_kv: HostKVStore | None = None,
                 vision: VisionStage | None = None) -> None:
        self.model = model
        self.vision = vision              # image features of vision models (vision/stage.py)
        self._multimodal: dict[int, MultimodalPrompt | None] = {}   # by slot
        self.kv = kv
        self.snapshots = snapshots
        self.host_kv = host_kv            # the host tier's pages (--kv-offload-gib)
        self.sampler = Sampler(token_vocab)   # ids past the tokenizer's are never sampled
        self.token_vocab = token_vocab
        self.device = model.device
        self.page_size = kv.page_size
        self.vocab_size = model.config.vocab_size
        self.eos_token_ids = eos_token_ids
        self._slots: dict[int, SlotSampling] = {}
        # each slot's hidden state after its last fed tokens, by the parity of the row's
        # position: a finished sequence's terminal checkpoint at endpoint E is captured from
        # row E - 1 in a later, zero-token step, even when one overlapped decode (position E)
        # already ran behind it
        self.last_hidden = torch.zeros((num_slots, 2, model.config.hidden_size),
                                       dtype=snapshots.hidden.dtype, device=self.device)
        self._done: collections.deque[Completion] = collections.deque()
        self._failure: BaseException | None = None

    # -- the interface ----------------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return len(self._done)

    @property
    def window(self) -> int:
        """Synchronous: each step completes before the next is planned."""
        return 1

    def submit(self, step: Step) -> int:
        self._check_healthy()
        started = time.perf_counter()
        try:
            results = self._execute(step)
        except Exception as exc:
            self._failure = exc
            log.exception("step %d failed", step.fence)
            raise WorkerFailure(f"engine step {step.fence} ({step.kind}) failed: "
                                f"{type(exc).__name__}: {exc}") from exc
        encoded, encoder_s = 0, 0.0
        if self.vision is not None:           # the step is done with its image features
            self.vision.complete(step.fence)
            encoded, encoder_s = self.vision.take_step_work()
        self._done.append(Completion(step.fence, results, time.perf_counter() - started,
                                     encoded, encoder_s))
        return step.fence

    def poll(self) -> Completion | None:
        self._check_healthy()
        return self._done.popleft() if self._done else None

    def wait(self) -> Completion:
        completion = self.poll()
        if completion is None:
            raise WorkerFailure("wait() with no step outstanding")
        return completion

    def drain(self) -> bool:
        """Every submitted step has finished (on the CPU: once submit returned)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return True

    def _check_healthy(self) -> None:
        if self._failure is not None:
            raise PoisonedError("the runner failed earlier and cannot continue",
                                cause=f"{type(self._failure).__name__}: {self._failure}")

    # -- one step ---------------------------------------------------------------------------
    @torch.inference_mode()
    def _execute(self, step: Step) -> tuple[SeqResult, ...]:
        if step.transfers:
            if self.host_kv is None:
                raise WorkerFailure("a step moves host-tier pages but the runner has none")
            self.host_kv.run(step.transfers)
        for seq in step.seqs:
            if seq.init is not None:
                self._install(seq)
        for seq in step.seqs:
            if seq.restore is not None:
                r = seq.restore
                self.snapshots.restore(r.snapshot_id, r.page_id, r.num_tokens)
        layout = layout_step(step, self.page_size)
        hidden = None
        last_row: dict[int, int] = dict(zip(layout.forward_seqs, layout.last_rows, strict=True))
        if layout.num_tokens:
            hidden = self.model(self._forward_batch(layout, step), self.kv).hidden  # [T, H]
            fed = [step.seqs[i] for i in layout.forward_seqs]
            self.last_hidden.index_put_(                                    # [F, H] rows
                (torch.tensor([s.handle.slot for s in fed], device=self.device),
                 torch.tensor([(s.end - 1) % 2 for s in fed], device=self.device)),
                hidden.index_select(0, torch.tensor(layout.last_rows, device=self.device)))
        for index, seq in enumerate(step.seqs):
            if seq.resume_snapshot is not None:
                self.last_hidden[seq.handle.slot, (seq.start - 1) % 2].copy_(
                    self.snapshots.hidden[seq.resume_snapshot])
            for tail in seq.tail_captures:     # boundaries a chunk ran past: partial pages
                self.snapshots.capture_tail(tail.snapshot_id, tail.page_id, tail.num_tokens)
            if seq.capture is not None:
                c = seq.capture
                if index in last_row:
                    assert hidden is not None
                    state = hidden[last_row[index]]
                else:
                    state = self.last_hidden[seq.handle.slot, (c.endpoint - 1) % 2]
                self.snapshots.capture(c.snapshot_id, c.page_id, c.num_tokens, state)
        scores = score_step(self.model, step, layout, hidden, self.token_vocab).collect()
        emitted = self._sample(step, layout, hidden)
        self._keep_verified_hidden(step, layout, hidden, emitted)
        results = []
        for index, seq in enumerate(step.seqs):
            tokens, logprobs = emitted.get(index, ((), ()))
            consumed = seq.sample_from + len(tokens) if seq.sample else seq.end
            prompt_logprobs, pooled = scores.get(index, ((), ()))
            results.append(SeqResult(seq.handle, consumed, tokens, logprobs,
                                     prompt_logprobs, pooled))
        return tuple(results)

    def _keep_verified_hidden(self, step: Step, layout: StepLayout, hidden: torch.Tensor | None,
                              emitted: dict[int, tuple[tuple[int, ...], tuple]]) -> None:
        """A verification keeps the hidden state of its last emitted row (position
        sample_from + n - 1: the state a terminal checkpoint at the accepted length reads),
        not that of its last fed row (a rejected draft's)."""
        last_row = dict(zip(layout.forward_seqs, layout.last_rows, strict=True))
        for index, seq in enumerate(step.seqs):
            if seq.max_emit <= 1 or index not in emitted:
                continue
            assert hidden is not None
            count = len(emitted[index][0])
            row = last_row[index] - seq.max_emit + count
            self.last_hidden[seq.handle.slot, (seq.sample_from + count - 1) % 2].copy_(
                hidden[row])

    def _forward_batch(self, layout: StepLayout, step: Step) -> ForwardBatch:
        device = self.device
        token_ids = [self._slots[slot].output_token_ids[-1] if slot >= 0 else token
                     for token, slot in zip(layout.token_ids, layout.pending_slots,
                                            strict=True)]
        meta = build_metadata(
            [b - a for a, b in zip(layout.query_start_loc, layout.query_start_loc[1:],
                                   strict=False)],
            layout.seq_lens, layout.page_tables, self.page_size, device)
        ids = torch.tensor(token_ids, dtype=torch.int64, device=device)
        if self.model.position_rows != 3:
            return ForwardBatch(ids, torch.tensor(layout.positions, dtype=torch.int64,
                                                  device=device), meta)
        # mRoPE: each fed sequence's rows from its prompt (then p + rope_delta), and the
        # image features of the image rows it feeds
        fed = [(self._multimodal.get(step.seqs[i].handle.slot), step.seqs[i].start,
                step.seqs[i].end) for i in layout.forward_seqs]
        positions = torch.from_numpy(step_positions(fed)).to(device)
        images = None
        with_images = [(first, prompt, start, end) for first, (prompt, start, end)
                       in zip(layout.query_start_loc, fed, strict=False) if prompt is not None]
        if with_images:
            if self.vision is None:
                raise WorkerFailure("a step feeds image tokens but the runner has no vision "
                                    "stage")
            images = self.vision.embeds(with_images, step.fence)
        return ForwardBatch(ids, positions, meta, images=images)

    def _install(self, seq: SeqStep) -> None:
        init = seq.init
        assert init is not None
        params = init.params if isinstance(init.params, SamplingParams) else SamplingParams()
        params = dataclasses.replace(params, seed=init.seed, logprobs=init.logprobs,
                                     top_logprobs=init.top_logprobs)
        self._slots[seq.handle.slot] = SlotSampling(seq.handle, params, init.prompt_token_ids,
                                                    list(init.output_token_ids))
        self._multimodal[seq.handle.slot] = init.multimodal

    def _sample(self, step: Step, layout: StepLayout, hidden: torch.Tensor | None
                ) -> dict[int, tuple[tuple[int, ...], tuple[SampledLogprobs, ...]]]:
        """Sample every sampled row; each sequence emits its verified prefix (one token for
        an ordinary step). A row at offset o samples as if the o drafts before it were
        accepted (their ids count for penalties and the random position)."""
        if not layout.sample_rows:
            return {}
        states: list[torch.Tensor] = []
        rows: list[SamplingRow] = []
        for row, index, offset in zip(layout.sample_rows, layout.sample_seqs,
                                      layout.sample_offsets, strict=True):
            seq = step.seqs[index]
            slot = self._slots.get(seq.handle.slot)
            if slot is None or slot.handle != seq.handle:
                raise RuntimeError(f"slot {seq.handle} samples without initialised state")
            if len(slot.output_token_ids) != seq.output_index:
                raise RuntimeError(f"slot {seq.handle} has {len(slot.output_token_ids)} tokens, "
                                   f"the step samples token {seq.output_index}")
            if seq.resume_snapshot is not None and not seq.token_ids:
                states.append(self.snapshots.hidden[seq.resume_snapshot])
            else:
                assert hidden is not None
                states.append(hidden[row])
            outputs = slot.output_token_ids + list(seq.draft_token_ids[:offset])
            rows.append(SamplingRow(slot.params, outputs, slot.prompt_token_ids,
                                    seq.row_bitmask(offset)))
        logits = self.model.compute_logits(torch.stack(states))            # [S, V] float32
        batch = SamplingBatch.build(rows, self.vocab_size, self.eos_token_ids, self.device)
        out = self.sampler(logits, batch).to_lists(batch.num_top_logprobs)
        by_seq: dict[int, list[tuple[int, float, list[tuple[int, float]]]]] = {}
        for index, sampled in zip(layout.sample_seqs, out, strict=True):
            by_seq.setdefault(index, []).append(sampled)
        emitted: dict[int, tuple[tuple[int, ...], tuple[SampledLogprobs, ...]]] = {}
        for index, samples in by_seq.items():
            seq = step.seqs[index]
            slot = self._slots[seq.handle.slot]
            tokens = verified_tokens([token for token, _, _ in samples], seq.draft_token_ids)
            slot.output_token_ids.extend(tokens)
            infos: tuple[SampledLogprobs, ...] = ()
            if slot.params.logprobs:
                infos = tuple(SampledLogprobs(token, logprob,
                                              tuple(TokenLogprob(t, lp) for t, lp in top))
                              for token, logprob, top in samples[:len(tokens)])
            emitted[index] = (tuple(tokens), infos)
        return emitted

"""TorchRunner: executes steps with the model on one device (the CPU path; float32 exact).

Per step: restore snapshot tails into pages, run the forward pass over the packed rows (writing
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
from services.engine.model import CausalLM, ForwardBatch, KVCache
from services.engine.runner.inputs import build_forward_inputs
from services.engine.runner.snapshots import SnapshotStore
from services.engine.sampling import Sampler, SamplingBatch, SamplingParams, SamplingRow
from services.engine.scheduler.plan import Completion, SeqResult, SeqStep, SlotHandle, Step
from services.engine.scheduler.requests import SampledLogprobs, TokenLogprob

log = logging.getLogger(__name__)


@dataclass(slots=True)
class SlotSampling:
    handle: SlotHandle
    params: SamplingParams            # seed resolved
    prompt_token_ids: tuple[int, ...]
    output_token_ids: list[int]


class TorchRunner:
    def __init__(self, model: CausalLM, kv: KVCache, snapshots: SnapshotStore, *,
                 num_slots: int, eos_token_ids: tuple[int, ...] = ()) -> None:
        self.model = model
        self.kv = kv
        self.snapshots = snapshots
        self.sampler = Sampler()
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
        self._done.append(Completion(step.fence, results, time.perf_counter() - started))
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
        for seq in step.seqs:
            if seq.init is not None:
                self._install(seq)
        for seq in step.seqs:
            if seq.restore is not None:
                r = seq.restore
                self.snapshots.restore(r.snapshot_id, r.page_id, r.num_tokens)
        last_tokens = {slot: s.output_token_ids[-1] for slot, s in self._slots.items()
                       if s.output_token_ids}
        inputs = build_forward_inputs(step, self.page_size, self.device, last_tokens)
        hidden = None
        last_row: dict[int, int] = {}
        if inputs is not None:
            hidden = self.model(ForwardBatch(inputs.input_ids, inputs.positions, inputs.meta),
                                self.kv).hidden
            last_row = dict(zip(inputs.seq_indices, inputs.last_rows, strict=True))
            fed = [step.seqs[i] for i in inputs.seq_indices]
            self.last_hidden.index_put_(                                    # [B, H] rows
                (torch.tensor([s.handle.slot for s in fed], device=self.device),
                 torch.tensor([(s.end - 1) % 2 for s in fed], device=self.device)),
                hidden.index_select(0, torch.tensor(inputs.last_rows, device=self.device)))
        for index, seq in enumerate(step.seqs):
            if seq.resume_snapshot is not None:
                self.last_hidden[seq.handle.slot, (seq.start - 1) % 2].copy_(
                    self.snapshots.hidden[seq.resume_snapshot])
            if seq.capture is not None:
                c = seq.capture
                if index in last_row:
                    assert hidden is not None
                    state = hidden[last_row[index]]
                else:
                    state = self.last_hidden[seq.handle.slot, (c.endpoint - 1) % 2]
                self.snapshots.capture(c.snapshot_id, c.page_id, c.num_tokens, state)
        sampled = self._sample(step, hidden, last_row)
        return tuple(SeqResult(seq.handle, seq.end, *sampled.get(index, (None, None)))
                     for index, seq in enumerate(step.seqs))

    def _install(self, seq: SeqStep) -> None:
        init = seq.init
        assert init is not None
        params = init.params if isinstance(init.params, SamplingParams) else SamplingParams()
        params = dataclasses.replace(params, seed=init.seed, logprobs=init.logprobs,
                                     top_logprobs=init.top_logprobs)
        self._slots[seq.handle.slot] = SlotSampling(seq.handle, params, init.prompt_token_ids,
                                                    list(init.output_token_ids))

    def _sample(self, step: Step, hidden: torch.Tensor | None, last_row: dict[int, int]
                ) -> dict[int, tuple[int, SampledLogprobs | None]]:
        indices = [i for i, seq in enumerate(step.seqs) if seq.sample]
        if not indices:
            return {}
        states: list[torch.Tensor] = []
        slots: list[SlotSampling] = []
        for index in indices:
            seq = step.seqs[index]
            slot = self._slots.get(seq.handle.slot)
            if slot is None or slot.handle != seq.handle:
                raise RuntimeError(f"slot {seq.handle} samples without initialised state")
            if len(slot.output_token_ids) != seq.output_index:
                raise RuntimeError(f"slot {seq.handle} has {len(slot.output_token_ids)} tokens, "
                                   f"the step samples token {seq.output_index}")
            if seq.resume_snapshot is not None:
                states.append(self.snapshots.hidden[seq.resume_snapshot])
            else:
                assert hidden is not None
                states.append(hidden[last_row[index]])
            slots.append(slot)
        logits = self.model.compute_logits(torch.stack(states))            # [N, V] float32
        rows = [SamplingRow(s.params, s.output_token_ids, s.prompt_token_ids,
                            step.seqs[i].allowed_tokens)
                for i, s in zip(indices, slots, strict=True)]
        batch = SamplingBatch.build(rows, self.vocab_size, self.eos_token_ids, self.device)
        out = self.sampler(logits, batch).to_lists(batch.num_top_logprobs)
        sampled: dict[int, tuple[int, SampledLogprobs | None]] = {}
        for index, slot, (token, logprob, top) in zip(indices, slots, out, strict=True):
            slot.output_token_ids.append(token)
            info = None
            if slot.params.logprobs:
                info = SampledLogprobs(token, logprob,
                                       tuple(TokenLogprob(t, lp) for t, lp in top))
            sampled[index] = (token, info)
        return sampled

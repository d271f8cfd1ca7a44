"""Per-slot sampling state that lives on the device between steps.

Row s holds slot s's sampling parameters, its seed halves, how many tokens it has generated
(the random stream's counter), its last sampled token (the next decode's input when that
decode was planned before the token reached the host), its hidden states by position parity,
and, for requests that use them, penalty counts, prompt mask, logit bias and the stop ids that
min_tokens suppresses. The last row (index num_slots) belongs to the padding rows of captured
graphs: whatever they sample lands there.

A step never rebuilds this from Python lists: `install` writes a new request's row once (from
its `SamplingInit`), and the sampler updates counters, last tokens and counts on the device.
The host keeps a `SlotInfo` per slot: the flags that choose a step's sampling mode and which
optional rows a later occupant must clear.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

import torch

from services.engine.runner.frames import BulkStaging
from services.engine.runner.step_inputs import StepInputs
from services.engine.sampling import SamplingParams
from services.engine.sampling.random_stream import split_seed
from services.engine.scheduler.plan import SamplingInit, SlotHandle


class SamplingMode(enum.IntEnum):
    """What a step's sampler must do, the least that serves every row (graphs per mode)."""

    GREEDY = 0      # argmax of the model's logits
    RANDOM = 1      # temperature + Gumbel draw (greedy rows still take the argmax)
    FULL = 2        # + logit bias, min_tokens suppression, penalties, min_p, top_k, top_p


FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence", "frequency", "repetition")
INT_FIELDS = ("seed_lo", "seed_hi", "top_k", "min_tokens", "output_pos", "last_token")


@dataclass(slots=True)
class SlotInfo:
    handle: SlotHandle
    params: SamplingParams          # seed resolved
    outputs: int                    # tokens sampled in this slot (incl. ones dropped later)
    mode: SamplingMode
    logprobs: bool
    top_logprobs: int
    suppress_until: int             # min_tokens when stop ids / EOS are suppressed, else 0


def slot_mode(params: SamplingParams, suppresses: bool) -> SamplingMode:
    if (params.logit_bias or params.has_penalties or suppresses or params.min_p > 0 or
            params.top_k_enabled or params.top_p < 1):
        return SamplingMode.FULL
    return SamplingMode.GREEDY if params.is_greedy else SamplingMode.RANDOM


class SlotState:
    """Device tensors, rows = num_slots + 1 (the last for padding)."""

    def __init__(self, num_slots: int, vocab_size: int, hidden_size: int,
                 hidden_dtype: torch.dtype, device: torch.device,
                 eos_token_ids: tuple[int, ...] = (), token_vocab: int | None = None,
                 width: int = 1) -> None:
        rows = num_slots + 1
        self.num_slots = num_slots
        self.num_rows = rows
        self.width = width                  # sampled rows per slot in a verification step
        self.padding_row = num_slots
        self.vocab_size = vocab_size        # logits columns (the model's embedding rows)
        # the tokenizer's ids: columns past it are masked before sampling (sampling/vocab.py)
        self.token_vocab = vocab_size if token_vocab is None else min(token_vocab, vocab_size)
        self.device = device
        self.eos_token_ids = eos_token_ids
        self.floats = {name: torch.zeros(rows, dtype=torch.float32, device=device)
                       for name in FLOAT_FIELDS}
        self.ints = {name: torch.zeros(rows, dtype=torch.int64, device=device)
                     for name in INT_FIELDS}
        self.ints["top_k"].fill_(vocab_size)
        self.floats["top_p"].fill_(1.0)
        self.floats["repetition"].fill_(1.0)
        # [rows, V]: only FULL steps read these and only their rows' owners set them
        self.counts = torch.zeros((rows, vocab_size), dtype=torch.int32, device=device)
        self.prompt_mask = torch.zeros((rows, vocab_size), dtype=torch.bool, device=device)
        self.bias = torch.zeros((rows, vocab_size), dtype=torch.float32, device=device)
        self.stop_mask = torch.zeros((rows, vocab_size), dtype=torch.bool, device=device)
        # structured outputs: each slot's allowed-token bitmask [rows, ceil(V / 32)] int32,
        # all ones (every token) except while a constrained choice occupies the slot; steps
        # that sample such a choice upload its row first (`install_bitmasks`). Verification
        # rows have their own: row `bitmask_row(slot, offset)` = offset * rows + slot
        self.token_bitmask = torch.full((rows * width, (vocab_size + 31) // 32), -1,
                                        dtype=torch.int32, device=device)
        self._constrained: set[int] = set()   # bitmask rows that are not all ones
        # hidden state of each slot's last fed rows, by position parity: [rows * 2, H]
        self.last_hidden = torch.zeros((rows * 2, hidden_size), dtype=hidden_dtype,
                                       device=device)
        self.info: dict[int, SlotInfo] = {}
        self._dirty: set[int] = set()       # slots whose optional [V] rows are not zero

    @property
    def last_token(self) -> torch.Tensor:
        return self.ints["last_token"]

    @property
    def output_pos(self) -> torch.Tensor:
        return self.ints["output_pos"]

    @property
    def num_bytes(self) -> int:
        tensors = [*self.floats.values(), *self.ints.values(), self.counts, self.prompt_mask,
                   self.bias, self.stop_mask, self.last_hidden, self.token_bitmask]
        return sum(t.numel() * t.element_size() for t in tensors)

    # -- host side --------------------------------------------------------------------------
    def mode(self, slots: list[int]) -> tuple[SamplingMode, bool]:
        """The sampling mode and whether logprobs are needed for a step sampling `slots`."""
        mode = SamplingMode.GREEDY
        logprobs = False
        for slot in slots:
            info = self.info[slot]
            current = info.mode
            if current is SamplingMode.FULL and not (
                    info.params.logit_bias or info.params.has_penalties or
                    info.params.min_p > 0 or info.params.top_k_enabled or
                    info.params.top_p < 1) and info.outputs >= info.suppress_until:
                # only min_tokens made it FULL, and that is over now
                current = info.mode = slot_mode(info.params, False)
            mode = max(mode, current)
            logprobs = logprobs or info.logprobs
        return mode, logprobs

    def check(self, handle: SlotHandle, output_index: int) -> SlotInfo:
        info = self.info.get(handle.slot)
        if info is None or info.handle != handle:
            raise RuntimeError(f"slot {handle} samples without initialised state")
        if info.outputs != output_index:
            raise RuntimeError(f"slot {handle} has sampled {info.outputs} tokens, the step "
                               f"samples token {output_index}")
        return info

    # -- installing a slot's row ------------------------------------------------------------
    def register(self, handle: SlotHandle, init: SamplingInit) -> SlotInfo:
        """Host side of (re)initialising a slot from the step's `SamplingInit`."""
        params = init.params if isinstance(init.params, SamplingParams) else SamplingParams()
        params = dataclasses.replace(params, seed=init.seed, logprobs=init.logprobs,
                                     top_logprobs=init.top_logprobs)
        outputs = len(init.output_token_ids)
        info = SlotInfo(handle, params, outputs, slot_mode(params, params.min_tokens > outputs),
                        init.logprobs, init.top_logprobs if init.logprobs else 0,
                        params.min_tokens)
        self.info[handle.slot] = info
        return info

    def pack_inits(self, values: StepInputs, inits: list[tuple[SlotInfo, SamplingInit]]
                   ) -> None:
        """The scalar rows of `inits` into the step's inputs (init_slots / _ints / _floats)."""
        slots: list[int] = []
        ints: list[int] = []
        floats: list[float] = []
        for info, init in inits:
            params = info.params
            lo, hi = split_seed(params.seed or 0)
            outputs = init.output_token_ids
            row = {"seed_lo": lo, "seed_hi": hi,
                   "top_k": params.top_k if params.top_k_enabled else self.vocab_size,
                   "min_tokens": params.min_tokens, "output_pos": len(outputs),
                   "last_token": outputs[-1] if outputs else 0}
            reals = {"temperature": 0.0 if params.is_greedy else params.temperature,
                     "top_p": params.top_p, "min_p": params.min_p,
                     "presence": params.presence_penalty,
                     "frequency": params.frequency_penalty,
                     "repetition": params.repetition_penalty}
            slots.append(info.handle.slot)
            ints.extend(row[name] for name in INT_FIELDS)
            floats.extend(reals[name] for name in FLOAT_FIELDS)
        values.init_slots = slots
        values.init_ints = ints
        values.init_floats = floats

    def install(self, views: StepInputs[torch.Tensor]) -> None:
        """Write the staged scalar rows (device ops on the current stream)."""
        slots = views.init_slots
        count = slots.shape[0]
        if not count:
            return
        ints = views.init_ints.view(count, len(INT_FIELDS))
        floats = views.init_floats.view(count, len(FLOAT_FIELDS))
        for k, name in enumerate(INT_FIELDS):
            self.ints[name].index_copy_(0, slots, ints[:, k])
        for k, name in enumerate(FLOAT_FIELDS):
            self.floats[name].index_copy_(0, slots, floats[:, k])

    # -- structured outputs -----------------------------------------------------------------
    def bitmask_row(self, slot: int, offset: int = 0) -> int:
        """The bitmask row of a slot's sampled row at verification offset `offset`."""
        return offset * self.num_rows + slot

    def pack_bitmasks(self, values: StepInputs, rows: list[tuple[int, object]],
                      released: list[int]) -> None:
        """The step's grammar rows (bitmask row, int32 bitmask) into its inputs
        (bitmask_slots / bitmask_words), and the rows to reset to all ones (a constrained
        choice left them: bitmask_reset). The fields stay empty in steps without grammars."""
        slots = [slot for slot, _ in rows]
        values.bitmask_slots = slots
        if rows:
            import numpy as np

            values.bitmask_words = np.concatenate([mask for _, mask in rows])  # type: ignore
        values.bitmask_reset = released
        self._constrained.update(slots)
        self._constrained.difference_update(released)

    def released_bitmasks(self, inits: list[tuple[SlotInfo, SamplingInit]],
                          grammar_rows: set[int]) -> list[int]:
        """Bitmask rows of slots a new occupant takes over that a constrained choice left
        (and this step does not upload again)."""
        slots = {info.handle.slot for info, _ in inits}
        return sorted(row for row in self._constrained
                      if row % self.num_rows in slots and row not in grammar_rows)

    def install_bitmasks(self, views: StepInputs[torch.Tensor]) -> None:
        """Write the staged bitmask rows (device ops on the current stream, before the
        step's graph or body: a graph reads the persistent rows)."""
        reset = views.bitmask_reset
        if reset.shape[0]:
            self.token_bitmask.index_fill_(0, reset, -1)
        slots = views.bitmask_slots
        if slots.shape[0]:
            words = views.bitmask_words.view(slots.shape[0], -1)
            self.token_bitmask.index_copy_(0, slots, words)

    def needs_rows(self, info: SlotInfo) -> bool:
        """Whether installing this slot touches its [V]-sized rows: a FULL request fills
        them; a slot whose last occupant had a bias or stop row must clear them."""
        return info.handle.slot in self._dirty or info.mode is SamplingMode.FULL

    def install_rows(self, staging: BulkStaging, inits: list[tuple[SlotInfo, SamplingInit]]
                     ) -> None:
        """Clear a previous occupant's optional rows and fill this request's: output counts,
        prompt mask (repetition penalty), logit bias, the ids min_tokens suppresses. Rare: only
        requests that use them (FULL mode) and slots whose last occupant did."""
        work = [(info, init) for info, init in inits if self.needs_rows(info)]
        if not work:
            return
        lists: list[tuple[int, list[int], list[int], list[int], list[float], list[int]]] = []
        for info, init in work:
            params = info.params
            outputs = list(init.output_token_ids) if params.has_penalties else []
            prompt = (list(init.prompt_token_ids)
                      if params.repetition_penalty != 1 else [])
            bias_ids = [t for t, _ in params.logit_bias]
            bias_values = [v for _, v in params.logit_bias]
            stops = (sorted({*self.eos_token_ids, *params.stop_token_ids})
                     if params.min_tokens > len(init.output_token_ids) else [])
            lists.append((info.handle.slot, outputs, prompt, bias_ids, bias_values, stops))
        i64_lists: list[list[int]] = []
        f32_lists: list[list[float]] = []
        for _, outputs, prompt, bias_ids, bias_values, stops in lists:
            i64_lists += [outputs, prompt, bias_ids, stops]
            f32_lists.append(bias_values)
        i64, f32 = staging.upload(i64_lists, f32_lists)
        for n, (slot, outputs, prompt, bias_ids, _, stops) in enumerate(lists):
            out_ids, prompt_ids, bias_idx, stop_ids = i64[4 * n:4 * n + 4]
            for tensor in (self.counts, self.prompt_mask, self.bias, self.stop_mask):
                tensor[slot].zero_()
            if outputs:
                self.counts[slot].index_add_(0, out_ids,
                                             torch.ones_like(out_ids, dtype=torch.int32))
            if prompt:
                self.prompt_mask[slot].index_fill_(0, prompt_ids, True)
            if bias_ids:
                self.bias[slot].index_copy_(0, bias_idx, f32[n])
            if stops:
                self.stop_mask[slot].index_fill_(0, stop_ids, True)
            # counts and prompt mask only matter to rows with penalties (which install
            # them); the bias and stop rows apply to every row of a FULL step: clear later
            if bias_ids or stops:
                self._dirty.add(slot)
            else:
                self._dirty.discard(slot)

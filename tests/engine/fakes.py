"""A fake runner whose "model" reads its KV cache through the page table.

The fake writes each fed token id into its page slot, and a sampled token is a hash of the
whole prefix *as read back through the page table* (or of a snapshot's saved state). So any
paging mistake (a page reused too early, a wrong restore, a missing capture, a host-tier copy
to or from the wrong page) changes the tokens,
and `reference_tokens` says what a correct engine must produce for a prompt, whatever the
batching, chunking, caching or preemption. Completions can be held back to test in-flight
cancellation.
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.engine.model.attention import kv_slot
from services.engine.runner.layout import layout_step, verified_tokens
from services.engine.scheduler.plan import Completion, SeqResult, Step
from services.engine.scheduler.requests import EngineRequest, PromptLogprob, RequestUpdate
from services.engine.scheduler.scheduler import Scheduler, choice_seed


def _fingerprint(tokens: Sequence[int | None]) -> bytes:
    return hashlib.blake2b(repr(tuple(tokens)).encode(), digest_size=16).digest()


def next_token(fingerprint: bytes, seed: int, vocab: int) -> int:
    digest = hashlib.blake2b(fingerprint + seed.to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % vocab


def reference_tokens(prompt: Sequence[int], count: int, *, seed: int = 0, vocab: int = 1000,
                     eos: frozenset[int] = frozenset(), choice: int = 0) -> list[int]:
    tokens = list(prompt)
    out: list[int] = []
    seed = choice_seed(seed, choice)
    while len(out) < count:
        token = next_token(_fingerprint(tokens), seed, vocab)
        out.append(token)
        tokens.append(token)
        if token in eos:
            break
    return out


def fake_prompt_logprob(prefix: Sequence[int | None], token: int) -> float:
    """The fake model's logprob of `token` after `prefix` (read through the page table)."""
    digest = hashlib.blake2b(_fingerprint(prefix) + token.to_bytes(8, "little"),
                             digest_size=4).digest()
    return -int.from_bytes(digest, "little") / 2**32 * 10


def fake_hidden(prefix: Sequence[int | None]) -> tuple[float, ...]:
    """The fake model's 4-dim "hidden state" of the last row of `prefix`."""
    digest = _fingerprint(prefix)
    return tuple(float(b) - 128.0 for b in digest[:4])


def first_allowed(bitmask, token: int, banned: set[int]) -> int:
    """The first token at or after `token` (wrapping) whose bit is set and that is not banned:
    what a sampler's grammar mask does to the fake's hashed choice."""
    bits = np.unpackbits(np.asarray(bitmask, dtype=np.int32).view(np.uint8),
                         bitorder="little")
    allowed = [t for t in np.flatnonzero(bits).tolist() if t not in banned]
    assert allowed, "the grammar allows no token"
    later = [t for t in allowed if t >= token]
    return later[0] if later else allowed[0]


class FakeRunner:
    def __init__(self, *, num_pages: int, page_size: int, num_snapshots: int,
                 vocab: int = 1000) -> None:
        self.page_size = page_size
        self.vocab = vocab
        self.kv: list[list[int | None]] = [[None] * page_size for _ in range(num_pages)]
        self.snapshot_tail: dict[int, tuple[int | None, ...]] = {}
        self.snapshot_state: dict[int, bytes] = {}
        self.seeds: dict[int, int] = {}
        self.last_token: dict[int, int] = {}   # slot -> last sampled (feeds pending tokens)
        self.window = 1                   # 2: the engine loop overlaps steps (two frames)
        self.done: deque[Completion] = deque()
        self.hold = False                 # keep completions back until release()
        self.held: deque[Completion] = deque()
        self.steps: list[Step] = []
        self.completed: list[Completion] = []   # every completion produced, in order
        self.drain_ok = True              # what drain() reports
        self.fail_at: int | None = None   # raise inside submit of this fence
        self.gate: threading.Event | None = None   # submit waits for it (hold the loop)
        self.ignore_grammar = False       # sample past the grammar's bitmask (inject errors)
        self.host: dict[int, list[int | None]] = {}   # host-tier pages (KVTransfers)

    def submit(self, step: Step) -> int:
        if self.gate is not None:
            self.gate.wait(30)
        if self.fail_at is not None and step.fence >= self.fail_at:
            raise RuntimeError(f"injected device fault at fence {step.fence}")
        self.steps.append(step)
        size = self.page_size
        for gpu, host in step.transfers.offload:      # offloads first, then onloads
            self.host[host] = list(self.kv[gpu])
        for host, gpu in step.transfers.onload:
            self.kv[gpu] = list(self.host[host])
        for s in step.seqs:
            if s.init is not None:
                self.seeds[s.handle.slot] = s.init.seed
            if s.restore is not None:
                tail = self.snapshot_tail[s.restore.snapshot_id]
                assert len(tail) == s.restore.num_tokens
                self.kv[s.restore.page_id][:len(tail)] = list(tail)
        layout = layout_step(step, size)
        for token, pending, slot in zip(layout.token_ids, layout.pending_slots,
                                        layout.kv_slots, strict=True):
            self.kv[slot // size][slot % size] = \
                self.last_token[pending] if pending >= 0 else token
        results = []
        for s in step.seqs:
            for tail in s.tail_captures:      # the partial page alone: no state to resume
                self.snapshot_state.pop(tail.snapshot_id, None)
                self.snapshot_tail[tail.snapshot_id] = tuple(
                    self.kv[tail.page_id][:tail.num_tokens] if tail.num_tokens else [])
            state = b""
            if s.token_ids or (s.capture is not None and s.resume_snapshot is None):
                state = _fingerprint(self._read(s.page_ids, s.end))
            if s.capture is not None:
                self.snapshot_state[s.capture.snapshot_id] = state
                tail = self.kv[s.capture.page_id][:s.capture.num_tokens] \
                    if s.capture.num_tokens else []
                self.snapshot_tail[s.capture.snapshot_id] = tuple(tail)
            scored = tuple(
                PromptLogprob(s.start + 1 + j, target,
                              fake_prompt_logprob(self._read(s.page_ids, s.start + 1 + j),
                                                  target), 1)
                for j, target in enumerate(s.score_targets))
            pooled: tuple[float, ...] = ()
            if s.pool == "last":
                pooled = fake_hidden(self._read(s.page_ids, s.end))
            elif s.pool == "mean":
                rows = [fake_hidden(self._read(s.page_ids, p + 1)) for p in range(s.start, s.end)]
                pooled = tuple(sum(column) for column in zip(*rows, strict=True))
            if not s.sample:
                results.append(SeqResult(s.handle, s.end, prompt_logprobs=scored,
                                         pooled=pooled))
                continue
            sampled = []
            for offset in range(s.max_emit):
                position = s.sample_from + offset      # the row whose state samples
                if s.resume_snapshot is not None and not s.token_ids:
                    row_state = self.snapshot_state[s.resume_snapshot]
                else:
                    row_state = _fingerprint(self._read(s.page_ids, position + 1))
                sampled.append(self._sample(s, row_state, offset))
            tokens = verified_tokens(sampled, s.draft_token_ids)
            self.last_token[s.handle.slot] = tokens[-1]
            results.append(SeqResult(s.handle, s.sample_from + len(tokens), tuple(tokens),
                                     prompt_logprobs=scored, pooled=pooled))
        completion = Completion(step.fence, tuple(results), duration_s=0.001)
        self.completed.append(completion)
        (self.held if self.hold else self.done).append(completion)
        return step.fence

    def _read(self, page_ids, end: int) -> list[int | None]:
        """Positions [0, end) of a sequence, read back through its page table."""
        size = self.page_size
        return [self.kv[slot // size][slot % size]
                for slot in (kv_slot(page_ids, p, size) for p in range(end))]

    def _sample(self, s, state: bytes, offset: int) -> int:
        seed = self.seeds[s.handle.slot]
        token = next_token(state, seed, self.vocab)
        banned = set(s.suppress_token_ids)   # (min_tokens: every sampled row of the step)
        while token in banned:          # what a sampler's mask does
            token = (token + 1) % self.vocab
        mask = s.row_bitmask(offset)      # a verification row's: after its drafts
        if mask is not None and not self.ignore_grammar:
            token = first_allowed(mask, token, banned)
        return token

    def poll(self) -> Completion | None:
        return self.done.popleft() if self.done else None

    def wait(self) -> Completion:
        self.release()
        completion = self.poll()
        assert completion is not None, "wait() with nothing outstanding"
        return completion

    def drain(self) -> bool:
        return self.drain_ok

    @property
    def outstanding(self) -> int:
        return len(self.done) + len(self.held)

    def release(self) -> None:
        self.done.extend(self.held)
        self.held.clear()


def run_step(scheduler: Scheduler, runner: FakeRunner) -> tuple[bool, list[RequestUpdate]]:
    """One plan -> commit -> submit -> complete round; (did anything happen, updates)."""
    updates: list[RequestUpdate] = []
    plan = scheduler.plan()
    if plan is not None:
        fence = scheduler.state.resources.fences.next_fence
        runner.submit(scheduler.commit(plan, fence))
    completed = False
    while (completion := runner.poll()) is not None:
        updates.extend(scheduler.complete(completion))
        completed = True
    return plan is not None or completed, updates


@dataclass(frozen=True)
class Arrival:
    """A request admitted at `step`, cancelled `cancel_after` steps later (None: never)."""

    step: int
    request: EngineRequest
    cancel_after: int | None = None


def run_arrivals(scheduler: Scheduler, runner: FakeRunner, arrivals: Sequence[Arrival], *,
                 hold_every: int = 0, max_steps: int = 4000
                 ) -> tuple[dict[str, dict[int, list[int]]], set[str]]:
    """Random-workload driver: admit each arrival at its step, cancel the ones due, hold every
    (hold_every + 1)-th step's completions back, and run until idle (asserting progress).
    Returns request id -> choice -> tokens, and the ids a cancel actually stopped."""
    pending = sorted(arrivals, key=lambda arrival: arrival.step)
    cancel_at: dict[str, int] = {}
    cancelled: set[str] = set()
    outputs: dict[str, dict[int, list[int]]] = {}
    for step in range(max_steps):
        while pending and pending[0].step <= step:
            arrival = pending.pop(0)
            scheduler.admit(arrival.request)
            if arrival.cancel_after is not None:
                cancel_at[arrival.request.request_id] = step + arrival.cancel_after
        for rid, when in list(cancel_at.items()):
            if when <= step:
                del cancel_at[rid]
                if scheduler.cancel(rid) is not None:
                    cancelled.add(rid)
        runner.hold = bool(hold_every) and step % (hold_every + 1) == 0
        if not runner.hold:
            runner.release()
        ran, updates = run_step(scheduler, runner)
        collect(outputs, updates)
        if not pending and not scheduler.has_work:
            break
        assert ran or pending or runner.held or scheduler.state.in_flight, "stalled"
    assert not scheduler.has_work
    return outputs, cancelled


def run_until_idle(scheduler: Scheduler, runner: FakeRunner, max_steps: int = 10_000
                   ) -> dict[str, dict[int, list[int]]]:
    """Drive until no work is left; returns request id -> choice -> tokens."""
    outputs: dict[str, dict[int, list[int]]] = {}
    for _ in range(max_steps):
        ran, updates = run_step(scheduler, runner)
        collect(outputs, updates)
        if not scheduler.has_work:
            return outputs
        assert ran or scheduler.state.in_flight, "the scheduler stalled with work left"
    raise AssertionError("did not finish")


def collect(outputs: dict[str, dict[int, list[int]]], updates: list[RequestUpdate]) -> None:
    for update in updates:
        for delta in update.deltas:
            outputs.setdefault(update.request_id, {}).setdefault(delta.index, []).extend(
                delta.token_ids)


def run_step_two_frames(scheduler: Scheduler, runner: FakeRunner
                        ) -> tuple[bool, list[RequestUpdate]]:
    """One round of the engine loop with a window of two (as core/loop.py drives a two-frame
    runner): plan and submit while fewer than two steps are outstanding, complete the oldest
    when the window is full or nothing new could be planned. Held completions stay held."""
    updates: list[RequestUpdate] = []
    submitted = False
    if runner.outstanding < 2:
        plan = scheduler.plan()
        if plan is not None:
            fence = scheduler.state.resources.fences.next_fence
            runner.submit(scheduler.commit(plan, fence))
            submitted = True
    completed = False
    if runner.done and (runner.outstanding >= 2 or not submitted):
        updates.extend(scheduler.complete(runner.done.popleft()))
        completed = True
    return submitted or completed, updates


def run_like_the_loop(scheduler: Scheduler, runner, max_rounds: int = 100_000
                      ) -> dict[str, dict[int, list[int]]]:
    """Drive to idle exactly as core/loop.py does: plan and submit while the runner's window
    has room, wait for the oldest completion when it is full or nothing could be planned."""
    outputs: dict[str, dict[int, list[int]]] = {}
    for _ in range(max_rounds):
        submitted = False
        if runner.outstanding < runner.window:
            plan = scheduler.plan()
            if plan is not None:
                fence = scheduler.state.resources.fences.next_fence
                runner.submit(scheduler.commit(plan, fence))
                submitted = True
        if runner.outstanding and (runner.outstanding >= runner.window or not submitted):
            collect(outputs, scheduler.complete(runner.wait()))
        while (completion := runner.poll()) is not None:
            collect(outputs, scheduler.complete(completion))
        if not scheduler.has_work:
            return outputs
    raise AssertionError("did not finish")

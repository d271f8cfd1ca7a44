"""The slot sampler's verification rows (what verification graphs and eager verification
steps run) against its one-token path: row o of a sequence samples exactly what a decode
would after its o drafts were accepted (random position, min_tokens, penalty counts), the
slot advances by exactly the emitted prefix, and the last emitted row is marked."""

from __future__ import annotations

import torch

from services.engine.runner.layout import verified_tokens
from services.engine.runner.slot_sampler import SampleOutputs, VerifyRows, sample_rows
from services.engine.runner.slot_state import SamplingMode, SlotState

VOCAB = 48


def _state() -> SlotState:
    state = SlotState(3, VOCAB, 8, torch.float32, torch.device("cpu"), eos_token_ids=(5,),
                      width=4)
    generator = torch.Generator().manual_seed(3)
    for slot, (temperature, lo) in enumerate(((0.9, 11), (1.3, 12), (0.0, 13))):
        state.floats["temperature"][slot] = temperature
        state.floats["presence"][slot] = 1.5
        state.floats["frequency"][slot] = 1.0
        state.floats["repetition"][slot] = 1.4
        state.ints["seed_lo"][slot] = lo
        state.ints["output_pos"][slot] = 2 + slot
        state.ints["min_tokens"][slot] = 4
        state.stop_mask[slot, 5] = True
        state.counts[slot] = torch.randint(0, 2, (VOCAB,), generator=generator,
                                           dtype=torch.int32)
        state.prompt_mask[slot] = torch.rand(VOCAB, generator=generator) < 0.2
    return state


def _copy(state: SlotState) -> SlotState:
    other = _state()
    for name in state.ints:
        other.ints[name].copy_(state.ints[name])
    other.counts.copy_(state.counts)
    return other


def test_verification_rows_sample_as_decodes_after_their_drafts():
    generator = torch.Generator().manual_seed(0)
    # 3 sequences x 3 rows, each sequence's rows alike (as a repetitive model's): a row
    # repeats the token before it unless the drafts' penalty counts push it away
    logits = (torch.randn((3, 1, VOCAB), generator=generator) * 2).expand(3, 3, VOCAB)
    logits = logits.reshape(9, VOCAB).contiguous()
    slots = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # drafts chosen so that some rows match and some do not (found from the reference below)
    reference_ids: list[int] = []
    drafts_of: dict[int, list[int]] = {}
    for seq in range(3):
        base = _state()
        drafts: list[int] = []
        for offset in range(3):
            row = 3 * seq + offset
            probe = _copy(base)
            probe.ints["output_pos"][seq] += offset
            for token in drafts:
                probe.counts[seq, token] += 1
            out = SampleOutputs.allocate(1, torch.device("cpu"))
            sample_rows(logits[row:row + 1], torch.tensor([seq]), probe, SamplingMode.FULL,
                        False, out)
            token = int(out.ids[0, 0])
            reference_ids.append(token)
            # sequence 0 accepts both drafts, 1 rejects the second, 2 rejects the first
            accept = seq == 0 or (seq == 1 and offset == 0)
            drafts.append(token if accept else (token + 1) % VOCAB)
        drafts_of[seq] = drafts[:2]
    state = _state()
    verify = VerifyRows(torch.tensor([0, 1, 2] * 3),
                        torch.tensor([d for s in range(3) for d in (*drafts_of[s], -1)]),
                        torch.tensor([0, 0, 0, 3, 3, 3, 6, 6, 6]))
    out = SampleOutputs.allocate(9, torch.device("cpu"))
    last = sample_rows(logits, torch.tensor(slots), state, SamplingMode.FULL, False, out,
                       verify=verify)
    ids = out.ids[0, :9].tolist()
    assert ids == reference_ids
    assert last is not None
    emitted = [verified_tokens(ids[3 * s:3 * s + 3], tuple(drafts_of[s])) for s in range(3)]
    assert [len(e) for e in emitted] == [3, 2, 1]
    assert last.tolist() == [False, False, True, False, True, False, True, False, False]
    before = _state()
    for seq in range(3):
        assert int(state.ints["output_pos"][seq]) == \
            int(before.ints["output_pos"][seq]) + len(emitted[seq])
        assert int(state.ints["last_token"][seq]) == emitted[seq][-1]
        expected = before.counts[seq].clone()
        for token in emitted[seq]:
            expected[token] += 1
        assert torch.equal(state.counts[seq], expected)

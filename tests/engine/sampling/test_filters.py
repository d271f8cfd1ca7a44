"""Each batched filter equals its one-row reference on random logits (hypothesis)."""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from services.engine.sampling import filters, reference

logit = st.floats(-8, 8, allow_nan=False, width=32)
# examples too close to a float32 rounding edge are skipped (assume); that may skip many
edge_settings = settings(max_examples=80, deadline=None,
                         suppress_health_check=[HealthCheck.filter_too_much])


@st.composite
def logit_rows(draw, min_vocab: int = 2, max_vocab: int = 24, max_rows: int = 4):
    vocab = draw(st.integers(min_vocab, max_vocab))
    rows = draw(st.integers(1, max_rows))
    # a coarse grid makes ties (and their boundary rules) common
    grid = draw(st.booleans())
    values = st.integers(-4, 4).map(float) if grid else logit
    return [draw(st.lists(values, min_size=vocab, max_size=vocab)) for _ in range(rows)]


def masks_equal(batched: torch.Tensor, rows: list[list[float]]) -> None:
    expected = torch.tensor(rows, dtype=torch.float32)
    assert torch.equal(torch.isinf(batched), torch.isinf(expected))
    finite = ~torch.isinf(expected)
    torch.testing.assert_close(batched[finite], expected[finite], rtol=1e-6, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(logit_rows(), st.data())
def test_penalties(rows, data) -> None:
    vocab = len(rows[0])
    token = st.integers(0, vocab - 1)
    outputs = [data.draw(st.lists(token, max_size=8)) for _ in rows]
    prompts = [data.draw(st.lists(token, max_size=8)) for _ in rows]
    presence = [data.draw(st.floats(-2, 2)) for _ in rows]
    frequency = [data.draw(st.floats(-2, 2)) for _ in rows]
    repetition = [data.draw(st.floats(0.05, 2)) for _ in rows]
    counts = torch.zeros(len(rows), vocab, dtype=torch.int32)
    prompt_mask = torch.zeros(len(rows), vocab, dtype=torch.bool)
    for i, (out, prompt) in enumerate(zip(outputs, prompts, strict=True)):
        for t in out:
            counts[i, t] += 1
        prompt_mask[i, prompt] = True
    batched = filters.apply_penalties(torch.tensor(rows), counts, prompt_mask,
                                      torch.tensor(presence), torch.tensor(frequency),
                                      torch.tensor(repetition))
    expected = [reference.apply_penalties(r, p, o, pr, f, rep) for r, p, o, pr, f, rep in
                zip(rows, prompts, outputs, presence, frequency, repetition, strict=True)]
    torch.testing.assert_close(batched, torch.tensor(expected, dtype=torch.float32),
                               rtol=1e-5, atol=1e-5)


@edge_settings
@given(logit_rows(), st.data())
def test_min_p(rows, data) -> None:
    min_p = [data.draw(st.floats(0, 1)) for _ in rows]
    for row, m in zip(rows, min_p, strict=True):   # stay clear of float32 rounding at the edge
        probs = reference.softmax(row)
        assume(all(abs(p - max(probs) * m) > 1e-5 for p in probs))
    batched = filters.apply_min_p(torch.tensor(rows), torch.tensor(min_p))
    masks_equal(batched, [reference.apply_min_p(r, m) for r, m in zip(rows, min_p,
                                                                      strict=True)])


@settings(max_examples=80, deadline=None)
@given(logit_rows(), st.data())
def test_top_k(rows, data) -> None:
    vocab = len(rows[0])
    top_k = [data.draw(st.integers(1, vocab + 3)) for _ in rows]
    expected = [reference.apply_top_k(r, k) for r, k in zip(rows, top_k, strict=True)]
    batched = filters.apply_top_k_top_p(torch.tensor(rows), torch.tensor(top_k), None)
    masks_equal(batched, expected)
    # sorting only the largest max(top_k) logits gives the same (ties included)
    candidates = filters.apply_top_k_top_p(torch.tensor(rows), torch.tensor(top_k), None,
                                           num_candidates=max(top_k))
    masks_equal(candidates, expected)


def _clear_of_top_p_edge(row: list[float], top_p: float) -> bool:
    probs = sorted(reference.softmax(row), reverse=True)
    mass = 0.0
    for p in probs:
        if abs(mass - top_p) < 1e-4:
            return False
        mass += p
    return True


@edge_settings
@given(logit_rows(), st.data())
def test_top_p(rows, data) -> None:
    top_p = [data.draw(st.floats(0.01, 1)) for _ in rows]
    assume(all(_clear_of_top_p_edge(r, p) for r, p in zip(rows, top_p, strict=True)))
    batched = filters.apply_top_k_top_p(torch.tensor(rows), None, torch.tensor(top_p))
    masks_equal(batched, [reference.apply_top_p(r, p) for r, p in zip(rows, top_p,
                                                                      strict=True)])


@edge_settings
@given(logit_rows(), st.data())
def test_top_k_then_top_p(rows, data) -> None:
    vocab = len(rows[0])
    top_k = [data.draw(st.integers(1, vocab)) for _ in rows]
    top_p = [data.draw(st.floats(0.01, 1)) for _ in rows]
    expected_k = [reference.apply_top_k(r, k) for r, k in zip(rows, top_k, strict=True)]
    assume(all(_clear_of_top_p_edge(r, p) for r, p in zip(expected_k, top_p, strict=True)))
    expected = [reference.apply_top_p(r, p) for r, p in zip(expected_k, top_p, strict=True)]
    for num_candidates in (None, max(top_k)):
        batched = filters.apply_top_k_top_p(torch.tensor(rows), torch.tensor(top_k),
                                            torch.tensor(top_p), num_candidates)
        masks_equal(batched, expected)


def test_every_filter_keeps_the_top_token() -> None:
    logits = torch.tensor([[0.0, 5.0, 5.0, -1.0], [3.0, 2.0, 1.0, 0.0]])
    kept = filters.apply_top_k_top_p(logits, torch.tensor([1, 1]), torch.tensor([1e-6, 1e-6]))
    assert kept[0].isfinite().tolist() == [False, True, True, False]   # tie at the top stays
    assert kept[1].isfinite().tolist() == [True, False, False, False]
    kept = filters.apply_min_p(logits, torch.tensor([1.0, 1.0]))
    assert kept.isfinite().sum().item() == 3


def test_logit_bias_and_suppression() -> None:
    logits = torch.zeros(2, 5)
    filters.add_logit_bias_(logits, torch.tensor([0, 1, 1]), torch.tensor([4, 0, 4]),
                            torch.tensor([2.0, -1.0, 3.0]))
    filters.suppress_tokens_(logits, torch.tensor([0]), torch.tensor([1]))
    assert logits.tolist() == [[0.0, -math.inf, 0.0, 0.0, 2.0], [-1.0, 0.0, 0.0, 0.0, 3.0]]


def test_temperature_leaves_greedy_rows_alone() -> None:
    logits = torch.tensor([[1.0, 2.0], [1.0, 2.0]])
    out = filters.apply_temperature(logits, torch.tensor([0.0, 0.5]))
    assert out.tolist() == [[1.0, 2.0], [2.0, 4.0]]


def test_candidate_sort_leaves_rows_without_top_k_whole() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 1.0], [4.0, 3.0, 2.0, 1.0, 1.0]])
    out = filters.apply_top_k_top_p(logits, torch.tensor([2, 5]), torch.tensor([0.5, 1.0]),
                                    num_candidates=2)
    assert out[0].isfinite().tolist() == [True, False, False, False, False]
    assert out[1].isfinite().all()
    ties = filters.apply_top_k_top_p(logits, torch.tensor([4, 9]), None, num_candidates=4)
    assert ties[0].isfinite().all()   # the tie at the 4th value keeps both 1.0s

"""How many Triton compilations the eager (prefill / mixed) steps need across the shapes a
serving engine meets: each new one stalls its step while it compiles (0.5-2 s on the H200,
seen inside serving measurements), so per-step sizes must not create variants (the decode
graphs, captured at start-up, keep the specialised attention kernel). Checked on any
machine: launches are recorded and keyed the way Triton's JIT keys its cache, nothing runs
(in a subprocess without TRITON_INTERPRET, as the sm_90 compile checks)."""

from __future__ import annotations

from tests.kernels.test_package import compiled_json


def test_eager_steps_share_a_few_compilations() -> None:
    counts = compiled_json(
        "import json\n"
        "from tests.kernels.shapes import WINDOW, eager_step_variants\n"
        "print(json.dumps(eager_step_variants(30, windows=(0, WINDOW))))\n")
    full, both = counts["full"], counts["all"]
    # attention (prefill tiles here: every step has a prefill chunk): split or not; the
    # split reduction one per power-of-two split count it meets (a tiny kernel); the others
    # one each. With the per-step sizes specialised these 30 steps needed 6 attention and 2
    # norm compilations.
    for counts in (full, both):
        assert counts["_reduce_splits_kernel"] <= 6, counts
        assert counts["_rms_norm_kernel"] == 1 and counts["_qkv_prologue_kernel"] == 1, counts
    assert full["_paged_attention"] <= 2, full
    # a model with sliding-window layers (Gemma 3, Mistral) adds the windowed attention
    # kernel, split or not, and nothing else: the window is a constant, the split
    # reductions are shared
    assert both["_paged_attention"] <= 2 * full["_paged_attention"], both
    assert both["_reduce_splits_kernel"] <= full["_reduce_splits_kernel"] + 1, (full, both)

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


def test_eager_steps_launch_without_pdl_and_graphs_with_it() -> None:
    """PDL is a launch option that is part of a compilation's key. Eager steps launch without
    it, so no short eager step (a prompt's tail beside decodes, over any context) needs a PDL
    variant of its own that the warm-up would have to meet; with PDL on them,
    tests/engine/gpu/test_gpu_compiles.py saw one compile while serving. The graphs' capture
    and its warm-up run (`pdl.graph_launches`) launch with it. PDL is switched on for the CPU
    tensors here, as sm_90 has it."""
    flags = compiled_json(
        "import json\n"
        "from services.engine.kernels import pdl\n"
        "pdl.pdl_enabled = lambda device: True\n"
        "from tests.kernels.sm90_compile import compile_key\n"
        "from tests.kernels.shapes import record_eager_steps\n"
        "steps = [([2], [300]), ([1, 1, 1, 2], [700] * 4), ([5], [5]), ([1], [4000]),\n"
        "         ([16], [9000]), ([17], [9000])]\n"
        "def with_pdl():\n"
        "    launches = record_eager_steps(steps, 16384)[0]\n"
        "    return sorted({str(compile_key(l)[0]) for l in launches\n"
        "                   if ('PDL', True) in compile_key(l)[1]})\n"
        "eager = with_pdl()\n"
        "with pdl.graph_launches():\n"
        "    graph = with_pdl()\n"
        "print(json.dumps([eager, graph]))\n")
    eager, graph = flags
    assert eager == [], eager
    # attention, its split reduction, the norm and the prologue: each has a PDL variant
    assert len(graph) == 4, graph


def test_warm_up_covers_short_eager_steps() -> None:
    """Eager steps of at most skinny_linear.MAX_ROWS rows (a prompt's tail, alone or beside
    decodes, continuing a long prompt; a verification that no graph serves): the warm-up's
    shapes (runner/warm_up.py) must meet every attention, reduction, norm and prologue
    compilation they need. Short steps split the KV range the most (few programs), so they
    meet every power-of-two tier of the reduction's split count; without the warm-up's short
    steps over 2^n and 1.5 x 2^n contexts one tier compiled while serving on the H200
    (tests/engine/gpu/test_gpu_compiles.py)."""
    missing = compiled_json(
        "import json, random\n"
        "from services.engine.kernels import skinny_linear\n"
        "from services.engine.runner.warm_up import eager_shapes\n"
        "from tests.kernels.sm90_compile import compile_key\n"
        "from tests.kernels.shapes import record_eager_steps\n"
        "limit, max_len = skinny_linear.MAX_ROWS, 4096\n"
        "warm = [(q, k) for q, k in eager_shapes(1024, 32, max_len, 4096, 16) if sum(q) <= limit]\n"
        "rng = random.Random(3)\n"
        "steps = []\n"
        "for _ in range(60):\n"
        "    seqs = rng.randint(1, limit)\n"
        "    q = [1] * (seqs - 1) + [rng.randint(1, limit - seqs + 1)]\n"
        "    steps.append((q, [n + rng.randint(0, max_len - n) for n in q]))\n"
        "def keys(shapes):\n"
        "    return {compile_key(l) for l in record_eager_steps(shapes, max_len)[0]}\n"
        "print(json.dumps(sorted(str(k) for k in keys(steps) - keys(warm))))\n")
    assert missing == [], missing

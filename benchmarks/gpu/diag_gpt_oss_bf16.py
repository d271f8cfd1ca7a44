"""Which kernel makes gpt-oss in bf16 on the GPU leave its float32 reference (a diagnostic).

    python benchmarks/gpu/diag_gpt_oss_bf16.py

The tiny random gpt-oss checkpoint of the tests, served by the GraphRunner in bf16 with
every kernel, then with one group of kernels swapped for the torch reference ops at a time
(fused MoE; attention and its prologue; linear layers; norms and activations), each against
transformers' float32 forward over the same tokens: the worst logprob difference of any
chosen token and where it is (request, position).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.engine.model import moe, ops
from tests.engine.gpu import test_gpu_runner as runner_tests
from tests.engine.model.checkpoints import SPECS, build_checkpoint

GROUPS = {
    "all kernels": (),
    "torch MoE": ("moe",),
    "torch attention": ("paged_attention", "qkv_prologue", "write_kv", "apply_rotary"),
    "torch linear": ("linear", "norm_linear"),
    "torch norms/activations": ("rms_norm", "fused_add_rms_norm", "silu_and_mul",
                                "gelu_tanh_and_mul"),
    "torch everything": ("moe", *ops.OP_NAMES),
}


def main() -> None:
    import transformers

    checkpoint = build_checkpoint(SPECS["gpt-oss"], Path(tempfile.mkdtemp()))
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=torch.float32).eval()
    all_ops = dict(ops.kernel_ops())
    real_moe_kernel = moe._kernel
    for label, off in GROUPS.items():
        kept = {k: v for k, v in all_ops.items() if k not in off}
        ops.kernel_ops = lambda kept=kept: kept            # type: ignore[assignment]
        moe._kernel = ((lambda name="fused_experts": None) if "moe" in off  # type: ignore
                       else real_moe_kernel)
        for dtype in ("float32", "bfloat16"):
            engine = runner_tests._engine(checkpoint, "cuda", dtype)
            got, got_lp = runner_tests._run(engine, runner_tests._requests())
            worst, where = 0.0, None
            for i, (n, s, _) in enumerate(runner_tests.SHAPES):
                prompt = runner_tests._prompt(n, s)
                tokens = got[f"r{i}"]
                with torch.no_grad():
                    logits = reference(torch.tensor([prompt + tokens])).logits[0].float()
                ref = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
                for j, (token, lp) in enumerate(zip(tokens, got_lp[f"r{i}"], strict=True)):
                    d = abs(lp.logprob - ref[j, token].item())
                    if d > worst:
                        worst, where = d, (i, j)
            print(f"{label:26s} {dtype:9s} worst |logprob - float32 ref| {worst:.4f} at {where}",
                  flush=True)


if __name__ == "__main__":
    main()

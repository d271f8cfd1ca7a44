"""services/engine/model/moe.py: routing, the fused-experts reference and the Experts module,
against a naive per-token loop (float64) and against transformers' own expert modules."""

from __future__ import annotations

import pytest
import torch

from services.engine.model import moe
from services.engine.model.attention import AttentionMetadata
from services.engine.model.layers.weights import WeightShapeError

ACTIVATION_CASES = [("silu", False), ("silu", True), ("swiglu_oai", True), ("swiglu_oai", False)]


def one_layer_config(hidden: int):
    """A one-layer Qwen3-MoE ModelConfig of width `hidden` (2 heads of hidden / 2): what a
    lone SparseMoeBlock needs (here and tests/kernels/test_fused_moe.py)."""
    from services.engine.model.config import LayerAttention, ModelConfig

    return ModelConfig(
        architecture="Qwen3MoeForCausalLM", model_type="qwen3_moe", vocab_size=16,
        hidden_size=hidden, intermediate_size=hidden // 2, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=hidden // 2,
        rms_norm_eps=1e-6, max_position_embeddings=32, tie_word_embeddings=False,
        layers=(LayerAttention(),))


def naive_experts(x, w_gate_up, w_down, weights, ids, gate_up_bias=None, down_bias=None,
                  activation="silu", limit=7.0, alpha=1.702):
    """One token and one selected expert at a time, float64."""
    x, w_gate_up, w_down = x.double(), w_gate_up.double(), w_down.double()
    inter = w_down.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = w_gate_up[e] @ x[t]
            if gate_up_bias is not None:
                h = h + gate_up_bias[e].double()
            gate, up = h[:inter], h[inter:]
            if activation == "silu":
                a = gate * torch.sigmoid(gate) * up
            else:
                gate = torch.clamp(gate, max=limit)
                up = torch.clamp(up, -limit, limit)
                a = (up + 1) * gate * torch.sigmoid(alpha * gate)
            y = w_down[e] @ a
            if down_bias is not None:
                y = y + down_bias[e].double()
            out[t] += float(weights[t, j]) * y
    return out


def random_case(tokens: int, experts: int, top_k: int, hidden: int, inter: int, bias: bool,
                seed: int, skew: bool = False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    w_gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5 * 3
    w_down = torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5
    logits = torch.randn(tokens, experts, generator=g)
    if skew:   # ragged loads: expert 1 popular, the last two never chosen
        logits[:, 1] += 3.0
        logits[:, -2:] -= 100.0
    weights, ids = moe.softmax_topk(logits, top_k, renormalize=True)
    biases = ((torch.randn(experts, 2 * inter, generator=g),
               torch.randn(experts, hidden, generator=g)) if bias else (None, None))
    return x, w_gate_up, w_down, weights, ids, biases


@pytest.mark.parametrize("activation,bias", ACTIVATION_CASES)
@pytest.mark.parametrize("tokens,experts,top_k", [(1, 4, 2), (7, 8, 2), (13, 6, 3), (5, 4, 4),
                                                  (0, 4, 2)])

def test_reference_matches_naive_loop(activation, bias, tokens, experts, top_k) -> None:
    x, w_gate_up, w_down, weights, ids, (b1, b2) = random_case(
        tokens, experts, top_k, hidden=16, inter=12, bias=bias, seed=tokens * 7 + experts,
        skew=tokens > 4)
    expected = naive_experts(x, w_gate_up, w_down, weights, ids, b1, b2, activation)
    for fn in (moe.reference_fused_experts, moe.dense_fused_experts, moe.fused_experts):
        got = fn(x, w_gate_up, w_down, weights, ids, gate_up_bias=b1, down_bias=b2,
                 activation=activation)
        assert got.shape == x.shape and got.dtype == x.dtype
        torch.testing.assert_close(got.double(), expected, atol=1e-4, rtol=1e-4)


def test_swiglu_clamps_bite() -> None:
    """Gates and ups past the limit: the clamp changes the result (so a missing clamp fails)."""
    x, w_gate_up, w_down, weights, ids, (b1, b2) = random_case(
        6, 4, 2, hidden=16, inter=8, bias=True, seed=3)
    w_gate_up = w_gate_up * 20
    h = torch.einsum("teh,th->te", w_gate_up[ids[:, 0].long()], x)
    assert (h.abs() > 7).any()
    expected = naive_experts(x, w_gate_up, w_down, weights, ids, b1, b2, "swiglu_oai", 7.0)
    got = moe.reference_fused_experts(x, w_gate_up, w_down, weights, ids, gate_up_bias=b1,
                                      down_bias=b2, activation="swiglu_oai", limit=7.0)
    unclamped = naive_experts(x, w_gate_up, w_down, weights, ids, b1, b2, "swiglu_oai", 1e9)
    torch.testing.assert_close(got.double(), expected, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(got.double(), unclamped, atol=1e-2)


def test_bad_calls_refused() -> None:
    x, w_gate_up, w_down, weights, ids, _ = random_case(3, 4, 2, 16, 8, False, 0)
    with pytest.raises(ValueError, match="unknown expert activation"):
        moe.fused_experts(x, w_gate_up, w_down, weights, ids, activation="gelu")
    with pytest.raises(ValueError, match="disagree"):
        moe.fused_experts(x, w_gate_up, w_down[:, :, :4], weights, ids)
    with pytest.raises(ValueError, match="for 2 tokens"):
        moe.fused_experts(x[:2], w_gate_up, w_down, weights, ids)


def test_routing_matches_transformers() -> None:
    import transformers
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    x = torch.randn(11, 16, generator=torch.Generator().manual_seed(5))
    for norm in (True, False):
        config = transformers.Qwen3MoeConfig(hidden_size=16, num_experts=8,
                                             num_experts_per_tok=3, norm_topk_prob=norm)
        router = Qwen3MoeTopKRouter(config)
        torch.nn.init.normal_(router.weight)
        _, hf_weights, hf_ids = router(x)
        weights, ids = moe.softmax_topk(x @ router.weight.detach().T, 3, renormalize=norm)
        assert ids.dtype == torch.int32 and weights.dtype == torch.float32
        assert torch.equal(ids.long(), hf_ids)
        torch.testing.assert_close(weights, hf_weights.detach())
    config = transformers.GptOssConfig(hidden_size=16, num_local_experts=8,
                                       num_experts_per_tok=4)
    router = GptOssTopKRouter(config)
    torch.nn.init.normal_(router.weight)
    torch.nn.init.normal_(router.bias)
    _, hf_weights, hf_ids = router(x)
    weights, ids = moe.topk_softmax(x @ router.weight.detach().T + router.bias.detach(), 4)
    assert torch.equal(ids.long(), hf_ids)
    torch.testing.assert_close(weights, hf_weights.detach())
    again, _ = moe.softmax_topk(x @ router.weight.detach().T + router.bias.detach(), 4, True)
    torch.testing.assert_close(again, weights)


def test_swiglu_experts_match_transformers_gpt_oss() -> None:
    """gpt-oss's experts (interleaved [E, H, 2I] layout converted to ours) give the same out."""
    import transformers
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    config = transformers.GptOssConfig(hidden_size=16, intermediate_size=12,
                                       num_local_experts=4, num_experts_per_tok=2)
    hf = GptOssExperts(config)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.8)
    x = torch.randn(9, 16, generator=g) * 2
    weights, ids = moe.topk_softmax(torch.randn(9, 4, generator=g), 2)
    expected = hf(x, ids.long(), weights).detach()
    gate_up = hf.gate_up_proj.detach()                    # [E, H, 2I], gate/up interleaved
    w_gate_up = torch.cat([gate_up[..., ::2], gate_up[..., 1::2]], dim=-1).transpose(1, 2)
    bias = hf.gate_up_proj_bias.detach()
    b_gate_up = torch.cat([bias[:, ::2], bias[:, 1::2]], dim=-1)
    w_down = hf.down_proj.detach().transpose(1, 2)         # [E, I, H] -> [E, H, I]
    got = moe.fused_experts(x, w_gate_up.contiguous(), w_down.contiguous(), weights, ids,
                            gate_up_bias=b_gate_up, down_bias=hf.down_proj_bias.detach(),
                            activation="swiglu_oai", limit=config.swiglu_limit,
                            alpha=config.swiglu_alpha)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _meta(slots: list[int]) -> AttentionMetadata:
    """One sequence of the rows with a slot; padding rows (-1) after it."""
    n = sum(slot >= 0 for slot in slots)
    return AttentionMetadata(
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        page_table=torch.zeros(1, 1, dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64), max_query_len=n, max_seq_len=n)


def test_experts_loaders_and_sparse_block_counts() -> None:
    """Per-expert and fused shards land in the same rows; the block counts real rows only."""
    experts = moe.Experts(3, 8, 4, bias=True, device="cpu", dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    gate = [torch.randn(4, 8, generator=g) for _ in range(3)]
    up = [torch.randn(4, 8, generator=g) for _ in range(3)]
    down = [torch.randn(8, 4, generator=g) for _ in range(3)]
    for e in range(3):
        experts.w_gate_up.weight_loader(experts.w_gate_up, gate[e], f"{e}.gate")
        experts.w_gate_up.weight_loader(experts.w_gate_up, up[e], f"{e}.up")
        experts.w_down.weight_loader(experts.w_down, down[e], str(e))
    fused = torch.stack([torch.cat([gate[e], up[e]]) for e in range(3)])
    assert torch.equal(experts.w_gate_up, fused)
    assert torch.equal(experts.w_down, torch.stack(down))
    other = moe.Experts(3, 8, 4, bias=True, device="cpu", dtype=torch.float32)
    other.w_gate_up.weight_loader(other.w_gate_up, fused, moe.FUSED)
    assert torch.equal(other.w_gate_up, fused)
    with pytest.raises(WeightShapeError):
        other.w_down.weight_loader(other.w_down, torch.zeros(3, 4, 8), moe.FUSED)
    with pytest.raises(KeyError):
        other.w_down.weight_loader(other.w_down, down[0], "3")

    from services.engine.model.config import MoEConfig

    block = moe.SparseMoeBlock(one_layer_config(8), MoEConfig(4, 2, 4, (True,)), device="cpu",
                               dtype=torch.float32)
    for p in block.parameters():
        torch.nn.init.normal_(p)
    x = torch.randn(5, 8, generator=g)
    out = block(x, _meta([3, 4, 9, -1, -1]))
    weights, ids = block.route(x)
    expected = moe.reference_fused_experts(x, block.experts.w_gate_up, block.experts.w_down,
                                           weights, ids)
    torch.testing.assert_close(out, expected)
    counts = torch.bincount(ids[:3].flatten().long(), minlength=4)
    assert block.expert_tokens.tolist() == counts.tolist()
    assert int(block.expert_tokens.sum()) == 3 * 2


@pytest.mark.parametrize("name,target", [
    ("model.layers.2.mlp.experts.5.gate_proj.weight",
     ("model.layers.2.mlp.experts.w_gate_up", "5.gate")),
    ("model.layers.2.mlp.experts.5.w3.weight", ("model.layers.2.mlp.experts.w_gate_up", "5.up")),
    ("model.layers.2.mlp.experts.11.down_proj.weight",
     ("model.layers.2.mlp.experts.w_down", "11")),
    ("model.layers.2.mlp.experts.0.w2.bias", ("model.layers.2.mlp.experts.down_bias", "0")),
    ("model.layers.0.mlp.experts.gate_up_proj", ("model.layers.0.mlp.experts.w_gate_up",
                                                 moe.FUSED)),
    ("model.layers.0.mlp.experts.down_proj_bias", ("model.layers.0.mlp.experts.down_bias",
                                                   moe.FUSED)),
    ("model.layers.0.mlp.gate_proj.weight", None),
    ("model.layers.0.mlp.experts.x.gate_proj.weight", None),
])
def test_expert_checkpoint_names(name, target) -> None:
    assert moe.expert_checkpoint_target(name) == target


def test_a_family_routing_override_is_used() -> None:
    """A subclass's `route` (gpt-oss's top-k-then-softmax) decides the experts and the load."""
    from services.engine.model.config import LayerAttention, ModelConfig, MoEConfig

    class FirstTwo(moe.SparseMoeBlock):
        def route(self, x):
            ids = torch.tensor([[0, 1]] * x.shape[0], dtype=torch.int32)
            return torch.full((x.shape[0], 2), 0.5), ids

    config = ModelConfig(
        architecture="GptOssForCausalLM", model_type="gpt_oss", vocab_size=16, hidden_size=8,
        intermediate_size=4, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=4, rms_norm_eps=1e-6, max_position_embeddings=32, tie_word_embeddings=False,
        layers=(LayerAttention(),))
    block = FirstTwo(config, MoEConfig(4, 2, 4, (True,)), device="cpu", dtype=torch.float32)
    for p in block.parameters():
        torch.nn.init.normal_(p)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(2))
    weights, ids = block.route(x)
    torch.testing.assert_close(block(x, _meta([0, 1, 2])), moe.reference_fused_experts(
        x, block.experts.w_gate_up, block.experts.w_down, weights, ids))
    assert block.expert_tokens.tolist() == [3, 3, 0, 0]


def test_gpt_oss_routing_is_softmax_topk_renormalized():
    """Why gpt-oss routes through the fused kernel on CUDA (GptOssMoeBlock.fused_routing):
    softmax over the k largest logits equals softmax over all experts, top k, renormalized."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(257, 32, generator=g) * 4
    weights, ids = moe.topk_softmax(logits, 4)
    want_weights, want_ids = moe.softmax_topk(logits, 4, renormalize=True)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)
    from services.engine.model.gpt_oss import GptOssMoeBlock
    assert GptOssMoeBlock.fused_routing

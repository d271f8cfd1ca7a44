"""EAGLE-3 heads (`speculative_method eagle3`, model/eagle3.py, runner/eagle3_drafter.py) in a
real engine, CPU float32, with tiny random heads written in the public checkpoint format
(config.json + safetensors, `midlayer.*`, `d2t`) for the tiny Qwen3 and Llama checkpoints:
greedy and seeded output equal the non-speculative output token for token, concurrent, on
the TorchRunner and the GraphRunner (eager, with and without overlap); the stored target
states are the target's own fused aux states; every round's drafts equal those of a fresh
proposer over the same tokens (rejected and chained rows rolled back); a head that predicts
a repeating target has every draft accepted; head forwards are counted; a head with a missing tensor, another hidden size or a `d2t` entry outside the
target's vocabulary is refused at start-up naming it."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from services.common.core import open_model
from services.common.errors import ValidationError
from services.engine.core.telemetry import SpeculativeLoad
from services.engine.model import ForwardBatch, ModelConfig, allocate_kv_cache, build_metadata
from services.engine.model.attention import kv_slot
from services.engine.model.eagle3 import load_eagle3_head, parse_eagle3_config
from services.engine.runner.eagle3_drafter import Eagle3Proposer
from services.engine.scheduler.plan import SlotHandle
from services.engine.scheduler.speculation import DRAFT
from tests.engine.grammar.byte_tokenizer import write_byte_tokenizer
from tests.engine.model.checkpoints import SPECS, VOCAB_SIZE, build_checkpoint
from tests.engine.runner.conftest import greedy_request, make_engine
from tests.engine.runner.test_speculative import KINDS, _drive, _prompt
from tests.engine.runner.test_speculative_draft import _requests, _same

VALUES = dict(page_size=4, max_num_seqs=6, kv_cache_bytes=8 << 20, prefill_chunk_size=64,
              max_num_batched_tokens=80)
DRAFT_VOCAB = VOCAB_SIZE // 2


def write_head(directory, target_dir, *, hidden_size=64, draft_vocab=DRAFT_VOCAB,
               embedding=False, seed=0, **config_changes):
    """A random EAGLE-3 head for the target in `target_dir`, in the checkpoint format:
    draft ids map to the even target ids (d2t) when the draft vocabulary is smaller."""
    from safetensors.torch import save_file

    target = json.loads((target_dir / "config.json").read_text())
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
              "hidden_size": hidden_size, "intermediate_size": 80, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "max_position_embeddings": 256,
              "vocab_size": target["vocab_size"], "draft_vocab_size": draft_vocab,
              "target_hidden_size": target["hidden_size"],
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 2]},
              "torch_dtype": "float32", **config_changes}
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(seed)
    h, inter, q, kv = hidden_size, 80, 4 * 16, 2 * 16

    def normal(*shape, scale=0.3):
        return scale * torch.randn(*shape, generator=g)

    tensors = {"fc.weight": normal(h, 3 * target["hidden_size"], scale=0.1),
               "norm.weight": 1 + normal(h, scale=0.1),
               "lm_head.weight": normal(draft_vocab, h, scale=1.0),
               "midlayer.self_attn.q_proj.weight": normal(q, 2 * h),
               "midlayer.self_attn.k_proj.weight": normal(kv, 2 * h),
               "midlayer.self_attn.v_proj.weight": normal(kv, 2 * h),
               "midlayer.self_attn.o_proj.weight": normal(h, q),
               "midlayer.mlp.gate_proj.weight": normal(inter, h),
               "midlayer.mlp.up_proj.weight": normal(inter, h),
               "midlayer.mlp.down_proj.weight": normal(h, inter)}
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        tensors[f"midlayer.{norm}.weight"] = 1 + normal(h, scale=0.1)
    if embedding:
        tensors["embed_tokens.weight"] = normal(target["vocab_size"], h, scale=1.0)
    if draft_vocab < target["vocab_size"]:
        ids = torch.arange(draft_vocab)
        tensors["d2t"] = ids * 2 - ids
        tensors["t2d"] = torch.zeros(target["vocab_size"], dtype=torch.bool)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def _target(spec, tmp_path_factory):
    directory = build_checkpoint(SPECS[spec], tmp_path_factory.mktemp(f"eagle3-{spec}"))
    write_byte_tokenizer(directory, VOCAB_SIZE)
    return directory


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return _target("qwen3-qknorm-sharded", tmp_path_factory)


@pytest.fixture(scope="module")
def source(qwen_dir):
    return open_model(qwen_dir)


@pytest.fixture(scope="module")
def head_dir(qwen_dir, tmp_path_factory):
    return write_head(tmp_path_factory.mktemp("eagle3-head") / "head", qwen_dir)


def _eagle_engine(source, head, kind="torch", k=4, **overrides):
    return make_engine(source, **{**VALUES, **KINDS[kind], "speculative_method": "eagle3",
                                  "speculative_model": str(head),
                                  "num_speculative_tokens": k, **overrides})


@pytest.fixture(scope="module")
def plain(source):
    return _drive(make_engine(source, **VALUES), _requests())


class _Checked:
    """Wraps the engine's proposer: every round's drafts must equal a fresh proposer's
    (its own, empty head KV) over the same tokens and target states."""

    def __init__(self, proposer: Eagle3Proposer) -> None:
        self.inner = proposer
        self.num_tokens = proposer.num_tokens
        self.source = proposer.source
        self.method = proposer.method
        self.rounds = 0

    def propose_for(self, handle, tokens, limit, target_pages=()):
        inner = self.inner
        drafts, forwards = inner.propose_for(handle, tokens, limit, target_pages)
        kv = allocate_kv_cache(inner.head.config.layer, inner.kv.num_pages, inner.page_size,
                               inner.device, torch.float32)
        fresh = Eagle3Proposer(inner.head, inner.embedding, kv, inner.store,
                               num_tokens=inner.num_tokens, token_vocab=VOCAB_SIZE,
                               chunk_tokens=inner.chunk_tokens)
        assert fresh.propose_for(handle, tokens, limit, target_pages)[0] == drafts
        assert inner.tokens_held(handle.slot) == tuple(tokens[1:])   # only target rows
        self.rounds += 1
        return drafts, forwards


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_eagle3_output_is_the_plain_output(source, head_dir, plain, kind):
    """Greedy (with logprobs) and seeded requests at once, verified against a random head's
    drafts: the plain tokens, logprobs and finish reasons; each round's drafts are a fresh
    proposer's (a rollback that kept rejected or chained rows would draft otherwise)."""
    engine = _eagle_engine(source, head_dir, kind)
    config = engine.scheduler.state.config
    assert isinstance(config.proposer, Eagle3Proposer)
    checked = _Checked(config.proposer)
    object.__setattr__(config, "proposer", checked)
    _same(_drive(engine, _requests()), plain)
    counters = engine.scheduler.state.counters
    assert checked.rounds > 0 and counters.spec_draft_tokens > 0
    # every round ends in the round graph (on the CPU, its body); the 70-token prompt's
    # first round feeds the rows before the graph's last 64 eagerly first
    assert checked.inner.graphs.rounds == checked.rounds
    assert checked.inner.pages.round_counts["eager"] >= 1
    assert counters.launches_by_kind["verify"] > 0
    assert counters.spec_drafter_steps >= counters.spec_draft_tokens
    object.__setattr__(config, "proposer", checked.inner)
    load = SpeculativeLoad.of(engine.scheduler)
    assert load is not None and load.method == "eagle3" and load.drafter_steps > 0


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_store_holds_the_targets_fused_states(source, head_dir, kind):
    """After serving, a choice's stored states at its computed positions equal the head's
    fc over the target's aux layers recomputed from scratch (a wrong slot or layer fails),
    whichever runner ran the target."""
    engine = _eagle_engine(source, head_dir, kind)
    proposer = engine.scheduler.state.config.proposer
    assert isinstance(proposer, Eagle3Proposer) and proposer.source == DRAFT
    prompt = _prompt(23, 11)
    engine.scheduler.admit(greedy_request("r", prompt, 6))
    scheduler, runner = engine.scheduler, engine.runner
    for _ in range(4):                 # prefill, then decodes and verifications
        plan = scheduler.plan()
        assert plan is not None
        runner.submit(scheduler.commit(plan, scheduler.state.resources.fences.next_fence))
        scheduler.complete(runner.wait())
    seq = next(iter(engine.scheduler.state.running.values()))
    tokens = seq.tokens(0, seq.num_computed)
    target = engine.runner.model
    kv = allocate_kv_cache(target.config, 16, 4, "cpu", torch.float32)
    pages = list(range(-(-len(tokens) // 4)))
    meta = build_metadata([len(tokens)], [len(tokens)], [pages], 4)
    batch = ForwardBatch(torch.tensor(tokens), torch.arange(len(tokens)), meta)
    with torch.inference_mode():
        expected = proposer.head.fuse(target.forward(batch, kv).aux_hidden)
        rows = proposer.store.rows[[kv_slot(seq.page_ids, p, 4) for p in range(len(tokens))]]
    torch.testing.assert_close(rows, expected, atol=1e-5, rtol=1e-5)


def test_llama_target_with_its_own_embedding(tmp_path_factory):
    """A Llama target, a head of another width (fc: 3 x 64 -> 48) with its own embedding and
    the full vocabulary (no d2t), saved as pytorch_model.bin with `model.` names (as some
    trainers write it): the plain output."""
    from safetensors.torch import load_file

    target_dir = _target("llama", tmp_path_factory)
    source = open_model(target_dir)
    head = write_head(tmp_path_factory.mktemp("eagle3-llama") / "head", target_dir,
                      hidden_size=48, draft_vocab=VOCAB_SIZE, embedding=True, seed=4)
    tensors = load_file(head / "model.safetensors")
    torch.save({f"model.{name}".replace("model.midlayer.", "model.layers.0."): value
                for name, value in tensors.items()}, head / "pytorch_model.bin")
    (head / "model.safetensors").unlink()
    requests = _requests()
    reference = _drive(make_engine(source, **VALUES), requests)
    engine = _eagle_engine(source, head)
    assert engine.scheduler.state.config.proposer.head.embed_tokens is not None
    _same(_drive(engine, requests), reference)
    assert engine.scheduler.state.counters.spec_drafter_steps > 0


def test_bad_heads_are_refused_at_start_up(source, qwen_dir, head_dir, tmp_path):
    """A missing tensor, another target hidden size, a head width unlike the target's with a
    shared embedding, a d2t entry past the target's vocabulary: ValidationError naming the
    head directory and the tensor or setting."""
    from safetensors.torch import load_file, save_file

    missing = tmp_path / "missing"
    shutil.copytree(head_dir, missing)
    tensors = load_file(missing / "model.safetensors")
    del tensors["midlayer.mlp.down_proj.weight"]
    save_file(tensors, missing / "model.safetensors")
    with pytest.raises(ValidationError, match=f"{missing}.*lacks tensor "
                       "'midlayer.mlp.down_proj.weight'") as info:
        _eagle_engine(source, missing)
    assert info.value.param == "midlayer.mlp.down_proj.weight"

    wide = write_head(tmp_path / "wide", qwen_dir, target_hidden_size=96)
    with pytest.raises(ValidationError, match="target hidden size 96, the target's is 64"):
        _eagle_engine(source, wide)

    plain_llama = write_head(tmp_path / "llama", qwen_dir, architectures=["LlamaForCausalLM"])
    with pytest.raises(ValidationError, match="is not an EAGLE-3 head"):
        _eagle_engine(source, plain_llama)

    narrow = write_head(tmp_path / "narrow", qwen_dir, hidden_size=48)
    with pytest.raises(ValidationError, match="embed_tokens"):
        _eagle_engine(source, narrow)          # the shared embedding is 64 wide

    out_of_range = tmp_path / "d2t"
    shutil.copytree(head_dir, out_of_range)
    tensors = load_file(out_of_range / "model.safetensors")
    tensors["d2t"][7] = VOCAB_SIZE
    save_file(tensors, out_of_range / "model.safetensors")
    with pytest.raises(ValidationError, match="d2t maps draft id 7 to 327, outside the "
                       "target's vocabulary") as info:
        _eagle_engine(source, out_of_range)
    assert info.value.param == "d2t"

    shaped = tmp_path / "shaped"
    shutil.copytree(head_dir, shaped)
    tensors = load_file(shaped / "model.safetensors")
    tensors["fc.weight"] = tensors["fc.weight"][:, :128].contiguous()
    save_file(tensors, shaped / "model.safetensors")
    with pytest.raises(ValidationError, match="'fc.weight' has shape"):
        _eagle_engine(source, shaped)


def test_accepted_drafts_do_not_keep_chained_rows(source, head_dir):
    """A round whose first draft was accepted: the head's chained row for it (built from the
    head's own state) is rolled back and rebuilt from the target's state, so the next drafts
    equal a fresh proposer's; a new slot generation starts over."""
    engine = _eagle_engine(source, head_dir)
    proposer = engine.scheduler.state.config.proposer
    assert isinstance(proposer, Eagle3Proposer)
    target, kv = engine.runner.model, engine.runner.kv
    pages = list(range(12))

    def feed(tokens, start):           # the target computes positions start.. (the hook stores)
        end = start + len(tokens)
        meta = build_metadata([len(tokens)], [end], [pages], kv.page_size)
        target(ForwardBatch(torch.tensor(tokens), torch.arange(start, end), meta), kv)

    tokens = _prompt(30, 7)
    handle = SlotHandle(0, 1)
    feed(tokens[:-1], 0)
    drafts, forwards = proposer.propose_for(handle, tokens, 4, pages)
    assert len(drafts) == 4 and forwards == 4       # the prompt's rows in one chunk, then 3
    kept = [*tokens, drafts[0], (drafts[1] + 1) % VOCAB_SIZE]   # draft 0 accepted, 1 not
    feed([tokens[-1], drafts[0]], len(tokens) - 1)
    again, forwards = proposer.propose_for(handle, kept, 4, pages)
    assert forwards == 4 and proposer.tokens_held(0) == tuple(kept[1:])
    fresh = _eagle_engine(source, head_dir).scheduler.state.config.proposer
    assert isinstance(fresh, Eagle3Proposer)
    with torch.inference_mode():
        fresh.store.rows.copy_(proposer.store.rows)
    assert again == fresh.propose_for(handle, kept, 4, pages)[0]
    free = proposer.free_pages
    proposer.propose_for(SlotHandle(0, 2), tokens[:5], 1, pages)
    assert proposer.tokens_held(0) == tuple(tokens[1:5]) and proposer.free_pages > free


def test_fc_reads_the_aux_layers_in_the_heads_order(source, qwen_dir, tmp_path):
    """Ids [2, 1, 2]: the target returns layers 0 and 1 in its order; fc's inputs are the
    states entering layers 2, 1, 2 (after layers 1, 0, 1), in that order."""
    head_dir = write_head(tmp_path / "head", qwen_dir,
                          eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 1, 2]})
    target = open_model(qwen_dir)
    config = parse_eagle3_config(json.loads((head_dir / "config.json").read_text()),
                                 ModelConfig.from_dict(target.config), str(head_dir))
    assert config.target_layers == (0, 1) and config.aux_order == (1, 0, 1)
    head = load_eagle3_head(head_dir, config, torch.device("cpu"), torch.float32, 64,
                            VOCAB_SIZE)
    after0, after1 = torch.randn(3, 64), torch.randn(3, 64)
    with torch.inference_mode():
        torch.testing.assert_close(head.fuse((after0, after1)),
                                   torch.cat([after1, after0, after1], -1) @ head.fc.weight.T)


def _edit_tensors(directory, edit):
    from safetensors.torch import load_file, save_file

    for path in sorted(directory.glob("*.safetensors")):
        tensors = load_file(path)
        edit(tensors)
        save_file(tensors, path, metadata={"format": "pt"})


def repeating_pair(qwen_dir, directory):
    """A target that repeats its last token (attention and MLP outputs zero, unit-norm
    embedding rows as its lm_head) and a head that predicts the token whose state it reads
    (fc selects the first aux state, the layer adds nothing, lm_head = those rows)."""
    target_dir = directory / "target"
    shutil.copytree(qwen_dir, target_dir)
    from safetensors.torch import load_file

    embed = torch.cat([load_file(p).get("model.embed_tokens.weight", torch.empty(0, 64))
                       for p in sorted(target_dir.glob("*.safetensors"))])
    rows = embed / embed.norm(dim=-1, keepdim=True)

    def target_edit(tensors):
        for name in tensors:
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                tensors[name] = torch.zeros_like(tensors[name])
            elif name == "model.norm.weight":
                tensors[name] = torch.ones_like(tensors[name])
            elif name in ("model.embed_tokens.weight", "lm_head.weight"):
                tensors[name] = rows.clone()

    _edit_tensors(target_dir, target_edit)
    head_dir = write_head(target_dir.parent / "head", target_dir, draft_vocab=VOCAB_SIZE)

    def head_edit(tensors):
        tensors["fc.weight"] = torch.cat([torch.eye(64), torch.zeros(64, 128)], dim=1)
        for name in ("midlayer.self_attn.o_proj.weight", "midlayer.mlp.down_proj.weight"):
            tensors[name] = torch.zeros_like(tensors[name])
        tensors["norm.weight"] = torch.ones(64)
        tensors["lm_head.weight"] = rows.clone()

    _edit_tensors(head_dir, head_edit)
    return open_model(target_dir), head_dir


@pytest.fixture(scope="module")
def repeating(qwen_dir, tmp_path_factory):
    return repeating_pair(qwen_dir, tmp_path_factory.mktemp("eagle3-repeat"))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_draft_accepted_with_a_predicting_head(repeating, kind):
    """Verified runs of accepted drafts (k + 1 tokens a step, the head catching up on them):
    the plain greedy output, every draft accepted."""
    source, head_dir = repeating
    greedy = [r for r in _requests() if r.sampling.temperature == 0.0]
    plain = _drive(make_engine(source, **VALUES), greedy)
    assert all(len(set(tokens)) == 1 for tokens, _, _ in plain.values())
    engine = _eagle_engine(source, head_dir, kind)
    _same(_drive(engine, greedy), plain)
    counters = engine.scheduler.state.counters
    assert counters.spec_accepted_tokens == counters.spec_draft_tokens > 20

"""What the speculative benchmarks share (bench_speculative.py, bench_speculative_draft.py,
profile_verify_round.py): the oracle proposer, a target made to repeat its last token, a random
EAGLE-3 head in the public format, and the driver that serves a row and reports it.

    engine = build_target(model_dir, args, speculative_method="ngram", ...)
    make_repeating(engine.runner.model)
    with_proposer(engine, Oracle({tuple(prompt): plain}, 0.7, 4, vocab))
    reset_row(engine)
    tokens, decode_s, _ = serve(engine, [greedy_request("o", prompt, 512)])
    report_row("oracle a=0.7 k=4", engine, tokens, decode_s, plain_tok_s, {})

The target repeats its last token (`make_repeating`: every layer's o_proj and down_proj
zeroed, the embedding rows unit vectors and the lm_head those rows, the final norm's weight
ones): each layer still runs every kernel on every weight at the real shape (the cost
is the model's), but the greedy token leads by about sqrt(hidden) = 64 logits, so verification rows
and one-token decodes, which round differently in bf16, still agree on it and the recorded
continuation stays the target's own (`same`: tokens equal to the plain run). With
full random layers a near-tie diverged after 18-34 tokens, after which the recorded
continuation was no longer the target's and the oracle measured nothing.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path


class Oracle:
    """The recorded greedy continuation of each prompt, each draft corrupted with
    probability 1 - acceptance (its own seeded stream)."""

    source = "copy"
    KEY = 32

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], acceptance: float,
                 num_tokens: int, vocab: int, seed: int = 0) -> None:
        # looked up by the prompt's length and first KEY tokens (the benchmark's prompts are
        # random: those tell them apart), one dict probe per proposal: a scan comparing
        # every whole prompt cost ~8 ms of host time per step at batch 64, which the step
        # after a verification waits for
        self.by_length: dict[int, dict[tuple[int, ...], list[int]]] = {}
        for prompt, output in continuations.items():
            outputs = self.by_length.setdefault(len(prompt), {})
            assert prompt[:self.KEY] not in outputs, "prompts must differ in their first tokens"
            outputs[prompt[:self.KEY]] = output
        self.acceptance = acceptance
        self.num_tokens = num_tokens
        self.vocab = vocab
        self.rng = random.Random(seed)

    def propose(self, tokens, limit):
        for length, outputs in self.by_length.items():
            output = outputs.get(tuple(tokens[:min(length, self.KEY)]))
            if output is not None and len(tokens) >= length:
                done = len(tokens) - length
                drafts = list(output[done:done + min(limit, self.num_tokens)])
                return tuple(d if self.rng.random() < self.acceptance
                             else (d + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
                             for d in drafts)
        return ()


class OracleHead:
    """A per-choice proposer (an EAGLE-3 head) that runs and is timed as usual; the oracle's
    tokens replace its drafts (as many as it drafted)."""

    def __init__(self, head, oracle: Oracle) -> None:
        self.head = head
        self.oracle = oracle

    @property
    def num_tokens(self) -> int:
        return self.head.num_tokens

    @property
    def source(self) -> str:
        return self.head.source

    def propose_for(self, handle, tokens, limit, target_pages=()):
        drafts, forwards = self.head.propose_for(handle, tokens, limit, target_pages)
        return self.oracle.propose(tokens, len(drafts)) if drafts else (), forwards

    def __getattr__(self, name: str):      # forward_s, drop, ... : the head's
        return getattr(self.head, name)


def make_repeating(model) -> None:
    """Make the target's greedy token its last input token by a wide margin (module doc),
    in place: captured graphs read the same tensors."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.zero_()
        embed = model.model.embed_tokens.weight
        rows = embed.float()
        embed.copy_(rows / rows.norm(dim=-1, keepdim=True).clamp(min=1e-6))
        del rows
        if model.lm_head is not None:
            model.lm_head.weight.copy_(embed)
        model.model.norm.weight.fill_(1.0)


def write_eagle3_head(directory: Path, target: dict, *, intermediate_size: int,
                      draft_vocab: int, seed: int = 0) -> Path:
    """A random EAGLE-3 head for `target` (a config dict) in the public checkpoint format
    (config.json, model.safetensors with fc, midlayer.*, norm, lm_head, d2t, t2d), bf16."""
    import torch
    from safetensors.torch import save_file

    h, heads, kv_heads, dim = (target[k] for k in ("hidden_size", "num_attention_heads",
                                                   "num_key_value_heads", "head_dim"))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
              "hidden_size": h, "intermediate_size": intermediate_size,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": dim,
              "rms_norm_eps": target["rms_norm_eps"], "rope_theta": target["rope_theta"],
              "max_position_embeddings": target["max_position_embeddings"],
              "vocab_size": target["vocab_size"], "draft_vocab_size": draft_vocab,
              "target_hidden_size": h, "torch_dtype": "bfloat16"}
    layers = target["num_hidden_layers"]
    if layers < 6:          # the default aux layers (2, L/2, L-3) need six (the smoke's two)
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 1, layers]}
    shapes = {"fc.weight": (h, 3 * h), "lm_head.weight": (draft_vocab, h),
              "midlayer.self_attn.q_proj.weight": (heads * dim, 2 * h),
              "midlayer.self_attn.k_proj.weight": (kv_heads * dim, 2 * h),
              "midlayer.self_attn.v_proj.weight": (kv_heads * dim, 2 * h),
              "midlayer.self_attn.o_proj.weight": (h, heads * dim),
              "midlayer.mlp.gate_proj.weight": (intermediate_size, h),
              "midlayer.mlp.up_proj.weight": (intermediate_size, h),
              "midlayer.mlp.down_proj.weight": (h, intermediate_size)}
    g = torch.Generator().manual_seed(seed)
    tensors = {name: (0.02 * torch.randn(*shape, generator=g)).to(torch.bfloat16)
               for name, shape in shapes.items()}
    for norm in ("norm", "midlayer.input_layernorm", "midlayer.hidden_norm",
                 "midlayer.post_attention_layernorm"):
        tensors[f"{norm}.weight"] = torch.ones(h, dtype=torch.bfloat16)
    ids = torch.arange(draft_vocab)
    tensors["d2t"] = ids * (target["vocab_size"] // draft_vocab // 2)   # target = draft + d2t
    tensors["t2d"] = torch.zeros(target["vocab_size"], dtype=torch.bool)
    tensors["t2d"][ids + tensors["d2t"]] = True
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def free_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def build_target(model_dir: Path, args, **overrides):
    from services.common.core import open_model
    from services.engine.config import EngineConfig
    from services.engine.core.build import build_engine

    values = dict(model=str(model_dir), load_format="dummy", max_model_len=args.max_model_len,
                  max_num_seqs=args.max_num_seqs, dummy_seed=1)
    if args.smoke:
        values.update(kv_cache_bytes=64 << 20, device="cpu", dtype="float32")
    values.update(overrides)
    return build_engine(EngineConfig(**values),
                        open_model(model_dir, allow_missing_weights=True))


def serve(engine, requests, on_first=None, logprobs: dict | None = None
           ) -> tuple[dict[str, list[int]], float, float]:
    """Drive like the engine loop: tokens per request, seconds from the first token to the
    last (decode), and seconds in all. `on_first()` runs when the first token arrives;
    `logprobs`, when given, gathers each request's sampled logprobs.

    The heap is frozen first, as the engine core's is once it is ready (services/common/
    heap.py): unfrozen, a full collection of this process (torch, the model, the earlier
    rows) pauses the loop for tens of ms whenever it falls inside a row. The row's collector
    pauses land in its host seconds (`gc_s`, `gc_full`: full collections)."""
    from services.common.heap import GcPauses, freeze_startup_heap

    freeze_startup_heap("benchmark")
    pauses = GcPauses.install()
    before = pauses.snapshot()
    for request in requests:
        engine.scheduler.admit(request)
    scheduler, runner = engine.scheduler, engine.runner
    tokens: dict[str, list[int]] = {}
    host = meter(engine).host = dict.fromkeys(("plan_s", "submit_s", "wait_s", "complete_s",
                                              "steps", "followed"), 0.0)
    clock = time.perf_counter
    started = clock()
    first = None
    while scheduler.has_work:
        submitted = False
        if runner.outstanding < runner.window:
            at = clock()
            plan = scheduler.plan()
            host["plan_s"] += clock() - at
            if plan is not None:
                at = clock()
                step = scheduler.commit(plan, scheduler.state.resources.fences.next_fence)
                runner.submit(step)
                host["submit_s"] += clock() - at
                host["steps"] += 1
                host["followed"] += any(s.feeds_pending for s in step.seqs)
                submitted = True
        if runner.outstanding and (runner.outstanding >= runner.window or not submitted):
            at = clock()
            done = runner.wait()
            host["wait_s"] += clock() - at
            at = clock()
            updates = scheduler.complete(done)
            host["complete_s"] += clock() - at
            for update in updates:
                for delta in update.deltas:
                    if delta.token_ids and first is None:
                        first = time.perf_counter()
                        host["steps_before_first"] = host["steps"]
                        if on_first is not None:
                            on_first()
                    tokens.setdefault(update.request_id, []).extend(delta.token_ids)
                    if logprobs is not None:
                        logprobs.setdefault(update.request_id, []).extend(delta.logprobs)
    end = time.perf_counter()
    after = pauses.snapshot()
    host["gc_s"] = sum(after.seconds) - sum(before.seconds)
    host["gc_full"] = after.collections(2) - before.collections(2)
    return tokens, end - (first or started), end - started


def greedy_request(request_id: str, prompt: list[int], max_tokens: int):
    from services.engine.sampling import SamplingParams
    from services.engine.scheduler.requests import EngineRequest, StopRules

    params = SamplingParams.create(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                   seed=0)
    return EngineRequest(request_id=request_id, prompt_token_ids=tuple(prompt),
                         sampling=params, stop=StopRules(max_tokens=max_tokens,
                                                         ignore_eos=True), seed=0)


def agree(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy outputs share (all of them in float32; in bf16 a
    verification row and a one-token decode may round a near-tie differently)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def split_margin(engine, prompt: list[int], plain: list[int], index: int) -> float | None:
    """Where a speculative output leaves the plain one (`index` < len(plain)): the target's
    gap, in nats, between its best and second-best token after prompt + plain[:index],
    scored without speculation on `engine`. A gap under bf16's rounding of the logits (a few
    hundredths) says a verification row and a decode step rounded a near-tie apart; a wide
    one says the speculative state is wrong. None when the outputs never split. Serves a
    request: call it after the row's counters are read."""
    if index >= len(plain):
        return None
    request = dataclasses.replace(greedy_request("margin", prompt + plain[:index], 1),
                                  logprobs=True, top_logprobs=2, speculative=False)
    logprobs: dict = {}
    serve(engine, [request], logprobs=logprobs)
    top = logprobs["margin"][0].top if logprobs.get("margin") else ()
    return round(top[0].logprob - top[1].logprob, 4) if len(top) > 1 else None


def with_proposer(engine, proposer) -> None:
    state = engine.scheduler.state
    state.config = dataclasses.replace(state.config, proposer=proposer)


def report_row(name: str, engine, tokens: dict[str, list[int]], decode_s: float, base_tok_s: float,
         extra: dict) -> dict:
    counters = engine.scheduler.state.counters
    generated = sum(len(t) for t in tokens.values())
    tok_s = (generated - len(tokens)) / max(decode_s, 1e-9)
    rounds = counters.spec_rounds
    row = {"name": name, "tok_s": round(tok_s, 1),
           "speedup": round(tok_s / base_tok_s, 3) if base_tok_s else None,
           "tokens_per_round": round((generated - len(tokens)) / rounds, 3) if rounds else None,
           "acceptance": round(counters.spec_accepted_tokens / counters.spec_draft_tokens, 3)
           if counters.spec_draft_tokens else None,
           "mean_width": round(counters.spec_depth / rounds, 3) if rounds else None,
           "verify_steps": counters.spec_verify_steps,
           "switched_off": counters.speculation_off,
           "verify_graph_steps": getattr(engine.runner, "verify_graph_steps", 0),
           "eager_verify": dict(getattr(engine.runner, "eager_verify_reasons", {})),
           "drafter_graph_rounds": getattr(getattr(engine.scheduler.state.config.proposer,
                                                   "graphs", None), "rounds", None),
           # device seconds by step kind (the rest of the run's time is the host's)
           "device_s": _device_seconds(engine),
           "host_s": {k: round(v, 4) for k, v in meter(engine).host.items()},
           # the cost model's measured device ms per step shape (the policy's inputs)
           "step_ms": {f"{kind} {label}": round(1e3 * stats.estimate_s(), 3)
                       for (kind, label), stats in engine.scheduler.state.costs.shapes.items()
                       if kind in ("decode", "verify") and stats.estimate_s() is not None}}
    row.update(extra)
    print(json.dumps(row), flush=True)      # as it comes (a run cut off keeps its rows)
    return row


@dataclasses.dataclass(slots=True)
class RowMeter:
    """What a row measures besides the engine's counters: the device seconds by step kind
    when the row was reset, and the last serve's host seconds by phase (plan includes the
    proposer's drafting), its steps and those that followed an in-flight one (overlap)."""

    device_at_reset: dict[str, float] = dataclasses.field(default_factory=dict)
    host: dict[str, float] = dataclasses.field(default_factory=dict)


_METERS: dict[int, RowMeter] = {}        # by id(engine): the script's engines


def meter(engine) -> RowMeter:
    return _METERS.setdefault(id(engine), RowMeter())


def reset_row(engine) -> None:
    """A row's counters start at zero (the cost model's estimates carry over)."""
    engine.scheduler.state.counters = type(engine.scheduler.state.counters)()
    getattr(engine.runner, "eager_verify_reasons", {}).clear()
    graphs = getattr(engine.scheduler.state.config.proposer, "graphs", None)
    if graphs is not None:                       # an EAGLE-3 head's round graphs
        graphs.rounds = 0
    meter(engine).device_at_reset = _device_totals(engine)


def _device_totals(engine) -> dict[str, float]:
    out: dict[str, float] = {}
    for (kind, _), stats in engine.scheduler.state.costs.shapes.items():
        out[kind] = out.get(kind, 0.0) + stats.total_s
    return out


def _device_seconds(engine) -> dict[str, float]:
    """Measured device seconds by step kind since the row's reset."""
    base = meter(engine).device_at_reset
    return {kind: round(total - base.get(kind, 0.0), 4)
            for kind, total in _device_totals(engine).items() if total > base.get(kind, 0.0)}


def cell(row: dict, key: str, width: int) -> str:
    value = row.get(key)
    return f"{'—' if value is None else value:>{width}}"

"""Assembling an engine from its config and model: load, size the KV pool, wire the parts.

Runs inside the engine-core process. The effective context is the smallest of the configured
limit, the manifest's and the model's exact range (`ModelConfig.max_context`). A request that
could not run alone in the page pool is refused at admission (validation), so any admitted
request can always finish.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.common.core import ModelSource
from services.common.errors import UnsupportedError, ValidationError
from services.common.pixel_patches import RAW_DTYPE
from services.common.startup import StartupPhases
from services.engine.config import EngineConfig
from services.engine.core.messages import CoreInfo
from services.engine.grammar import GrammarCompiler, GrammarVocabulary
from services.engine.kernels.compile_pool import CompilePool, default_workers
from services.engine.kernels.precompile import current_target, load_remembered, remembered_path
from services.engine.model import (
    KVCache,
    ModelConfig,
    allocate_kv_cache,
    default_dtype,
    kv_cache_bytes_per_page,
    load_dummy_model,
    load_model,
)
from services.engine.model.moe import expert_weight_bytes, reset_expert_load
from services.engine.model.pooling import pooling_config
from services.engine.model.qwen_vl import QwenVLForConditionalGeneration
from services.engine.prefix.history import BLOCK_TOKENS
from services.engine.runner.base import Runner
from services.engine.runner.drafter import Drafter, DraftModelProposer, open_drafter
from services.engine.runner.eagle3_drafter import Eagle3Drafter, Eagle3Proposer, open_eagle3
from services.engine.runner.graph_runner import GraphRunner, GraphRunnerConfig
from services.engine.runner.host_kv import HostKVStore
from services.engine.runner.memory import plan_layout
from services.engine.runner.snapshots import SnapshotStore
from services.engine.runner.torch_runner import TorchRunner
from services.engine.sampling.vocab import token_vocab_size
from services.engine.scheduler.proposals import NgramProposer, Proposer, SequenceProposer
from services.engine.scheduler.resources import KVResources
from services.engine.scheduler.scheduler import Scheduler
from services.engine.scheduler.state import SchedulerConfig
from services.engine.vision.features import FeatureCache
from services.engine.vision.pixels import ImagePrepPixels
from services.engine.vision.stage import VisionStage

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class Engine:
    scheduler: Scheduler
    runner: Runner
    info: CoreInfo
    grammars: GrammarCompiler | None = None   # structured outputs (None: off)


def build_vision(config: EngineConfig, model: object) -> VisionStage | None:
    """The image path of a vision model: the device feature cache and imageprep's pixels
    (without an imageprep address the model serves text, and images are refused)."""
    if not isinstance(model, QwenVLForConditionalGeneration):
        return None
    # raw uint8 pixels, pixel_values computed on the device; or pixel_values themselves, in
    # bf16 for a bf16 tower (half the bytes; imageprep rounds as its cast)
    values_dtype = "bfloat16" if model.visual.dtype == torch.bfloat16 else ""
    dtype = RAW_DTYPE if config.vision_pixels == "raw" else values_dtype
    pixels = ImagePrepPixels(config.imageprep_address, pixel_dtype=dtype,
                             fallback_dtype=values_dtype) if config.imageprep_address else None
    if pixels is None:
        log.warning("vision model without imageprep_address: images are refused")
    model.visual.attention_backend = config.vision_attention
    return VisionStage(model, FeatureCache(config.vision_cache_bytes), pixels,
                       graphs=config.vision_graphs)


def check_vision_attention(config: EngineConfig, device: torch.device) -> None:
    """Refuse `vision_attention: triton` off CUDA: there the paged kernel runs only under
    Triton's CPU interpreter (TRITON_INTERPRET=1, tests), so the start fails naming the
    setting rather than the first image failing (or crawling) inside the encoder."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if config.vision_attention == "triton" and device.type != "cuda" and not interpreted:
        raise ValidationError(
            f"vision_attention triton needs a CUDA device, and the engine's device is "
            f"{device.type} (device: {config.device}); use vision_attention sdpa, or set "
            "TRITON_INTERPRET=1 to run the kernel in Triton's CPU interpreter",
            param="vision_attention")


def build_host_tier(config: EngineConfig, kv: KVCache) -> HostKVStore | None:
    """The host tier's pinned pages (`kv_offload_gib`), or None when it is off."""
    if config.kv_offload_gib <= 0:
        return None
    if not config.prefix_block_reuse or BLOCK_TOKENS % kv.page_size:
        log.warning("kv_offload_gib needs prefix_block_reuse and a page size dividing %d: "
                    "the host tier is off", BLOCK_TOKENS)
        return None
    page_bytes = kv.num_bytes // kv.num_pages
    per_block = BLOCK_TOKENS // kv.page_size
    pages = int(config.kv_offload_gib * 2**30) // page_bytes // per_block * per_block
    if pages < per_block:
        raise ValidationError(f"kv_offload_gib {config.kv_offload_gib} holds no "
                              f"{BLOCK_TOKENS}-token block ({page_bytes * per_block} bytes)",
                              param="kv_offload_gib")
    started = time.perf_counter()
    store = HostKVStore(kv, pages)
    log.info("KV host tier: %d pages (%d blocks, %.2f GiB pinned) in %.1f s", pages,
             pages // per_block, store.num_bytes / 2**30, time.perf_counter() - started)
    return store


def build_grammars(config: EngineConfig, source: ModelSource, vocab_size: int,
                   device: torch.device) -> GrammarCompiler | None:
    """The grammar compiler over the core's tokenizer.json, its vocabulary loaded now (eager)
    or at the first grammar request (lazy); None when structured outputs are off."""
    mode = config.structured_outputs
    if mode == "off":
        return None
    tokenizer = source.manifest.tokenizer_file
    path = source.path(tokenizer) if tokenizer else None
    compiler = GrammarCompiler(
        GrammarVocabulary(path, vocab_size, tuple(source.manifest.eos_token_ids)),
        cache_size=config.grammar_cache_size)
    if (mode == "eager" or (mode == "auto" and device.type == "cuda")) and path is not None \
            and path.is_file():
        try:
            compiler.vocabulary.tokenizer()
        except UnsupportedError as exc:
            if mode == "eager":
                raise  # asked for explicitly: refuse to start without it
            # auto: serve everything else; grammar requests get this error at admission
            log.warning("structured outputs unavailable: %s", exc.message)
    return compiler


def build_proposer(config: EngineConfig,
                   drafter: DraftModelProposer | Eagle3Proposer | None = None
                   ) -> Proposer | SequenceProposer | None:
    """The speculative proposer of `speculative_method` (None: speculation off; draft,
    eagle3: the drafter built with the KV pool)."""
    method = config.speculative_method
    if method == "none":
        return None
    if method == "ngram":
        return NgramProposer(num_tokens=config.num_speculative_tokens)
    if method in ("draft", "eagle3") and drafter is not None:
        return drafter
    # never serve without the speculation that was asked for
    raise UnsupportedError(f"speculative_method {method} needs its drafter",
                           param="speculative_method")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValidationError(f"device {name} requested but CUDA is not available",
                              param="device")
    return device


def start_compile_pool(config: EngineConfig) -> CompilePool | None:
    """The kernel compile workers (kernels/compile_pool.py) for a CUDA device with the graph
    runner, forked now: call it before CUDA is initialised. None elsewhere."""
    workers = default_workers() if config.kernel_compile_workers < 0 else \
        config.kernel_compile_workers
    if workers < 1 or config.runner == "torch":
        return None
    try:
        if resolve_device(config.device).type != "cuda":
            return None
        import triton  # noqa: F401  (imported before the fork: the workers need it)
    except (ValidationError, ImportError):
        return None
    return CompilePool.start(workers)


# Engine settings that cannot change which kernel variants a start-up meets: where it listens
# and logs, where the model and imageprep are (the model's config is in the digest itself),
# how weights are drawn, host-side sizes. A `helios run` start gets a fresh socket path each
# time, so these must stay out of the variant list's digest or no list is ever found again.
KERNEL_NEUTRAL_SETTINGS = frozenset({
    "grace_period_s", "listen", "log_format", "log_level", "metrics_listen", "model",
    "imageprep_address", "device", "cpu_threads", "load_format", "dummy_seed",
    "kernel_compile_workers", "grammar_cache_size", "max_waiting", "kv_events_endpoint",
    "kv_events_replay_endpoint", "kv_events_topic", "kv_events_buffer"})


def kernel_list_parts(config: EngineConfig, model_config: dict[str, Any], dtype: torch.dtype,
                      capability: tuple[int, int], versions: dict[str, str]
                      ) -> dict[str, Any]:
    """What decides a start-up's kernel variants: the engine settings but the neutral ones,
    the model's config, the dtype, the device's compute capability, the library versions."""
    settings = {key: value for key, value in dataclasses.asdict(config).items()
                if key not in KERNEL_NEUTRAL_SETTINGS}
    return {"engine": settings, "model": model_config, "dtype": str(dtype),
            "device": list(capability), **versions}


def kernel_list_path(config: EngineConfig, source: ModelSource, device: torch.device,
                     dtype: torch.dtype) -> Path | None:
    """Where this start-up's kernel variant list is remembered (kernels/precompile.py adds
    the kernel sources to the digest of `kernel_list_parts`). None off CUDA."""
    if device.type != "cuda":
        return None
    import triton

    return remembered_path(kernel_list_parts(
        config, source.config, dtype, torch.cuda.get_device_capability(device),
        {"torch": torch.__version__, "triton": triton.__version__}))


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index or 0
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return "cpu"


@dataclass(frozen=True, slots=True)
class RunnerChoice:
    graph: bool               # GraphRunner (else the synchronous TorchRunner)
    graph_max_batch: int      # largest captured decode capacity (0: none; CUDA only)
    overlap: bool             # two-frame execution
    cost_model: bool          # measured step durations size prefill chunks
    prefill_graphs: bool      # graphs for prefill and mixed steps (with decode graphs)


def resolve_runner(config: EngineConfig, device: torch.device) -> RunnerChoice:
    """auto: the graph runner with graphs, overlap and the cost model on CUDA; the torch
    runner on the CPU. Each can be forced (the CPU tests run the graph runner eagerly)."""
    cuda = device.type == "cuda"
    graph = config.runner == "graph" or (config.runner == "auto" and cuda)
    max_batch = config.max_num_seqs if config.cuda_graph_max_batch == 0 else \
        max(0, config.cuda_graph_max_batch)
    overlap = graph and (config.overlap == "on" or (config.overlap == "auto" and cuda))
    cost_model = config.cost_model == "on" or (config.cost_model == "auto" and cuda)
    graph_batch = max_batch if graph else 0
    prefill_graphs = bool(graph_batch) and config.cuda_graph_prefill != "off"
    return RunnerChoice(graph, graph_batch, overlap, cost_model, prefill_graphs)


def build_engine(config: EngineConfig, source: ModelSource,
                 phases: StartupPhases | None = None,
                 compile_pool: CompilePool | None = None) -> Engine:
    """The model, the KV cache, the runner and the scheduler; each start-up phase is timed
    (`phases`, services/common/startup.py). A `compile_pool` (`start_compile_pool`, forked
    before CUDA is initialised) compiles the start-up's kernel variants in parallel; it is
    closed here."""
    phases = phases or StartupPhases("engine")
    device = resolve_device(config.device)
    check_vision_attention(config, device)
    dtype = default_dtype(device) if config.dtype == "auto" else _DTYPES[config.dtype]
    model_config = ModelConfig.from_dict(source.config, config.quantization,
                                         config.mxfp4_experts)
    manifest = source.manifest
    context = min(config.max_model_len or manifest.max_model_len, manifest.max_model_len,
                  model_config.max_context)
    # a remembered kernel variant list (kernels/precompile.py) compiles while the weights load
    kernel_list = kernel_list_path(config, source, device, dtype) \
        if compile_pool is not None else None
    known = load_remembered(kernel_list) if kernel_list is not None else []
    if compile_pool is not None and known:
        target = current_target()
        for variant in known:
            compile_pool.submit(variant, target)
    phases.start("load weights")
    if config.load_format == "dummy":
        model = load_dummy_model(model_config, device, dtype, max_positions=context,
                                 seed=config.dummy_seed)
    else:
        model = load_model(source, device, dtype, max_positions=context,
                           quantization=config.quantization,
                           mxfp4_experts=config.mxfp4_experts)
    drafter: Drafter | Eagle3Drafter | None = None
    if config.speculative_method == "draft":    # its pages share the KV budget (drafter.py)
        phases.start("load the draft model")
        drafter = open_drafter(config.speculative_model, source, device, dtype, context,
                               dummy_seed=config.dummy_seed
                               if config.load_format == "dummy" else None)
    elif config.speculative_method == "eagle3":     # likewise (eagle3_drafter.py)
        phases.start("load the EAGLE-3 head")
        drafter = open_eagle3(config.speculative_model, model, source, device, dtype, context)
    phases.start("allocate the KV cache")
    itemsize = torch.empty((), dtype=dtype).element_size()
    # FP8 pages (kv_cache_dtype fp8): one byte per element, so twice the pages per byte
    kv_dtype = torch.float8_e4m3fn if config.kv_cache_dtype == "fp8" else dtype
    layout = plan_layout(
        device=device,
        page_bytes=kv_cache_bytes_per_page(model_config, config.page_size, kv_dtype) +
        (drafter.page_bytes(config.page_size) if drafter is not None else 0),
        page_size=config.page_size, hidden_bytes=model_config.hidden_size * itemsize,
        budget_bytes=config.kv_cache_bytes, memory_fraction=config.kv_cache_memory_fraction,
        num_snapshots=config.num_snapshots, max_num_seqs=config.max_num_seqs,
        min_tokens=min(context, config.prefill_chunk_size), capacity_hint=config.capacity_hint)
    if (layout.num_pages - 1) * layout.page_size < context:
        log.warning("the KV pool holds %d tokens, less than the %d-token context: longer "
                    "requests are refused (400: they can never run)",
                    (layout.num_pages - 1) * layout.page_size, context)
    kv = allocate_kv_cache(model_config, layout.num_pages, layout.page_size, device, kv_dtype)
    snapshots = SnapshotStore(kv, layout.num_snapshots, model_config.hidden_size, dtype, device)
    # before any graph capture: an EAGLE-3 head hooks the target's forward
    draft_proposer = None if drafter is None else drafter.proposer(
        layout.num_pages, layout.page_size, num_tokens=config.num_speculative_tokens,
        chunk_tokens=config.batched_tokens)
    host_kv = build_host_tier(config, kv)
    eos = tuple(manifest.eos_token_ids)
    # the tokenizer's ids: the sampler never emits the embedding's padding rows past them,
    # and every validation message names this size (sampling/vocab.py)
    tokenizer = source.path(manifest.tokenizer_file) if manifest.tokenizer_file else None
    token_vocab = token_vocab_size(tokenizer, model_config.vocab_size)
    choice = resolve_runner(config, device)
    vision = build_vision(config, model)     # both runners feed its image rows eagerly
    # a step may feed one whole image span past its token budget: at most the context
    max_image_tokens = context if vision is not None else 0
    runner: Runner
    if choice.graph:
        graph_runner = GraphRunner(model, kv, snapshots, GraphRunnerConfig(
            num_slots=config.max_num_seqs, max_model_len=context,
            max_num_batched_tokens=config.batched_tokens,
            graph_max_batch=choice.graph_max_batch, overlap=choice.overlap,
            eos_token_ids=eos, token_vocab=token_vocab,
            max_drafts=config.num_speculative_tokens
            if config.speculative_method != "none" else 0,
            max_image_tokens=max_image_tokens, prefill_graphs=choice.prefill_graphs),
            host_kv=host_kv, vision=vision)
        if compile_pool is not None:
            phases.start("compile kernels")
            graph_runner.precompile(compile_pool, submitted=bool(known))
        phases.start("capture CUDA graphs")
        graph_runner.capture(kernel_list, known)
        if draft_proposer is not None and choice.graph_max_batch:  # the drafter's rounds'
            draft_proposer.warm_up()        # graphs (after the target's) and eager round
        runner = graph_runner
    else:
        runner = TorchRunner(model, kv, snapshots, vision=vision,
                             num_slots=config.max_num_seqs,
                             eos_token_ids=eos, token_vocab=token_vocab, host_kv=host_kv)
    if compile_pool is not None:
        compile_pool.close()
    reset_expert_load(model)     # graph capture and warm-up forwards routed tokens too
    pooling = pooling_config(source)
    resources = KVResources(num_pages=layout.num_pages, page_size=layout.page_size,
                            num_snapshots=layout.num_snapshots,
                            block_reuse=config.prefix_block_reuse,
                            host_pages=host_kv.num_pages if host_kv is not None else 0)
    scheduler_config = SchedulerConfig(
        max_num_seqs=config.max_num_seqs, max_waiting=config.waiting_capacity,
        prefill_chunk_size=config.prefill_chunk_size,
        max_num_batched_tokens=config.batched_tokens, max_model_len=context,
        vocab_size=token_vocab, eos_token_ids=frozenset(eos),
        checkpoint_extra_fraction=config.checkpoint_extra_fraction,
        checkpoint_stops=config.checkpoint_stops,
        context_hint=manifest.context_hint or config.context_hint,
        capacity_hint=manifest.capacity_hint or config.capacity_hint,
        supports_images=vision is not None and vision.pixels is not None,
        max_image_tokens=max_image_tokens, overlap=choice.overlap, cost_model=choice.cost_model,
        pooling=pooling.mode, normalize_embeddings=pooling.normalize,
        pooling_hint=pooling.reason, proposer=build_proposer(config, draft_proposer))
    phases.start("load the grammar vocabulary")
    grammars = build_grammars(config, source, model_config.vocab_size, device)
    phases.finish()
    scheduler = Scheduler(scheduler_config, resources, manifest.identity_bytes, grammars)
    info = CoreInfo(device=describe_device(device), dtype=str(dtype).removeprefix("torch."),
                    page_size=layout.page_size, num_pages=layout.num_pages,
                    num_snapshots=layout.num_snapshots, max_model_len=context,
                    max_num_seqs=config.max_num_seqs,
                    prefill_chunk_size=config.prefill_chunk_size,
                    kv_cache_bytes=layout.budget_bytes, vocab_size=token_vocab,
                    vision=vision is not None and vision.pixels is not None)
    log.info("engine built", extra={"fields": {
        "device": info.device, "dtype": info.dtype, "pages": layout.num_pages,
        "page_size": layout.page_size, "snapshots": layout.num_snapshots,
        "context": context, "kv_bytes": layout.budget_bytes,
        "kv_dtype": str(kv_dtype).removeprefix("torch."),
        "quantization": model_config.quantization.name if model_config.quantization else "",
        "expert_weight_bytes": expert_weight_bytes(model)}})
    return Engine(scheduler, runner, info, grammars)

"""EngineConfig: one frozen dataclass for the engine service (flags, env HELIOS_*, YAML)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import ServiceConfig, option
from services.common.errors import ValidationError

DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("", "fp8")
KV_CACHE_DTYPES = ("auto", "fp8")
LOAD_FORMATS = ("auto", "safetensors", "dummy")
RUNNERS = ("auto", "torch", "graph")
SWITCHES = ("auto", "on", "off")
STRUCTURED_OUTPUTS = ("auto", "eager", "lazy", "off")
SPECULATIVE_METHODS = ("none", "ngram", "draft", "eagle3")
MAX_SPECULATIVE_TOKENS = 15      # drafts per step at most (a verification row width of 16)


@dataclass(frozen=True)
class EngineConfig(ServiceConfig):
    listen: str = option("127.0.0.1:50052", "gRPC listen address: host:port or unix:///path")
    model: str = option("", "prepared core or Hugging Face model directory")
    imageprep_address: str = option("", "imageprep gRPC address (pixels for vision models)")
    vision_cache_bytes: int = option(256 << 20, "device bytes for cached vision features "
                                     "(by image identity; LRU)")
    vision_attention: str = option("sdpa", "vision encoder attention: sdpa, or triton (the "
                                   "paged kernel over each image's keys; CUDA)")
    vision_graphs: int = option(4, "vision encoder passes kept as CUDA graphs, one per "
                                "image layout (the images' grids), captured the second time "
                                "a layout is met; 0: every pass eager")
    vision_pixels: str = option("raw", "how images' pixels come from imageprep: raw (the "
                                "resized uint8 image; pixel_values computed on the device) "
                                "or values (pixel_values, 8x the bytes in float32)")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    dtype: str = option("auto", "compute dtype: auto (float32 on CPU, bfloat16 on GPU), "
                                "float32, bfloat16 or float16")
    mxfp4_experts: str = option("dequantize", "a checkpoint's MXFP4 experts (gpt-oss): "
                                "dequantize (to the model dtype at load) or keep (packed, "
                                "4.25 bits a weight; the fused-MoE kernel dequantizes tiles)")
    quantization: str = option("", "weights: empty (as the checkpoint stores them; FP8 "
                                   "checkpoints run FP8) or fp8 (quantize a dense checkpoint's "
                                   "decoder projections to e4m3 at load, one scale per output "
                                   "row; activations per token)")
    kv_cache_dtype: str = option("auto", "KV pages: auto (the compute dtype) or fp8 (e4m3 "
                                         "with per-head scales: twice the pages for the bytes)")
    max_num_seqs: int = option(64, "live request slots")
    max_waiting: int = option(0, "bounded waiting queue in requests (0: 4 x max_num_seqs)")
    prefill_chunk_size: int = option(512, "prompt tokens per prefill step (multiple of 64)")
    max_num_batched_tokens: int = option(0, "tokens per engine step across requests "
                                            "(0: prefill_chunk_size + max_num_seqs)")
    max_model_len: int | None = option(None, "context limit (default: the model's)")
    page_size: int = option(16, "tokens per KV page")
    kv_cache_bytes: int = option(0, "bytes for KV pages and snapshot rows (0: "
                                    "kv_cache_memory_fraction of free device memory; on the "
                                    "CPU capped at 1 GiB)")
    kv_cache_memory_fraction: float = option(0.9, "fraction of free device memory for the KV "
                                                  "cache when kv_cache_bytes is 0")
    num_snapshots: int = option(0, "checkpoint snapshot rows (0: 2 x max_num_seqs)")
    cpu_threads: int = option(0, "torch intra-op threads of the engine core (0: torch's "
                                 "default, one per core)")
    load_format: str = option("auto", "weights: auto or safetensors (read the checkpoint), "
                                      "or dummy (random weights drawn on the device from "
                                      "dummy_seed; a directory without weights serves: "
                                      "speed tests at real shapes)")
    dummy_seed: int = option(0, "seed of the dummy weights")
    runner: str = option("auto", "auto (graph on CUDA, torch on the CPU), torch (eager, "
                                 "synchronous) or graph (persistent buffers, CUDA graphs for "
                                 "decode, two-frame overlap; eager on the CPU)")
    cuda_graph_max_batch: int = option(0, "largest decode batch captured as a CUDA graph "
                                          "(power-of-two capacities up to it; 0: max_num_seqs, "
                                          "-1: no graphs)")
    cuda_graph_prefill: str = option("auto", "CUDA graphs for prefill and mixed steps, one "
                                             "per power-of-two token capacity up to "
                                             "max_num_batched_tokens (auto: on wherever decode "
                                             "graphs are; off: those steps run eagerly)")
    kernel_compile_workers: int = option(
        -1, "processes that compile the start-up's Triton kernel variants in parallel on a "
            "CUDA device (-1: one per core but one, at most 16; 0: the engine core compiles "
            "them itself, one at a time)")
    overlap: str = option("auto", "two-frame execution: plan step N+1 while step N runs "
                                  "(auto: on with the graph runner)")
    cost_model: str = option("auto", "size prefill chunks by measured per-shape step durations "
                                     "(auto: on for CUDA)")
    structured_outputs: str = option(
        "auto", "grammar-constrained decoding (JSON schema, regex, Lark): eager loads the "
                "vocabulary the grammar library needs at startup, lazy at the first grammar "
                "request (about a second for 150k tokens), off refuses grammars; auto: eager on "
                "CUDA, lazy on the CPU")
    grammar_cache_size: int = option(64, "compiled grammars kept (least recently used first "
                                         "out)")
    checkpoint_extra_fraction: float = option(
        0.05, "extra prefill work allowed for checkpoints at earlier message boundaries")
    checkpoint_stops: bool = option(
        False, "prefill stops at each message-boundary checkpoint (the reference design: the "
               "checkpoint also saves the boundary's hidden state); off: a chunk runs past a "
               "boundary and saves its partial page only, so a chat's prompt takes no extra "
               "step for the end of its last message")
    context_hint: str = option("raise --max-model-len (engine) up to the model's context",
                               "appended to context-overflow errors")
    capacity_hint: str = option("raise --max-num-seqs or the KV cache budget (engine)",
                                "appended to capacity errors")
    prefix_block_reuse: bool = option(True, "reuse every complete 64-token block a cached "
                                            "prompt shares (and wait for blocks a running "
                                            "prompt is prefilling); off: exact checkpoints "
                                            "only (message boundaries, whole prompts)")
    speculative_method: str = option(
        "none", "speculative decoding: none, ngram (copy proposals: prompt lookup over the "
                "request's own prompt and output, no extra model), draft (a draft model, "
                "speculative_model) or eagle3 (an EAGLE-3 head, speculative_model); every "
                "proposal is verified by the target, so output is unchanged")
    speculative_model: str = option("", "the draft model or EAGLE-3 head directory "
                                        "(speculative_method draft or eagle3)")
    num_speculative_tokens: int = option(4, "drafts a request may verify per step at most "
                                            f"(1..{MAX_SPECULATIVE_TOKENS}); the scheduler "
                                            "picks each request's width up to it")
    kv_offload_gib: float = option(0.0, "host memory (GiB, pinned) for a second KV tier: "
                                        "complete blocks evicted from the GPU are copied there "
                                        "and brought back on a prefix hit instead of being "
                                        "recomputed (0: off; needs prefix_block_reuse)")
    kv_events_endpoint: str = option("", "ZMQ PUB endpoint for prefix-cache events in vLLM's "
                                         "KV-events format (e.g. tcp://*:5557; empty: off)")
    kv_events_replay_endpoint: str = option("", "ZMQ ROUTER endpoint replaying buffered KV "
                                                "event batches from a sequence number")
    kv_events_topic: str = option("", "topic frame of every KV event batch")
    kv_events_buffer: int = option(10_000, "KV event batches kept for replay")

    def __post_init__(self) -> None:
        if self.vision_attention not in ("sdpa", "triton"):
            raise ValidationError(f"vision_attention must be sdpa or triton, not "
                                  f"{self.vision_attention!r}", param="vision_attention")
        if self.vision_graphs < 0:
            raise ValidationError(f"vision_graphs must be 0 or more, not {self.vision_graphs}",
                                  param="vision_graphs")
        if self.mxfp4_experts not in ("dequantize", "keep"):
            raise ValidationError(f"mxfp4_experts must be dequantize or keep, not "
                                  f"{self.mxfp4_experts!r}", param="mxfp4_experts")
        if self.vision_pixels not in ("raw", "values"):
            raise ValidationError(f"vision_pixels must be raw or values, not "
                                  f"{self.vision_pixels!r}", param="vision_pixels")
        super().__post_init__()
        if not self.model:
            raise ValidationError("engine needs --model (a core or model directory)",
                                  param="model")
        if self.kv_events_replay_endpoint and not self.kv_events_endpoint:
            raise ValidationError("kv_events_replay_endpoint needs kv_events_endpoint",
                                  param="kv_events_replay_endpoint")
        if self.max_num_seqs < 1:
            raise ValidationError("max_num_seqs must be >= 1", param="max_num_seqs")
        if self.prefill_chunk_size < 64 or self.prefill_chunk_size % 64:
            raise ValidationError("prefill_chunk_size must be a positive multiple of 64",
                                  param="prefill_chunk_size")
        if self.max_num_batched_tokens and self.max_num_batched_tokens < max(
                64, self.max_num_seqs):
            raise ValidationError("max_num_batched_tokens must be 0 or at least 64 and "
                                  "max_num_seqs (every live request decodes each step)",
                                  param="max_num_batched_tokens")
        if self.max_waiting < 0:
            raise ValidationError("max_waiting must be >= 0", param="max_waiting")
        if self.page_size < 1:
            raise ValidationError("page_size must be >= 1", param="page_size")
        if self.kv_offload_gib < 0:
            raise ValidationError("kv_offload_gib must be >= 0", param="kv_offload_gib")
        if self.kv_cache_bytes < 0 or not 0 < self.kv_cache_memory_fraction <= 1:
            raise ValidationError("kv_cache_bytes must be >= 0 and kv_cache_memory_fraction "
                                  "in (0, 1]", param="kv_cache_bytes")
        if self.cpu_threads < 0:
            raise ValidationError("cpu_threads must be >= 0", param="cpu_threads")
        if self.num_snapshots < 0:
            raise ValidationError("num_snapshots must be >= 0", param="num_snapshots")
        if self.dtype not in DTYPES:
            raise ValidationError(f"dtype must be one of {DTYPES}", param="dtype")
        if self.quantization not in QUANTIZATIONS:
            raise ValidationError(f"quantization {self.quantization!r} is not supported "
                                  "(supported: fp8, or empty for the checkpoint's own)",
                                  param="quantization")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValidationError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}",
                                  param="kv_cache_dtype")
        for name, allowed in (("load_format", LOAD_FORMATS), ("runner", RUNNERS),
                              ("overlap", SWITCHES), ("cost_model", SWITCHES),
                              ("cuda_graph_prefill", SWITCHES),
                              ("structured_outputs", STRUCTURED_OUTPUTS),
                              ("speculative_method", SPECULATIVE_METHODS)):
            if getattr(self, name) not in allowed:
                raise ValidationError(f"{name} must be one of {allowed}", param=name)
        if self.cuda_graph_max_batch < -1:
            raise ValidationError("cuda_graph_max_batch must be >= -1",
                                  param="cuda_graph_max_batch")
        if self.kernel_compile_workers < -1:
            raise ValidationError("kernel_compile_workers must be >= -1 (-1: automatic)",
                                  param="kernel_compile_workers")
        if self.grammar_cache_size < 1:
            raise ValidationError("grammar_cache_size must be >= 1", param="grammar_cache_size")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValidationError(f"num_speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS}",
                                  param="num_speculative_tokens")
        if self.speculative_method in ("draft", "eagle3") and not self.speculative_model:
            raise ValidationError(f"speculative_method {self.speculative_method} needs "
                                  "speculative_model (a model directory)",
                                  param="speculative_model")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValidationError("max_model_len must be >= 2", param="max_model_len")

    @property
    def batched_tokens(self) -> int:
        return self.max_num_batched_tokens or self.prefill_chunk_size + self.max_num_seqs

    @property
    def waiting_capacity(self) -> int:
        return self.max_waiting or 4 * self.max_num_seqs

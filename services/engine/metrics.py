"""Engine metrics: the core's counters and gauges, read at scrape time, plus latency histograms.

Counters and gauges come from the engine core's load snapshot (the same numbers GetLoad
returns), fetched when Prometheus scrapes, so a scrape after the engine went quiet shows exact
totals. Names follow the reference design (`helios_engine_*`) and, for Kubernetes inference
routing, vLLM's (`vllm:*`, labelled with `model_name` only). The servicer observes
time-to-first-token and end-to-end latency per request. No request labels, prompts or ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.common.heap import gc_families
from services.engine.core.telemetry import LoadSnapshot
from services.engine.prefix.history import BLOCK_TOKENS

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
MINUTE_SAMPLE_S = 5.0   # the last-minute token gauge is re-sampled at most this often

_COUNTERS = (  # (name, help, snapshot field)
    ("helios_engine_requests_admitted", "requests admitted by the engine", "requests_admitted"),
    ("helios_engine_requests_completed", "requests that finished normally", "requests_completed"),
    ("helios_engine_requests_cancelled", "requests cancelled or aborted", "requests_cancelled"),
    ("helios_engine_requests_failed", "requests that failed during execution", "requests_failed"),
    ("helios_engine_requests_rejected", "requests refused at admission", "requests_rejected"),
    ("helios_engine_prefix_lookups", "prefix-cache lookups (rejected admissions included)",
     "prefix_lookups"),
    ("helios_engine_prefix_hits", "prefix-cache lookups that reused a checkpoint", "prefix_hits"),
    ("helios_engine_prefix_misses", "prefix-cache lookups that reused nothing", "prefix_misses"),
    ("helios_engine_prefix_reused_tokens", "prompt tokens served from the prefix cache",
     "prefix_reused_tokens"),
    ("helios_engine_checkpoints_published", "ready checkpoint publications (unique)",
     "checkpoints_published"),
    ("helios_engine_checkpoints_evicted", "logical checkpoint evictions", "checkpoints_evicted"),
    ("helios_engine_prompt_tokens", "prompt tokens consumed (no padding, no reuse)",
     "prompt_tokens"),
    ("helios_engine_generation_tokens", "output tokens committed", "generation_tokens"),
    ("helios_engine_preemptions", "requests preempted for pages", "preemptions"),
)

_GAUGES = (
    ("helios_engine_slots_live", "request slots holding a live request", "slots_live"),
    ("helios_engine_slots_free", "request slots free for admission", "slots_free"),
    ("helios_engine_slots_retiring", "request slots waiting for their last GPU use",
     "slots_retiring"),
    ("helios_engine_pages_total", "KV pages in the pool", "pages_total"),
    ("helios_engine_pages_reusable", "KV pages free to reuse (fences complete)", "pages_free"),
    ("helios_engine_pages_cached", "KV pages owned by cached checkpoints", "pages_cached"),
    ("helios_engine_pages_retiring", "KV pages waiting for their final-use fence",
     "pages_retiring"),
    ("helios_engine_checkpoints_cached", "checkpoints in the prefix cache", "checkpoints_cached"),
    ("helios_engine_requests_pending", "requests waiting for admission to a slot", "num_waiting"),
    ("helios_engine_requests_running", "requests holding a slot", "num_running"),
)


class EngineMetrics(Collector):
    def __init__(self, registry: CollectorRegistry, model_name: str,
                 fetch: Callable[[], LoadSnapshot | None], *, page_size: int = 16) -> None:
        self.model_name = model_name
        self.page_size = page_size
        self._fetch = fetch
        self._minute_value = 0
        self._minute_sampled = -MINUTE_SAMPLE_S
        self.ttft = Histogram("vllm:time_to_first_token_seconds",
                              "engine admission to the first output token", ["model_name"],
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "engine request start to its last output", ["model_name"],
                             buckets=LATENCY_BUCKETS, registry=registry)
        registry.register(self)

    # -- per request (servicer) -------------------------------------------------------------
    def observe_first_token(self, seconds: float) -> None:
        self.ttft.labels(self.model_name).observe(seconds)

    def observe_finished(self, seconds: float) -> None:
        self.e2e.labels(self.model_name).observe(seconds)

    # -- scrape -----------------------------------------------------------------------------
    def describe(self) -> Iterator[Metric]:
        return iter(())  # values are read at scrape time; nothing to describe up front

    def collect(self) -> Iterator[Metric]:
        snap = self._fetch()
        if snap is None:
            return
        for name, help_text, attr in _COUNTERS:
            yield CounterMetricFamily(name, help_text, value=getattr(snap, attr))
        for name, help_text, attr in _GAUGES:
            yield GaugeMetricFamily(name, help_text, value=getattr(snap, attr))
        launches = CounterMetricFamily("helios_engine_launches",
                                       "successful engine steps by graph kind", labels=["kind"])
        for kind, count in sorted(snap.launches_by_kind.items()):
            launches.add_metric([kind], count)
        yield launches
        now = time.monotonic()
        if now - self._minute_sampled >= MINUTE_SAMPLE_S:
            self._minute_value, self._minute_sampled = snap.tokens_last_minute, now
        yield GaugeMetricFamily("helios_engine_tokens_last_minute",
                                "output tokens generated during the most recent minute "
                                "(sampled every five seconds)", value=self._minute_value)
        # vLLM-compatible names (Kubernetes inference routing reads these)
        labels, value = ["model_name"], [self.model_name]
        for name, help_text, number, family in (
            ("vllm:num_requests_waiting", "requests waiting to be scheduled",
             snap.num_waiting, GaugeMetricFamily),
            ("vllm:num_requests_running", "requests being scheduled", snap.num_running,
             GaugeMetricFamily),
            ("vllm:kv_cache_usage_perc", "fraction of KV pages in use (1 = full)",
             snap.kv_cache_usage, GaugeMetricFamily),
            ("vllm:prefix_cache_queries", "prompt tokens looked up in the prefix cache",
             snap.prefix_query_tokens, CounterMetricFamily),
            ("vllm:prefix_cache_hits", "prompt tokens found in the prefix cache",
             snap.prefix_reused_tokens, CounterMetricFamily),
            ("vllm:prompt_tokens", "prompt tokens processed", snap.prompt_tokens,
             CounterMetricFamily),
            ("vllm:generation_tokens", "output tokens generated", snap.generation_tokens,
             CounterMetricFamily),
        ):
            metric = family(name, help_text, labels=labels)
            metric.add_metric(value, number)
            yield metric
        yield from _tier_metrics(snap)
        yield from _speculative_metrics(snap, self.model_name)
        if snap.gc is not None:         # the core's own pauses stall the step loop
            yield from gc_families("helios_engine_core", snap.gc, "engine core process")
        # the cache's shape, as vLLM states it (Gateway API Inference Extension's model-server
        # protocol): a block is the prefix cache's 64-token unit, the one KV events name
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "prefix-cache configuration (value 1)",
            labels=["model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching"])
        info.add_metric([self.model_name, str(BLOCK_TOKENS),
                         str(snap.pages_total * self.page_size // BLOCK_TOKENS), "True"], 1)
        yield info


def _tier_metrics(snap: LoadSnapshot) -> Iterator[Metric]:
    """Prefix-cache hits and reused tokens per tier (gpu, host), and the host tier's pages."""
    host = snap.host_tier
    hits = CounterMetricFamily("helios_engine_prefix_tier_hits",
                               "residencies that reused cached KV, per tier", labels=["tier"])
    tokens = CounterMetricFamily("helios_engine_prefix_tier_reused_tokens",
                                 "prompt tokens served from cache, per tier", labels=["tier"])
    hits.add_metric(["gpu"], snap.prefix_hits)
    tokens.add_metric(["gpu"], snap.prefix_reused_tokens)
    if host is not None:
        hits.add_metric(["host"], host.hits)
        tokens.add_metric(["host"], host.reused_tokens)
    yield hits
    yield tokens
    if host is None:
        return
    yield GaugeMetricFamily("helios_engine_host_pages_total", "KV pages in the host tier",
                            value=host.pages_total)
    yield GaugeMetricFamily("helios_engine_host_pages_cached",
                            "host-tier pages holding evicted blocks", value=host.pages_cached)
    for name, help_text, value in (
        ("helios_engine_host_blocks_offloaded", "blocks copied from the GPU to the host tier",
         host.blocks_offloaded),
        ("helios_engine_host_blocks_dropped", "evicted blocks the host tier had no room for",
         host.blocks_dropped),
        ("helios_engine_host_blocks_evicted", "blocks the host tier evicted",
         host.blocks_evicted),
    ):
        yield CounterMetricFamily(name, help_text, value=value)


def _speculative_metrics(snap: LoadSnapshot, model_name: str) -> Iterator[Metric]:
    """Speculative decoding: Helios's names and vLLM's `vllm:spec_decode_*` (nothing while it
    is off)."""
    spec = snap.speculative
    if spec is None:
        return
    for name, help_text, value in (
        ("helios_engine_spec_verification_steps", "completed steps that verified drafts",
         spec.verification_steps),
        ("helios_engine_spec_drafter_steps", "learned-proposal (draft model) steps run; copy "
         "proposals run none", spec.drafter_steps),
        ("helios_engine_spec_rounds", "generation rounds of speculating requests",
         spec.rounds),
        ("helios_engine_spec_depth", "draft positions allocated over those rounds (zero-draft "
         "rounds included)", spec.depth),
        ("helios_engine_spec_accepted_tokens", "drafts accepted and committed",
         spec.num_accepted_tokens),
        ("helios_engine_spec_switched_off", "rounds the batch switch-off stripped every draft",
         spec.switched_off),
    ):
        yield CounterMetricFamily(name, help_text, value=value)
    yield GaugeMetricFamily(
        "helios_engine_spec_acceptance_length", "mean accepted drafts per round that verified "
        "any (the bonus token excluded)",
        value=spec.num_accepted_tokens / spec.num_drafts if spec.num_drafts else 0.0)
    for name, help_text, number in (
        ("vllm:spec_decode_num_drafts", "rounds that verified drafts", spec.num_drafts),
        ("vllm:spec_decode_num_draft_tokens", "draft tokens verified", spec.num_draft_tokens),
        ("vllm:spec_decode_num_accepted_tokens", "draft tokens accepted",
         spec.num_accepted_tokens),
    ):
        metric = CounterMetricFamily(name, help_text, labels=["model_name"])
        metric.add_metric([model_name], number)
        yield metric
    per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                  "draft tokens accepted, by draft position",
                                  labels=["model_name", "position"])
    for position, count in enumerate(spec.num_accepted_tokens_per_pos):
        per_pos.add_metric([model_name, str(position)], count)
    yield per_pos

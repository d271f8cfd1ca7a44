"""The Helios Grafana dashboard: every panel and its PromQL, written as data.

    python docker/grafana/dashboard.py          # writes helm/helios/dashboards/helios.json
    python docker/grafana/dashboard.py --check  # exit 1 when that file is not this output

helm/helios/dashboards/helios.json is the one copy Grafana reads: the chart ships it as a
ConfigMap for Grafana's dashboard sidecar and docker/compose.yaml mounts the same file. Change
panels here and regenerate; tests/deploy/test_dashboard.py fails when the JSON differs from
this output, and checks every query against a real `helios run --demo` scrape. Metric meanings:
docs/observability.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_json import Panel, Query, Row, dashboard, datasource_variable, query_variable

OUTPUT = Path(__file__).resolve().parents[2] / "helm" / "helios" / "dashboards" / "helios.json"
WINDOW = "$__rate_interval"
NAMESPACE = 'namespace=~"$namespace"'
MODEL = 'model_name=~"$model_name"'
TOKENS_PER_S = "suffix: tok/s"
PER_S = "reqps"


def sel(name: str, *matchers: str) -> str:
    """A selector of this dashboard: every series is filtered by the namespace variable."""
    return f"{name}{{{', '.join((NAMESPACE, *matchers))}}}"


def rate(name: str, *matchers: str) -> str:
    return f"rate({sel(name, *matchers)}[{WINDOW}])"


def total_rate(name: str, *matchers: str, by: str = "") -> str:
    return f"sum{f' by ({by})' if by else ''} ({rate(name, *matchers)})"


def gauge(name: str, *matchers: str, agg: str = "sum") -> str:
    return f"{agg}({sel(name, *matchers)})"


def ratio(hits: str, total: str) -> str:
    return f"{hits} / {total}"


def quantiles(histogram: str, *matchers: str) -> tuple[Query, ...]:
    """p50/p90/p99 across every pod, and the mean, of a Prometheus histogram."""
    buckets = total_rate(f"{histogram}_bucket", *matchers, by="le")
    return (*(Query(f"histogram_quantile({q}, {buckets})", f"p{round(q * 100)}")
              for q in (0.5, 0.9, 0.99)),
            Query(ratio(total_rate(f"{histogram}_sum", *matchers),
                        total_rate(f"{histogram}_count", *matchers)), "mean"))


def p90(histogram: str, legend: str, *matchers: str) -> Query:
    return Query(f"histogram_quantile(0.9, {total_rate(histogram + '_bucket', *matchers, by='le')})",
                 legend)


def stat(title: str, description: str, expr: str, unit: str = "short",
         thresholds: tuple[tuple[str, float], ...] = ()) -> Panel:
    return Panel(title, description, (Query(expr, title),), unit=unit, kind="stat", width=3,
                 height=4, thresholds=thresholds)


OVERVIEW = Row("Overview", (
    stat("Running", "Requests holding an engine slot (vllm:num_requests_running).",
         gauge("vllm:num_requests_running", MODEL)),
    stat("Waiting", "Requests waiting for a slot (vllm:num_requests_waiting).",
         gauge("vllm:num_requests_waiting", MODEL), thresholds=(("yellow", 1),)),
    stat("KV cache", "Fraction of KV pages in use, the fullest engine (vllm:kv_cache_usage_perc).",
         gauge("vllm:kv_cache_usage_perc", MODEL, agg="max"), "percentunit",
         (("yellow", 0.8), ("red", 0.95))),
    stat("Generation", "Committed output tokens per second, all engines.",
         total_rate("vllm:generation_tokens_total", MODEL), TOKENS_PER_S),
    stat("Prefill", "Prompt tokens computed per second (prefix reuse and padding excluded).",
         total_rate("vllm:prompt_tokens_total", MODEL), TOKENS_PER_S),
    stat("Prefix hits", "Share of looked-up prompt tokens served from the prefix cache.",
         ratio(total_rate("vllm:prefix_cache_hits_total", MODEL),
               total_rate("vllm:prefix_cache_queries_total", MODEL)), "percentunit"),
    stat("Last minute", "Output tokens generated during the most recent minute, sampled every "
         "five seconds by each engine.", gauge("helios_engine_tokens_last_minute")),
    stat("Engine uptime", "Seconds since the youngest engine's listener started.",
         gauge("helios_engine_uptime_seconds", agg="min"), "s"),
))

THROUGHPUT = Row("Throughput and latency", (
    Panel("Token throughput", "Prefill: prompt tokens computed; reused: prompt tokens served "
          "from the prefix cache instead; generation: committed output tokens.", (
              Query(total_rate("vllm:prompt_tokens_total", MODEL), "prefill"),
              Query(total_rate("helios_engine_prefix_reused_tokens_total"), "reused"),
              Query(total_rate("vllm:generation_tokens_total", MODEL), "generation")),
          TOKENS_PER_S),
    Panel("Requests running and waiting", "Engine requests holding a slot, and waiting for one.", (
        Query(gauge("vllm:num_requests_running", MODEL), "running"),
        Query(gauge("vllm:num_requests_waiting", MODEL), "waiting")), stacked=True),
    Panel("Time to first token (engine)", "Engine admission to the first output token.",
          quantiles("vllm:time_to_first_token_seconds", MODEL), "s", width=8),
    Panel("End-to-end latency (engine)", "Engine request start to its last output.",
          quantiles("vllm:e2e_request_latency_seconds", MODEL), "s", width=8),
    Panel("First token by tier (p90)", "Where time to first token goes: the gateway's admission "
          "to first upstream event, the frontend's Generate call to first visible text, the "
          "engine's admission to first token.", (
              p90("helios_gateway_time_to_first_event_seconds", "gateway"),
              p90("helios_frontend_time_to_first_token_seconds", "frontend"),
              p90("vllm:time_to_first_token_seconds", "engine", MODEL)), "s", width=8),
))

KV = Row("Engine: KV cache, slots and pages", (
    Panel("KV cache usage", "Fraction of KV pages in use per model (1 = full: admission waits "
          "or preempts).", (Query(gauge("vllm:kv_cache_usage_perc", MODEL, agg="max"),
                                  "max"),), "percentunit", width=8, max=1,
          thresholds=(("red", 0.95),)),
    Panel("Request slots", "Live: holding a request; free: ready for admission; retiring: "
          "waiting for their last GPU use.", (
              Query(gauge("helios_engine_slots_live"), "live"),
              Query(gauge("helios_engine_slots_free"), "free"),
              Query(gauge("helios_engine_slots_retiring"), "retiring")), width=8, stacked=True),
    Panel("KV pages", "Free: reusable now (their fences completed); cached: owned by "
          "prefix-cache checkpoints; retiring: waiting for their final-use fence; total: the "
          "pool.", (
              Query(gauge("helios_engine_pages_reusable"), "free"),
              Query(gauge("helios_engine_pages_cached"), "cached"),
              Query(gauge("helios_engine_pages_retiring"), "retiring"),
              Query(gauge("helios_engine_pages_total"), "total")),
          width=8, stacked=True, unstacked=("total",)),
    Panel("Checkpoints cached", "Prefix-cache checkpoints held by the engines.",
          (Query(gauge("helios_engine_checkpoints_cached"), "cached"),)),
    Panel("Checkpoint publications and evictions", "Unique ready checkpoints published, and "
          "logical evictions (before GPU retirement), per second.", (
              Query(total_rate("helios_engine_checkpoints_published_total"), "published"),
              Query(total_rate("helios_engine_checkpoints_evicted_total"), "evicted")), "ops"),
))

PREFIX = Row("Prefix cache", (
    Panel("Prefix-cache hit rate", "Tokens: looked-up prompt tokens found in the cache; "
          "lookups: lookups that reused a checkpoint (rejected admissions included).", (
              Query(ratio(total_rate("vllm:prefix_cache_hits_total", MODEL),
                          total_rate("vllm:prefix_cache_queries_total", MODEL)), "tokens"),
              Query(ratio(total_rate("helios_engine_prefix_hits_total"),
                          total_rate("helios_engine_prefix_lookups_total")), "lookups")),
          "percentunit", width=8, max=1),
    Panel("Prefix lookups", "Lookups per second that reused a checkpoint (hits) or nothing.", (
        Query(total_rate("helios_engine_prefix_hits_total"), "hits"),
        Query(total_rate("helios_engine_prefix_misses_total"), "misses")), "ops", width=8,
          stacked=True),
    Panel("Reused prompt tokens", "Prompt tokens served from the prefix cache, and all prompt "
          "tokens looked up, per second.", (
              Query(total_rate("helios_engine_prefix_reused_tokens_total"), "reused"),
              Query(total_rate("vllm:prefix_cache_queries_total", MODEL), "looked up")),
          TOKENS_PER_S, width=8),
))

STEPS = Row("Engine: steps and requests", (
    Panel("Launches by graph kind", "Successful engine steps per second by graph kind.",
          (Query(total_rate("helios_engine_launches_total", by="kind"), "{{kind}}"),), "ops",
          stacked=True),
    Panel("Engine requests", "Admitted, completed, cancelled (client gone or aborted), failed, "
          "rejected at admission, and preempted for pages, per second.", tuple(
              Query(total_rate(f"helios_engine_{name}_total"), legend) for name, legend in (
                  ("requests_admitted", "admitted"), ("requests_completed", "completed"),
                  ("requests_cancelled", "cancelled"), ("requests_failed", "failed"),
                  ("requests_rejected", "rejected"), ("preemptions", "preempted"))), PER_S),
))

GATEWAY = Row("Gateway (HTTP)", (
    Panel("HTTP requests by route and status", "Responses per second by route template and "
          "status code.", (Query(total_rate("helios_gateway_requests_total", by="route, status"),
                                 "{{route}} {{status}}"),), PER_S),
    Panel("HTTP admission: capacity vs active", "Admitted requests in flight against the "
          "gateways' admission permits (queue + active); at capacity new requests get 429.", (
              Query(gauge("helios_gateway_admission_capacity"), "capacity"),
              Query(gauge("helios_gateway_active_requests"), "active"))),
    Panel("Rejections (429 / 503)", "429: HTTP admission is full; 503: model admission capacity "
          "or workers unavailable. Admission refusals by reason.", (
              Query(total_rate("helios_gateway_requests_total", 'status=~"429|503"',
                               by="status"), "{{status}}"),
              Query(total_rate("helios_gateway_admission_rejected_total", by="reason"),
                    "admission {{reason}}")), PER_S, width=8),
    Panel("Errors", "Failed requests by error kind, failures inside started streams, and "
          "clients that went away.", (
              Query(total_rate("helios_gateway_errors_total", by="kind"), "{{kind}}"),
              Query(total_rate("helios_gateway_stream_errors_total", by="kind"),
                    "stream {{kind}}"),
              Query(total_rate("helios_gateway_client_disconnects_total"), "disconnects")),
          PER_S, width=8),
    Panel("Time to first event (gateway)", "Gateway admission to the first upstream event "
          "(prefill included).", quantiles("helios_gateway_time_to_first_event_seconds"), "s",
          width=8),
))

FRONTEND = Row("Frontend", (
    Panel("Active requests and workers", "Generate streams in flight; preparation workers "
          "(capacity), those busy, and requests waiting for one.", (
              Query(gauge("helios_frontend_active_requests"), "active streams"),
              Query(gauge("helios_frontend_workers"), "workers"),
              Query(gauge("helios_frontend_workers_busy"), "busy"),
              Query(gauge("helios_frontend_preparation_waiting"), "waiting")), width=8),
    Panel("Generate requests by outcome", "Finished Generate streams per second.",
          (Query(total_rate("helios_frontend_requests_total", by="outcome"), "{{outcome}}"),),
          PER_S, width=8, stacked=True),
    Panel("Frontend errors", "Failed Generate requests per second by error kind.",
          (Query(total_rate("helios_frontend_errors_total", by="kind"), "{{kind}}"),), PER_S,
          width=8),
))

IMAGEPREP = Row("Imageprep", (
    Panel("Pending images vs capacity", "Images waiting for or in preparation, against the "
          "images that may be at once.", (
              Query(gauge("helios_imageprep_pending_images"), "pending"),
              Query(gauge("helios_imageprep_capacity_images"), "capacity")), width=8),
    Panel("Image events", "Per second: prepared (decoded now), retained (served from the "
          "cache), refused (decode or validation error), tensors fetched, and images evicted "
          "from the memory tier.", (
              Query(total_rate("helios_imageprep_images_total", by="outcome"), "{{outcome}}"),
              Query(total_rate("helios_imageprep_fetched_images_total"), "fetched"),
              Query(total_rate("helios_imageprep_memory_cache_evictions_total"), "evicted")),
          "ops", width=8),
    Panel("Prepare latency", "Prepare calls, admission to descriptors.",
          quantiles("helios_imageprep_prepare_seconds"), "s", width=8),
    Panel("Image cache bytes", "Bytes of prepared tensors in the memory tier, against its "
          "budget.", (
              Query(gauge("helios_imageprep_memory_cache_bytes"), "used"),
              Query(gauge("helios_imageprep_memory_cache_budget_bytes"), "budget")), "bytes",
          width=8),
    Panel("Cached images", "Prepared images held in the memory tier.",
          (Query(gauge("helios_imageprep_memory_cache_images"), "images"),), width=8),
    Panel("Image cache hit rate", "Memory-tier lookups that found the prepared image.", (
        Query(ratio(total_rate("helios_imageprep_memory_cache_hits_total"),
                    f"({total_rate('helios_imageprep_memory_cache_hits_total')} + "
                    f"{total_rate('helios_imageprep_memory_cache_misses_total')})"), "hit rate"),),
          "percentunit", width=8, max=1),
))

VARIABLES = [
    datasource_variable(),
    query_variable("namespace", "Namespace",
                   "label_values(helios_engine_uptime_seconds, namespace)", multi=False),
    query_variable("model_name", "Model",
                   'label_values(vllm:num_requests_running{namespace=~"$namespace"}, model_name)',
                   multi=True),
]


def build() -> dict:
    return dashboard(
        uid="helios", title="Helios", tags=("helios", "llm"),
        description="Helios LLM serving: throughput, latency, KV cache, prefix cache, engine "
                    "steps, the gateway, frontend and imageprep (docs/observability.md).",
        variables=VARIABLES,
        rows=(OVERVIEW, THROUGHPUT, KV, PREFIX, STEPS, GATEWAY, FRONTEND, IMAGEPREP))


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python docker/grafana/dashboard.py", file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

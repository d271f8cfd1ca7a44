"""/metrics after known traffic: each counter moves by exactly what the traffic implies.

One `helios run --demo`; the gateway's /metrics shows every service (the launcher wires the
upstream scrapes). Deltas are read after the responses finished and the engine went quiet, as
the reference design requires for per-request accounting.
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import HeliosRun

PROMPTS = ["Name three colours.", "What is two plus two?", "Name three colours."]
MAX_TOKENS = 4


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_quiet(url: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        samples = scrape(url)
        if value(samples, "helios_engine_requests_running") == 0 and \
                value(samples, "helios_engine_requests_pending") == 0:
            return samples
        assert time.monotonic() < deadline, "the engine never went quiet"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    with HeliosRun.start_demo(tmp_path_factory.mktemp("metrics")) as run:
        yield run


def test_metrics_have_no_request_labels_or_text(run):
    text = httpx.get(run.url + "/metrics").text
    for forbidden in ("request_id", "prompt=", "Name three"):
        assert forbidden not in text
    names = {f.name for f in text_string_to_metric_families(text)}
    for name in ("helios_gateway_admission_capacity", "helios_frontend_workers",
                 "helios_engine_slots_free", "helios_imageprep_pending_images",
                 "vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries",
                 "vllm:prefix_cache_hits", "vllm:prompt_tokens", "vllm:generation_tokens",
                 "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "helios_engine_tokens_last_minute", "helios_engine_uptime_seconds",
                 "helios_gateway_uptime_seconds", "vllm:cache_config_info"):
        assert name in names, name
    (info,) = [s for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "vllm:cache_config_info"]
    pages = value(scrape(run.url), "helios_engine_pages_total")     # 16-token pages
    assert info.value == 1 and info.labels["block_size"] == "64"
    assert info.labels["model_name"] == "helios-demo"
    assert int(info.labels["num_gpu_blocks"]) == pages * 16 // 64 > 0


def test_counters_move_by_exactly_the_traffic(run):
    client = openai.OpenAI(base_url=run.url + "/v1", api_key="unused", max_retries=0)
    before = wait_quiet(run.url)
    usages = []
    for prompt in PROMPTS:
        response = client.chat.completions.create(
            model="helios-demo", messages=[{"role": "user", "content": prompt}],
            max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})
        assert response.choices[0].finish_reason == "length"
        usages.append(response.usage)
    after = wait_quiet(run.url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    n = len(PROMPTS)
    prompt_tokens = sum(u.prompt_tokens for u in usages)
    cached = sum((u.prompt_tokens_details.cached_tokens or 0) if u.prompt_tokens_details else 0
                 for u in usages)
    assert cached > 0, "the repeated prompt must reuse the prefix cache"
    model = {"model_name": "helios-demo"}

    assert delta("helios_gateway_requests_total", route="/v1/chat/completions",
                 status="200") == n
    assert delta("helios_frontend_requests_total", outcome="completed") == n
    assert delta("helios_frontend_prompt_tokens_total") == prompt_tokens
    assert delta("helios_frontend_output_tokens_total") == n * MAX_TOKENS
    assert delta("helios_engine_requests_admitted_total") == n
    assert delta("helios_engine_requests_completed_total") == n
    assert delta("helios_engine_requests_failed_total") == 0
    assert delta("helios_engine_requests_cancelled_total") == 0
    assert delta("helios_engine_generation_tokens_total") == n * MAX_TOKENS
    assert delta("vllm:generation_tokens_total", **model) == n * MAX_TOKENS
    assert delta("helios_engine_prompt_tokens_total") == prompt_tokens - cached
    assert delta("vllm:prompt_tokens_total", **model) == prompt_tokens - cached
    assert delta("helios_engine_prefix_lookups_total") == n
    assert delta("helios_engine_prefix_hits_total") + \
        delta("helios_engine_prefix_misses_total") == n
    assert delta("helios_engine_prefix_hits_total") >= 1
    assert delta("helios_engine_prefix_reused_tokens_total") == cached
    assert delta("vllm:prefix_cache_hits_total", **model) == cached
    assert delta("vllm:prefix_cache_queries_total", **model) == prompt_tokens
    assert delta("vllm:time_to_first_token_seconds_count", **model) == n
    assert delta("vllm:e2e_request_latency_seconds_count", **model) == n
    assert delta("helios_frontend_time_to_first_token_seconds_count") == n
    launches = sum(delta("helios_engine_launches_total", kind=k)
                   for k in ("prefill", "decode", "mixed", "resume"))
    assert launches >= n * (MAX_TOKENS - 1)
    assert delta("helios_engine_checkpoints_published_total") >= 1


def test_a_disconnect_counts_as_cancelled(run):
    before = wait_quiet(run.url)
    body = {"model": "helios-demo", "messages": [{"role": "user", "content": "Talk."}],
            "max_tokens": 3000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", run.url + "/v1/chat/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                break  # one token arrived: hang up
    after = wait_quiet(run.url)
    assert value(after, "helios_engine_requests_cancelled_total") - \
        value(before, "helios_engine_requests_cancelled_total") == 1
    assert value(after, "helios_engine_requests_admitted_total") - \
        value(before, "helios_engine_requests_admitted_total") == 1
    assert value(after, "helios_frontend_requests_total", outcome="cancelled") - \
        value(before, "helios_frontend_requests_total", outcome="cancelled") == 1
    assert value(after, "helios_engine_slots_live") == 0


# objects each process keeps alive after start-up; far more are frozen (imports, the model)
MIN_FROZEN = 10_000


def test_every_process_froze_its_start_up_heap_and_times_its_collections(run):
    """Each service (and the engine core, through its load snapshot) froze its start-up heap
    before serving, and its collector pauses show as a histogram by generation."""
    client = openai.OpenAI(base_url=run.url + "/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(model="helios-demo", max_tokens=2,
                                   messages=[{"role": "user", "content": "Hi."}])
    samples = wait_quiet(run.url)
    for prefix in ("helios_gateway", "helios_frontend", "helios_imageprep", "helios_engine",
                   "helios_engine_core"):
        frozen = value(samples, f"{prefix}_gc_frozen_objects")
        assert frozen > MIN_FROZEN, (prefix, frozen)
        counts = [value(samples, f"{prefix}_gc_pause_seconds_count", generation=str(g))
                  for g in range(3)]
        assert counts[0] >= 1, (prefix, counts)    # serving allocates: young collections ran
        # the freeze's own full collection ran before SERVING and was timed
        assert counts[2] >= 1 and value(samples, f"{prefix}_gc_pause_seconds_sum",
                                        generation="2") > 0, (prefix, counts)

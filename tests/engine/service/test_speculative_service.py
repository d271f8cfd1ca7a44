"""Speculative decoding in a real engine process (the demo core, `--speculative-method ngram`):
greedy output equals the output of a request that opted out (`disable_speculation`), and the
speculative counters agree between GetLoad and /metrics (Helios's names and vLLM's
`vllm:spec_decode_*`); an opted-out request adds no drafts."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.service.conftest import generate_request, start_engine
from tests.support.processes import free_port

PATTERN = [101, 202, 303, 404, 505, 606, 707, 808]


def _tokens(engine, request) -> list[int]:
    return [t for m in engine.stub.Generate(request, timeout=120) for o in m.outputs
            for t in o.token_ids]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_speculation_through_the_engine_service(tmp_path, demo_core):
    port = free_port()
    with start_engine(tmp_path, "--speculative-method", "ngram", "--num-speculative-tokens",
                      "3", "--metrics-listen", f"127.0.0.1:{port}") as engine:
        prompt = PATTERN * 6                       # copy proposals find the pattern
        off = _tokens(engine, generate_request("off", prompt, 24, disable_speculation=True))
        load = engine.wait_idle()
        assert load.HasField("speculative") and load.speculative.method == "ngram"
        assert load.speculative.num_speculative_tokens == 3
        assert load.speculative.num_draft_tokens == 0 and load.speculative.rounds == 0
        on = _tokens(engine, generate_request("on", prompt, 24))
        assert on == off and len(on) == 24
        spec = engine.wait_idle().speculative
        assert spec.num_drafts > 0 and spec.num_draft_tokens >= spec.num_drafts
        assert spec.verification_steps > 0 and spec.drafter_steps == 0    # copy proposals
        assert spec.rounds < 23 and spec.depth == spec.num_draft_tokens  # fewer rounds
        assert sum(spec.num_accepted_tokens_per_pos) == spec.num_accepted_tokens
        assert len(spec.num_accepted_tokens_per_pos) <= 3
        deadline = time.monotonic() + 30
        while True:                   # the scrape reads a fresh snapshot
            samples = _scrape(port)
            model = {k[1] for k in samples if k[0] == "vllm:spec_decode_num_drafts_total"}
            if model:
                break
            assert time.monotonic() < deadline, "no vllm:spec_decode metrics"
            time.sleep(0.2)
        (labels,) = model
        assert samples[("vllm:spec_decode_num_drafts_total", labels)] == spec.num_drafts
        assert samples[("vllm:spec_decode_num_draft_tokens_total", labels)] == \
            spec.num_draft_tokens
        assert samples[("vllm:spec_decode_num_accepted_tokens_total", labels)] == \
            spec.num_accepted_tokens
        per_pos = {dict(k[1])["position"]: v for k, v in samples.items()
                   if k[0] == "vllm:spec_decode_num_accepted_tokens_per_pos_total"}
        assert per_pos == {str(i): float(c)
                           for i, c in enumerate(spec.num_accepted_tokens_per_pos)}
        assert samples[("helios_engine_spec_verification_steps_total", ())] == \
            spec.verification_steps
        assert samples[("helios_engine_spec_drafter_steps_total", ())] == 0
        assert samples[("helios_engine_launches_total", (("kind", "verify"),))] > 0
        assert engine.process.terminate() == 0


def test_draft_model_through_the_engine_service(tmp_path, demo_core):
    """`--speculative-method draft` with the demo model as its own draft: the opted-out
    output, every greedy draft accepted, drafter forwards in GetLoad equal to /metrics."""
    port = free_port()
    with start_engine(tmp_path, "--speculative-method", "draft", "--speculative-model",
                      str(demo_core), "--num-speculative-tokens", "3",
                      "--metrics-listen", f"127.0.0.1:{port}") as engine:
        prompt = [11, 29, 305, 47, 1003, 58, 77]
        off = _tokens(engine, generate_request("off", prompt, 20, disable_speculation=True))
        assert engine.wait_idle().speculative.drafter_steps == 0
        on = _tokens(engine, generate_request("on", prompt, 20))
        assert on == off and len(on) == 20
        spec = engine.wait_idle().speculative
        assert spec.method == "draft" and spec.drafter_steps > 0
        assert spec.num_accepted_tokens == spec.num_draft_tokens > 0
        deadline = time.monotonic() + 30
        while True:                   # the scrape reads a fresh snapshot
            samples = _scrape(port)
            steps = samples.get(("helios_engine_spec_drafter_steps_total", ()))
            if steps:
                break
            assert time.monotonic() < deadline, "no drafter steps in /metrics"
            time.sleep(0.2)
        assert steps == spec.drafter_steps
        assert engine.process.terminate() == 0

"""Collector pauses of every Helios process, read from the gateway's /metrics (the
`*_gc_pause_seconds` histograms of services/common/heap.py).

    before = scrape(url); ...; print(table(delta(before, scrape(url))))
"""

from __future__ import annotations

SUFFIX = "_gc_pause_seconds"

# {process prefix: {generation: [collections, seconds]}}
Pauses = dict[str, dict[str, list[float]]]


def scrape(url: str) -> Pauses:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url.rstrip("/") + "/metrics", timeout=10).text
    pauses: Pauses = {}
    for family in text_string_to_metric_families(text):
        if not family.name.endswith(SUFFIX):
            continue
        prefix = family.name.removesuffix(SUFFIX)
        for sample in family.samples:
            generation = sample.labels.get("generation", "")
            row = pauses.setdefault(prefix, {}).setdefault(generation, [0.0, 0.0])
            if sample.name.endswith("_count"):
                row[0] = sample.value
            elif sample.name.endswith("_sum"):
                row[1] = sample.value
    return pauses


def delta(before: Pauses, after: Pauses) -> Pauses:
    return {prefix: {g: [row[0] - before.get(prefix, {}).get(g, [0.0, 0.0])[0],
                         row[1] - before.get(prefix, {}).get(g, [0.0, 0.0])[1]]
                     for g, row in gens.items()} for prefix, gens in after.items()}


def summary(pauses: Pauses) -> dict[str, dict[str, float]]:
    """Per process: full collections and their ms, and ms in all collections."""
    return {prefix.removeprefix("helios_"): {
        "gen2": int(gens.get("2", [0, 0])[0]),
        "gen2_ms": round(1e3 * gens.get("2", [0, 0])[1], 1),
        "all_ms": round(1e3 * sum(row[1] for row in gens.values()), 1)}
        for prefix, gens in sorted(pauses.items())}

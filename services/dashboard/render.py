"""Lay the dashboard out as plain text lines for a given terminal size (no curses here).

Two panes share the header and the request table: the throughput overview and the scheduler
details (Tab / left / right switch). Wider terminals show more columns: the scheduler pane adds
max GPU ms and requests per call at 90+ columns; the request table adds prompt, output, out ms
and bursts at 100+ columns.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.dashboard.sample import SpeculativeSample
from services.dashboard.state import HISTORY_CELLS, DashboardState, GraphRow

PANES = ("overview", "scheduler")
WIDE_SCHEDULER = 90
WIDE_REQUESTS = 100


@dataclass(frozen=True, slots=True)
class View:
    pane: str = "overview"
    scroll: int = 0


def _num(value: float | int | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}" if digits else f"{round(value):,}"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def header(state: DashboardState, model: str, local_now_s: float, width: int,
           view: View) -> list[str]:
    age = state.sample_age_s(local_now_s)
    latest = state.latest
    tabs = "  ".join(f"[{p}]" if p == view.pane else f" {p} " for p in PANES)
    status = ""
    if latest is not None:
        status = ("draining" if latest.draining else
                  "admission paused" if latest.admission_paused else "serving")
    dropped = latest.dropped_updates if latest else 0
    line1 = f"Helios  {model}  {status}  sample age {_num(age * 1000 if age is not None else None)} ms"
    line2 = f"{tabs}   dropped updates {dropped:,}"
    if state.truncated_completions or state.truncated_rows:
        line2 += "   history truncated"
    lines = [line1, line2]
    if state.error:
        lines.append(f"! {state.error}")
    return [line[:width] for line in lines]


def overview(state: DashboardState, width: int) -> list[str]:
    s = state.latest
    if s is None:
        return ["waiting for the first sample ..."]
    tp = state.throughput()
    lines = [
        f"Throughput   prefill {_num(tp.prefill_tps)} tok/s   generation "
        f"{_num(tp.generation_tps)} tok/s",
        f"Requests     active {s.num_running}   queued {s.num_waiting}   completed "
        f"{s.requests_completed:,}   failed {s.requests_failed:,}   cancelled "
        f"{s.requests_cancelled:,}",
        f"Prefix       reused tokens {s.prefix_reused_tokens:,}   cached checkpoints "
        f"{s.checkpoints_cached:,}",
        f"KV pages     cached {s.pages_cached:,}   free {s.pages_free:,} / {s.pages_total:,}   "
        f"retiring {s.pages_retiring:,}",
        f"Slots        live {s.slots_live} / {s.slots_total}   free {s.slots_free}   retiring "
        f"{s.slots_retiring}",
        speculation(s.speculative),
    ]
    lines += experts(state, width)
    return [line[:width] for line in lines]


def speculation(spec: SpeculativeSample | None) -> str:
    """Drafter steps (learned proposals; copy proposals run none), verification steps, mean
    accepted drafts per round that offered any, and draft positions per round (DEPTH)."""
    if spec is None:
        return "Speculation  drafter steps —   verification steps —   acceptance —"
    return (f"Speculation  drafter steps {spec.drafter_steps:,}   verification steps "
            f"{spec.verification_steps:,}   acceptance {_num(spec.acceptance_length, 2)}   "
            f"DEPTH {_num(spec.mean_depth, 2)}")


BARS = " ▁▂▃▄▅▆▇█"


def experts(state: DashboardState, width: int) -> list[str]:
    """An MoE model's routing: the most-loaded expert and one bar per expert (tokens in the
    window, scaled to the busiest); nothing for a dense model."""
    load = state.expert_load()
    if load is None:
        return []
    window = "since start" if load.window_s is None else f"last {load.window_s:.1f} s"
    top = max(load.tokens) or 1
    bars = "".join(BARS[min(8, -(-8 * t // top))] for t in load.tokens)
    return [
        f"Experts      {len(load.tokens)} x {load.layers} layers, top-{load.top_k}   "
        f"{window}: {sum(load.tokens):,} routed   most loaded #{load.busiest} "
        f"({load.tokens[load.busiest]:,} tokens, {load.busiest_share:.0%}, "
        f"{load.imbalance:.1f}x mean)",
        f"  per expert |{bars[:max(0, width - 14)]}|",
    ]


def scheduler(rows: list[GraphRow], width: int) -> list[str]:
    wide = width >= WIDE_SCHEDULER
    head = f"{'graph':<12}{'capacity':<14}{'calls/2s':>9}{'mean ms':>9}{'share':>7}"
    if wide:
        head += f"{'max ms':>9}{'req/call':>9}"
    head += f"{'untimed':>8}{'est ms':>8}"
    lines = [head]
    for row in rows:
        line = (f"{row.kind[:11]:<12}{row.label[:13]:<14}{row.calls:>9}{_ms(row.mean_ms):>9}"
                f"{'—' if row.share is None else f'{row.share:.0%}':>7}")
        if wide:
            rpc = "—" if row.requests_per_call is None else f"{row.requests_per_call:.1f}"
            line += f"{_ms(row.max_ms):>9}{rpc:>9}"
        estimate = "?" if row.estimate_ms is None else f"{row.estimate_ms:.2f}"
        line += f"{row.untimed:>8}{estimate:>8}"
        lines.append(line)
    if not rows:
        lines.append("no graphs completed yet")
    return [line[:width] for line in lines]


def requests(state: DashboardState, width: int, height: int, scroll: int) -> list[str]:
    wide = width >= WIDE_REQUESTS
    head = f"{'request':<12}{'phase':<11}{'gap ms':>9}"
    if wide:
        head += f"{'prompt':>15}{'output':>8}{'out ms':>9}{'bursts':>8}"
    head += "  " + "history (10 s)".ljust(HISTORY_CELLS)
    rows = state.ordered_rows()
    visible = max(0, height - 1)
    scroll = max(0, min(scroll, max(0, len(rows) - visible)))
    lines = [head]
    for row in rows[scroll:scroll + visible]:
        r = row.sample
        name = f"{r.key[0]}.{r.key[1]}"
        phase = "retired" if row.retired else r.phase
        line = f"{name:<12}{phase[:10]:<11}{r.gap_ms:>9.0f}"
        if wide:
            out_ms = "—" if r.out_ms is None else f"{r.out_ms:.0f}"
            line += (f"{f'{r.prompt_consumed}/{r.prompt_len}':>15}{r.output_tokens:>8}"
                     f"{out_ms:>9}{r.bursts:>8}")
        line += "  " + state.history(r.key)
        lines.append(line)
    if len(rows) > visible:
        lines.append(f"rows {scroll + 1}-{min(len(rows), scroll + visible)} of {len(rows)}"
                     "  (up/down to scroll)")
    return [line[:width] for line in lines]


def screen(state: DashboardState, model: str, local_now_s: float, width: int, height: int,
           view: View) -> list[str]:
    """The whole screen, at most `height` lines of at most `width` characters."""
    lines = [*header(state, model, local_now_s, width, view), ""]
    if view.pane == "overview":
        lines += overview(state, width)
    else:
        lines += scheduler(state.scheduler_rows(), width)
    lines.append("")
    remaining = max(2, height - len(lines) - 1)
    lines += requests(state, width, remaining, view.scroll)
    lines.append("Tab/←/→ pane  ↑/↓ scroll  q quit  (Ctrl-C stops the server under helios run)"[:width])
    return lines[:height]

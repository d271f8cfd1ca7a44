"""Speculative decoding policy: how many drafts each request verifies, and when not to.

    width = choose_width(stats, source, limit, extra_row_cost)   # 0..limit drafts
    keep = worth_verifying(costs, planned, stats_of)             # the batch switch-off
    stats.observe(source, offered, accepted, committed)          # after a verification

Each request (choice) owns conditional acceptance statistics by depth and proposal source
(`AcceptanceStats`): at depth d (0-based) the chance that draft d is accepted given drafts
0..d-1 were. A verification that emitted a correction while an offered draft remained
supplies one rejection at the first unaccepted depth; every accepted draft a positive; a
choice that ended inside its accepted run censors the depths after its last committed token
(no observation). Observational weight ages (both counts decay on each new observation at a
depth, the mean is unchanged), unobserved depths start at the prior mean `PRIOR_MEAN`.

Width: the expected tokens of a round with w drafts are 1 + sum_{j<=w} prod_{d<j} p_d; the
width maximises them per estimated cost (1 + w * extra_row_cost, the relative cost of one
verified row over a one-token decode, from measured step durations when the cost model has
them), and must beat plain decoding by `MIN_GAIN`. Zero is a width: a request whose drafts keep failing decodes plainly (and overlaps),
with a probe of one draft every `PROBE_EVERY` rounds so that a change of content can revive it.
Expected yield is clipped by the proposals available and the output and context left.

Switch-off: with measured costs for both this batch's decode and its verification shape, the
batch verifies only when its expected tokens per second beat plain decoding's (at a large
batch verifying k + 1 rows per request costs like a prefill; a decode is one weight read).
A stale verification estimate is measured again. A request whose drafts were switched off
decodes behind its in-flight step (overlap) until its next probe is due.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.engine.scheduler.costs import DurationEstimator, capacity, shape_label

PRIOR_MEAN = 0.5          # an unobserved depth's acceptance probability
PRIOR_WEIGHT = 1.0        # pseudo-observations behind the prior
DECAY = 0.9               # each new observation at a depth ages the older ones by this
PROBE_EVERY = 16          # zero-width rounds between probes of one draft
DEFAULT_ROW_COST = 0.05   # an extra verified row's cost relative to a decode, unmeasured
MIN_GAIN = 0.1            # a verification must beat a plain decode's tokens per cost by this
                          # (it gives up the two-frame overlap: a verification is never
                          # followed, the next round waits for its tokens)
COPY = "copy"             # proposal sources: copy proposals (prompt lookup) ...
DRAFT = "draft"           # ... and a draft model


@dataclass(slots=True)
class DepthStats:
    accepted: float = 0.0
    offered: float = 0.0

    @property
    def mean(self) -> float:
        return (self.accepted + PRIOR_MEAN * PRIOR_WEIGHT) / (self.offered + PRIOR_WEIGHT)

    def add(self, accepted: bool) -> None:
        self.accepted = self.accepted * DECAY + (1.0 if accepted else 0.0)
        self.offered = self.offered * DECAY + 1.0


@dataclass(slots=True)
class AcceptanceStats:
    """One choice's acceptance by proposal source and depth, and its zero-width streak."""

    by_source: dict[str, list[DepthStats]] = field(default_factory=dict)
    idle_rounds: int = 0          # rounds decoded without drafts since the last verification
    proposed: bool = False        # the last round's proposer found drafts

    def depth(self, source: str, d: int) -> DepthStats:
        depths = self.by_source.setdefault(source, [])
        while len(depths) <= d:
            depths.append(DepthStats())
        return depths[d]

    def survival(self, source: str, width: int) -> list[float]:
        """P(drafts 0..j all accepted) for j < width."""
        out: list[float] = []
        alive = 1.0
        for d in range(width):
            alive *= self.depth(source, d).mean
            out.append(alive)
        return out

    def expected_accepted(self, source: str, width: int) -> float:
        return sum(self.survival(source, width))

    def observe(self, source: str, offered: int, emitted: int, committed: int) -> None:
        """A verification offered `offered` drafts (within the choice's limits) and emitted
        `emitted` tokens (the accepted drafts, then the correction or bonus token), of which
        `committed` were committed (fewer when the choice ended inside the run)."""
        self.idle_rounds = 0
        accepted = emitted - 1
        if committed < emitted:          # ended inside the accepted run: censor the rest
            for d in range(committed):
                self.depth(source, d).add(True)
            return
        for d in range(accepted):
            self.depth(source, d).add(True)
        if accepted < offered:           # the correction replaced draft `accepted`
            self.depth(source, accepted).add(False)


def choose_width(stats: AcceptanceStats, source: str, limit: int,
                 extra_row_cost: float) -> int:
    """Drafts to verify (0..limit): the most expected tokens per estimated cost; a probe of
    one draft after PROBE_EVERY idle rounds."""
    if limit <= 0:
        return 0
    best, best_rate = 0, 1.0 + MIN_GAIN
    for width, alive in enumerate(stats.survival(source, limit), start=1):
        tokens = 1.0 + stats.expected_accepted(source, width)
        rate = tokens / (1.0 + width * extra_row_cost)
        if alive <= 0.0:
            break
        if rate > best_rate + 1e-9:
            best, best_rate = width, rate
    if best == 0 and stats.idle_rounds >= PROBE_EVERY:
        return 1
    return best


def extra_row_cost(costs: DurationEstimator, num_seqs: int, width: int) -> float:
    """The relative cost of one more verified row over a decode of `num_seqs` sequences,
    from the measured verification of that batch at `width` rows per request, if any."""
    num_rows = num_seqs * width
    decode = costs.estimated_duration_s("decode", shape_label(num_seqs, num_seqs))
    verify = costs.estimated_duration_s("verify", verify_label(num_seqs, width))
    extra = num_rows - num_seqs
    if decode is None or verify is None or decode <= 0 or extra <= 0:
        return DEFAULT_ROW_COST
    return max(0.0, (verify - decode) / decode) * num_seqs / extra


def verify_label(num_seqs: int, width: int) -> str:
    """A verification step's shape label: b<batch capacity> w<target width> (the widest
    request's rows: 1 + its drafts) rows<packed target rows>, as `Step.label` names it."""
    batch = capacity(num_seqs)
    return f"b{batch} w{width} rows{batch * width}"


def worth_verifying(costs: DurationEstimator, num_seqs: int, width: int,
                    expected_tokens: float, now: float) -> bool:
    """The batch switch-off: verify when `expected_tokens` (over the batch's `num_seqs`
    requests, a round with drafts of the widest `width` rows) per estimated verification
    time beat one token per request per decode time. Unmeasured shapes verify (and get
    measured), and so does a verification shape measured longer ago than the estimator's
    `stale_after_s`: an estimate that turned speculation off is never refreshed otherwise."""
    decode = costs.estimated_duration_s("decode", shape_label(num_seqs, num_seqs))
    verify = costs.estimated_duration_s("verify", verify_label(num_seqs, width))
    if decode is None or verify is None:
        return True
    if costs.is_stale("verify", verify_label(num_seqs, width), now):
        return True
    return expected_tokens / max(verify, 1e-12) >= num_seqs / max(decode, 1e-12)

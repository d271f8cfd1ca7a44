"""Speculative decoding policy: how many drafts each request verifies, and when not to.

    width = plan_width(stats, source, limit, extra_row_cost)      # 0..limit drafts
    stats.close_round(source, width, max_drafts, extra_row_cost)  # every planned round
    keep = worth_verifying(costs, planned, stats_of)              # the batch switch-off
    stats.observe(source, offered, accepted, committed)           # after a verification

Each request (choice) owns conditional acceptance statistics by depth and proposal source
(`AcceptanceStats`): at depth d (0-based) the chance that draft d is accepted given drafts
0..d-1 were. A verification that emitted a correction while an offered draft remained
supplies one rejection at the first unaccepted depth; every accepted draft a positive; a
choice that ended inside its accepted run censors the depths after its last committed token
(no observation). Each depth keeps a mean and the observational weight behind it (the
prior's `PRIOR_WEIGHT` pseudo-observations at `PRIOR_MEAN`, then the observations): a new
observation ages the older weight by `DECAY`, and every round of the choice that does not
observe a depth (a plain decode, or a verification that stopped short of it) ages its
weight by `AGING`. Neither changes a mean: a depth the width no longer reaches keeps its
mean while the evidence behind it fades.

Width: the expected tokens of a round with w drafts are 1 + sum_{j<=w} prod_{d<j} p_d; the
width maximises them per estimated cost (1 + w * extra_row_cost, the relative cost of one
verified row over a one-token decode, from measured step durations when the cost model has
them), and must beat plain decoding by `MIN_GAIN`. Expected yield is clipped by the
proposals available and the output and context left.

The ordinary width uses the means, and on its own never recovers from noise: once a few
rejections in a row drive a depth's mean low, the width stops short of that depth and
nothing observes it again (a low depth 0: plain decoding for good). So each round earns
`PROBE_CREDIT` of its own cost into the choice's probe budget (1% of the raw cost goes to
probes; at most `PROBE_SAVINGS` is saved, and a new choice, knowing least, starts with
that), and when the budget covers a probe the next round verifies one depth past the
ordinary width, if the optimistic width (by each depth's upper estimate,
`DepthStats.optimistic`, which rises towards 1 as the weight ages) is wider. A probe costs
its extra row, plus `MIN_GAIN` (the overlap it gives up) when the choice would not
propose otherwise: at width zero (this is how a zero width revives) or after a proposal
that found nothing (retrying the proposer is the probe then). The budget counts decodes
(with measured or default row costs), not seconds, so CPU plans stay deterministic. A
probe is decided when the round before it is planned (`probe_cost`): a zero-width choice
decodes behind its in-flight step, so whether its next round proposes is known in advance.

Switch-off: with measured costs for both this batch's decode and its verification shape, the
batch verifies only when its expected tokens per second beat plain decoding's (at a large
batch verifying k + 1 rows per request costs like a prefill; a decode is one weight read).
A probing choice counts by the upper estimates that chose its width (by its means a probe
never pays). A stale verification estimate is measured again. A request whose drafts were
switched off decodes behind its in-flight step (overlap) until its next probe is due.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.engine.scheduler.costs import DurationEstimator, capacity, shape_label

PRIOR_MEAN = 0.5          # an unobserved depth's acceptance probability
PRIOR_WEIGHT = 1.0        # pseudo-observations behind the prior
DECAY = 0.9               # each new observation at a depth ages the older ones by this
AGING = 0.97              # each round that does not observe a depth ages its weight by this
PROBE_CREDIT = 0.01 / 0.99    # probe budget earned per unit of a round's cost (1% of all)
PROBE_SAVINGS = 1.0       # the most probe credit a choice saves up (and starts with), in
                          # decodes: a probe dearer than that never runs
DEFAULT_ROW_COST = 0.05   # an extra verified row's cost relative to a decode, unmeasured
MIN_GAIN = 0.1            # a verification must beat a plain decode's tokens per cost by this
                          # (it gives up the two-frame overlap: a verification is never
                          # followed, the next round waits for its tokens)
COPY = "copy"             # proposal sources: copy proposals (prompt lookup) ...
DRAFT = "draft"           # ... and a draft model


@dataclass(slots=True)
class DepthStats:
    """One depth's acceptance: an exponentially weighted mean and the aged weight of the
    observations behind it (the prior's included)."""

    mean: float = PRIOR_MEAN
    weight: float = PRIOR_WEIGHT

    @property
    def optimistic(self) -> float:
        """The upper estimate probes use: the mean after one more imagined acceptance (a Beta
        posterior's "one more success"). Close to the mean while much recent evidence stands
        behind it, rising towards 1 as that evidence ages, and above the mean even at a mean
        of 0, where mean + c * sqrt(var / weight) would stay at 0 for good."""
        return (self.mean * self.weight + 1.0) / (self.weight + 1.0)

    def add(self, accepted: bool) -> None:
        self.weight = self.weight * DECAY + 1.0
        self.mean += ((1.0 if accepted else 0.0) - self.mean) / self.weight


@dataclass(slots=True)
class AcceptanceStats:
    """One choice's acceptance by proposal source and depth, and its probe budget."""

    by_source: dict[str, list[DepthStats]] = field(default_factory=dict)
    budget: float = PROBE_SAVINGS     # probe credit in decodes
    probe_cost: float = 0.0       # what the probe due next round costs (0: none is due)
    proposed: bool = False        # the last round's proposer found drafts

    def depth(self, source: str, d: int) -> DepthStats:
        depths = self.by_source.setdefault(source, [])
        while len(depths) <= d:
            depths.append(DepthStats())
        return depths[d]

    def survival(self, source: str, width: int, optimistic: bool = False) -> list[float]:
        """P(drafts 0..j all accepted) for j < width, by the means or the upper
        estimates."""
        out: list[float] = []
        alive = 1.0
        for d in range(width):
            depth = self.depth(source, d)
            alive *= depth.optimistic if optimistic else depth.mean
            out.append(alive)
        return out

    def expected_accepted(self, source: str, width: int, optimistic: bool = False) -> float:
        return sum(self.survival(source, width, optimistic))

    def observe(self, source: str, offered: int, emitted: int, committed: int) -> None:
        """A verification offered `offered` drafts (within the choice's limits) and emitted
        `emitted` tokens (the accepted drafts, then the correction or bonus token), of which
        `committed` were committed (fewer when the choice ended inside the run)."""
        accepted = emitted - 1
        if committed < emitted:          # ended inside the accepted run: censor the rest
            accepted = observed = committed
        else:                            # the correction replaced draft `accepted`
            observed = accepted + (accepted < offered)
        for depth in self.by_source.get(source, [])[observed:]:
            depth.weight *= AGING
        for d in range(accepted):
            self.depth(source, d).add(True)
        if observed > accepted:
            self.depth(source, accepted).add(False)

    def close_round(self, source: str, width: int, max_drafts: int,
                    extra_row_cost: float) -> None:
        """A round verifying `width` drafts was planned: a round without drafts ages every
        weight (a verification ages what it does not observe: `observe`), the budget earns
        its share of the round's cost, and the next round (of at most `max_drafts`, the
        proposer's) is made a probe when the budget now covers one."""
        if not width:
            for depths in self.by_source.values():
                for depth in depths:
                    depth.weight *= AGING
        earned = PROBE_CREDIT * (1.0 + width * extra_row_cost)
        self.budget = min(PROBE_SAVINGS, self.budget + earned)
        cost = _probe_cost(self, source, max_drafts, extra_row_cost)
        self.probe_cost = cost if 0.0 < cost <= self.budget else 0.0


def choose_width(stats: AcceptanceStats, source: str, limit: int, extra_row_cost: float,
                 optimistic: bool = False) -> int:
    """Drafts to verify (0..limit): the most expected tokens per estimated cost, by the
    means (the ordinary width) or by the upper estimates (the optimistic one)."""
    best, best_rate = 0, 1.0 + MIN_GAIN
    tokens = 1.0
    for width, alive in enumerate(stats.survival(source, limit, optimistic), start=1):
        if alive <= 0.0:
            break
        tokens += alive
        rate = tokens / (1.0 + width * extra_row_cost)
        if rate > best_rate + 1e-9:
            best, best_rate = width, rate
    return best


def plan_width(stats: AcceptanceStats, source: str, limit: int,
               extra_row_cost: float) -> int:
    """This round's drafts (0..limit): the ordinary width, or, when a probe is due, one
    more if the optimistic width is wider. A due probe is paid what it was due at, whether
    or not it found drafts to verify (it gave up the overlap all the same)."""
    ordinary = choose_width(stats, source, limit, extra_row_cost)
    if not stats.probe_cost:
        return ordinary
    stats.budget -= stats.probe_cost
    stats.probe_cost = 0.0
    return _probe_width(stats, source, limit, extra_row_cost, ordinary)


def _probe_width(stats: AcceptanceStats, source: str, limit: int, extra_row_cost: float,
                 ordinary: int) -> int:
    """One depth past the ordinary width where the optimistic width is wider: deeper drafts
    are only ever observed through that depth, so one row is the cheapest probe that can
    widen the ordinary width, and the budget buys the most of them."""
    optimistic = choose_width(stats, source, limit, extra_row_cost, optimistic=True)
    return ordinary + 1 if optimistic > ordinary else ordinary


def _probe_cost(stats: AcceptanceStats, source: str, max_drafts: int,
                extra_row_cost: float) -> float:
    """What making the next round a probe would cost over its ordinary plan, in decodes:
    its extra row, plus the overlap given up when the choice would not propose otherwise
    (width zero, or no drafts found last round: retrying the proposer is the probe then);
    0 when there is nothing to probe."""
    ordinary = choose_width(stats, source, max_drafts, extra_row_cost)
    width = _probe_width(stats, source, max_drafts, extra_row_cost, ordinary)
    extra = (width - ordinary) * extra_row_cost
    if stats.proposed and ordinary:
        return extra
    return MIN_GAIN + extra if width else 0.0


def extra_row_cost(costs: DurationEstimator, num_seqs: int, width: int, now: float) -> float:
    """The relative cost of one more verified row over a decode of `num_seqs` sequences,
    from the fresh measured verification of that batch at `width` rows per request, if any:
    over the measured decode or, with none, over the narrowest verification measured (a
    decode's upper bound). A choice whose every round verifies never runs a plain decode,
    so without that the default would stand for good; the slope between verifications
    leaves out what any verification costs over a decode, which `MIN_GAIN` stands for. A
    stale estimate does not count (as in `worth_verifying`): one slow measurement must not
    price every row out for good, since then nothing would verify and measure it again."""
    verify = costs.fresh_duration_s("verify", verify_label(num_seqs, width), now)
    base_rows = 1
    base = costs.fresh_duration_s("decode", shape_label(num_seqs, num_seqs), now)
    if base is None:
        base_rows, base = _narrowest_verification(costs, num_seqs, width, now)
    extra = num_seqs * (width - base_rows)
    if base is None or verify is None or base <= 0 or extra <= 0:
        return DEFAULT_ROW_COST
    return max(0.0, (verify - base) / base) * num_seqs / extra


def _narrowest_verification(costs: DurationEstimator, num_seqs: int, width: int,
                            now: float) -> tuple[int, float | None]:
    """This batch's narrowest fresh verification below `width` rows per request: (its rows
    per request, its duration), or (1, None)."""
    for rows in range(2, width):
        duration = costs.fresh_duration_s("verify", verify_label(num_seqs, rows), now)
        if duration is not None:
            return rows, duration
    return 1, None


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

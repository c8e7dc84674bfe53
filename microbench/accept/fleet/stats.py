"""The fleet gate's statistics, pure: robust z within a peer group, k from a false-flag budget,
the small-fleet rule, and the noise rule that turns a flag into FAIL or INCONCLUSIVE.

Robust z = (x - median) / (1.4826 x MAD): the median and the median absolute deviation are not
moved by the few bad nodes a fleet gate looks for (a mean and a standard deviation are, which is
how a baseline built as a mean hides the outliers it was built to find); 1.4826 makes the MAD
estimate the standard deviation of normal noise.

A node is flagged on a metric when it is worse (lower for a bandwidth, higher for a latency)
than the median by more than k robust standard deviations AND by at least a minimum fraction of
the median: in a tight fleet a 1% difference can be many MADs, and is still no fault.

k: nodes x metrics tests are run at once, so a per-test threshold must be strict enough that the
whole run stays within its budget of false flags. The count of false flags of a healthy fleet is
close to Poisson; k is set so that a healthy fleet exceeds the budget in at most 5% of runs:
lambda with P(Poisson(lambda) <= budget) = 0.95, then the one-sided tail p = lambda / tests, and
k = the (1 - p) quantile of Student's t with (values the spread was estimated from - 1) degrees
of freedom: the normal quantile for a large group, larger for a small one, whose MAD is a rough
estimate of its spread.

Under 8 nodes the MAD of the whole group is too coarse (the bad node is a large part of it):
each node is held against the median and MAD of the others (leave one out).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

MAD_SCALE = 1.4826
SMALL_FLEET = 8
CONFIDENCE = 0.95


def median(values: list[float]) -> float:
    return statistics.median(values)


def robust_sigma(values: list[float], center: float | None = None) -> float:
    """1.4826 x the median absolute deviation from `center` (default the median)."""
    if len(values) < 2:
        return 0.0
    center = median(values) if center is None else center
    return MAD_SCALE * median([abs(v - center) for v in values])


def poisson_cdf(n: int, lam: float) -> float:
    term = total = math.exp(-lam)
    for i in range(1, n + 1):
        term *= lam / i
        total += term
    return total


def expected_false_flags(budget: float, confidence: float = CONFIDENCE) -> float:
    """lambda such that a Poisson count stays at or under floor(budget) with `confidence`."""
    allowed = int(math.floor(budget))
    if allowed > 50:
        # Past 50 the Poisson count is normal to within a flag: lambda + z sqrt(lambda) = allowed + 1/2.
        z = statistics.NormalDist().inv_cdf(confidence)
        return ((-z + math.sqrt(z * z + 4 * (allowed + 0.5))) / 2) ** 2
    low, high = 0.0, max(1.0, 2.0 * allowed + 10.0)
    for _ in range(100):
        mid = (low + high) / 2
        if poisson_cdf(allowed, mid) >= confidence:
            low = mid
        else:
            high = mid
    return low


def tail_for_budget(budget: float, tests: int, confidence: float = CONFIDENCE) -> float:
    """The one-sided tail probability each of `tests` tests may have, for at most `budget` false
    flags in `confidence` of healthy runs. ValueError when the budget allows half to fail."""
    if tests < 1:
        return 0.0
    if budget >= tests / 2:
        raise ValueError(f"a budget of {budget:g} false flags over {tests} tests allows half of them to be flagged")
    p = expected_false_flags(budget, confidence) / tests
    if p >= 0.5:
        raise ValueError(f"a budget of {budget:g} false flags over {tests} tests allows half of them to be flagged")
    return p


def k_for_budget(budget: float, tests: int, confidence: float = CONFIDENCE) -> float:
    """The |z| threshold of a large group (its spread well known): the normal (1 - p) quantile."""
    p = tail_for_budget(budget, tests, confidence)
    return statistics.NormalDist().inv_cdf(1.0 - p) if p > 0 else float("inf")


def k_for_peers(p: float, peers: int) -> float:
    """The threshold for a z whose spread was estimated from `peers` values: Student's t with
    peers - 1 degrees of freedom at the same tail p. Six lab hosts (five peers each) take k near
    5 where the normal k is 2.7: a MAD of five values is itself a rough guess, and a normal k
    would spend the budget on that guess's error. Over a few hundred peers t is the normal."""
    if p <= 0:
        return float("inf")
    if peers <= 2:
        return float("inf")          # one degree of freedom or none: no spread worth a z
    return t_quantile(1.0 - p, peers - 1)


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((a + m2 - 1) * (a + m2)), -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, dof: float) -> float:
    tail = 0.5 * _betainc(dof / 2.0, 0.5, dof / (dof + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(q: float, dof: float) -> float:
    """The q quantile (q > 0.5) of Student's t with `dof` degrees of freedom, by bisection."""
    low, high = 0.0, 1.0
    while t_cdf(high, dof) < q:
        high *= 2.0
        if high > 1e12:
            return float("inf")
    for _ in range(200):
        mid = (low + high) / 2
        if t_cdf(mid, dof) < q:
            low = mid
        else:
            high = mid
    return high


@dataclass(frozen=True)
class Gate:
    """One node's value on one metric against its peers."""
    reference: float       # the median it is held to (of the others, under 8 nodes)
    sigma: float           # 1.4826 MAD of the same values
    z: float | None        # (x - reference) / sigma; None when sigma is 0 and x == reference
    worse_fraction: float  # how much worse than the reference, as a share of it (negative: better)
    flagged: bool
    edge: float            # the band's edge: flagged exactly when x is past it (worse side)


def band_edge(reference: float, sigma: float, k: float, min_fraction: float, higher_better: bool) -> float:
    """Where flagging starts: past k sigmas AND past the minimum fraction, whichever is farther."""
    if higher_better:
        return min(reference - k * sigma, reference * (1.0 - min_fraction))
    return max(reference + k * sigma, reference * (1.0 + min_fraction))


def gate_one(x: float, peers: list[float], k: float, min_fraction: float, higher_better: bool,
             reference: float | None = None, sigma: float | None = None) -> Gate:
    ref = median(peers) if reference is None else reference
    sig = robust_sigma(peers, ref) if sigma is None else sigma
    if sig > 0:
        z: float | None = (x - ref) / sig
    else:
        z = None if x == ref else math.copysign(math.inf, x - ref)
    worse = ((ref - x) if higher_better else (x - ref)) / ref if ref else 0.0
    edge = band_edge(ref, sig, k, min_fraction, higher_better)
    flagged = (x < edge) if higher_better else (x > edge)
    return Gate(ref, sig, z, worse, flagged, edge)


def group_k(p: float, nodes: int) -> float:
    """The k a group of `nodes` uses at tail p: its spread comes from all of them (8 or more) or
    from the others (leave one out)."""
    return k_for_peers(p, nodes if nodes >= SMALL_FLEET else nodes - 1)


def gate(values: dict[str, float], p: float, min_fraction: float, higher_better: bool,
         spread: dict[str, float] | None = None) -> dict[str, Gate]:
    """Every node's gate on one metric of one peer group, at tail probability p: against the
    group's median and MAD, or, under SMALL_FLEET nodes, against the other nodes' (leave one
    out); k from p and how many values the spread was estimated from.

    spread: each node's own repeatability, half the range of its iterations (or runs). The
    group's sigma is never taken as tighter than the median of these: four hosts here once
    agreed within 0.2% on a buffered write whose iterations moved 2% on each host, and a fifth
    9% below them stood 11 MADs away while its own iterations could not tell it from the
    machine. Without per-iteration times the spreads are 0 and the MAD decides alone."""
    nodes = list(values)
    if len(nodes) < 2:
        return {}
    spread = spread or {}
    k = group_k(p, len(nodes))

    def sigma(members: list[str], ref: float) -> float:
        floor = median([spread.get(m, 0.0) for m in members])
        return max(robust_sigma([values[m] for m in members], ref), floor)

    if len(nodes) >= SMALL_FLEET:
        all_values = list(values.values())
        ref = median(all_values)
        sig = sigma(nodes, ref)
        return {n: gate_one(values[n], all_values, k, min_fraction, higher_better, ref, sig) for n in nodes}
    out = {}
    for n in nodes:
        others = [m for m in nodes if m != n]
        ref = median([values[m] for m in others])
        out[n] = gate_one(
            values[n], [values[m] for m in others], k, min_fraction, higher_better, ref, sigma(others, ref)
        )
    return out


def noise_edge(g: Gate, peers_worst: float | None, higher_better: bool) -> float:
    """Where a node's best iteration must lie for a FAIL: past the gate's edge and past the
    fleet's own range of iterations, whose end (for a bandwidth, the lower) is `peers_worst`:
    the median of its peers' slowest iterations. Without per-iteration times a peer's worst is
    its value, and the gate's edge decides alone."""
    if peers_worst is None:
        return g.edge
    return min(g.edge, peers_worst) if higher_better else max(g.edge, peers_worst)


def typical_worst(worst: dict[str, float]) -> dict[str, float]:
    """Per node, the median of its peers' slowest iterations: of the others under SMALL_FLEET
    nodes, of the whole group above (where one node moves the median by nothing)."""
    if len(worst) >= SMALL_FLEET:
        whole = median(list(worst.values()))
        return {n: whole for n in worst}
    return {n: median([w for m, w in worst.items() if m != n]) for n in worst if len(worst) > 1}


def noise_verdict(g: Gate, best: float, higher_better: bool, peers_worst: float | None = None) -> str:
    """PASS when not flagged; FAIL when even the node's best iteration (or best repeat) lies
    outside the fleet's band: past the gate's edge and past the iterations its peers gave;
    INCONCLUSIVE when its range reaches back into that band. compare's rule, with the fleet as
    the other run: while any iteration was as good as a typical peer's slowest, the machine
    (another job on a shared disk, a busy core) may explain the median."""
    if not g.flagged:
        return "PASS"
    edge = noise_edge(g, peers_worst, higher_better)
    beyond = best < edge if higher_better else best > edge
    return "FAIL" if beyond else "INCONCLUSIVE"


def merge_repeats(values: list[tuple[float, float, float]], higher_better: bool) -> tuple[float, float, float]:
    """Several runs of one metric on one node -> (value, worst, best): the median value, and the
    range from the worst to the best any run reached."""
    if higher_better:
        return median([v for v, _, _ in values]), min(w for _, w, _ in values), max(b for _, _, b in values)
    return median([v for v, _, _ in values]), max(w for _, w, _ in values), min(b for _, _, b in values)

"""The CI gate's decision rule: is the current run's throughput slower than the baseline's?

Input: two lists of per-step global throughput samples (samples/s, higher is better) for the
*same* configuration, one from the baseline and one from the current run (see
``profiler.baseline.step_throughput_samples``). Output: a :class:`Verdict`.

The change is measured on log-throughput, so a shift there is a ratio: ``ratio = exp(shift)``
is current / baseline (< 1 = slower). The rule (both conditions must hold for ``"regression"``):

1. **Significance** — a one-sided Mann-Whitney U test of "current is stochastically smaller than
   baseline" gives ``p < alpha`` (default 0.002, the threshold asv uses). The test is rank-based,
   so a few outlier steps (a checkpoint, a page-cache miss) cannot carry it. For small samples
   without ties the p-value is exact (the U distribution is counted); otherwise the normal
   approximation with tie correction and continuity correction is used, which is accurate for
   ``n >= 8`` per side.
2. **Size** — the Hodges-Lehmann estimate of the shift is the median of all ``n1 * n2`` pairwise
   differences ``log(current_j) - log(baseline_i)``. Its distribution-free confidence interval
   (``confidence``, default 0.90 two-sided, i.e. a one-sided 95 % upper bound) runs from the
   k-th smallest to the k-th largest of those differences, where ``k - 1`` is the largest ``u``
   with ``P(U <= u) <= (1 - confidence) / 2`` under no change: the same U distribution as the
   test, counted exactly when ``n1 * n2 <= EXACT_MAX_PAIRS`` and from the normal approximation
   (continuity-corrected) otherwise; tied values (a coarse timer) are not corrected for here.
   The interval is the set of shifts the two-sided U test would not reject, so its coverage
   holds for any continuous step-time distribution that differs between the sides only by the
   shift. The gate fails only when ``exp(upper end)`` lies below ``1 - max_regression``
   (default 5 %): a tiny but real slowdown, which a long run makes "significant", does not fail
   it; only one that is surely larger than the tolerance does.

The Hodges-Lehmann interval replaces a bootstrap interval of the median ratio: it uses every
step rather than the middle one or two, so it is narrower at the same number of steps (its
efficiency is 0.95 of the mean's under normal noise, the median's 0.64) and catches a real
slowdown more often, and it is deterministic. ``median_ratio`` (median(current) /
median(baseline)) is still reported but does not decide anything.

Both the test and the interval take the steps as independent draws. Real steps are
autocorrelated and a shared machine's level drifts within and between runs; the interval does
not see that, so on such a machine two runs of the same code are flagged more often than
``alpha`` suggests (``benchmarks/gate_power.py --real-runs`` measures it; docs/ci.md).

**Minimum detectable regression.** Each verdict also says which slowdown this comparison could
see: with ``se = (upper - lower) / (2 z_c)`` (``z_c`` the normal quantile of the interval, 1.645
at 90 %), the gate flags a true log-shift ``d`` with probability ``power`` (default 0.95) when
``d <= log(1 - max_regression) - (z_c + z_power) se`` (the interval must clear the tolerance)
and ``d <= -(z_alpha + z_power) se`` (the test must be significant). ``min_detectable`` is the
slowdown ``1 - exp(d)`` at the more negative of the two bounds; at the defaults it is the
tolerance plus two half-widths of the interval (on the log scale). It counts the step-to-step
noise the two samples show, not the run-to-run drift of the machine, which comes on top. ``se``
scales as ``sqrt(1/n1 + 1/n2)``, so when ``min_detectable`` exceeds ``2 * max_regression``
the verdict names ``steps_needed``: the steps per side that would bring it within
``2 * max_regression``.

**Launches.** :func:`compare_launches` takes each side as a list of launches (one probe process
each, ``ddp-profile run --repeat K``). Their steps are pooled for the rule above; with two or
more launches a side, the Hodges-Lehmann shift of the launch medians must also lie beyond the
tolerance (:class:`LaunchCheck`), and the spread of those medians gives the chance that
unchanged code fails the gate, which :func:`launch_warning` reports when it is over 1 %.

With fewer than ``min_samples`` finite, positive samples on either side the verdict is
``"inconclusive"``. Anything else is ``"pass"`` (including a faster current run). Nothing is
random: the same inputs always give the same verdict.

Numpy only; no I/O. ``GateResult`` and ``Comparison`` are the plain data the reports render.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, replace
from statistics import NormalDist
from typing import Any, Optional, Sequence

import numpy as np

PASS = "pass"
REGRESSION = "regression"
INCONCLUSIVE = "inconclusive"
_SEVERITY = {PASS: 0, INCONCLUSIVE: 1, REGRESSION: 2}
EXACT_MAX_PAIRS = 400  # exact U distribution (no ties) up to n1 * n2 pairs, e.g. 20 x 20
MAX_MATERIALISED_PAIRS = 4_000_000  # beyond this, order statistics are found by bisection
REACH_FACTOR = 2.0  # min_detectable above REACH_FACTOR * max_regression earns steps_needed
_NORMAL = NormalDist()
RISK_TARGET = 0.01  # launch-level false-alarm risk above this earns launches_needed


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`compare`.

    ``ratio`` is exp(Hodges-Lehmann shift of log-throughput), current / baseline (< 1 =
    slower), and ``ratio_ci_low`` .. ``ratio_ci_high`` its ``confidence`` interval
    (``interval_method`` "exact" or "normal"); the decision uses these. ``median_ratio`` is
    median(current) / median(baseline), for reference. ``min_detectable`` is the slowdown
    (a fraction, 0.08 = 8 %) this comparison would flag with 95 % power; ``steps_needed`` the
    steps per side that would bring it within twice the tolerance, or None when it is there.
    """

    status: str
    p_value: float
    ratio: float
    ratio_ci_low: float
    ratio_ci_high: float
    median_ratio: float
    n_baseline: int
    n_current: int
    reason: str
    min_detectable: float = math.nan
    steps_needed: Optional[int] = None
    interval_method: Optional[str] = None
    max_regression: float = 0.05
    alpha: float = 0.002
    confidence: float = 0.90
    launches_baseline: int = 1
    launches_current: int = 1
    launch: Optional["LaunchCheck"] = None

    def to_dict(self) -> dict[str, Any]:
        return _no_nan(asdict(self))


def _no_nan(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class LaunchCheck:
    """The launch-level view of a comparison with several launches per side.

    Each launch (one probe process of the configuration) is summarised by the median of its
    log step throughputs. ``ratio`` is exp(Hodges-Lehmann shift of those launch medians),
    ``ratio_ci_low`` .. ``ratio_ci_high`` an approximate t interval (pooled spread,
    ``n1 + n2 - 2`` degrees of freedom). ``spread`` is the pooled standard deviation of the
    launch medians (log scale, about the relative SD of a launch's level).
    ``false_alarm_risk`` is the chance, under no change and normal launch levels with that
    spread, that the launch-level shift lands beyond the tolerance; ``launches_needed`` the
    launches per side that would bring it to ``RISK_TARGET`` (None when it is there).
    ``min_detectable`` is the slowdown the launch-level condition catches with 95 % power.
    """

    ratio: float
    ratio_ci_low: float
    ratio_ci_high: float
    spread: float
    false_alarm_risk: float
    min_detectable: float
    launches_needed: Optional[int] = None


def _finite_positive(values: Sequence[float]) -> np.ndarray:
    array = np.asarray(list(values), dtype=float)
    return array[np.isfinite(array) & (array > 0)]


def _midranks(combined: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks."""
    order = np.argsort(combined, kind="mergesort")
    sorted_values = combined[order]
    ranks = np.empty(len(combined), dtype=float)
    start = 0
    n = len(combined)
    while start < n:
        stop = start
        while stop + 1 < n and sorted_values[stop + 1] == sorted_values[start]:
            stop += 1
        ranks[order[start:stop + 1]] = (start + stop) / 2.0 + 1.0
        start = stop + 1
    return ranks


def u_statistic(baseline: Sequence[float], current: Sequence[float]) -> float:
    """U of the current sample: pairs with current > baseline, ties counted one half."""
    x = np.asarray(baseline, dtype=float)
    y = np.asarray(current, dtype=float)
    ranks = _midranks(np.concatenate([x, y]))
    return float(ranks[len(x):].sum() - len(y) * (len(y) + 1) / 2.0)


@functools.lru_cache(maxsize=64)
def exact_u_cdf(n1: int, n2: int) -> np.ndarray:
    """``P(U <= u)`` for ``u = 0 .. n1 * n2`` under no change and no ties, by counting.

    Place the largest of all values last: a current value there beats all ``n1`` baseline values,
    so ``count(n1, n2, u) = count(n1, n2 - 1, u - n1) + count(n1 - 1, n2, u)``. The returned
    array is cached and read-only.
    """
    size = n1 * n2 + 1
    # table[i] holds the counts for (i baseline values, j current values), j growing.
    table = [np.zeros(size) for _ in range(n1 + 1)]
    for i in range(n1 + 1):
        table[i][0] = 1.0  # j = 0: U = 0 only
    for j in range(1, n2 + 1):
        new = [np.zeros(size) for _ in range(n1 + 1)]
        new[0][0] = 1.0  # i = 0: U = 0 only
        for i in range(1, n1 + 1):
            new[i][i:] += table[i][:size - i]  # largest is current: + i pairs
            new[i] += new[i - 1]  # largest is baseline
        table = new
    counts = table[n1]
    cdf = np.cumsum(counts) / counts.sum()
    cdf.setflags(write=False)
    return cdf


def _exact_lower_tail(u_obs: float, n1: int, n2: int) -> float:
    """P(U <= u_obs) under H0 with no ties."""
    return float(exact_u_cdf(n1, n2)[int(math.floor(u_obs + 1e-9))])


def mann_whitney_less(baseline: Sequence[float], current: Sequence[float],
                      method: str = "auto") -> tuple[float, float]:
    """One-sided Mann-Whitney U test of H1 "current tends to be smaller"; return (U, p).

    ``method``: ``"exact"`` (no ties only), ``"normal"`` (tie- and continuity-corrected), or
    ``"auto"`` (exact when there are no ties and ``n1 * n2 <= EXACT_MAX_PAIRS``).
    """
    x = np.asarray(baseline, dtype=float)
    y = np.asarray(current, dtype=float)
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        return math.nan, math.nan
    combined = np.concatenate([x, y])
    u = u_statistic(x, y)
    _, tie_counts = np.unique(combined, return_counts=True)
    has_ties = bool((tie_counts > 1).any())
    if method == "exact" or (method == "auto" and not has_ties and n1 * n2 <= EXACT_MAX_PAIRS):
        if has_ties:
            raise ValueError("the exact U distribution here assumes no ties")
        return u, _exact_lower_tail(u, n1, n2)
    n = n1 + n2
    tie_term = float((tie_counts ** 3 - tie_counts).sum()) / (n * (n - 1))
    variance = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if variance <= 0:  # every value identical: no evidence either way
        return u, 1.0
    z = (u - n1 * n2 / 2.0 + 0.5) / math.sqrt(variance)
    return u, min(1.0, 0.5 * math.erfc(-z / math.sqrt(2.0)))


def interval_rank(n1: int, n2: int, confidence: float = 0.90,
                  method: str = "auto") -> tuple[int, str]:
    """``(k, method)``: the interval is the k-th smallest .. k-th largest pairwise difference.

    ``k - 1`` is the largest ``u`` with ``P(U <= u) <= (1 - confidence) / 2``, so the interval
    covers the true shift with probability at least ``confidence`` (exact method). ``k = 0``:
    no such ``u`` (samples too small for this confidence), the interval is unbounded.
    ``method``: ``"exact"``, ``"normal"`` (continuity-corrected), or ``"auto"`` (exact when
    ``n1 * n2 <= EXACT_MAX_PAIRS``).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tail = (1.0 - confidence) / 2.0
    if method == "exact" or (method == "auto" and n1 * n2 <= EXACT_MAX_PAIRS):
        cdf = exact_u_cdf(n1, n2)
        return int(np.searchsorted(cdf, tail * (1 + 1e-12), side="right")), "exact"
    if method not in ("normal", "auto"):
        raise ValueError(f"method must be exact, normal or auto, got {method!r}")
    mean = n1 * n2 / 2.0
    sd = math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12.0)
    # P(U <= k - 1) ~ Phi((k - 1 + 0.5 - mean) / sd) <= tail
    k = math.floor(mean + 0.5 + _NORMAL.inv_cdf(tail) * sd)
    return max(0, k), "normal"


def _select_pairwise(x: np.ndarray, y: np.ndarray, rank: int, iterations: int = 200) -> float:
    """The ``rank``-th smallest ``y_j - x_i`` (1-based) without forming the pairs.

    Bisects on the value, counting the pairs at or below it with ``searchsorted`` (``x``
    sorted); the result is exact to within rounding of the bisection (~1e-15 of the range).
    """
    n_pairs = len(x) * len(y)

    def count_le(t: float) -> int:  # y_j - x_i <= t  <=>  x_i >= y_j - t
        return n_pairs - int(np.searchsorted(x, y - t, side="left").sum())

    lo, hi = float(y.min() - x[-1]), float(y.max() - x[0])
    if count_le(lo) >= rank:
        return lo
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if count_le(mid) >= rank:
            hi = mid
        else:
            lo = mid
    return hi


def pairwise_order_statistics(x: Sequence[float], y: Sequence[float], ranks: Sequence[int],
                              max_pairs: int = MAX_MATERIALISED_PAIRS) -> list[float]:
    """The ``ranks``-th smallest (1-based) of the ``len(x) * len(y)`` differences ``y_j - x_i``.

    Up to ``max_pairs`` pairs the differences are formed and partitioned; beyond, each order
    statistic is found by bisection (:func:`_select_pairwise`), in O((n1 + n2) log n) memory.
    """
    xs = np.sort(np.asarray(x, dtype=float))
    ys = np.asarray(y, dtype=float)
    n_pairs = len(xs) * len(ys)
    if any(not 1 <= r <= n_pairs for r in ranks):
        raise ValueError(f"ranks must be in 1..{n_pairs}, got {list(ranks)}")
    if n_pairs <= max_pairs:
        differences = (ys[:, None] - xs[None, :]).ravel()
        partitioned = np.partition(differences, sorted({r - 1 for r in ranks}))
        return [float(partitioned[r - 1]) for r in ranks]
    return [_select_pairwise(xs, ys, r) for r in ranks]


@dataclass(frozen=True)
class ShiftEstimate:
    """Hodges-Lehmann shift ``current - baseline`` and its interval (``rank`` k, ``method``)."""

    shift: float
    low: float
    high: float
    rank: int
    method: str


def hodges_lehmann(baseline: Sequence[float], current: Sequence[float],
                   confidence: float = 0.90, method: str = "auto",
                   max_pairs: int = MAX_MATERIALISED_PAIRS) -> ShiftEstimate:
    """Hodges-Lehmann estimate of the shift from ``baseline`` to ``current``, with its interval.

    The estimate is the median of the pairwise differences ``current_j - baseline_i``; the
    interval is their k-th smallest .. k-th largest, k from :func:`interval_rank`. Pass
    log-throughput to get a log-ratio. Both samples must be non-empty and finite.
    """
    x = np.asarray(baseline, dtype=float)
    y = np.asarray(current, dtype=float)
    if len(x) == 0 or len(y) == 0 or not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("hodges_lehmann needs non-empty, finite samples")
    n_pairs = len(x) * len(y)
    k, used = interval_rank(len(x), len(y), confidence, method)
    middle = [(n_pairs + 1) // 2, n_pairs // 2 + 1]  # the same rank twice when n_pairs is odd
    ranks = middle + ([k, n_pairs + 1 - k] if k >= 1 else [])
    values = pairwise_order_statistics(x, y, ranks, max_pairs)
    shift = 0.5 * (values[0] + values[1])
    low, high = (values[2], values[3]) if k >= 1 else (-math.inf, math.inf)
    return ShiftEstimate(shift=shift, low=low, high=high, rank=k, method=used)


def _z(probability: float) -> float:
    return _NORMAL.inv_cdf(probability)


def min_detectable_regression(log_low: float, log_high: float, *, confidence: float = 0.90,
                              max_regression: float = 0.05, alpha: float = 0.002,
                              power: float = 0.95) -> float:
    """The slowdown (fraction) the gate would flag with ``power``, given the interval's width.

    See the module docstring: ``se = (log_high - log_low) / (2 z_c)``; the answer is
    ``1 - exp(-max(-log(1 - max_regression) + (z_c + z_power) se, (z_alpha + z_power) se))``.
    NaN when the interval is unbounded.
    """
    if not (math.isfinite(log_low) and math.isfinite(log_high)):
        return math.nan
    z_c, z_power = _z(1.0 - (1.0 - confidence) / 2.0), _z(power)
    se = max(0.0, log_high - log_low) / (2.0 * z_c)
    needed = max(-math.log(1.0 - max_regression) + (z_c + z_power) * se,
                 (_z(1.0 - alpha) + z_power) * se)
    return 1.0 - math.exp(-needed)


def steps_for_reach(log_low: float, log_high: float, n_baseline: int, n_current: int, *,
                    confidence: float = 0.90, max_regression: float = 0.05,
                    alpha: float = 0.002, power: float = 0.95,
                    reach: Optional[float] = None) -> Optional[int]:
    """Steps per side that would bring :func:`min_detectable_regression` within ``reach``.

    ``reach`` defaults to ``REACH_FACTOR * max_regression``. The interval's width scales as
    ``sqrt(1/n1 + 1/n2)``, so with ``n`` steps on both sides ``se(n) = se * sqrt((2 / n) /
    (1/n1 + 1/n2))``. None when the comparison already reaches it, or when there is no sensible
    target (``max_regression`` 0, or a reach of 100 % or more).
    """
    reach = REACH_FACTOR * max_regression if reach is None else reach
    if not 0 < reach < 1 or max_regression >= reach:
        return None
    if not (math.isfinite(log_low) and math.isfinite(log_high)):
        return None
    current = min_detectable_regression(log_low, log_high, confidence=confidence,
                                        max_regression=max_regression, alpha=alpha, power=power)
    if current <= reach:
        return None
    z_c, z_power = _z(1.0 - (1.0 - confidence) / 2.0), _z(power)
    se = (log_high - log_low) / (2.0 * z_c)
    target = -math.log(1.0 - reach)
    se_wanted = min((target + math.log(1.0 - max_regression)) / (z_c + z_power),
                    target / (_z(1.0 - alpha) + z_power))
    inverse_n = 1.0 / n_baseline + 1.0 / n_current
    return math.ceil(2.0 / inverse_n * (se / se_wanted) ** 2)


def detectability_warning(verdict: Verdict) -> Optional[str]:
    """One line when ``verdict.min_detectable`` is beyond reach, naming the steps needed."""
    if verdict.steps_needed is None or not math.isfinite(verdict.min_detectable):
        return None
    steps = verdict.steps_needed
    text = (f"this comparison can only see a slowdown of {verdict.min_detectable * 100:.1f} % "
            f"or more (95 % power), over {REACH_FACTOR:g}x the "
            f"{verdict.max_regression * 100:g} % tolerance: measure about {steps} steps per "
            f"side (steps = {steps})")
    if verdict.n_baseline < steps:
        text += (f"; the baseline holds only {verdict.n_baseline}, so re-make it from a run "
                 f"with that many")
    return text


def launch_warning(verdict: Verdict) -> Optional[str]:
    """One line when the launch-to-launch variation is unmeasured, or too large for the
    tolerance with this many launches; None otherwise (and when inconclusive)."""
    if verdict.status == INCONCLUSIVE:
        return None
    check = verdict.launch
    if check is None:
        return ("a single launch on at least one side: how much launches of unchanged code "
                "differ on this machine is not measured, and a launch that runs slow or fast "
                "as a whole can pass for a change; measure 3 or more per side "
                "(ddp-profile run --repeat 3, docs/ci.md)")
    if check.launches_needed is None:
        return None
    return (f"launches of the same configuration differ by {check.spread * 100:.1f} % (SD of "
            f"their medians): with {min(verdict.launches_baseline, verdict.launches_current)} "
            f"per side, unchanged code fails this gate about {check.false_alarm_risk * 100:.1f} "
            f"% of the time; measure {check.launches_needed} per side "
            f"(--repeat {check.launches_needed}) or loosen the tolerance")


def compare(baseline: Sequence[float], current: Sequence[float], *,
            max_regression: float = 0.05, alpha: float = 0.002, min_samples: int = 8,
            confidence: float = 0.90, power: float = 0.95) -> Verdict:
    """Decide whether ``current`` throughput regressed against ``baseline`` (see module doc)."""
    if not 0 <= max_regression < 1:
        raise ValueError(f"max_regression must be in [0, 1), got {max_regression}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    base = _finite_positive(baseline)
    cur = _finite_positive(current)
    settings = dict(max_regression=max_regression, alpha=alpha, confidence=confidence)
    median_ratio = (float(np.median(cur) / np.median(base)) if len(base) and len(cur)
                    else math.nan)
    if min(len(base), len(cur)) < max(min_samples, 1):
        return Verdict(INCONCLUSIVE, math.nan, math.nan, math.nan, math.nan, median_ratio,
                       len(base), len(cur),
                       f"too few samples to decide: {len(base)} baseline, {len(cur)} current "
                       f"step(s), need {min_samples} each", **settings)
    _, p_value = mann_whitney_less(base, cur)
    estimate = hodges_lehmann(np.log(base), np.log(cur), confidence)
    ratio = math.exp(estimate.shift)
    ci_low, ci_high = math.exp(estimate.low), math.exp(estimate.high)
    detectable = min_detectable_regression(estimate.low, estimate.high, confidence=confidence,
                                           max_regression=max_regression, alpha=alpha,
                                           power=power)
    steps_needed = steps_for_reach(estimate.low, estimate.high, len(base), len(cur),
                                   confidence=confidence, max_regression=max_regression,
                                   alpha=alpha, power=power)
    tolerance = f"the {max_regression * 100:g} % tolerance"
    change = (f"ratio (Hodges-Lehmann) {_percent(ratio - 1)} "
              f"({_ci_text(ci_low, ci_high, confidence)})")
    if p_value < alpha and ci_high < 1.0 - max_regression:
        status = REGRESSION
        reason = f"slower beyond {tolerance}: {change}, p={p_value:.2g} < {alpha:g}"
    elif p_value >= alpha:
        status = PASS
        reason = f"no significant slowdown: {change}, p={p_value:.2g} >= {alpha:g}"
    else:
        status = PASS
        reason = f"slowdown not shown beyond {tolerance}: {change}, p={p_value:.2g}"
    return Verdict(status, p_value, ratio, ci_low, ci_high, median_ratio, len(base), len(cur),
                   reason, min_detectable=detectable, steps_needed=steps_needed,
                   interval_method=estimate.method, **settings)


def t_quantile(probability: float, df: int) -> float:
    """Student's t quantile, by the Cornish-Fisher expansion around the normal one.

    At 0.95 (the one-sided end of a 90 % interval) within 1.5 % of the exact value for
    ``df >= 2``; at 0.99 within 1 % from ``df >= 4``. The launch-level interval it sets is
    informative, not part of the decision.
    """
    if df < 1:
        return math.inf
    z = _z(probability)
    z3, z5, z7 = z ** 3, z ** 5, z ** 7
    return (z + (z3 + z) / (4 * df) + (5 * z5 + 16 * z3 + 3 * z) / (96 * df ** 2)
            + (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * df ** 3))


def launch_medians(launches: Sequence[Sequence[float]], min_samples: int = 8) -> np.ndarray:
    """The median log-throughput of each launch with at least ``min_samples`` usable steps."""
    medians = []
    for launch in launches:
        values = _finite_positive(launch)
        if len(values) >= max(min_samples, 1):
            medians.append(float(np.median(np.log(values))))
    return np.asarray(medians, dtype=float)


def launch_check(baseline: np.ndarray, current: np.ndarray, *, max_regression: float,
                 confidence: float = 0.90, power: float = 0.95) -> LaunchCheck:
    """Compare launch medians (log scale, two or more per side): see :class:`LaunchCheck`."""
    n1, n2 = len(baseline), len(current)
    shift = float(np.median(np.subtract.outer(current, baseline)))
    df = n1 + n2 - 2
    squares = float(((baseline - baseline.mean()) ** 2).sum()
                    + ((current - current.mean()) ** 2).sum())
    spread = math.sqrt(squares / df)
    se = spread * math.sqrt(1.0 / n1 + 1.0 / n2)
    half = t_quantile(1.0 - (1.0 - confidence) / 2.0, df) * se
    tolerance = math.log(1.0 - max_regression)
    risk = _NORMAL.cdf(tolerance / se) if se > 0 else 0.0
    needed = None
    if risk > RISK_TARGET and max_regression > 0:
        # se with k launches on each side: spread * sqrt(2 / k)
        needed = math.ceil(2.0 * (_z(1.0 - RISK_TARGET) * spread / tolerance) ** 2)
    detectable = 1.0 - math.exp(tolerance - _z(power) * se)
    return LaunchCheck(ratio=math.exp(shift), ratio_ci_low=math.exp(shift - half),
                       ratio_ci_high=math.exp(shift + half), spread=spread,
                       false_alarm_risk=risk, min_detectable=detectable,
                       launches_needed=needed)


def compare_launches(baseline: Sequence[Sequence[float]], current: Sequence[Sequence[float]],
                     *, max_regression: float = 0.05, alpha: float = 0.002,
                     min_samples: int = 8, confidence: float = 0.90,
                     power: float = 0.95) -> Verdict:
    """:func:`compare` for sides measured in several launches (lists of per-step samples).

    The steps of all launches are pooled for the step-level rule. When both sides have two or
    more launches with ``min_samples`` usable steps, the launch-level shift
    (:func:`launch_check`) must also lie beyond the tolerance for ``"regression"``: launches of
    unchanged code differ in level by more than their steps' spread suggests (shared machines,
    placement, clocks), and only repeated launches show by how much.
    """
    verdict = compare([v for launch in baseline for v in launch],
                      [v for launch in current for v in launch],
                      max_regression=max_regression, alpha=alpha, min_samples=min_samples,
                      confidence=confidence, power=power)
    base = launch_medians(baseline, min_samples)
    cur = launch_medians(current, min_samples)
    counts = dict(launches_baseline=len(baseline), launches_current=len(current))
    if verdict.status == INCONCLUSIVE or len(base) < 2 or len(cur) < 2:
        return replace(verdict, **counts)
    check = launch_check(base, cur, max_regression=max_regression, confidence=confidence,
                         power=power)
    status, reason = verdict.status, verdict.reason
    launch_text = (f"launch medians {_percent(check.ratio - 1)} "
                   f"({len(base)} / {len(cur)} launches)")
    if status == REGRESSION:
        if check.ratio < 1.0 - max_regression:
            reason = f"{reason}; {launch_text}"
        else:
            status = PASS
            reason = (f"{launch_text}: not beyond the {max_regression * 100:g} % tolerance, "
                      f"though the pooled steps are ({verdict.reason})")
    else:
        reason = f"{reason}; {launch_text}"
    detectable = max(verdict.min_detectable, check.min_detectable) \
        if math.isfinite(verdict.min_detectable) else check.min_detectable
    return replace(verdict, status=status, reason=reason, min_detectable=detectable,
                   launch=check, **counts)


def _percent(change: float) -> str:
    return f"{change * 100:+.1f} %"


def _ci_text(low: float, high: float, confidence: float) -> str:
    return f"{confidence * 100:g} % CI {_percent(low - 1)} .. {_percent(high - 1)}"


def worst_status(statuses: Sequence[str]) -> str:
    """``regression`` over ``inconclusive`` over ``pass``; ``inconclusive`` when empty."""
    if not statuses:
        return INCONCLUSIVE
    return max(statuses, key=lambda s: _SEVERITY[s])


@dataclass(frozen=True)
class Comparison:
    """One compared configuration: which probes, their throughput, and the verdict."""

    config: dict[str, Any]
    label: str
    baseline_probe_id: Optional[str]
    current_probe_id: Optional[str]
    baseline_median: float
    current_median: float
    verdict: Verdict


@dataclass(frozen=True)
class GateResult:
    """Everything the gate decided, as plain data for the reports (no I/O here).

    ``baseline`` and ``current`` describe each side: source, kind ("run"|"baseline"),
    environment. ``warnings`` names environment differences that ``force`` let through.
    """

    baseline: dict[str, Any]
    current: dict[str, Any]
    comparisons: list[Comparison]
    max_regression: float
    alpha: float
    warnings: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return worst_status([c.verdict.status for c in self.comparisons])

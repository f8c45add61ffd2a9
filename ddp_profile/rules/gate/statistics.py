"""The gate's statistics: rank tests, Hodges-Lehmann intervals, and what a comparison can see.

Input: samples of per-step global throughput (samples/s) or their logs; numpy only, no I/O,
nothing random. :mod:`ddp_profile.rules.gate.verdict` turns these into a decision.
:func:`mann_whitney_less` is the one-sided test "current is stochastically smaller than
baseline" (exact for small samples without ties, :func:`exact_u_cdf`; else the normal
approximation with tie and continuity corrections). :func:`hodges_lehmann` is the median of
the pairwise log differences, with the distribution-free interval of the same U distribution
(:func:`interval_rank`): it uses every step and is deterministic. Both take the steps as
independent draws; a shared machine's drift is not in them. :func:`min_detectable_regression`
is the slowdown the comparison could flag with ``power``, and :func:`steps_for_reach` the
steps per side that would bring it within ``REACH_FACTOR * max_regression``. The derivations:
docs/internals.md, "The gate's statistics (rules/gate/statistics)".
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Optional, Sequence

import numpy as np

from ddp_profile.defaults import ALPHA, CONFIDENCE, MAX_REGRESSION, MIN_SAMPLES, POWER
from ddp_profile.profiler.quantiles import z_quantile

EXACT_MAX_PAIRS = 400  # exact U distribution (no ties) up to n1 * n2 pairs, e.g. 20 x 20
MAX_MATERIALISED_PAIRS = 4_000_000  # beyond this, order statistics are found by bisection
REACH_FACTOR = 2.0  # min_detectable above REACH_FACTOR * max_regression earns steps_needed
_NORMAL = NormalDist()


def finite_positive(values: Sequence[float]) -> np.ndarray:
    """The finite, positive values of ``values`` as a float array (unusable steps dropped)."""
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
    for _ in range(n2):  # one more current value each time
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


def interval_rank(n1: int, n2: int, confidence: float = CONFIDENCE,
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
                   confidence: float = CONFIDENCE, method: str = "auto",
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


def min_detectable_regression(log_low: float, log_high: float, *, confidence: float = CONFIDENCE,
                              max_regression: float = MAX_REGRESSION, alpha: float = ALPHA,
                              power: float = POWER) -> float:
    """The slowdown (fraction) the gate would flag with ``power``, given the interval's width.

    See the module docstring: ``se = (log_high - log_low) / (2 z_c)``; the answer is
    ``1 - exp(-max(-log(1 - max_regression) + (z_c + z_power) se, (z_alpha + z_power) se))``.
    NaN when the interval is unbounded.
    """
    if not (math.isfinite(log_low) and math.isfinite(log_high)):
        return math.nan
    z_c, z_power = z_quantile(1.0 - (1.0 - confidence) / 2.0), z_quantile(power)
    se = max(0.0, log_high - log_low) / (2.0 * z_c)
    needed = max(-math.log(1.0 - max_regression) + (z_c + z_power) * se,
                 (z_quantile(1.0 - alpha) + z_power) * se)
    return 1.0 - math.exp(-needed)


def steps_for_reach(log_low: float, log_high: float, n_baseline: int, n_current: int, *,
                    confidence: float = CONFIDENCE, max_regression: float = MAX_REGRESSION,
                    alpha: float = ALPHA, power: float = POWER,
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
    z_c, z_power = z_quantile(1.0 - (1.0 - confidence) / 2.0), z_quantile(power)
    se = (log_high - log_low) / (2.0 * z_c)
    target = -math.log(1.0 - reach)
    se_wanted = min((target + math.log(1.0 - max_regression)) / (z_c + z_power),
                    target / (z_quantile(1.0 - alpha) + z_power))
    inverse_n = 1.0 / n_baseline + 1.0 / n_current
    return math.ceil(2.0 / inverse_n * (se / se_wanted) ** 2)


def launch_medians(launches: Sequence[Sequence[float]],
                   min_samples: int = MIN_SAMPLES) -> np.ndarray:
    """The median log-throughput of each launch with at least ``min_samples`` usable steps."""
    medians = []
    for launch in launches:
        values = finite_positive(launch)
        if len(values) >= max(min_samples, 1):
            medians.append(float(np.median(np.log(values))))
    return np.asarray(medians, dtype=float)


"""The CI gate's decision rule: is the current run's throughput slower than the baseline's?

Input: two lists of per-step global throughput samples (samples/s, higher is better) for the
*same* configuration, one from the baseline and one from the current run (see
``profiler.baseline.step_throughput_samples``). Output: a :class:`Verdict`.

The rule (both conditions must hold for ``"regression"``):

1. **Significance** — a one-sided Mann-Whitney U test of "current is stochastically smaller than
   baseline" gives ``p < alpha`` (default 0.002, the threshold asv uses). The test is rank-based,
   so a few outlier steps (a checkpoint, a page-cache miss) cannot carry it. For small samples
   without ties the p-value is exact (the U distribution is counted); otherwise the normal
   approximation with tie correction and continuity correction is used, which is accurate for
   ``n >= 8`` per side.
2. **Size** — the bootstrap confidence interval (percentile method, ``confidence``, default
   0.90 two-sided, i.e. a one-sided 95 % upper bound) of ``median(current) / median(baseline)``
   lies wholly below ``1 - max_regression`` (default 5 %). A tiny but real slowdown, which a
   long run makes "significant", therefore does not fail the gate; only one that is surely larger
   than the tolerance does.

With fewer than ``min_samples`` finite, positive samples on either side the verdict is
``"inconclusive"``. Anything else is ``"pass"`` (including a faster current run). The bootstrap
is seeded, so the same inputs always give the same verdict.

Numpy only; no I/O. ``GateResult`` and ``Comparison`` are the plain data the reports render.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

PASS = "pass"
REGRESSION = "regression"
INCONCLUSIVE = "inconclusive"
_SEVERITY = {PASS: 0, INCONCLUSIVE: 1, REGRESSION: 2}
EXACT_MAX_PAIRS = 400  # exact U distribution (no ties) up to n1 * n2 pairs, e.g. 20 x 20


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`compare`; ``median_ratio`` is current / baseline (< 1 = slower)."""

    status: str
    p_value: float
    median_ratio: float
    ci_low: float
    ci_high: float
    n_baseline: int
    n_current: int
    reason: str
    max_regression: float = 0.05
    alpha: float = 0.002
    confidence: float = 0.90

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in asdict(self).items()}


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


def _exact_lower_tail(u_obs: float, n1: int, n2: int) -> float:
    """P(U <= u_obs) under H0 with no ties, by counting arrangements.

    Place the largest of all values last: a current value there beats all ``n1`` baseline values,
    so ``count(n1, n2, u) = count(n1, n2 - 1, u - n1) + count(n1 - 1, n2, u)``.
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
    return float(counts[:int(math.floor(u_obs + 1e-9)) + 1].sum() / counts.sum())


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


def bootstrap_median_ratio(baseline: np.ndarray, current: np.ndarray, *, n_boot: int = 2000,
                           confidence: float = 0.90, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of median(current) / median(baseline); seeded."""
    rng = np.random.default_rng(seed)
    base_medians = np.median(baseline[rng.integers(0, len(baseline),
                                                   (n_boot, len(baseline)))], axis=1)
    cur_medians = np.median(current[rng.integers(0, len(current),
                                                 (n_boot, len(current)))], axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(cur_medians / base_medians, [tail, 1.0 - tail])
    return float(low), float(high)


def compare(baseline: Sequence[float], current: Sequence[float], *,
            max_regression: float = 0.05, alpha: float = 0.002, min_samples: int = 8,
            n_boot: int = 2000, seed: int = 0, confidence: float = 0.90) -> Verdict:
    """Decide whether ``current`` throughput regressed against ``baseline`` (see module doc)."""
    if not 0 <= max_regression < 1:
        raise ValueError(f"max_regression must be in [0, 1), got {max_regression}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    base = _finite_positive(baseline)
    cur = _finite_positive(current)
    settings = dict(max_regression=max_regression, alpha=alpha, confidence=confidence)
    if min(len(base), len(cur)) < max(min_samples, 1):
        ratio = (float(np.median(cur) / np.median(base)) if len(base) and len(cur) else math.nan)
        return Verdict(INCONCLUSIVE, math.nan, ratio, math.nan, math.nan, len(base), len(cur),
                       f"too few samples to decide: {len(base)} baseline, {len(cur)} current "
                       f"step(s), need {min_samples} each", **settings)
    ratio = float(np.median(cur) / np.median(base))
    _, p_value = mann_whitney_less(base, cur)
    ci_low, ci_high = bootstrap_median_ratio(base, cur, n_boot=n_boot, confidence=confidence,
                                             seed=seed)
    tolerance = f"the {max_regression * 100:g} % tolerance"
    change = f"median {_percent(ratio - 1)} ({_ci_text(ci_low, ci_high, confidence)})"
    if p_value < alpha and ci_high < 1.0 - max_regression:
        status = REGRESSION
        reason = f"slower beyond {tolerance}: {change}, p={p_value:.2g} < {alpha:g}"
    elif p_value >= alpha:
        status = PASS
        reason = f"no significant slowdown: {change}, p={p_value:.2g} >= {alpha:g}"
    else:
        status = PASS
        reason = f"slowdown not shown beyond {tolerance}: {change}, p={p_value:.2g}"
    return Verdict(status, p_value, ratio, ci_low, ci_high, len(base), len(cur), reason,
                   **settings)


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

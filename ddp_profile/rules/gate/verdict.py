"""The CI gate's decision: is the current run's throughput slower than the baseline's?

Input: per-step global throughput samples for the *same* configuration, one list per launch on
each side (``profiler.store.baseline.step_throughput_samples``). Output: a :class:`Verdict`,
plain data; its wording is :mod:`ddp_profile.reports.ci`'s. On log-throughput, a shift is a
ratio (``exp(shift)``: current / baseline). ``"regression"`` needs both **significance** (a
one-sided Mann-Whitney U test, ``p < alpha``: rank-based, so a few outlier steps cannot carry
it) and **size** (the upper end of the Hodges-Lehmann interval of the shift lies below
``log(1 - max_regression)``: a tiny but real slowdown does not fail the gate); with two or more
launches a side (:func:`compare_launches`), the shift of the launch medians must also lie
beyond the tolerance (:class:`LaunchCheck`). Each verdict says which slowdown the comparison
could see (``min_detectable``, ``steps_needed``). Fewer than ``min_samples`` usable samples on
a side is ``"inconclusive"``; anything else ``"pass"``. Nothing is random. The rule for a
reader: docs/ci.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from statistics import NormalDist
from typing import Any, Optional, Sequence

import numpy as np

from ddp_profile.defaults import ALPHA, CONFIDENCE, MAX_REGRESSION, MIN_SAMPLES, POWER
from ddp_profile.profiler.decide.gate import INCONCLUSIVE, PASS, REGRESSION
from ddp_profile.profiler.quantiles import t_quantile, z_quantile
from ddp_profile.rules.gate.statistics import (
    finite_positive,
    hodges_lehmann,
    launch_medians,
    mann_whitney_less,
    min_detectable_regression,
    steps_for_reach,
)

RISK_TARGET = 0.01  # launch-level false-alarm risk above this earns launches_needed
# Why a verdict came out as it did (its wording is reports.ci.reason):
TOO_FEW = "too_few"  # fewer than min_samples usable steps on a side
BEYOND = "beyond"  # significant, and the interval lies beyond the tolerance
NOT_SIGNIFICANT = "not_significant"  # p >= alpha
NOT_BEYOND = "not_beyond"  # significant, but the interval reaches into the tolerance


@dataclass(frozen=True)
class LaunchCheck:
    """The launch-level view of a comparison with several launches per side.

    Each launch (one probe process of the configuration) is summarised by the median of its
    log step throughputs; ``n_baseline`` / ``n_current`` launches had enough steps for one.
    ``ratio`` is exp(Hodges-Lehmann shift of those launch medians), ``ratio_ci_low`` ..
    ``ratio_ci_high`` an approximate t interval (pooled spread, ``n1 + n2 - 2`` degrees of
    freedom). ``spread`` is the pooled standard deviation of the launch medians (log scale,
    about the relative SD of a launch's level). ``false_alarm_risk`` is the chance, under no
    change and normal launch levels with that spread, that the launch-level shift lands beyond
    the tolerance; ``launches_needed`` the launches per side that would bring it to
    ``RISK_TARGET`` (None when it is there). ``min_detectable`` is the slowdown the
    launch-level condition catches with 95 % power. ``overruled``: the pooled steps showed a
    regression that the launch medians do not.
    """

    ratio: float
    ratio_ci_low: float
    ratio_ci_high: float
    spread: float
    false_alarm_risk: float
    min_detectable: float
    launches_needed: Optional[int] = None
    n_baseline: int = 0
    n_current: int = 0
    overruled: bool = False


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`compare` / :func:`compare_launches`.

    ``ratio`` is exp(Hodges-Lehmann shift of log-throughput), current / baseline (< 1 =
    slower), and ``ratio_ci_low`` .. ``ratio_ci_high`` its ``confidence`` interval
    (``interval_method`` "exact" or "normal"); the decision uses these, and ``basis`` says
    which condition decided it (``TOO_FEW``, ``BEYOND``, ``NOT_SIGNIFICANT``, ``NOT_BEYOND``).
    ``median_ratio`` is median(current) / median(baseline), for reference. ``min_detectable``
    is the slowdown (a fraction, 0.08 = 8 %) this comparison would flag with 95 % power;
    ``steps_needed`` the steps per side that would bring it within twice the tolerance, or
    None when it is there.
    """

    status: str
    p_value: float
    ratio: float
    ratio_ci_low: float
    ratio_ci_high: float
    median_ratio: float
    n_baseline: int
    n_current: int
    basis: str
    min_detectable: float = math.nan
    steps_needed: Optional[int] = None
    interval_method: Optional[str] = None
    max_regression: float = MAX_REGRESSION
    alpha: float = ALPHA
    confidence: float = CONFIDENCE
    min_samples: int = MIN_SAMPLES
    launches_baseline: int = 1
    launches_current: int = 1
    launch: Optional[LaunchCheck] = None

    def to_dict(self) -> dict[str, Any]:
        """The verdict as a JSON-ready dict (no NaN: missing numbers are None)."""
        return _no_nan(asdict(self))


def _no_nan(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    return value


def _check_settings(max_regression: float, alpha: float, confidence: float) -> None:
    if not 0 <= max_regression < 1:
        raise ValueError(f"max_regression must be in [0, 1), got {max_regression}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def compare(baseline: Sequence[float], current: Sequence[float], *,
            max_regression: float = MAX_REGRESSION, alpha: float = ALPHA,
            min_samples: int = MIN_SAMPLES, confidence: float = CONFIDENCE,
            power: float = POWER) -> Verdict:
    """Decide whether ``current`` throughput regressed against ``baseline`` (see module doc)."""
    _check_settings(max_regression, alpha, confidence)
    base = finite_positive(baseline)
    cur = finite_positive(current)
    settings = dict(max_regression=max_regression, alpha=alpha, confidence=confidence,
                    min_samples=min_samples)
    median_ratio = (float(np.median(cur) / np.median(base)) if len(base) and len(cur)
                    else math.nan)
    if min(len(base), len(cur)) < max(min_samples, 1):
        return Verdict(INCONCLUSIVE, math.nan, math.nan, math.nan, math.nan, median_ratio,
                       len(base), len(cur), TOO_FEW, **settings)
    _, p_value = mann_whitney_less(base, cur)
    estimate = hodges_lehmann(np.log(base), np.log(cur), confidence)
    ci_low, ci_high = math.exp(estimate.low), math.exp(estimate.high)
    detectable = min_detectable_regression(estimate.low, estimate.high, confidence=confidence,
                                           max_regression=max_regression, alpha=alpha,
                                           power=power)
    steps_needed = steps_for_reach(estimate.low, estimate.high, len(base), len(cur),
                                   confidence=confidence, max_regression=max_regression,
                                   alpha=alpha, power=power)
    if p_value < alpha and ci_high < 1.0 - max_regression:
        status, basis = REGRESSION, BEYOND
    elif p_value >= alpha:
        status, basis = PASS, NOT_SIGNIFICANT
    else:
        status, basis = PASS, NOT_BEYOND
    return Verdict(status, p_value, math.exp(estimate.shift), ci_low, ci_high, median_ratio,
                   len(base), len(cur), basis, min_detectable=detectable,
                   steps_needed=steps_needed, interval_method=estimate.method, **settings)


def launch_check(baseline: np.ndarray, current: np.ndarray, *, max_regression: float,
                 confidence: float = CONFIDENCE, power: float = POWER) -> LaunchCheck:
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
    risk = NormalDist().cdf(tolerance / se) if se > 0 else 0.0
    needed = None
    if risk > RISK_TARGET and max_regression > 0:
        # se with k launches on each side: spread * sqrt(2 / k)
        needed = math.ceil(2.0 * (z_quantile(1.0 - RISK_TARGET) * spread / tolerance) ** 2)
    detectable = 1.0 - math.exp(tolerance - z_quantile(power) * se)
    return LaunchCheck(ratio=math.exp(shift), ratio_ci_low=math.exp(shift - half),
                       ratio_ci_high=math.exp(shift + half), spread=spread,
                       false_alarm_risk=risk, min_detectable=detectable,
                       launches_needed=needed, n_baseline=n1, n_current=n2)


def compare_launches(baseline: Sequence[Sequence[float]], current: Sequence[Sequence[float]],
                     *, max_regression: float = MAX_REGRESSION, alpha: float = ALPHA,
                     min_samples: int = MIN_SAMPLES, confidence: float = CONFIDENCE,
                     power: float = POWER) -> Verdict:
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
    status = verdict.status
    if status == REGRESSION and not check.ratio < 1.0 - max_regression:
        status = PASS
        check = replace(check, overruled=True)
    detectable = max(verdict.min_detectable, check.min_detectable) \
        if math.isfinite(verdict.min_detectable) else check.min_detectable
    return replace(verdict, status=status, min_detectable=detectable, launch=check, **counts)


@dataclass(frozen=True)
class Comparison:
    """The compared configuration: which probes, their throughput, and the verdict."""

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
    environment. The gate compares one configuration: ``comparison``. ``warnings`` are the
    lines the reports print under it (environment differences that ``force`` let through,
    too few steps or launches).
    """

    baseline: dict[str, Any]
    current: dict[str, Any]
    comparison: Comparison
    max_regression: float
    alpha: float
    warnings: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        """The verdict's status: pass, regression or inconclusive."""
        return self.comparison.verdict.status

"""The gate's statistics: the U test, the Hodges-Lehmann interval, order statistics."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from ddp_profile.rules.gate.statistics import (
    EXACT_MAX_PAIRS,
    exact_u_cdf,
    hodges_lehmann,
    interval_rank,
    mann_whitney_less,
    min_detectable_regression,
    pairwise_order_statistics,
    u_statistic,
)
from tests.rules.gate.samples import throughput


def _brute_force_p(baseline, current) -> float:
    """Exact one-sided p: the share of all relabellings whose U is at most the observed U."""
    combined = np.concatenate([baseline, current])
    observed = u_statistic(baseline, current)
    n, n2 = len(combined), len(current)
    hits = total = 0
    for chosen in itertools.combinations(range(n), n2):
        mask = np.zeros(n, dtype=bool)
        mask[list(chosen)] = True
        total += 1
        hits += u_statistic(combined[~mask], combined[mask]) <= observed + 1e-9
    return hits / total


@pytest.mark.parametrize("seed", range(6))
def test_exact_p_equals_brute_force_on_tiny_inputs(seed):
    rng = np.random.default_rng(seed)
    baseline, current = rng.normal(10, 1, 5), rng.normal(9.5, 1, 4)
    _, p_value = mann_whitney_less(baseline, current, method="exact")
    assert p_value == pytest.approx(_brute_force_p(baseline, current), abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_normal_approximation_is_close_to_exact_at_n8(seed):
    rng = np.random.default_rng(seed)
    baseline, current = rng.normal(10, 1, 8), rng.normal(9.2, 1, 8)
    _, p_normal = mann_whitney_less(baseline, current, method="normal")
    exact = _brute_force_p(baseline, current)
    assert p_normal == pytest.approx(exact, abs=0.01)


def test_tie_corrected_normal_approximation_is_close_to_brute_force():
    baseline = np.array([3.0, 3.0, 4.0, 4.0, 4.0, 5.0, 5.0, 6.0])
    current = np.array([2.0, 3.0, 3.0, 3.0, 4.0, 4.0, 5.0, 3.0])
    _, p_normal = mann_whitney_less(baseline, current)  # ties: the normal path
    assert p_normal == pytest.approx(_brute_force_p(baseline, current), abs=0.02)
    with pytest.raises(ValueError):
        mann_whitney_less(baseline, current, method="exact")


def test_p_value_is_monotone_in_the_shift():
    baseline = throughput(30, 1)
    p_values = [mann_whitney_less(baseline, factor * throughput(30, 2))[1]
                for factor in (1.1, 1.0, 0.97, 0.94, 0.9)]
    assert p_values == sorted(p_values, reverse=True)


# --- Hodges-Lehmann estimate and its distribution-free interval ---------------------------


def _all_differences(baseline, current) -> np.ndarray:
    return np.sort([c - b for b in baseline for c in current])


def _brute_force_u_cdf(n1: int, n2: int) -> np.ndarray:
    """P(U <= u) by listing every placement of the current values among n1 + n2 ranks."""
    counts = np.zeros(n1 * n2 + 1)
    for chosen in itertools.combinations(range(n1 + n2), n2):
        # a current value at 0-based rank r beats the baseline values below it
        counts[sum(r - i for i, r in enumerate(chosen))] += 1
    return np.cumsum(counts) / counts.sum()


def test_hodges_lehmann_by_hand():
    # differences 2-1, 2-2, 2-3, 4-1, 4-2, 4-3, 7-1, 7-2, 7-3 = -1 0 1 1 2 3 4 5 6
    assert hodges_lehmann([1.0, 2.0, 3.0], [2.0, 4.0, 7.0]).shift == 2.0
    # an even number of pairs: 1-0, 2-0, 1-10, 2-10 = -9 -8 1 2, median (-8 + 1) / 2
    assert hodges_lehmann([0.0, 10.0], [1.0, 2.0]).shift == -3.5
    # a pure shift is recovered exactly
    rng = np.random.default_rng(3)
    sample = rng.normal(0, 1, 11)
    assert hodges_lehmann(sample, sample - 0.25).shift == pytest.approx(-0.25, abs=1e-12)


@pytest.mark.parametrize("n1,n2", [(3, 3), (4, 5), (5, 7), (8, 8)])
def test_exact_u_distribution_equals_enumeration(n1, n2):
    assert exact_u_cdf(n1, n2) == pytest.approx(_brute_force_u_cdf(n1, n2), abs=1e-12)


@pytest.mark.parametrize("n1,n2,confidence", [(5, 7, 0.90), (8, 8, 0.90), (8, 8, 0.95),
                                               (6, 9, 0.80)])
def test_interval_rank_is_the_largest_allowed_by_the_u_distribution(n1, n2, confidence):
    cdf = _brute_force_u_cdf(n1, n2)
    tail = (1 - confidence) / 2
    k, method = interval_rank(n1, n2, confidence)
    assert method == "exact" and k >= 1
    assert cdf[k - 1] <= tail < cdf[k]  # P(U <= k-1) within the tail, P(U <= k) beyond it


def test_interval_rank_matches_published_critical_values():
    """One-sided 5 % critical values of U (n1 = n2): 15 at 8, 27 at 10, 138 at 20."""
    for n, critical in ((8, 15), (10, 27), (20, 138)):
        assert interval_rank(n, n, 0.90, method="exact")[0] == critical + 1


@pytest.mark.parametrize("seed", range(4))
def test_interval_is_the_kth_smallest_and_largest_pairwise_difference(seed):
    rng = np.random.default_rng(seed)
    baseline, current = rng.normal(10, 1, 9), rng.normal(9.4, 1.3, 12)
    estimate = hodges_lehmann(baseline, current, 0.90)
    differences = _all_differences(baseline, current)
    k = estimate.rank
    assert estimate.low == differences[k - 1]
    assert estimate.high == differences[len(differences) - k]
    assert estimate.shift == pytest.approx(np.median(differences), abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_interval_holds_the_shifts_the_u_test_does_not_reject(seed):
    """Inside the interval neither one-sided exact test rejects at (1 - confidence) / 2."""
    rng = np.random.default_rng(seed)
    baseline, current = rng.normal(10, 1, 7), rng.normal(9.0, 1, 8)
    estimate = hodges_lehmann(baseline, current, 0.90)
    differences = _all_differences(baseline, current)
    midpoints = (differences[:-1] + differences[1:]) / 2  # never equal to a difference
    for delta in midpoints[differences[1:] > differences[:-1]]:
        shifted = current - delta
        p_lower = mann_whitney_less(baseline, shifted, method="exact")[1]
        p_upper = mann_whitney_less(shifted, baseline, method="exact")[1]
        inside = estimate.low < delta < estimate.high
        assert inside == (p_lower > 0.05 and p_upper > 0.05), delta


@pytest.mark.parametrize("n1,n2", [(15, 20), (20, 20), (12, 30), (18, 22)])
def test_exact_and_normal_interval_ranks_agree_for_moderate_n(n1, n2):
    exact, _ = interval_rank(n1, n2, 0.90, method="exact")
    normal, _ = interval_rank(n1, n2, 0.90, method="normal")
    assert abs(exact - normal) <= 1
    assert abs(exact_u_cdf(n1, n2)[exact - 1] - 0.05) < 0.01


@pytest.mark.parametrize("n", [12, 40])
def test_ninety_percent_interval_covers_the_true_shift_near_nominally(n):
    """Skewed, outlier-prone step times, the same on both sides but for a known log-shift."""
    rng = np.random.default_rng(1234 + n)
    true_shift = math.log(0.93)
    trials, covered = 2000, 0

    def steps(size):
        times = rng.lognormal(0, 0.07, size)
        outliers = rng.random(size) < 0.05
        times[outliers] *= rng.uniform(1.3, 2.5, int(outliers.sum()))
        return np.log(1000 / times)

    for _ in range(trials):
        estimate = hodges_lehmann(steps(n), steps(n) + true_shift, 0.90)
        covered += estimate.low <= true_shift <= estimate.high
    # exact intervals are conservative (discrete U), the normal one is close to nominal;
    # 2000 trials give a standard error of 0.7 points
    assert 0.88 <= covered / trials <= 0.935, covered / trials
    assert estimate.method == ("exact" if n * n <= EXACT_MAX_PAIRS else "normal")


@pytest.mark.parametrize("seed", range(3))
def test_bisection_order_statistics_equal_the_formed_pairs(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.lognormal(0, 1, 57), rng.lognormal(0.2, 1, 43)
    ranks = [1, 2, 100, 57 * 43 // 2, 57 * 43 - 1, 57 * 43]
    formed = pairwise_order_statistics(x, y, ranks)
    bisected = pairwise_order_statistics(x, y, ranks, max_pairs=0)
    assert bisected == pytest.approx(formed, rel=1e-12, abs=1e-12)
    tied_x, tied_y = np.round(x, 0), np.round(y, 0)  # heavy ties
    assert pairwise_order_statistics(tied_x, tied_y, ranks, max_pairs=0) == pytest.approx(
        pairwise_order_statistics(tied_x, tied_y, ranks), abs=1e-9)
    with pytest.raises(ValueError):
        pairwise_order_statistics(x, y, [0])


def test_unbounded_interval_when_samples_are_too_small_for_the_confidence():
    estimate = hodges_lehmann([1.0, 2.0], [1.5, 2.5], 0.90)  # P(U = 0) = 1/6 > 5 %
    assert estimate.rank == 0 and estimate.low == -math.inf and estimate.high == math.inf
    assert math.isnan(min_detectable_regression(estimate.low, estimate.high))

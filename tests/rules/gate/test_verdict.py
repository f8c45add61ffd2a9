"""The gate's decision rule: Mann-Whitney U + the Hodges-Lehmann interval of the ratio."""

from __future__ import annotations

import dataclasses
import itertools
import math
from statistics import NormalDist

import numpy as np
import pytest

from ddp_profile.reports.ci import detectability_warning, launch_warning, reason
from ddp_profile.rules.gate.statistics import (EXACT_MAX_PAIRS, exact_u_cdf, hodges_lehmann,
                                               interval_rank, mann_whitney_less,
                                               min_detectable_regression,
                                               pairwise_order_statistics, steps_for_reach,
                                               t_quantile, u_statistic)
from ddp_profile.rules.gate.verdict import (INCONCLUSIVE, PASS, REGRESSION, compare,
                                            compare_launches)


def _throughput(n: int, seed: int, level: float = 1000.0, cv: float = 0.05) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return level * rng.lognormal(0.0, cv, n)


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


def test_a_a_samples_pass():
    for seed in range(5):
        verdict = compare(_throughput(40, seed), _throughput(40, 100 + seed))
        assert verdict.status == PASS, reason(verdict)
        assert verdict.ratio_ci_low < 1.0 < verdict.ratio_ci_high or abs(verdict.ratio - 1) < 0.03


def test_identical_samples_pass_with_p_one_half():
    samples = _throughput(30, 1)
    verdict = compare(samples, samples)
    assert verdict.status == PASS
    assert verdict.median_ratio == 1.0 and verdict.ratio == 1.0
    assert verdict.ratio_ci_low < 1.0 < verdict.ratio_ci_high
    assert 0.45 < verdict.p_value <= 0.55


def test_fifteen_percent_slowdown_fails():
    verdict = compare(_throughput(40, 1), 0.85 * _throughput(40, 2))
    assert verdict.status == REGRESSION, reason(verdict)
    assert verdict.p_value < 0.002
    assert verdict.ratio_ci_low < verdict.ratio < verdict.ratio_ci_high < 0.95
    assert 0.80 < verdict.ratio < 0.90 and 0.80 < verdict.median_ratio < 0.90
    assert "tolerance" in reason(verdict) and "\n" not in reason(verdict)
    assert "Hodges-Lehmann" in reason(verdict) and "90 % CI" in reason(verdict)


def test_faster_current_run_passes():
    verdict = compare(_throughput(40, 1), 1.3 * _throughput(40, 2))
    assert verdict.status == PASS
    assert verdict.p_value > 0.99


def test_significant_but_within_tolerance_passes():
    """A real 2 % slowdown over many steps is significant, yet inside the 5 % tolerance."""
    verdict = compare(_throughput(300, 1, cv=0.02), 0.98 * _throughput(300, 2, cv=0.02))
    assert verdict.p_value < 0.002
    assert verdict.status == PASS
    assert "not shown beyond the 5 % tolerance" in reason(verdict)


def test_tolerance_is_configurable():
    baseline, current = _throughput(60, 1, cv=0.02), 0.92 * _throughput(60, 2, cv=0.02)
    assert compare(baseline, current, max_regression=0.05).status == REGRESSION
    assert compare(baseline, current, max_regression=0.10).status == PASS


def test_few_samples_are_inconclusive():
    verdict = compare(_throughput(7, 1), 0.5 * _throughput(40, 2))
    assert verdict.status == INCONCLUSIVE
    assert (verdict.n_baseline, verdict.n_current) == (7, 40)
    assert math.isnan(verdict.p_value)
    assert "too few samples" in reason(verdict)


def test_non_finite_and_non_positive_samples_are_dropped():
    baseline = list(_throughput(10, 1)) + [math.nan, math.inf, 0.0, -5.0]
    verdict = compare(baseline, _throughput(10, 2))
    assert verdict.n_baseline == 10
    assert compare([math.nan] * 20, _throughput(20, 2)).status == INCONCLUSIVE


def test_all_tied_values_pass_with_p_one():
    verdict = compare([100.0] * 20, [100.0] * 20)
    assert verdict.status == PASS
    assert verdict.p_value == 1.0


def test_heavily_tied_samples_still_detect_a_regression():
    """Throughput quantised to a few values (coarse timer) still gives a sane verdict."""
    baseline = np.round(_throughput(40, 1), -2)  # 900, 1000, 1100 ...
    current = np.round(0.8 * _throughput(40, 2), -2)
    assert len(np.unique(np.concatenate([baseline, current]))) < 10
    verdict = compare(baseline, current)
    assert verdict.status == REGRESSION
    assert compare(baseline, baseline[::-1]).status == PASS


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
    baseline = _throughput(30, 1)
    p_values = [mann_whitney_less(baseline, factor * _throughput(30, 2))[1]
                for factor in (1.1, 1.0, 0.97, 0.94, 0.9)]
    assert p_values == sorted(p_values, reverse=True)


def test_verdict_is_deterministic_and_frozen():
    baseline, current = _throughput(30, 1), 0.97 * _throughput(30, 2)
    first, second = compare(baseline, current), compare(baseline, current)
    assert first == second
    assert compare(baseline[::-1], current).ratio_ci_low == first.ratio_ci_low  # order-free
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.status = REGRESSION  # type: ignore[misc]
    assert first.to_dict()["status"] == first.status


def test_invalid_settings_raise():
    with pytest.raises(ValueError):
        compare([1.0] * 10, [1.0] * 10, max_regression=1.5)
    with pytest.raises(ValueError):
        compare([1.0] * 10, [1.0] * 10, alpha=0.0)


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


# --- minimum detectable regression ----------------------------------------------------------


def test_min_detectable_formula_at_the_defaults_is_tolerance_plus_two_half_widths():
    half_width = 0.03
    expected = 1 - math.exp(math.log(0.95) - 2 * half_width)  # z_c = z_power = 1.645
    assert min_detectable_regression(-0.1, -0.1 + 2 * half_width) == pytest.approx(
        expected, rel=1e-9)
    # a very wide interval: the significance test, not the tolerance, is the binding one
    se = 0.2 / (2 * 1.6448536)
    assert min_detectable_regression(-0.1, 0.1) == pytest.approx(
        1 - math.exp(-(2.8781617 + 1.6448536) * se), rel=1e-6)  # z at 1 - 0.002


def test_min_detectable_is_in_every_verdict_and_shrinks_with_more_steps():
    small = compare(_throughput(20, 1), _throughput(20, 2))
    large = compare(_throughput(200, 1), _throughput(200, 2))
    assert 0.05 < large.min_detectable < small.min_detectable < 0.3
    assert large.steps_needed is None
    assert math.isnan(compare(_throughput(5, 1), _throughput(5, 2)).min_detectable)


def test_a_slowdown_of_min_detectable_is_caught_about_95_percent_of_the_time():
    """The figure means what it says: simulate that slowdown and count the regressions."""
    n, cv = 30, 0.06
    figures = [compare(_throughput(n, s, cv=cv), _throughput(n, 1000 + s, cv=cv)).min_detectable
               for s in range(20)]
    detectable = float(np.median(figures))
    caught = sum(compare(_throughput(n, 2000 + s, cv=cv),
                         (1 - detectable) * _throughput(n, 3000 + s, cv=cv)).status == REGRESSION
                 for s in range(400))
    assert 0.88 <= caught / 400 <= 0.99, (detectable, caught)
    at_tolerance = sum(compare(_throughput(n, 4000 + s, cv=cv),
                               0.95 * _throughput(n, 5000 + s, cv=cv)).status == REGRESSION
                       for s in range(200))
    assert at_tolerance / 200 < 0.1


def test_steps_needed_brings_min_detectable_within_twice_the_tolerance():
    """One short comparison's width is itself noisy, so this checks the typical (median) case."""
    cv = 0.09
    short = [compare(_throughput(20, s, cv=cv), _throughput(20, 100 + s, cv=cv))
             for s in range(15)]
    assert all(v.min_detectable > 0.10 and v.steps_needed > 20 for v in short)
    n = int(np.median([v.steps_needed for v in short]))
    longer = [compare(_throughput(n, s, cv=cv), _throughput(n, 100 + s, cv=cv)).min_detectable
              for s in range(15)]
    assert 0.09 < float(np.median(longer)) < 0.11  # n^-1/2 scaling lands near the target
    # unequal sides: the formula uses 1/n1 + 1/n2
    assert steps_for_reach(-0.2, 0.0, 10, 40) == steps_for_reach(-0.2, 0.0, 16, 16)
    assert steps_for_reach(-0.2, 0.0, 20, 20, max_regression=0.0) is None  # no target
    assert steps_for_reach(-0.01, 0.01, 20, 20) is None  # already within reach


def test_detectability_warning_names_the_steps_and_a_short_baseline():
    verdict = compare(_throughput(20, 1, cv=0.09), _throughput(60, 2, cv=0.09))
    text = detectability_warning(verdict)
    assert text is not None and "\n" not in text
    assert f"{verdict.steps_needed} steps per side" in text
    assert "the baseline holds only 20" in text
    assert detectability_warning(compare(_throughput(200, 1), _throughput(200, 2))) is None


def test_verdict_json_has_the_new_fields_and_no_nan():
    data = compare(_throughput(30, 1), _throughput(30, 2)).to_dict()
    for key in ("ratio", "ratio_ci_low", "ratio_ci_high", "median_ratio", "min_detectable",
                "steps_needed", "interval_method"):
        assert key in data
    assert data["interval_method"] == "normal"
    inconclusive = compare(_throughput(3, 1), _throughput(30, 2)).to_dict()
    assert inconclusive["ratio"] is None and inconclusive["min_detectable"] is None


# ---- several launches per side -------------------------------------------------------------
def _launches(levels, n=60, seed=0, cv=0.05):
    """One list of per-step samples per launch, each around its own level."""
    return [list(_throughput(n, seed + i, level=level, cv=cv)) for i, level in enumerate(levels)]


def test_t_quantile_matches_tables():
    # Student's t, one-sided 0.95 and 0.99 (standard tables)
    for df, p, exact in ((2, 0.95, 2.920), (4, 0.95, 2.132), (10, 0.95, 1.812),
                         (4, 0.99, 3.747), (10, 0.99, 2.764)):
        assert t_quantile(p, df) == pytest.approx(exact, rel=0.015)


def test_a_slow_launch_alone_does_not_fail_the_gate():
    # one long launch of the current side runs 12 % slow as a whole, its two shorter ones do
    # not: most pooled steps are slower beyond 5 %, the median launch is not
    baseline = _launches([1000, 1004, 996], seed=0)
    current = _launches([880], n=400, seed=10) + _launches([1001, 999], seed=11)
    pooled = compare([v for launch in baseline for v in launch],
                     [v for launch in current for v in launch])
    assert pooled.status == REGRESSION
    verdict = compare_launches(baseline, current)
    assert verdict.status == PASS
    assert "3 / 3 launches" in reason(verdict) and "not beyond" in reason(verdict)
    assert verdict.launch.ratio == pytest.approx(1.0, abs=0.01)


def test_a_slowdown_in_every_launch_fails():
    baseline = _launches([1000, 1010, 990], seed=0)
    current = _launches([880, 890, 875], seed=10)
    verdict = compare_launches(baseline, current)
    assert verdict.status == REGRESSION
    assert verdict.launches_baseline == verdict.launches_current == 3
    assert verdict.launch.ratio == pytest.approx(0.88, abs=0.01)
    assert verdict.launch.ratio_ci_low < verdict.launch.ratio < verdict.launch.ratio_ci_high
    assert verdict.launch.spread == pytest.approx(0.008, abs=0.006)
    assert launch_warning(verdict) is None  # launches agree: a 5 % tolerance is within reach


def test_launch_level_false_alarm_risk_and_launches_needed():
    # launch levels about 3.5 % apart: with 3 launches per side unchanged code lands beyond a
    # 5 % tolerance now and then; the check names how many launches bring that under 1 %
    verdict = compare_launches(_launches([1000, 1045, 965], seed=0),
                               _launches([1035, 970, 1010], seed=20))
    check = verdict.launch
    assert verdict.status == PASS and 0.025 < check.spread < 0.05
    se = check.spread * math.sqrt(2 / 3)
    assert check.false_alarm_risk == pytest.approx(NormalDist().cdf(math.log(0.95) / se))
    assert check.false_alarm_risk > 0.01
    k = check.launches_needed
    assert NormalDist().cdf(math.log(0.95) / (check.spread * math.sqrt(2 / k))) <= 0.01
    assert NormalDist().cdf(math.log(0.95) / (check.spread * math.sqrt(2 / (k - 1)))) > 0.01
    assert f"--repeat {k}" in launch_warning(verdict)


def test_one_launch_a_side_keeps_the_step_rule_and_says_so():
    baseline, current = _launches([1000], seed=0), _launches([1000], seed=5)
    verdict = compare_launches(baseline, current)
    assert verdict.launch is None
    step_only = compare(baseline[0], current[0])
    assert (verdict.status, verdict.ratio) == (step_only.status, step_only.ratio)
    assert "single launch" in launch_warning(verdict)
    # a launch too short to summarise does not count as one
    short = compare_launches(_launches([1000, 1000]), [current[0], current[0][:3]])
    assert short.launch is None and short.launches_current == 2

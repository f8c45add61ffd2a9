"""The gate's decision rule: Mann-Whitney U + bootstrap interval of the median ratio."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from ddp_profile.rules.regression import (INCONCLUSIVE, PASS, REGRESSION, compare,
                                          mann_whitney_less, u_statistic, worst_status)


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
        assert verdict.status == PASS, verdict.reason
        assert verdict.ci_low < 1.0 < verdict.ci_high or abs(verdict.median_ratio - 1) < 0.03


def test_identical_samples_pass_with_p_one_half():
    samples = _throughput(30, 1)
    verdict = compare(samples, samples)
    assert verdict.status == PASS
    assert verdict.median_ratio == 1.0
    assert 0.45 < verdict.p_value <= 0.55


def test_fifteen_percent_slowdown_fails():
    verdict = compare(_throughput(40, 1), 0.85 * _throughput(40, 2))
    assert verdict.status == REGRESSION, verdict.reason
    assert verdict.p_value < 0.002
    assert verdict.ci_high < 0.95
    assert 0.80 < verdict.median_ratio < 0.90
    assert "tolerance" in verdict.reason and "\n" not in verdict.reason


def test_faster_current_run_passes():
    verdict = compare(_throughput(40, 1), 1.3 * _throughput(40, 2))
    assert verdict.status == PASS
    assert verdict.p_value > 0.99


def test_significant_but_within_tolerance_passes():
    """A real 2 % slowdown over many steps is significant, yet inside the 5 % tolerance."""
    verdict = compare(_throughput(300, 1, cv=0.02), 0.98 * _throughput(300, 2, cv=0.02))
    assert verdict.p_value < 0.002
    assert verdict.status == PASS
    assert "not shown beyond the 5 % tolerance" in verdict.reason


def test_tolerance_is_configurable():
    baseline, current = _throughput(60, 1, cv=0.02), 0.92 * _throughput(60, 2, cv=0.02)
    assert compare(baseline, current, max_regression=0.05).status == REGRESSION
    assert compare(baseline, current, max_regression=0.10).status == PASS


def test_few_samples_are_inconclusive():
    verdict = compare(_throughput(7, 1), 0.5 * _throughput(40, 2))
    assert verdict.status == INCONCLUSIVE
    assert (verdict.n_baseline, verdict.n_current) == (7, 40)
    assert math.isnan(verdict.p_value)
    assert "too few samples" in verdict.reason


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
    assert compare(baseline, current, seed=1).ci_low != first.ci_low
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.status = REGRESSION  # type: ignore[misc]
    assert first.to_dict()["status"] == first.status


def test_invalid_settings_raise():
    with pytest.raises(ValueError):
        compare([1.0] * 10, [1.0] * 10, max_regression=1.5)
    with pytest.raises(ValueError):
        compare([1.0] * 10, [1.0] * 10, alpha=0.0)


def test_worst_status_orders_regression_over_inconclusive_over_pass():
    assert worst_status([PASS, INCONCLUSIVE]) == INCONCLUSIVE
    assert worst_status([INCONCLUSIVE, REGRESSION, PASS]) == REGRESSION
    assert worst_status([PASS]) == PASS
    assert worst_status([]) == INCONCLUSIVE

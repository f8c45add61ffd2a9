"""The gate's decision rule (U test + Hodges-Lehmann interval of the ratio), launches, wording."""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import numpy as np
import pytest

from ddp_profile.profiler.quantiles import t_quantile
from ddp_profile.reports.ci import detectability_warning, launch_warning, reason
from ddp_profile.rules.gate.statistics import min_detectable_regression, steps_for_reach
from ddp_profile.rules.gate.verdict import INCONCLUSIVE, PASS, REGRESSION, compare, compare_launches
from tests.rules.gate.samples import throughput


def test_a_a_samples_pass():
    for seed in range(5):
        verdict = compare(throughput(40, seed), throughput(40, 100 + seed))
        assert verdict.status == PASS, reason(verdict)
        assert verdict.ratio_ci_low < 1.0 < verdict.ratio_ci_high or abs(verdict.ratio - 1) < 0.03


def test_identical_samples_pass_with_p_one_half():
    samples = throughput(30, 1)
    verdict = compare(samples, samples)
    assert verdict.status == PASS
    assert verdict.median_ratio == 1.0 and verdict.ratio == 1.0
    assert verdict.ratio_ci_low < 1.0 < verdict.ratio_ci_high
    assert 0.45 < verdict.p_value <= 0.55


def test_fifteen_percent_slowdown_fails():
    verdict = compare(throughput(40, 1), 0.85 * throughput(40, 2))
    assert verdict.status == REGRESSION, reason(verdict)
    assert verdict.p_value < 0.002
    assert verdict.ratio_ci_low < verdict.ratio < verdict.ratio_ci_high < 0.95
    assert 0.80 < verdict.ratio < 0.90 and 0.80 < verdict.median_ratio < 0.90
    assert "tolerance" in reason(verdict) and "\n" not in reason(verdict)
    assert "Hodges-Lehmann" in reason(verdict) and "90 % CI" in reason(verdict)


def test_faster_current_run_passes():
    verdict = compare(throughput(40, 1), 1.3 * throughput(40, 2))
    assert verdict.status == PASS
    assert verdict.p_value > 0.99


def test_significant_but_within_tolerance_passes():
    """A real 2 % slowdown over many steps is significant, yet inside the 5 % tolerance."""
    verdict = compare(throughput(300, 1, cv=0.02), 0.98 * throughput(300, 2, cv=0.02))
    assert verdict.p_value < 0.002
    assert verdict.status == PASS
    assert "not shown beyond the 5 % tolerance" in reason(verdict)


def test_tolerance_is_configurable():
    baseline, current = throughput(60, 1, cv=0.02), 0.92 * throughput(60, 2, cv=0.02)
    assert compare(baseline, current, max_regression=0.05).status == REGRESSION
    assert compare(baseline, current, max_regression=0.10).status == PASS


def test_few_samples_are_inconclusive():
    verdict = compare(throughput(7, 1), 0.5 * throughput(40, 2))
    assert verdict.status == INCONCLUSIVE
    assert (verdict.n_baseline, verdict.n_current) == (7, 40)
    assert math.isnan(verdict.p_value)
    assert "too few samples" in reason(verdict)


def test_non_finite_and_non_positive_samples_are_dropped():
    baseline = list(throughput(10, 1)) + [math.nan, math.inf, 0.0, -5.0]
    verdict = compare(baseline, throughput(10, 2))
    assert verdict.n_baseline == 10
    assert compare([math.nan] * 20, throughput(20, 2)).status == INCONCLUSIVE


def test_all_tied_values_pass_with_p_one():
    verdict = compare([100.0] * 20, [100.0] * 20)
    assert verdict.status == PASS
    assert verdict.p_value == 1.0


def test_heavily_tied_samples_still_detect_a_regression():
    """Throughput quantised to a few values (coarse timer) still gives a sane verdict."""
    baseline = np.round(throughput(40, 1), -2)  # 900, 1000, 1100 ...
    current = np.round(0.8 * throughput(40, 2), -2)
    assert len(np.unique(np.concatenate([baseline, current]))) < 10
    verdict = compare(baseline, current)
    assert verdict.status == REGRESSION
    assert compare(baseline, baseline[::-1]).status == PASS


def test_verdict_is_deterministic_and_frozen():
    baseline, current = throughput(30, 1), 0.97 * throughput(30, 2)
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
    small = compare(throughput(20, 1), throughput(20, 2))
    large = compare(throughput(200, 1), throughput(200, 2))
    assert 0.05 < large.min_detectable < small.min_detectable < 0.3
    assert large.steps_needed is None
    assert math.isnan(compare(throughput(5, 1), throughput(5, 2)).min_detectable)


def test_a_slowdown_of_min_detectable_is_caught_about_95_percent_of_the_time():
    """The figure means what it says: simulate that slowdown and count the regressions."""
    n, cv = 30, 0.06
    figures = [compare(throughput(n, s, cv=cv), throughput(n, 1000 + s, cv=cv)).min_detectable
               for s in range(20)]
    detectable = float(np.median(figures))
    caught = sum(compare(throughput(n, 2000 + s, cv=cv),
                         (1 - detectable) * throughput(n, 3000 + s, cv=cv)).status == REGRESSION
                 for s in range(400))
    assert 0.88 <= caught / 400 <= 0.99, (detectable, caught)
    at_tolerance = sum(compare(throughput(n, 4000 + s, cv=cv),
                               0.95 * throughput(n, 5000 + s, cv=cv)).status == REGRESSION
                       for s in range(200))
    assert at_tolerance / 200 < 0.1


def test_steps_needed_brings_min_detectable_within_twice_the_tolerance():
    """One short comparison's width is itself noisy, so this checks the typical (median) case."""
    cv = 0.09
    short = [compare(throughput(20, s, cv=cv), throughput(20, 100 + s, cv=cv))
             for s in range(15)]
    assert all(v.min_detectable > 0.10 and v.steps_needed > 20 for v in short)
    n = int(np.median([v.steps_needed for v in short]))
    longer = [compare(throughput(n, s, cv=cv), throughput(n, 100 + s, cv=cv)).min_detectable
              for s in range(15)]
    assert 0.09 < float(np.median(longer)) < 0.11  # n^-1/2 scaling lands near the target
    # unequal sides: the formula uses 1/n1 + 1/n2
    assert steps_for_reach(-0.2, 0.0, 10, 40) == steps_for_reach(-0.2, 0.0, 16, 16)
    assert steps_for_reach(-0.2, 0.0, 20, 20, max_regression=0.0) is None  # no target
    assert steps_for_reach(-0.01, 0.01, 20, 20) is None  # already within reach


def test_detectability_warning_names_the_steps_and_a_short_baseline():
    verdict = compare(throughput(20, 1, cv=0.09), throughput(60, 2, cv=0.09))
    text = detectability_warning(verdict)
    assert text is not None and "\n" not in text
    assert f"{verdict.steps_needed} steps per side" in text
    assert "the baseline holds only 20" in text
    assert detectability_warning(compare(throughput(200, 1), throughput(200, 2))) is None


def test_verdict_json_has_the_new_fields_and_no_nan():
    data = compare(throughput(30, 1), throughput(30, 2)).to_dict()
    for key in ("ratio", "ratio_ci_low", "ratio_ci_high", "median_ratio", "min_detectable",
                "steps_needed", "interval_method"):
        assert key in data
    assert data["interval_method"] == "normal"
    inconclusive = compare(throughput(3, 1), throughput(30, 2)).to_dict()
    assert inconclusive["ratio"] is None and inconclusive["min_detectable"] is None


# ---- several launches per side -------------------------------------------------------------
def _launches(levels, n=60, seed=0, cv=0.05):
    """One list of per-step samples per launch, each around its own level."""
    return [list(throughput(n, seed + i, level=level, cv=cv)) for i, level in enumerate(levels)]


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

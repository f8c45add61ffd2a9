"""The paired gate's verdict (``decide.gate``): launches of the change and its reference,
alternated, read with the claim's fit; the tolerance rule with three ends."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ddp_profile.profiler.decide import gate
from ddp_profile.profiler.decide.paired import CANDIDATE, REFERENCE


def alternation(ratio: float, launches: int, noise: float = 0.0, drift: float = 0.0,
                seed: int = 0) -> list[gate.Launch]:
    """``A B A B ... A``: the reference at 1000 samples/s, the current side at ``ratio`` of
    it, each launch's level off by ``noise`` (relative SD) and the machine drifting by
    ``drift`` a launch."""
    rng = np.random.default_rng(seed)
    out = []
    for position in range(launches):
        side = REFERENCE if position % 2 == 0 else CANDIDATE
        level = 1000.0 * math.exp(drift * position + rng.normal(0.0, noise))
        out.append(gate.Launch(side, position, level * (ratio if side == CANDIDATE else 1.0),
                               f"p{position:03d}"))
    return out


def test_unchanged_code_on_a_drifting_runner_passes_and_the_drift_is_the_fits():
    verdict = gate.judge(alternation(1.0, 7, noise=0.01, drift=-0.03))
    assert verdict.status == gate.PASS and verdict.basis == gate.WITHIN
    assert verdict.low > 0.95 and verdict.low < 1.0 < verdict.high
    assert verdict.drift == pytest.approx(-0.03, abs=0.01)  # 3 % a launch, not the change's
    assert (verdict.launches_reference, verdict.launches_current) == (4, 3)


def test_a_ten_percent_slowdown_is_a_regression_even_where_the_runner_speeds_up():
    verdict = gate.judge(alternation(0.90, 5, noise=0.01, drift=0.05))
    assert verdict.status == gate.REGRESSION and verdict.basis == gate.BEYOND
    assert verdict.high < 0.95 and verdict.ratio == pytest.approx(0.90, abs=0.02)


def test_a_slowdown_inside_the_tolerance_passes_and_one_across_it_stays_open():
    assert gate.judge(alternation(0.98, 9, noise=0.005)).status == gate.PASS
    open_ = gate.judge(alternation(0.95, 5, noise=0.03, seed=3))
    assert open_.status == gate.INCONCLUSIVE and open_.basis == gate.STRADDLES
    assert open_.low < 0.95 < open_.high


def test_an_open_verdict_asks_for_more_launches_within_the_budget_only():
    verdict = gate.judge(alternation(0.93, 5, noise=0.04, seed=1))
    assert verdict.basis == gate.STRADDLES
    assert verdict.launches_needed is not None and verdict.launches_needed > 5
    assert verdict.launches_needed % 2 == 1  # A ... A
    assert gate.more(verdict, 5, 15) and gate.more(verdict, 13, 15)
    assert not gate.more(verdict, 15, 15)
    decided = gate.judge(alternation(0.80, 5, noise=0.005))
    assert not gate.more(decided, 5, 15)


def test_more_launches_narrow_the_interval_as_the_estimate_says():
    """From 5 launches the estimate is rough (2 degrees of freedom), but it points the right
    way: at the launches it names, most draws that straddled clear the tolerance."""
    straddled = cleared = 0
    for seed in range(20):
        first = gate.judge(alternation(0.90, 5, noise=0.04, seed=seed))
        if first.basis != gate.STRADDLES:
            continue
        straddled += 1
        later = gate.judge(alternation(0.90, first.launches_needed, noise=0.04, seed=seed))
        cleared += later.status == gate.REGRESSION
    assert straddled >= 5 and cleared >= 0.6 * straddled


def test_a_failed_launch_or_a_different_environment_decides_nothing():
    launches = alternation(0.5, 5)
    failed = [*launches[:2], gate.Launch(REFERENCE, 2, None, "p002"), *launches[3:]]
    assert gate.judge(failed).basis == gate.TOO_FEW
    assert gate.judge(launches[:3]).basis == gate.TOO_FEW  # A B A: no room for the noise
    other = gate.judge(launches, differences=["world_size: reference 2, current 4"])
    assert other.status == gate.INCONCLUSIVE and other.basis == gate.ENVIRONMENT
    assert other.ratio == pytest.approx(0.5) and not gate.more(other, 5, 15)


def test_environment_differences_name_the_runners_not_the_changes():
    reference = [{"world_size": 2, "torch_version": "2.13.0", "sm_clock_mhz": 1980.0,
                  "throttled": 0.0}] * 3
    same = [dict(e) for e in reference]
    assert gate.environment_differences(reference, same) == ([], [])
    slower_clock = [{**e, "sm_clock_mhz": 1500.0} for e in reference]
    differences, notes = gate.environment_differences(reference, slower_clock)
    assert differences == [] and "1980 MHz" in notes[0] and "1500 MHz" in notes[0]
    hot = [{**e, "throttled": 0.4} for e in reference]
    differences, _ = gate.environment_differences(reference, hot)
    assert len(differences) == 1 and "throttled" in differences[0] and "40%" in differences[0]
    wider = [{**e, "world_size": 4} for e in reference]
    differences, _ = gate.environment_differences(reference, wider)
    assert differences == ["world_size: reference 2, current 4"]
    unknown = [{"world_size": None}] * 3  # unknown on one side: nothing to compare
    assert gate.environment_differences(reference, unknown) == ([], [])


def test_the_verdict_is_plain_json():
    verdict = gate.judge(alternation(1.0, 3))  # too few: NaN ratio
    assert verdict.to_dict()["ratio"] is None and verdict.to_dict()["status"] == gate.INCONCLUSIVE
    with pytest.raises(ValueError):
        gate.judge(alternation(1.0, 5), max_regression=1.0)

"""Launches read against their neighbours (``decide.neighbours``): a level that wanders in any
shape cancels; the noise estimate is unbiased for independent launches; short alternations
keep the linear fit."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from ddp_profile.profiler.decide import gate
from ddp_profile.profiler.decide.neighbours import LOCAL_FROM, local_fit
from ddp_profile.profiler.decide.paired import CANDIDATE, check_interval, fit_alternation
from ddp_profile.profiler.quantiles import t_quantile
from ddp_profile.reports import gate_paired


def rows_of(rates: list[float]) -> list[tuple]:
    """``A B A B ... A``: the reference at even places, the candidate between."""
    return [(CANDIDATE if i % 2 else None, float(i), rate) for i, rate in enumerate(rates)]


# imagenet's main.py, 9 whole launches on a 2-core machine that slowed down and recovered:
# the script's settings (A) and 1 worker (B), samples/s over each whole run
SWING = [22.5, 26.1, 22.0, 24.5, 16.4, 19.3, 18.9, 23.7, 23.9]


def test_a_machine_that_slows_and_recovers_drops_out_against_the_neighbours():
    line = fit_alternation(rows_of(SWING))
    near = fit_alternation(rows_of(SWING), local=True)
    assert not line.local and near.local
    line_low, _ = check_interval(line, CANDIDATE, 0.0, 0.95)
    near_low, near_high = check_interval(near, CANDIDATE, 0.0, 0.95)
    assert line_low < 1.0  # the swing is in the line's residual
    # each B against the mean of its two A's: 1.17, 1.27, 1.10, 1.11
    neighbours = [SWING[i] / math.exp((math.log(SWING[i - 1]) + math.log(SWING[i + 1])) / 2)
                  for i in (1, 3, 5, 7)]
    assert near.ratio(CANDIDATE) == pytest.approx(math.exp(np.mean(np.log(neighbours))))
    assert 1.0 < near_low < near.ratio(CANDIDATE) < near_high
    assert near.dof == 3 and near.drift == pytest.approx(line.drift)  # the line's, reported


def test_a_level_of_any_shape_cancels_exactly_without_noise():
    # the machine's level at the references: no line, no parabola; between two launches it
    # moves geometrically, so a candidate's level is its neighbours' geometric mean
    references = [100.0, 60.0, 95.0, 130.0, 70.0, 110.0]
    rates = []
    for before, after in zip(references, references[1:]):
        rates += [before, 1.2 * math.sqrt(before * after)]
    rates.append(references[-1])
    assert local_fit(rows_of(rates)).gains[CANDIDATE] == pytest.approx(math.log(1.2))
    assert local_fit(rows_of(rates)).sigma == pytest.approx(0.0, abs=1e-9)
    assert fit_alternation(rows_of(rates)).ratio(CANDIDATE) != pytest.approx(1.2, abs=0.02)


def test_the_noise_estimate_is_unbiased_for_independent_launches():
    rng = np.random.default_rng(7)
    sigma, estimates, errors = 0.05, [], []
    for _ in range(3000):
        logs = rng.normal(0.0, sigma, 9)
        fit = local_fit(rows_of(list(np.exp(logs))))
        estimates.append(fit.sigma ** 2)
        errors.append(fit.gains[CANDIDATE])
    # E[sigma^2] holds the covariance of neighbouring d that share a reference: without it
    # the estimate would be 1.5 - 1/(2k) = 1.375 times too large for k = 4
    assert np.mean(estimates) == pytest.approx(sigma ** 2, rel=0.05)
    # and the standard error is the gain's spread across alternations
    assert np.std(errors) == pytest.approx(fit.errors[CANDIDATE] / fit.sigma * sigma, rel=0.05)


def test_an_equal_pair_reads_faster_in_few_alternations():
    """A/A, 9 launches: the claim's reading (locally where the line leaves 3 times the
    neighbours' variance) calls an equal pair faster at 95 % in under 4.5 % of alternations
    (nominal 2.5 %: choosing the reading costs a little), on independent launches and on a
    machine whose level walks or swings; each reading alone stays near 2.5 %."""
    rng = np.random.default_rng(11)
    trials = 3000
    claims = {regime: {"claim": 0, "local": 0} for regime in ("still", "walking", "swinging")}
    for _ in range(trials):
        for regime, counts in claims.items():
            logs = rng.normal(0.0, 0.03, 9)
            if regime == "walking":
                logs += np.cumsum(rng.normal(0.0, 0.04, 9))
            if regime == "swinging":
                logs += 0.15 * np.sin(np.linspace(0.0, math.pi, 9) + rng.uniform(0, math.pi))
            rows = rows_of(list(np.exp(logs)))
            fit = fit_alternation(rows, local=True)
            counts["claim"] += check_interval(fit, CANDIDATE, 0.0, 0.95)[0] > 1.0
            near = local_fit(rows)
            counts["local"] += near.gains[CANDIDATE] > t_quantile(0.975, near.dof) \
                * near.errors[CANDIDATE]
    for regime, counts in claims.items():
        assert counts["claim"] / trials < 0.045, (regime, counts)
        assert counts["local"] / trials < 0.035, (regime, counts)


def test_short_alternations_and_candidates_off_their_place_keep_the_line():
    seven = rows_of([100.0, 110.0, 101.0, 111.0, 99.0, 108.0, 100.0])  # 3 candidates
    assert LOCAL_FROM == 4 and local_fit(seven) is None
    assert not fit_alternation(seven, local=True).local
    adjacent = [(None, 0.0, 100.0), (CANDIDATE, 1.0, 110.0), (CANDIDATE, 2.0, 111.0),
                (None, 3.0, 100.0), (CANDIDATE, 4.0, 109.0), (None, 5.0, 101.0),
                (CANDIDATE, 6.0, 112.0), (None, 7.0, 99.0), (CANDIDATE, 8.0, 110.0),
                (None, 9.0, 100.0)]
    assert local_fit(adjacent) is None
    assert local_fit(rows_of([100.0, 110.0, 101.0, 111.0, 99.0, 108.0, -1.0, 112.0,
                              100.0])) is None


def test_a_still_machine_keeps_the_line_and_a_swinging_one_is_read_locally():
    rng = np.random.default_rng(5)
    local = {"still": 0, "swinging": 0}
    for _ in range(1000):
        for regime in local:
            logs = rng.normal(0.0, 0.03, 9)
            if regime == "swinging":
                logs += 0.15 * np.sin(np.linspace(0.0, math.pi, 9) + rng.uniform(0, math.pi))
            local[regime] += fit_alternation(rows_of(list(np.exp(logs))), local=True).local
    assert local["still"] < 200 < 450 < local["swinging"], local  # of 1,000 (103, 563)
    assert fit_alternation(rows_of(SWING), local=True).local


def test_rounds_of_several_candidates_pool_their_noise():
    # A B A C A B A C ... A on a machine that slows down and recovers: four of each
    rng = np.random.default_rng(3)
    keys = [None, "b", None, "c"] * 4 + [None]
    gains = {None: 1.0, "b": 1.3, "c": 0.8}
    swing = np.sin(np.linspace(0.0, math.pi, len(keys)))
    rows = [(key, float(i), 100.0 * gains[key] * math.exp(0.4 * swing[i]
                                                          + rng.normal(0.0, 0.01)))
            for i, key in enumerate(keys)]
    fit = fit_alternation(rows, local=True)
    assert fit.local and fit.dof == 6  # (4 - 1) for each
    assert fit.ratio("b") == pytest.approx(1.3, rel=0.03)
    assert fit.ratio("c") == pytest.approx(0.8, rel=0.03)
    assert fit.errors["b"] == pytest.approx(fit.errors["c"])


def test_the_gate_reads_nine_launches_locally_and_says_so():
    # a slump in the middle, the current side at its neighbours' level
    rates = [1000.0, 952.0, 900.0, 790.0, 700.0, 832.0, 980.0, 1001.0, 1020.0]
    launches = [gate.Launch(CANDIDATE if i % 2 else "reference", i, rate, f"p{i:03d}")
                for i, rate in enumerate(rates)]
    verdict = gate.judge(launches, max_regression=0.05)
    assert verdict.local and verdict.dof == 3
    assert verdict.status == gate.PASS, verdict
    line = gate.judge(launches[:7], max_regression=0.05)  # 7 launches: the line's fit
    assert not line.local and line.status == gate.INCONCLUSIVE
    for judged, words in ((verdict, "each current launch against the mean of the reference "
                                    "launches beside it"), (line, "fit: log rate = level")):
        result = SimpleNamespace(verdict=judged, status=judged.status, launches=launches,
                                 notes=[], max_launches=19, against="HEAD~1",
                                 config=SimpleNamespace(label=lambda: "w=0 bs=8"))
        assert words in gate_paired.markdown(result)

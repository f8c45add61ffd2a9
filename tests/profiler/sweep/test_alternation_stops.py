"""When an alternation in launches stops (``decide.stopping``, ``sweep.claim.launch_each``):
decided, futile where no outcome of the launches left could make the candidate win,
unpromising where the launches left, read as those so far, would not establish it, or out of
rounds; the stop is recorded once, and a futile stop leaves the full alternation's answer."""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import pytest

from ddp_profile.profiler.decide import stopping
from ddp_profile.profiler.decide.choose import ChoiceThresholds
from ddp_profile.profiler.decide.neighbours import local_fit
from ddp_profile.profiler.decide.paired import (
    CANDIDATE,
    alternation_open,
    fit_alternation,
    paired,
)
from ddp_profile.profiler.quantiles import t_quantile
from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.sweep import claim
from ddp_profile.profiler.sweep.search import Search
from ddp_profile.profiler.sweep.state import SweepOptions
from tests.profiler.sweep.test_adaptive import (
    SPACE,
    OversubscribedMeasurer,
    RestartingMeasurer,
    io_bound,
)

DEFAULTS = ChoiceThresholds()
NINE = [i % 2 == 1 for i in range(claim.MAX_CLAIM_LAUNCHES)]  # A B A B A B A B A


def lower_end(logs: list[float], local: bool) -> Optional[tuple[float, float]]:
    """The candidate's log gain and its interval's lower end as ``decide.paired`` reads the
    alternation ``logs`` (A B A ...): by the line, or by the neighbours."""
    rows = [(CANDIDATE if c else None, float(i), math.exp(v))
            for i, (c, v) in enumerate(zip(NINE, logs))]
    fit = local_fit(rows) if local else fit_alternation(rows)
    if fit is None:
        return None
    gain = fit.gains[CANDIDATE]
    return gain, gain - t_quantile(0.975, fit.dof) * fit.errors[CANDIDATE]


@pytest.mark.parametrize("known, end", [(4, 5), (5, 7), (5, 9), (7, 9)])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_highest_lower_end_is_the_best_any_outcome_of_the_launches_left_reaches(
        known, end, local, seed):
    """Built alternations, the launches left read at values drawn around them, near and far:
    none lifts the interval's lower end above the closed form (else the rule stops too early),
    and the best of them comes within a hair of it (else too late)."""
    if local and end < claim.MAX_CLAIM_LAUNCHES:
        return  # the neighbours read 4 candidates at least
    rng = np.random.default_rng(seed)
    logs = list(7.0 + np.where(NINE, 0.01, 0.0) + rng.normal(0.0, 0.03, len(NINE)))
    floor = math.log(1.02)
    closed = stopping.highest_lower(logs[:known], NINE[:end], 0.95, floor, local)
    best = -math.inf
    for scale in (0.003, 0.03, 0.3):
        for _ in range(1500):
            rest = np.array(logs[known:end]) + rng.normal(0.0, scale, end - known)
            read = lower_end(logs[:known] + list(rest), local)
            if read is not None and read[0] >= floor:
                best = max(best, read[1])
    assert best <= closed + 1e-9
    assert closed - best < 0.004


def threads_probes(rates: list[float]) -> list[ProbeRecord]:
    """The threads check's launches, A B A ..., each a launch of its own, reading ``rates``."""
    return [ProbeRecord.from_json({
        "id": f"p{i:03d}", "kind": "threads", "status": "ok", "launch": f"p{i:03d}",
        "config": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                   "batch_size": 64},
        "throughput": rate, "throughput_rse": 0.01, "steps_measured": 30,
        "pair": {"role": "candidate" if i % 2 else "reference", "index": i,
                 "group": "threads-x"}}) for i, rate in enumerate(rates)]


def alternated(ratios: list[float], levels: tuple[float, ...] = (1000, 1003, 998, 1001, 1000)
               ) -> list[float]:
    """A B A B A B A B A: the references at ``levels``, each candidate ``ratios`` x 1000."""
    return [levels[i // 2] if i % 2 == 0 else 1000.0 * ratios[i // 2] for i in range(9)]


def full(rates: list[float]) -> tuple[int, str]:
    """The alternation as the sweep runs it: A B A B A, then a pair at a time until
    ``alternation_stop``; its launches and how it stopped."""
    for end in (5, 7, 9):
        probes = threads_probes(rates[:end])
        stop = stopping.alternation_stop(probes, probes, DEFAULTS, claim.MAX_CLAIM_LAUNCHES)
        if stop is not None:
            return end, stop
    return 9, stopping.ROUNDS


@pytest.mark.parametrize("ratios, launches, stopped, faster", [
    ([1.01, 0.99, 1.00, 1.00], 5, "futile", False),  # 1.00x [0.97-1.03]: cannot reach 1.02
    ([1.00, 1.01, 0.995, 1.00], 5, "unpromising", False),  # could still win at 5, but
    # launches read as those would not establish it (before that rule: under it at 7)
    ([1.04, 1.00, 1.04, 1.04], 5, "unpromising", False),  # read as its first 5, not
    # established at 9 (the last 4 would have: the rule's cost)
    ([1.05, 1.00, 1.05, 1.05], 9, "decided", True),  # a small gain established at 9
    ([1.06, 0.99, 1.05, 1.03], 5, "unpromising", False),  # open to the end (9 launches):
    # after 5, even a spread as low as theirs could be would leave it open at 9
    ([1.30, 1.28, 1.31, 1.30], 5, "decided", True),  # a clear gain
])
def test_an_alternation_stops_when_no_launch_left_can_change_its_answer(
        ratios, launches, stopped, faster):
    rates = alternated(ratios)
    assert full(rates) == (launches, stopped)
    probes = threads_probes(rates[:launches])
    assert paired(probes, probes, 0.95, DEFAULTS.launch_sd).faster == faster


def test_a_futile_stop_leaves_the_answer_of_the_full_alternation():
    """Modelled launches (2-4 % apart, drifting; an equal pair, or gains of 2-10 %), 60
    alternations: where the rule stops futile (some do: it is no rule that never stops),
    running every launch the sweep ran without it (on while open, to 9) ends on the same
    answer, not faster beyond noise by more than the floor; and it saves launches."""
    futile, saved = 0, 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        gain = rng.choice([0.0, 0.0, 0.02, 0.04, 0.1])
        sd, drift = rng.choice([0.02, 0.03, 0.04]), rng.normal(0.0, 0.005)
        rates = [1000.0 * math.exp((gain if i % 2 else 0.0) + drift * i + rng.normal(0.0, sd))
                 for i in range(9)]
        launches, stopped = full(rates)
        without = launches  # the launches the sweep ran before the rule: on while open
        while stopped == stopping.FUTILE and without < 9 and alternation_open(
                threads_probes(rates[:without]), threads_probes(rates[:without]), DEFAULTS):
            without += 2
        for end in {launches, without}:
            probes = threads_probes(rates[:end])
            answer = paired(probes, probes, 0.95, DEFAULTS.launch_sd)
            assert not (stopped == stopping.FUTILE and answer.faster
                        and answer.ratio > 1 + DEFAULTS.noise_floor), (seed, end, answer)
        futile += stopped == stopping.FUTILE
        saved += without - launches
    assert futile >= 10 and saved >= 10, (futile, saved)


def test_an_unpromising_stop_saves_launches_and_seldom_loses_a_gain(monkeypatch):
    """Modelled launches (3 % apart, a drifting level; an equal pair, gains of 5 % and 11 %),
    90 alternations, each run to its stop with the rule and without it (``establishes`` always
    true): the rule stops some unpromising, saves launches, claims no gain the run without it
    did not, and loses few of those it claimed."""
    def run(rates: list[float]) -> tuple[int, bool]:
        launches, _ = full(rates)
        probes = threads_probes(rates[:launches])
        answer = paired(probes, probes, 0.95, DEFAULTS.launch_sd)
        return launches, bool(answer.faster and answer.ratio > 1 + DEFAULTS.noise_floor)

    cases = []
    for seed in range(90):
        rng = np.random.default_rng(seed)
        gain, drift = (0.0, 0.05, 0.1)[seed % 3], rng.normal(0.0, 0.005)
        cases.append([1000.0 * math.exp((gain if i % 2 else 0.0) + drift * i
                                        + rng.normal(0.0, 0.03)) for i in range(9)])
    reasons = [full(rates)[1] for rates in cases]
    ruled = [run(rates) for rates in cases]
    monkeypatch.setattr(stopping, "establishes", lambda *args: True)
    without = [run(rates) for rates in cases]
    assert reasons.count(stopping.UNPROMISING) >= 8
    saved = sum(w[0] for w in without) - sum(r[0] for r in ruled)
    won = [w[1] for w in without]
    lost = sum(w[1] and not r[1] for w, r in zip(without, ruled))
    assert saved >= 20 and not any(r[1] and not w[1] for w, r in zip(without, ruled))
    assert sum(won) >= 30 and lost <= 0.1 * sum(won), (saved, sum(won), lost)


def threads_stops(found: Search) -> list[dict[str, Any]]:
    """How the threads check's alternations in launches ended (the claim's check, in launches
    too where screens are refused, records its own)."""
    return [e for e in found.alternation_stops if e["check"] == "the threads check"]


def test_the_threads_check_stops_unpromising_and_records_it_once():
    """With the threads that fit, every other launch reads 1.5x and the rest 0.83x: after
    A B A B A the launches left, read as those so far, would leave the check open at 9, so
    it stops there (futile after 7 before that rule, 9 before that);
    summary.json's ``search.alternations`` says so once."""
    fake = OversubscribedMeasurer(io_bound, 1.5, swing=1.8, screens=False)  # in launches
    found = Search(fake, SPACE, SweepOptions(pairs=2, ceiling=False))
    found.run()
    checked = [w for w in fake.asked if w.kind == Kind.THREADS and w.pair is not None]
    assert [w.pair["role"] for w in checked] == ["reference", "candidate"] * 2 + ["reference"]
    [ended] = threads_stops(found)
    assert ended == {"group": checked[0].pair["group"], "check": "the threads check",
                     "letters": "A B A B A", "launches": 5, "stopped": "unpromising"}


def test_a_clear_gain_is_decided_and_a_failed_launch_says_so():
    fake = OversubscribedMeasurer(io_bound, 3.0, screens=False)  # in launches
    found = Search(fake, SPACE, SweepOptions(pairs=2, ceiling=False))
    found.run()
    assert [e["stopped"] for e in threads_stops(found)] == ["decided"]
    assert threads_stops(found)[0]["launches"] == 5

    class Failing(OversubscribedMeasurer):
        def _line(self, requested: Any, kind: str, **extra: Any) -> dict[str, Any]:
            entry = super()._line(requested, kind, **extra)
            if (extra.get("pair") or {}).get("index") == 2:
                entry["status"] = "crash"
            return entry

    fake = Failing(io_bound, 3.0, screens=False)
    found = Search(fake, SPACE, SweepOptions(pairs=2, ceiling=False))
    found.run()
    assert threads_stops(found) == [{
        "group": threads_stops(found)[0]["group"], "check": "the threads check",
        "letters": "A B A", "launches": 3, "stopped": "failed"}]


def persistent_probes(rates: list[float]) -> list[ProbeRecord]:
    """The persistent-workers check's launches, A B A B A, reading ``rates`` per epoch."""
    return [ProbeRecord.from_json({
        **probe.to_json(), "kind": "persistent", "persistent_workers": bool(i % 2) or None})
        for i, probe in enumerate(threads_probes(rates))]


@pytest.mark.parametrize("rates, stops", [
    ([1000.0, 950.0, 1010.0, 960.0], True),  # slower: no fifth launch makes it faster
    ([1000.0, 1010.0, 1000.0, 1012.0], False),  # a fifth launch read low could
    ([1000.0, 1200.0, 980.0, 1260.0], False),
])
def test_the_persistence_check_stops_at_four_where_no_fifth_launch_could_make_it_faster(
        rates, stops):
    roles = ["reference", "candidate"] * 2 + ["reference"]
    probes = persistent_probes(rates)
    assert stopping.persistence_stop(probes[:3], roles, 0.95) is None  # no fit of A B A
    assert stopping.persistence_stop(probes, roles, 0.95) == (stopping.FUTILE if stops
                                                              else None)
    fifth = [paired(full_, full_, 0.95, DEFAULTS.launch_sd).faster
             for full_ in (persistent_probes(rates + [x])
                           for x in np.geomspace(100.0, 10000.0, 400))]
    assert any(fifth) != stops


class SlowerKeptAlive(RestartingMeasurer):
    """As ``RestartingMeasurer``, and workers kept alive read 0.7x, 0.75x ... of the steady
    rate, under the 0.8x the restarting workers run: persistent workers lose."""

    def _line(self, requested: Any, kind: str, **extra: Any) -> dict[str, Any]:
        entry = super()._line(requested, kind, **extra)
        if entry.get("persistent_workers"):
            entry["throughput"] *= 0.7 if len(self.entries) % 4 else 0.75
        return entry


def test_a_persistence_check_that_cannot_win_stops_after_four_launches():
    fake = SlowerKeptAlive(epoch=20)
    found = Search(fake, SPACE, SweepOptions(pairs=3, ceiling=False, comm=False))
    found.run()
    kept = [e for e in found.entries if e.kind == "persistent"]
    assert [e.pair.role for e in kept] == ["reference", "candidate"] * 2
    assert found.alternation_stops[-1] == {
        "group": kept[0].pair.group, "check": "the persistent-workers check",
        "letters": "A B A B", "launches": 4, "stopped": "futile"}

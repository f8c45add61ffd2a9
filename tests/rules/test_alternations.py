"""The expected speedup from the claim's check: the script's settings and the recommendation
alternated, drift and level cancelled (``rules.alternations``)."""

from __future__ import annotations

import dataclasses

import pytest

from ddp_profile.rules import Thresholds
from ddp_profile.rules.alternations import paired_claim
from ddp_profile.rules.recommend import recommend
from tests.rules.tables import RunBuilder

ROLES = ["reference", "candidate"] * 3 + ["reference"]


def drifting_run(gain: float, drift: float, noise: tuple[float, ...] = (1.0,) * 7,
                 launches: bool = False, searched: float = 3000.0,
                 epochs: tuple[float, ...] = ()):
    """The baseline (no workers) measured at 1,000 samples/s, 4 workers at ``searched`` (by
    default 3,000: 2.2x faster than the script, measured while the machine ran 1.36x faster,
    so 3x claimed apart); then the alternation, the machine speeding up by ``drift`` a
    window."""
    builder = (RunBuilder(world_size=2)
               .probe("p000", kind="baseline", num_workers=0, prefetch_factor=None,
                      throughput=1000.0).steps(n=20, compute=0.03)
               .probe("p001", num_workers=4, throughput=searched).steps(n=20, compute=0.01))
    for index, role in enumerate(ROLES):
        rate = 1000.0 * drift ** index * (gain if role == "candidate" else 1.0) * noise[index]
        workers = dict(num_workers=4) if role == "candidate" else dict(num_workers=0,
                                                                        prefetch_factor=None)
        launch = f"p{2 + index:03d}" if launches else "p002-screen"
        builder.probe(f"p{2 + index:03d}", kind="paired", throughput=rate, **workers,
                      entry={"pair": {"role": role, "index": index, "group": "claim-002"},
                             "launch": launch,
                             **({"epochs_throughput": rate * epochs[index]}
                                if index < len(epochs) else {})}).steps(n=10)
    return builder.build()


def test_windows_spanning_whole_epochs_are_read_by_their_wall_clock():
    """Every window spanned whole epochs: each is read by the wall clock over them, the
    restarts as paid; 4 workers pay 20 % of their rate at each boundary (the script none)."""
    paid = tuple(0.8 if role == "candidate" else 1.0 for role in ROLES)
    run = drifting_run(gain=2.2, drift=1.0, epochs=paid)
    probes = run.records
    assert paired_claim(run, probes[0], probes[1], 0.9).ratio == pytest.approx(2.2 * 0.8)
    part = drifting_run(gain=2.2, drift=1.0, epochs=paid[:6])  # one window did not: as run
    assert paired_claim(part, *part.records[:2], 0.9).ratio == pytest.approx(2.2)


def test_a_drifting_machine_cancels_out_of_the_alternation():
    run = drifting_run(gain=2.2, drift=1.05)
    probes = run.records
    claim = paired_claim(run, probes[0], probes[1], 0.9)
    assert claim.ratio == pytest.approx(2.2)
    assert claim.candidates == 3 and claim.launches == 1
    # the windows agree once the drift is out, but 4 workers ran 3,000 samples/s in one
    # launch and 2,200 at the alternation's start in another: plain launches spread that much
    low, high = claim.interval
    assert low < 2.2 < high and high / low > 1.4
    steady = drifting_run(gain=2.2, drift=1.05, searched=2200.0)
    low, high = paired_claim(steady, *steady.records[:2], 0.9).interval
    assert 2.05 < low < 2.2 < high < 2.35  # launches agree: the least spread, 2.5 % a launch
    rec = recommend(run, Thresholds())
    assert rec.config["num_workers"] == 4
    assert rec.expected_speedup == pytest.approx(2.2)  # not the 3x the two probes read apart
    assert "alternated, 3 of each" in rec.speedup_basis and "one launch" in rec.speedup_basis


def test_noisy_windows_widen_the_interval_around_the_true_gain():
    run = drifting_run(gain=2.2, drift=1.02, noise=(1.0, 1.06, 0.95, 0.97, 1.04, 1.03, 0.98))
    probes = run.records
    claim = paired_claim(run, probes[0], probes[1], 0.9)
    low, high = claim.interval
    assert low < 2.2 < high and high / low > 1.1
    assert abs(claim.ratio / 2.2 - 1) < 0.08


def test_launches_are_an_alternation_too_and_a_failed_one_leaves_no_claim():
    run = drifting_run(gain=2.2, drift=1.05, launches=True)
    probes = run.records
    claim = paired_claim(run, probes[0], probes[1], 0.9)
    assert claim.launches == 7 and claim.ratio == pytest.approx(2.2)
    lines = run.summary["probes"]
    lines[5]["status"] = "crash"  # a run read with one launch failed: a Run of its own
    run = dataclasses.replace(run, summary={**run.summary, "probes": lines})
    assert paired_claim(run, run.records[0], run.records[1], 0.9) is None
    rec = recommend(run, Thresholds())
    assert "not alternated" in rec.speedup_basis  # the unpaired figure, said to be so


def test_an_alternation_of_other_settings_is_not_read():
    run = drifting_run(gain=2.2, drift=1.05)
    probes = run.records
    other = probes[1].amended({"config": {**probes[1].config.to_dict(), "num_workers": 8}})
    assert paired_claim(run, probes[0], other, 0.9) is None


def test_a_gain_the_check_cannot_tell_from_none_keeps_the_scripts_settings():
    """The search measured 4 workers faster, but alternated with the script's own settings
    they ran 1.03x, windows 6 % apart: not established."""
    run = drifting_run(gain=1.03, drift=1.0, noise=(1.0, 1.06, 0.95, 0.97, 1.04, 1.03, 0.98),
                       searched=1400.0)
    rec = recommend(run, Thresholds())
    assert rec.probe_id == "p000" and rec.config["num_workers"] == 0
    assert rec.notes[0].startswith("num_workers=4") and "cannot tell" in rec.notes[0]
    assert "p002-p008" in rec.notes[0]

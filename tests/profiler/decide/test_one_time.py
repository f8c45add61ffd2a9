"""The candidate's one-time start-up that no probe measures (``decide.paired.one_time_start``):
read from the first batches of the alternation's own launches."""

from __future__ import annotations

import pytest

from ddp_profile.profiler.decide.paired import PairedClaim, one_time_start
from ddp_profile.profiler.store.probes import ProbeRecord

ROLES = ("reference", "candidate", "reference", "candidate", "reference")


def launches(firsts: tuple[float, float], launch_each: bool = True) -> list[ProbeRecord]:
    return [ProbeRecord.from_json({
        "id": f"p{i:03d}", "kind": "persistent", "status": "ok", "throughput": 100.0,
        "config": {"num_workers": 1 if role == "candidate" else 0},
        "time_to_first_batch_s": firsts[role == "candidate"] + 0.01 * i,
        "launch": f"p{i:03d}" if launch_each else "p000"}) for i, role in enumerate(ROLES)]


def claim(ratio: float, launches_: int = 5) -> PairedClaim:
    return PairedClaim(ratio=ratio, interval=(ratio - 0.05, ratio + 0.05),
                       probes=tuple(f"p{i:03d}" for i in range(5)), candidates=2,
                       launches=launches_, roles=ROLES)


def test_the_workers_start_up_is_the_difference_of_first_batches_and_its_break_even():
    start = one_time_start(launches((0.1, 2.6)), claim(1.07))
    assert start is not None and start.seconds == pytest.approx(2.5, abs=0.02)
    # 7 % faster saves 0.0654 s of each second the reference trains: 2.5 s take ~38 s
    assert start.break_even_s == pytest.approx(2.5 / (1 - 1 / 1.07), rel=0.01)
    assert "won back after about 38 s of training at 1.07x" in start.words()
    assert one_time_start(launches((0.1, 2.6)), claim(0.95)).break_even_s is None


def test_nothing_is_said_below_the_floor_or_in_windows_of_one_launch():
    assert one_time_start(launches((0.1, 0.2)), claim(1.07)) is None
    assert one_time_start(launches((0.1, 2.6)), claim(1.07, launches_=1)) is None
    assert one_time_start([], claim(1.07)) is None


def whole(firsts: tuple[float, float], short: bool = True) -> list[ProbeRecord]:
    """A B A B A launches that each ran a 2-epoch script to its end (119 of 125 steps, batch
    16, 2 ranks): A at 500 samples/s, B at 2,000 once its workers run."""
    return [ProbeRecord.from_json({
        "id": f"p{i:03d}", "kind": "persistent", "status": "ok",
        "throughput": 2000.0 if role == "candidate" else 500.0,
        "config": {"num_workers": 4 if role == "candidate" else 0, "batch_size": 16},
        "time_to_first_batch_s": firsts[role == "candidate"], "short": short,
        "steps_measured": 119, "warmup": 5, "steps": 125,
        "pair": {"role": role, "index": i, "group": "persistent-001"},
        "per_rank": [{"rank": 0}, {"rank": 1}]}) for i, role in enumerate(ROLES)]


def test_launches_that_ran_the_whole_script_charge_the_start_up_and_say_so():
    """The spawn script's case (2026-12-02): 4 workers kept alive ran 3.2x per epoch, but
    starting them took 11 s of a run that trains for 4 s: plain 2-epoch launches with them
    took 16.8 s against 14.1 s. Read as whole runs, the kept-alive side is the slower."""
    from ddp_profile.profiler.decide.paired import fitted, whole_runs

    probes = whole((0.05, 11.0))
    rates = whole_runs(probes)
    samples = 124 * 16 * 2
    assert rates[0] == pytest.approx(samples / (samples / 500.0 + 0.05))
    assert rates[1] == pytest.approx(samples / (samples / 2000.0 + 11.0))
    claim = fitted(probes, rates, 0.95, lambda fit: 0.02, whole=True)
    assert claim.ratio < 0.7 and not claim.faster
    assert "ran the script to its end and is read as a whole run" in claim.basis()
    assert one_time_start(probes, claim) is None  # charged, not a footnote
    assert whole_runs(whole((0.05, 11.0), short=False)) is None  # steps past the script's
    # end were not asked: its whole run is not in the launch


def test_launches_timed_to_the_scripts_end_are_read_by_the_wall_clock_validation_included():
    """imagenet's main.py validates every epoch with the loader workers its training uses:
    the training steps alone read 2 workers at 1.04x, plain launches 1.11x. Launches that ran
    the script to its end carry its whole run (``script_samples`` over ``script_run_s``,
    validation between the steps included): the claim reads that, as a user's check would."""
    from ddp_profile.profiler.decide.paired import paired, timed_runs, whole_runs

    probes = []
    for i, role in enumerate(ROLES):
        line = whole((0.1, 0.3))[i].to_json()
        line.update(throughput=1040.0 if role == "candidate" else 1000.0,
                    script_samples=2048, script_run_s=(70.0 / 1.11 if role == "candidate"
                                                       else 70.0) * (1.0 + 0.002 * i),
                    launch=f"p{i:03d}", kind="paired")
        probes.append(ProbeRecord.from_json(line))
    assert timed_runs(probes)
    assert whole_runs(probes)[0] == pytest.approx(2048 / 70.0)
    claim = paired(probes, probes, 0.95, 0.02)
    assert claim.ratio == pytest.approx(1.11, abs=0.01) and claim.whole_runs and claim.timed
    assert "by the wall clock from its first batch to its end" in claim.basis()
    # one launch short of its end (the harness stopped it): the steps as measured, 1.04x
    stopped = [ProbeRecord.from_json({**p.to_json(), "script_run_s": None}) if i == 2 else p
               for i, p in enumerate(probes)]
    assert not timed_runs(stopped)
    assert paired(stopped, stopped, 0.95, 0.02).ratio == pytest.approx(1.04, abs=0.01)

"""What restarting workers cost over the script's whole run (``decide.worker_restarts.kept_alive``)
and where a launch counts that run (``store.probedir.whole_run``)."""

from __future__ import annotations

import pytest

from ddp_profile.profiler.decide.worker_restarts import kept_alive, run_steps
from ddp_profile.profiler.settings import LoaderSettings, Mode, warmup_room, window_warmup
from ddp_profile.profiler.store.probedir import RankData, whole_run
from ddp_profile.profiler.store.probes import ProbeRecord


def record(probe_id: str, throughput: float, **line) -> ProbeRecord:
    return ProbeRecord.from_json({"id": probe_id, "kind": "sweep", "status": "ok",
                                  "config": {"num_workers": 1, "batch_size": 16},
                                  "throughput": throughput, **line})


RESTARTING = {"epoch_restart_s": 4.0, "epoch_steps": 62, "steady_throughput": 800.0}


def test_a_start_that_a_run_this_short_cannot_win_back_loses():
    base = record("b", 750.0, script_samples=4000)
    found = kept_alive([base], record("w1", 300.0, **RESTARTING), base)
    assert found is not None and found.probe == "b"
    assert found.script_s == pytest.approx(4000 / 750)
    assert found.kept_s == pytest.approx(4.0 + 4000 / 800)
    assert found.loses
    # saved: 1 - 750/800 of each second trained; won back after 4 s / 0.0625 = 64 s
    assert found.break_even_s == pytest.approx(64.0)


def test_a_long_run_wins_the_start_back_and_a_start_near_the_saving_is_not_condemned():
    base = record("b", 750.0, script_samples=4_000_000)
    assert not kept_alive([base], record("w1", 300.0, **RESTARTING), base).loses
    # saves 5.33 - 5.0 = 0.33 s; a start of 0.5 s loses as measured, but not at half of it
    close = {**RESTARTING, "epoch_restart_s": 0.5}
    base = record("b", 750.0, script_samples=4000)
    found = kept_alive([base], record("w1", 300.0, **close), base)
    assert found.kept_s > found.script_s and not found.loses


def test_nothing_is_predicted_without_a_launch_that_ran_the_script_to_its_end():
    base = record("b", 750.0)
    assert kept_alive([base], record("w1", 300.0, **RESTARTING), base) is None
    crashed = record("c", 750.0, script_samples=4000, status="crash")
    assert kept_alive([base, crashed], record("w1", 300.0, **RESTARTING), base) is None
    assert kept_alive([record("b", 750.0, script_samples=4000)], record("w1", 300.0),
                      base) is None  # no restart measured


def rank(number: int, reason: str, steps: int = 3, end_s: float = 10.0) -> RankData:
    data = RankData(rank=number, end={"kind": "end", "reason": reason, "t_ns": int(end_s * 1e9),
                                      "training_loader_id": 0})
    data.steps = [{"kind": "step", "loader_id": 0, "step": i, "samples": 16,
                   "t_ns": int((1 + i) * 1e9)} for i in range(steps)]
    return data


def test_the_whole_run_is_counted_only_where_every_rank_ran_the_script_to_its_end():
    """Samples: every rank's; seconds: from a rank's first batch asked for (1 s) to its end,
    the slowest rank's (rank 1 ends at 12 s: 11 s), whatever ran between its steps."""
    assert whole_run([rank(0, "script_exit"), rank(1, "script_exit", 4, end_s=12.0)]) == \
        (16 * 7, 11.0)
    assert whole_run([rank(0, "script_exit"), rank(1, "steps_done")]) is None
    assert whole_run([rank(0, "script_exit"), RankData(rank=1)]) is None
    assert whole_run([rank(0, "script_exit", steps=0)]) is None
    assert whole_run([]) is None


def test_a_script_without_a_process_group_is_its_one_processs_whole_run():
    """One process and no process group (``--launcher none``, a single-GPU script): its file
    has no rank, and its run to the script's end is the whole run; beside ranks (a spawning
    parent), an unranked file is not."""
    assert whole_run([rank(-1, "script_exit")]) == (16 * 3, 9.0)
    assert whole_run([rank(-1, "steps_done")]) is None
    parent = RankData(rank=-1, end={"kind": "end", "reason": "script_exit", "t_ns": 99 * 10 ** 9})
    assert whole_run([parent, rank(0, "script_exit")]) == (16 * 3, 9.0)


def test_a_short_scripts_run_bounds_the_warm_up_of_every_launch_after_it():
    """timm's ``train.py``, 2 epochs of 20 steps on one GPU: 15 workers at prefetch 4 drain 60
    prefetched batches, longer than the whole run. Once a launch ran the script to its end,
    a warm-up leaves half the run (``--steps`` at most) to measure."""
    two_ranks = [{"rank": 0}, {"rank": 1}]
    stopped = record("b", 750.0, per_rank=two_ranks)  # stopped after its steps: no run known
    assert run_steps([stopped], 32) is None and warmup_room(None, 30) is None
    ended = record("w", 900.0, per_rank=two_ranks, script_samples=2560)  # 2 ranks x 32 x 40
    assert run_steps([stopped, ended], 32) == 40
    assert run_steps([stopped, ended], 64) == 20  # a larger batch ends the run sooner
    assert run_steps([stopped, ended], None) == 80  # the script's own, the baseline's (16)
    room = warmup_room(run_steps([stopped, ended], 32), 30)
    assert room == 20  # 40 steps: 20 of warm-up at most, 20 measured
    assert warmup_room(400, 30) == 370  # a long run: --steps measured, the drain whole
    assert warmup_room(1, 30) == 1
    fifteen = LoaderSettings(15, False, 4, 32)
    assert window_warmup(5, fifteen, Mode.NORMAL) == 60  # the drain, no run known
    assert window_warmup(5, fifteen, Mode.NORMAL, room) == 20
    assert window_warmup(5, LoaderSettings(2, False, 2, 32), Mode.NORMAL, room) == 5
    assert window_warmup(5, fifteen, Mode.CEILING, room) == 5  # its cache fill, not a drain

"""A configuration's throughput as the script runs it, wherever its epoch restarts fall."""

from __future__ import annotations

import pytest

from ddp_profile.profiler.store.epochs import epoch_steps, rank_step_stats

EPOCH = 20  # steps per epoch: 320 samples per rank at batch 16
STEP_S = 0.01  # a steady step: 4 ms waiting, 6 ms computing
RESTART_S = 2.0  # starting the workers again: the loop waits this long, then takes the stock


def loader(workers: int = 2, persistent: bool = False, epoch_samples=320) -> dict:
    return {"own": {"persistent_workers": persistent, "epoch_samples": epoch_samples,
                    "batch_size": 16, "drop_last": False},
            "applied": {"num_workers": workers, "prefetch_factor": 2, "batch_size": 16}}


def steps(count: int, warmup: int, first_epoch_done: int = 0, workers: int = 2) -> list[dict]:
    """``count`` steps of a loader whose epoch is ``EPOCH`` steps; the first epoch began
    ``first_epoch_done`` steps before the first record. Each epoch starts by waiting
    ``RESTART_S``; its first ``workers x 2`` steps then take the stock without waiting."""
    records = []
    for index in range(count):
        in_epoch = (index + first_epoch_done) % EPOCH
        start = index == 0 or in_epoch == 0
        wait = RESTART_S if start else (0.0 if in_epoch <= workers * 2 else 0.004)
        record = {"step": index, "measured": index >= warmup, "data_wait_s": wait,
                  "compute_s": 0.006, "other_s": 0.0, "samples": 16}
        if start:
            record["loader_start"] = True
        records.append(record)
    return records


def as_run() -> float:
    """What one epoch of this loader runs at: its steps, the stock, and one restart."""
    epoch_s = RESTART_S + (EPOCH - 1) * 0.006 + (EPOCH - 1 - 4) * 0.004 + 0.006
    return EPOCH * 16 / epoch_s


def test_a_window_with_a_restart_and_one_without_read_the_epoch_as_run():
    # the same configuration measured twice: once the window holds the next epoch's restart,
    # once it ends before it; both windows hold their own iterator's start in the warm-up
    with_restart = rank_step_stats(steps(36, warmup=6), loader())
    without = rank_step_stats(steps(18, warmup=6), loader())
    for stats in (with_restart, without):
        assert stats["throughput"] == pytest.approx(as_run(), rel=0.05)
        assert stats["restart_s"] == pytest.approx(RESTART_S - 4 * 0.004, rel=0.02)
        assert stats["epoch_steps"] == EPOCH
        assert stats["steady_throughput"] == pytest.approx(16 / STEP_S, rel=0.01)
    # read as they came, the two windows of one configuration disagree fivefold: one pays a
    # restart per 30 steps (the script pays one per 20), the other none at all
    plain = [rank_step_stats(steps(count, warmup=6))["throughput"] for count in (36, 18)]
    assert plain[0] > 1.3 * as_run() and plain[1] > 5 * plain[0]


def test_workers_that_stay_alive_are_read_as_they_came():
    stats = rank_step_stats(steps(36, warmup=6), loader(persistent=True))
    assert stats["restart_s"] is None and stats["steady_throughput"] is None
    measured = steps(36, warmup=6)[6:]
    elapsed = sum(s["data_wait_s"] + s["compute_s"] for s in measured)
    assert stats["throughput"] == pytest.approx(16 * len(measured) / elapsed)


@pytest.mark.parametrize("facts", [loader(workers=0), loader(epoch_samples=None), None])
def test_no_restart_model_without_workers_or_a_known_epoch(facts):
    assert rank_step_stats(steps(36, warmup=6), facts)["restart_s"] is None


def test_the_epoch_length_follows_the_probed_batch_size_and_drop_last():
    facts = loader()
    facts["applied"]["batch_size"] = 48
    assert epoch_steps(facts) == 7  # 320 / 48, the last batch short
    facts["own"]["drop_last"] = True
    assert epoch_steps(facts) == 6


def timed(records: list[dict], shutdown_s: float = 0.0) -> list[dict]:
    """The records with their start times by the wall clock; each epoch's end also costs
    ``shutdown_s`` that no step's parts hold (the old workers shut down between steps)."""
    t = 0.0
    for record in records:
        if record.get("loader_start") and record["step"] > 0:
            t += shutdown_s
        record["t_ns"] = int(t * 1e9)
        t += record["data_wait_s"] + record["compute_s"] + record["other_s"]
    return records


def test_whole_epochs_are_timed_by_the_wall_clock_boundaries_and_all():
    from ddp_profile.profiler.store.epochs import whole_epochs

    # 50 measured steps from step 5: two whole epochs (40 steps), each with one restart and
    # one shutdown, whichever step the window starts at
    records = timed(steps(56, warmup=5), shutdown_s=0.5)
    samples, seconds = whole_epochs(records, loader())
    epoch_s = (RESTART_S + 0.5) + (EPOCH - 1) * 0.006 + (EPOCH - 1 - 4) * 0.004 + 0.006
    assert samples == 2 * EPOCH * 16 and seconds == pytest.approx(2 * epoch_s, rel=1e-6)
    # the steps' parts alone miss the shutdown; the wall clock does not
    assert samples / seconds < rank_step_stats(records, loader())["throughput"]
    # persistent workers: an epoch length all the same, from the loader's own sampler
    assert whole_epochs(timed(steps(56, warmup=5)), loader(persistent=True)) is not None
    assert whole_epochs(records[:20], loader()) is None  # less than an epoch measured
    gap = [r for r in records if r["step"] != 30]
    assert whole_epochs(gap, loader()) is None
    assert whole_epochs(records, loader(epoch_samples=None)) is None

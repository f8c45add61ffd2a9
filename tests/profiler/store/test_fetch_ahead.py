"""A loop that fetches each batch one call ahead of training on it (accelerate's prepared
loader): its steps are read as the loop trains, not as the loader hands
out batches."""

from __future__ import annotations

import pytest

from ddp_profile.profiler.rank.stepclock import runq_sampled
from ddp_profile.profiler.store.epochs import rank_step_stats
from ddp_profile.profiler.store.probedir import RankData, fetches_ahead, fold_fetch_ahead, whole_run

TRAIN_S = 0.5  # training one batch of 64
WAIT_S = 0.01


def run(epochs: int, batches: int, ahead: bool = True, warmup: int = 2) -> RankData:
    """One rank's training steps: each ``__next__`` to the next is a step. Fetching ahead, an
    iterator's first step holds no training (the wrapper asks for the second batch at once),
    and the epoch's last batch trains after the call that ends it, in no step."""
    steps, number, t_ns, forwards = [], 0, 0, 0
    for _ in range(epochs):
        for index in range(batches):
            trains = not (ahead and index == 0)
            step = {"kind": "step", "loader_id": 0, "step": number, "t_ns": t_ns,
                    "measured": number >= warmup, "data_wait_s": WAIT_S,
                    "compute_s": TRAIN_S if trains else 0.002, "other_s": 0.0,
                    "forward_s": 0.2 if trains else None, "samples": 64,
                    "ddp_n": [forwards], "syncs": int(trains), "opt_steps": int(trains)}
            forwards += trains
            if index == 0:
                step.update(loader_start=True, iter_start_s=0.3)
            steps.append(step)
            number += 1
            t_ns += int((WAIT_S + step["compute_s"]) * 1e9)
        if ahead:
            forwards += 1  # the epoch's last batch, trained after the loader ran out
            t_ns += int(TRAIN_S * 1e9)
    end = {"kind": "end", "reason": "script_exit", "t_ns": t_ns, "training_loader_id": 0}
    return RankData(rank=0, steps=steps, end=end)


def test_a_short_epoch_read_as_it_came_counts_a_batch_with_no_time():
    unfolded = rank_step_stats(run(6, 4).steps)
    assert unfolded["throughput"] == pytest.approx(4 / 3 * 64 / (TRAIN_S + WAIT_S), rel=0.05)


def test_each_iterators_first_step_joins_the_next_and_the_rate_is_the_loops():
    data = run(6, 4)
    fold_fetch_ahead(data)
    stats = rank_step_stats(data.steps)
    # 3 trained batches an epoch: each step one batch trained, its wait and the fetch ahead
    assert len(data.steps) == 18 and stats["throughput"] == pytest.approx(
        64 / (TRAIN_S + WAIT_S), rel=0.02)
    starts = [s for s in data.steps if s.get("loader_start")]
    assert [s["step"] for s in starts] == [1, 5, 9, 13, 17, 21]
    assert all(s["fetched_ahead"] == 64 and s["data_wait_s"] == pytest.approx(2 * WAIT_S)
               and s["iter_start_s"] == pytest.approx(0.3 + WAIT_S) for s in starts)
    assert starts[0]["t_ns"] == 0  # the epoch's steps start where its first call did
    # the whole run still counts every batch the script took, from its first call to its end
    samples, seconds = whole_run([data])
    assert samples == 6 * 4 * 64
    assert seconds == pytest.approx(6 * (4 * WAIT_S + 0.002 + 4 * TRAIN_S), rel=0.01)


def test_a_loop_that_trains_on_each_batch_as_it_comes_is_left_as_it_came():
    data = run(6, 4, ahead=False)
    before = [dict(s) for s in data.steps]
    assert not fetches_ahead(data.steps)
    fold_fetch_ahead(data)
    assert data.steps == before
    assert rank_step_stats(data.steps)["throughput"] == pytest.approx(
        64 / (TRAIN_S + WAIT_S), rel=0.02)


def test_epochs_of_one_batch_are_not_timed_in_steps_but_counted_in_the_whole_run():
    # read as it came, a 1-batch epoch read hundreds of times its speed (451.8 samples/s
    # against 8.6 for accelerate's cv_example.py at batch 256 on 512 images)
    data = run(6, 1)
    assert rank_step_stats(data.steps)["throughput"] > 20 * 64 / TRAIN_S
    assert fetches_ahead(data.steps)  # DDP's forwards moved between the steps
    fold_fetch_ahead(data)
    assert all(s["ahead"] and not s["measured"] for s in data.steps)
    assert rank_step_stats(data.steps)["steps"] == 0
    assert whole_run([data])[0] == 6 * 64


def test_a_loop_with_no_training_seen_is_not_taken_for_one_that_fetches_ahead():
    data = run(6, 1)
    for step in data.steps:
        step["ddp_n"] = [0]  # nothing says the loop trained outside its steps
    assert not fetches_ahead(data.steps)


def test_a_folded_step_has_the_run_queue_time_of_both_its_parts_or_none():
    """The run queue is read on a sample of the steps (``stepclock.runq_sampled``): a folded
    step carries the sum where both its parts carry theirs, else none (not a part's alone)."""
    data = run(6, 4)
    for step in data.steps:  # each epoch's first step is 4k: sampled, its next one not
        if runq_sampled(step["step"]):
            step["runq_s"] = 0.001 * (1 + step["step"])
    data.steps[4 + 1]["runq_s"] = 0.5  # the second epoch's second step read too
    fold_fetch_ahead(data)
    starts = [s for s in data.steps if s.get("loader_start")]
    assert starts[1]["step"] == 5 and starts[1]["runq_s"] == pytest.approx(0.005 + 0.5)
    assert [s["step"] for s in starts if "runq_s" in s] == [1, 5]  # steps 0 and 1 sampled
    assert all("runq_s" not in s for s in starts[2:])
    assert [s["step"] for s in data.steps if "runq_s" in s and not s.get("loader_start")] \
        == [k for k in range(24) if runq_sampled(k) and k % 4 > 1] == [2, 3]

"""The timing split, with an injected clock; the rows the loop keeps, written where the
rank's records are flushed."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ddp_profile.profiler.rank import loaders
from ddp_profile.profiler.rank.loading.clocks import RunQueueClock
from ddp_profile.profiler.rank.loading.sampling import is_metered
from ddp_profile.profiler.rank.stepclock import (
    RUNQ_EVERY,
    RUNQ_FIRST,
    StepClock,
    encode_step,
    runq_sampled,
    step_record,
)
from ddp_profile.profiler.store.record import RankRecorder
from tests.profiler.rank.test_loadcost import patched


class FakeClock:
    def __init__(self) -> None:
        self.now_ns = 1_000

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, ms: float) -> None:
        self.now_ns += int(ms * 1e6)


@pytest.fixture
def clock():
    return FakeClock()


def closing(step_clock: StepClock):
    """The record of the step a ``__next__`` call closes (None where none was open), as the
    rank's file gets it: the row the loop keeps, encoded."""
    row = step_clock.next_called()
    return None if row is None else step_record(row)


def make(clock: FakeClock, warmup: int = 1) -> StepClock:
    return StepClock(loader_id=3, warmup=warmup, clock=clock, wall=lambda: 5_000_000_000)


def one_step(step_clock: StepClock, clock: FakeClock, wait: float, forward: float,
             backward: float, other: float, optimizer: bool = True):
    record = closing(step_clock)
    clock.advance(wait)
    step_clock.batch_returned(samples=32)
    clock.advance(forward)
    step_clock.backward_called()
    clock.advance(backward)
    if optimizer:
        step_clock.optimizer_stepped()
    clock.advance(other)
    return record


def test_split_into_data_wait_compute_other(clock):
    steps = make(clock)
    assert one_step(steps, clock, wait=10, forward=4, backward=6, other=3) is None
    first = one_step(steps, clock, wait=20, forward=5, backward=5, other=1)
    assert first["data_wait_s"] == pytest.approx(0.010)
    assert first["compute_s"] == pytest.approx(0.010)
    assert first["forward_s"] == pytest.approx(0.004)
    assert first["other_s"] == pytest.approx(0.003)
    assert first["samples"] == 32 and first["loader_id"] == 3
    assert first["step"] == 0 and first["measured"] is False  # warm-up
    second = closing(steps)
    assert second["step"] == 1 and second["measured"] is True
    assert second["data_wait_s"] == pytest.approx(0.020)
    # wall time of the step start: the injected wall clock's offset plus the monotonic clock
    assert second["t_ns"] - first["t_ns"] == pytest.approx((10 + 4 + 6 + 3) * 1e6)


def test_without_optimizer_everything_after_the_batch_is_compute(clock):
    steps = make(clock, warmup=0)
    one_step(steps, clock, wait=2, forward=3, backward=4, other=5, optimizer=False)
    record = closing(steps)
    assert record["compute_s"] == pytest.approx(0.012) and record["other_s"] == 0


def test_last_optimizer_step_ends_compute(clock):
    steps = make(clock, warmup=0)
    closing(steps)
    steps.batch_returned(8)
    clock.advance(5)
    steps.optimizer_stepped()
    clock.advance(5)
    steps.optimizer_stepped()  # e.g. two optimizers
    clock.advance(2)
    record = closing(steps)
    assert record["compute_s"] == pytest.approx(0.010) and record["other_s"] == pytest.approx(0.002)
    assert record["forward_s"] is None


def test_exhausted_iterator_is_no_step(clock):
    steps = make(clock, warmup=0)
    one_step(steps, clock, 1, 1, 1, 1)
    closed = closing(steps)
    steps.exhausted()  # StopIteration: the epoch ended
    clock.advance(50)  # e.g. set_epoch, a validation pass
    assert closing(steps) is None  # nothing open: the wait above counts for no step
    clock.advance(7)
    steps.batch_returned(8)
    clock.advance(1)
    record = closing(steps)
    assert closed["step"] == 0 and record["step"] == 1
    assert record["data_wait_s"] == pytest.approx(0.007)


def test_events_outside_a_step_are_ignored(clock):
    steps = make(clock, warmup=0)
    steps.backward_called()
    steps.optimizer_stepped()
    assert not steps.in_step
    assert closing(steps) is None


def test_a_step_that_starts_a_new_pass_over_the_loader_is_flagged_and_measured(clock):
    """The new epoch's start-up wait is the loop's to pay; the stock the workers made while
    it waited then comes without waiting: measured together, they give the rate the loader
    keeps. Leaving the start out would keep only the stock's fast steps."""
    step_clock = make(clock, warmup=0)
    one_step(step_clock, clock, wait=1, forward=1, backward=1, other=0)
    closing(step_clock)
    clock.advance(150)  # a new epoch: the workers start again
    step_clock.batch_returned(samples=32)
    step_clock.loader_started(0.2)  # making the iterator took 50 ms before the wait began
    clock.advance(2)
    restarted = closing(step_clock)
    assert restarted["loader_start"] and restarted["measured"]
    assert restarted["data_wait_s"] == pytest.approx(0.150)
    assert restarted["iter_start_s"] == 0.2
    clock.advance(1)
    step_clock.batch_returned(samples=32)
    clock.advance(2)
    after = closing(step_clock)
    assert after["measured"] and "loader_start" not in after and "iter_start_s" not in after
    assert step_clock.measured_steps == 3


def test_each_step_carries_the_time_its_thread_sat_runnable_without_a_cpu(clock):
    counter = iter([100, 2_000_100, 2_500_100, None, 9_000_000])
    steps = StepClock(loader_id=0, warmup=0, clock=clock, runq=lambda: next(counter))
    assert one_step(steps, clock, wait=1, forward=1, backward=1, other=1) is None
    first = one_step(steps, clock, wait=1, forward=1, backward=1, other=1)
    assert first["runq_s"] == pytest.approx(0.002)  # between the two __next__ calls
    second = one_step(steps, clock, wait=1, forward=1, backward=1, other=1)
    assert second["runq_s"] == pytest.approx(0.0005)
    unread = one_step(steps, clock, wait=1, forward=1, backward=1, other=1)
    assert "runq_s" not in unread  # the counter could not be read: unknown, not 0
    assert "runq_s" not in one_step(steps, clock, wait=1, forward=1, backward=1, other=1)


def test_a_screens_window_its_communication_and_the_rank_are_written_with_the_step(clock):
    steps = make(clock, warmup=0)
    one_step(steps, clock, wait=1, forward=1, backward=1, other=1)
    row = steps.next_called()
    record = step_record(row, label=(2, False), extra={"ddp_n": [3], "coll_s": 0.5}, rank=1)
    assert record["window"] == 2 and record["measured"] is False  # the window's warm-up
    assert record["ddp_n"] == [3] and record["coll_s"] == 0.5 and record["rank"] == 1
    assert step_record(row)["measured"] is True and "window" not in step_record(row)
    assert step_record(row)["rank"] is None  # before the rank is known


def test_queued_rows_are_written_at_the_flush_in_order_with_the_rank_known_then(tmp_path):
    rank = [None]
    recorder = RankRecorder(str(tmp_path), lambda: rank[0])
    clock = FakeClock()
    steps = make(clock, warmup=0)
    one_step(steps, clock, wait=1, forward=1, backward=1, other=1)
    recorder.write({"kind": "event", "name": "before"})
    recorder.defer((encode_step, steps.next_called(), None, None))
    recorder.defer((lambda row, rank: 1 / 0, "a row its encoder fails on"))
    recorder.write_line('{"kind":"event","name":"after"}')
    assert recorder.pending == 4 and not os.listdir(tmp_path)  # nothing written before it
    rank[0] = 3  # the process group came up before the flush
    recorder.close()
    records = [json.loads(line) for line in open(tmp_path / "rank-3.jsonl")]
    assert [r["kind"] for r in records] == ["event", "step", "unencoded", "event"]
    assert records[1]["rank"] == 3 and records[1]["data_wait_s"] == pytest.approx(0.001)
    assert "ZeroDivisionError" in records[2]["error"] and records[3]["name"] == "after"


def test_an_epochs_steps_are_on_disk_when_its_loader_is_exhausted(tmp_path):
    """A script that fails between epochs (validation, a checkpoint) and is killed there keeps
    the epoch's steps: the rank flushes when an iterator ends."""
    with patched(tmp_path) as instr:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for (x,) in DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=4):
            model(x).sum().backward()
            opt.step()
        records = [json.loads(line) for line in open(instr.recorder.path)]
    steps = [r for r in records if r["kind"] == "step"]
    assert [s["step"] for s in steps] == list(range(6))  # the ending __next__ closed the last
    assert all(s["samples"] == 4 and s["compute_s"] > 0 and s["forward_s"] > 0
               and s["other_s"] >= 0 and s["data_wait_s"] > 0
               and ("runq_s" in s) == runq_sampled(s["step"]) for s in steps), steps
    batches = [r for r in records if r["kind"] == "batch_cost"]
    assert len(batches) == 6 and all(b["samples"] == 4 and b["wall_s"] > 0 for b in batches)


def test_what_another_thread_queues_during_a_flush_waits_for_the_next_in_order(tmp_path):
    """Queuing takes no lock: an item queued while a flush encodes (here by the encoder of
    the row before it, as a sampler's thread could) is not lost with the flushed ones."""
    recorder = RankRecorder(str(tmp_path), lambda: 0)

    def encoder(row, rank):
        recorder.write_line('{"kind":"event","name":"meanwhile"}')
        return '{"kind":"event","name":"%s"}' % row[1]

    recorder.defer((encoder, "first"))
    recorder.write_line('{"kind":"event","name":"second"}')
    recorder.flush()
    assert recorder.pending == 1
    recorder.close()
    names = [json.loads(line)["name"] for line in open(tmp_path / "rank-0.jsonl")]
    assert names == ["first", "second", "meanwhile"]


def test_a_steps_line_is_the_same_record_whether_it_is_written_whole_or_in_parts(clock):
    """The common step (its forward and run queue timed, nothing added) is written in one
    format; a step with more (a window, communication, a loader's start) has the same fields
    with its additions."""
    readings = iter([b"10 100 1\n", b"10 2100 2\n", b"10 2600 3\n"])
    steps = StepClock(loader_id=0, warmup=0, clock=clock, runq=lambda: next(readings))
    assert one_step(steps, clock, wait=1, forward=1, backward=1, other=1) is None
    row = steps.next_called()
    plain = json.loads(encode_step((encode_step, row, None, None), 0))
    assert plain["runq_s"] == pytest.approx(2e-6) and plain["forward_s"] == pytest.approx(1e-3)
    assert plain["compute_s"] == pytest.approx(2e-3) and plain["rank"] == 0
    labelled = json.loads(encode_step((encode_step, row, (2, False), {"coll_n": 1}), 0))
    assert labelled == {**plain, "window": 2, "measured": False, "coll_n": 1}
    unread = row[:10] + (b"torn",) + row[11:]
    assert json.loads(encode_step((encode_step, unread, None, None), 0)) == \
        {k: v for k, v in plain.items() if k != "runq_s"}


@pytest.mark.parametrize("ns", [0, 1, 9, 999_999, 123_456_789, 999_999_999,
                                (1 << 29) - 1, 1 << 29, 1_000_000_000, 3_141_592_653])
def test_a_steps_times_written_from_nanoseconds_are_the_text_of_their_seconds(ns):
    """Every time of a step under ``clocks.SHORT_NS`` is written from its nanoseconds; the line
    is the one the seconds' ``%.9f`` make (a raw run-queue reading takes that path)."""
    row = (5_000_000_000, 0, 7, True, ns, ns + 1, ns, ns + 2, 4, 1_000, 1_000 + ns, False, None)
    raw = row[:9] + (b"0 1000 1\n", b"0 %d 2\n" % (1_000 + ns)) + row[11:]
    line = encode_step((encode_step, row, None, None), 0)
    assert line == encode_step((encode_step, raw, None, None), 0)
    record = json.loads(line)
    assert record["data_wait_s"] == ns / 1e9 and record["runq_s"] == ns / 1e9
    assert record["compute_s"] == (ns + 1) / 1e9 and record["forward_s"] == (ns + 2) / 1e9


class Counter:
    """A run-queue counter that counts its reads: each a millisecond on from the last."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.reads * 1_000_000


def test_the_run_queue_is_read_at_the_boundaries_of_the_same_sample_of_steps_on_every_rank(
        clock):
    """The first RUNQ_FIRST measured steps are sampled and every k with k % RUNQ_EVERY == 0,
    whatever the rank: the straggler rule compares ranks step by step. Only a sampled step's
    two boundaries read."""
    warmup = 5
    sampled = [k for k in range(40) if runq_sampled(k, warmup)]
    assert sampled[:2] == [0, 4] and RUNQ_EVERY > 1
    assert sampled[2:2 + RUNQ_FIRST] == list(range(warmup, warmup + RUNQ_FIRST))
    assert [k for k in sampled if k >= warmup + RUNQ_FIRST] == \
        list(range(-(-(warmup + RUNQ_FIRST) // RUNQ_EVERY) * RUNQ_EVERY, 40, RUNQ_EVERY))
    by_rank = []
    for _rank in range(3):  # each rank's clock, with its own counter
        counter = Counter()
        steps = StepClock(loader_id=0, warmup=warmup, clock=clock, runq=counter)
        records, reads = [], []
        for _ in range(41):
            before = counter.reads
            record = one_step(steps, clock, wait=1, forward=1, backward=1, other=1)
            reads.append(counter.reads - before)
            if record is not None:
                records.append(record)
        by_rank.append([r["step"] for r in records if "runq_s" in r])
        # a boundary reads once where it starts or ends a sampled step, else not at all
        assert reads == [int(runq_sampled(k, warmup) or (k > 0 and runq_sampled(k - 1, warmup)))
                         for k in range(41)]
        assert sum(reads) < 41 * 3 / 4  # most boundaries read nothing
    assert by_rank[0] == by_rank[1] == by_rank[2] == sampled


def test_an_unsampled_steps_record_has_no_runq_and_a_sampled_ones_is_its_boundaries(clock):
    """A sampled step's runq_s is the difference of the readings at its two boundaries; an
    unsampled one's row carries no reading, and its record is the sampled one's less runq_s
    (written whole in one format too, long or short)."""
    counter = Counter()
    steps = StepClock(loader_id=0, warmup=0, clock=clock, runq=counter)
    rows = [steps.next_called()]
    for _ in range(3 * RUNQ_EVERY + RUNQ_FIRST):
        clock.advance(1)
        steps.batch_returned(samples=8)
        clock.advance(2)
        steps.backward_called()
        clock.advance(3)
        steps.optimizer_stepped()
        clock.advance(4)
        rows.append(steps.next_called())
    rows = rows[1:]
    for row in rows:
        sampled = runq_sampled(row[2])
        assert (row[9] is not None, row[10] is not None) == (sampled, sampled), row
        record = step_record(row)
        if sampled:  # one millisecond a read, and the boundaries' readings differ by one read
            assert record["runq_s"] == pytest.approx(0.001) and row[10] - row[9] == 1_000_000
        else:
            assert "runq_s" not in record
            read = row[:9] + (1_000, 3_000) + row[11:]
            assert step_record(read) == {**record, "runq_s": 2e-6}
        slow = row[:4] + (2_000_000_000,) + row[5:]  # a long wait: floats formatted
        assert json.loads(encode_step((encode_step, slow, None, None), 1)) == \
            {**record, "data_wait_s": 2.0, "rank": 1}
    unsampled = [r for r in rows if not runq_sampled(r[2])]
    assert unsampled and all(step_record(r)["data_wait_s"] == pytest.approx(0.001)
                             and step_record(r)["forward_s"] == pytest.approx(0.002)
                             for r in unsampled)


def test_a_boundary_that_read_nothing_leaves_no_reading_a_later_step_could_take(clock):
    """``runq_now`` (what the loop's fetch takes as its start) is the last ``__next__``'s own
    reading or None, never an earlier boundary's; an ended iterator's is no step's start."""
    counter = Counter()
    steps = StepClock(loader_id=0, warmup=0, clock=clock, runq=counter)
    for k in range(3 * RUNQ_EVERY + RUNQ_FIRST):
        before = counter.reads
        one_step(steps, clock, wait=1, forward=1, backward=1, other=1)
        if counter.reads == before:
            assert steps.runq_now is None, k
        else:
            assert steps.runq_now == counter.reads * 1_000_000
    steps.next_called()
    steps.exhausted()
    assert steps.runq_now is None


def test_the_loops_own_fetch_starts_from_its_own_boundarys_reading_or_reads_its_own(
        tmp_path, monkeypatch):
    """A real loop (``num_workers=0``): the loading meter's fetch takes its start from the
    ``__next__`` that fetches it where that boundary read the run queue, else reads its own;
    never a reading of an earlier boundary. The loop's counter is the real one less a second
    per read so far, so a fetch's runq_s says which reading started it (about ``n`` seconds:
    the ``n``-th), under half a second where it read its own."""
    real, reads = RunQueueClock(), [0]
    assert real() is not None, "no /proc/thread-self/schedstat here"

    def counted() -> int:
        reads[0] += 1
        return real() - reads[0] * 1_000_000_000
    monkeypatch.setattr(loaders, "RUNQ", counted)
    started = []  # per fetch: the number of the reading its boundary took, or 0
    with patched(tmp_path) as instr:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(TensorDataset(torch.randn(160, 4)), batch_size=4)
        batches = iter(loader)
        while True:
            before = reads[0]
            try:
                (x,) = next(batches)
            except StopIteration:
                break
            started.append(reads[0] if reads[0] > before else 0)
            model(x).sum().backward()
            opt.step()
        records = [json.loads(line) for line in open(instr.recorder.path)]
    assert len(started) == 40 and 0 in started and sorted(set(started))[1] > 0
    metered = [n for n in range(40) if is_metered(n, None)]
    batches = [r for r in records if r["kind"] == "batch_cost"]
    assert len(batches) == len(metered)
    taken = [round(b["runq_s"]) for b in batches]
    # each fetch is started by its own boundary's reading (a flush between may leave it to
    # read its own: 0), never another's
    assert all(t in (0, started[n]) for n, t in zip(metered, taken)), (taken, started)
    assert sum(t > 0 for t in taken) >= 3 and 0 in taken  # both kinds were seen


def test_a_step_boundary_flushes_the_queued_rows_once_the_flush_is_due(tmp_path):
    """The flush's due time is read against the boundary's own clock reading: rows wait while
    it is ahead, and the first boundary past it writes them."""
    def on_disk() -> int:
        if instr.recorder.path is None or not os.path.exists(instr.recorder.path):
            return 0
        return sum('"kind":"step"' in line for line in open(instr.recorder.path))
    with patched(tmp_path) as instr:
        batches = iter(DataLoader(TensorDataset(torch.randn(40, 4)), batch_size=4))
        next(batches)
        instr._flush_due = time.perf_counter_ns() + 3_600 * 10 ** 9  # an hour on
        for _ in range(4):
            next(batches)
        assert on_disk() == 0 and instr.recorder.pending >= 4
        instr._flush_due = time.perf_counter_ns() - 1  # due
        next(batches)
        assert on_disk() == 5 and instr._flush_due > time.perf_counter_ns()
        next(batches)
        assert on_disk() == 5  # the next one due half a second on

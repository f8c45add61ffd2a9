"""GPU-side step timing through a twin of CUDA timing events (same methods as torch.cuda.Event)."""

from __future__ import annotations

import pytest

from ddp_profile.profiler.rank.gpu_steps import GpuStepTimer


class FakeGpu:
    """A GPU timeline: recorded events complete when the GPU reaches them."""

    def __init__(self) -> None:
        self.now_ms = 0.0  # how far the GPU has worked
        self.queued_until_ms = 0.0  # where the next recorded event lands
        self.synchronised = 0

    def enqueue(self, work_ms: float) -> None:
        self.queued_until_ms = max(self.queued_until_ms, self.now_ms) + work_ms

    def event(self) -> "FakeEvent":
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu, self.at_ms = gpu, None

    def record(self) -> None:
        self.at_ms = max(self.gpu.queued_until_ms, self.gpu.now_ms)

    def query(self) -> bool:
        return self.at_ms is not None and self.at_ms <= self.gpu.now_ms

    def synchronize(self) -> None:
        self.gpu.synchronised += 1
        self.gpu.now_ms = max(self.gpu.now_ms, self.at_ms)

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.query() and end.query(), "elapsed_time on an unfinished event"
        return end.at_ms - self.at_ms


def test_gaps_show_a_starving_gpu_and_nothing_blocks_until_the_end():
    gpu, records = FakeGpu(), []
    timer = GpuStepTimer(gpu.event, records.append)
    for step in range(4):
        gpu.now_ms = max(gpu.now_ms, gpu.queued_until_ms) + 30.0  # idle 30 ms: waiting for data
        timer.step_started(0, step)
        gpu.enqueue(10.0)  # forward + backward + optimizer: 10 ms of GPU work
        timer.compute_issued()
        timer.poll()
    assert gpu.synchronised == 0
    timer.finish()
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all(r["gpu_busy_s"] == pytest.approx(0.010) for r in records)
    assert records[0]["gpu_gap_s"] is None
    assert all(r["gpu_gap_s"] == pytest.approx(0.030) for r in records[1:])


def test_a_busy_gpu_has_no_gap_even_when_the_host_waits():
    gpu, records = FakeGpu(), []
    timer = GpuStepTimer(gpu.event, records.append)
    for step in range(3):
        timer.step_started(0, step)  # the host got its batch while the GPU still works
        gpu.enqueue(50.0)
        timer.compute_issued()
        timer.poll()
    gpu.now_ms = gpu.queued_until_ms
    timer.poll()
    timer.finish()
    assert [r["gpu_gap_s"] for r in records[1:]] == [0.0, 0.0]
    assert all(r["gpu_busy_s"] == pytest.approx(0.050) for r in records)


def test_a_step_without_optimizer_is_not_timed_and_pending_is_bounded():
    gpu, records = FakeGpu(), []
    timer = GpuStepTimer(gpu.event, records.append, max_pending=2)
    timer.step_started(0, 0)  # no compute_issued: no end event, nothing recorded
    for step in range(1, 6):
        timer.step_started(0, step)
        gpu.enqueue(5.0)
        timer.compute_issued()
        timer.poll()  # the GPU never advances by itself here
    assert gpu.synchronised > 0  # memory stays bounded by waiting on the oldest
    timer.finish()
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]


def test_gpu_side_looks_for_cuda_in_the_first_batches_then_times_every_step():
    from ddp_profile.profiler.rank.gpu_steps import GpuSide

    gpu, emitted, found = FakeGpu(), [], []
    available = iter([None, None, gpu.event])  # the script moves to CUDA at its third batch
    side = GpuSide(emitted.append, lambda: found.append(True), lookups=4,
                   factory=lambda: next(available))
    for step in range(3):
        side.step_started(0, step)
        side.compute_issued()
    assert side.timer is not None and found == [True]  # the watch installed once
    for step in range(3, 6):
        gpu.enqueue(2.0)
        side.step_started(0, step)
        side.compute_issued()
    gpu.now_ms = gpu.queued_until_ms
    side.finish()
    assert [r["step"] for r in emitted] == [2, 3, 4, 5]


def test_gpu_side_gives_up_after_its_lookups_and_stays_inert():
    from ddp_profile.profiler.rank.gpu_steps import GpuSide

    calls = []
    side = GpuSide(lambda r: None, lambda: calls.append("cuda"), lookups=2,
                   factory=lambda: calls.append("looked"))
    for step in range(5):
        side.step_started(0, step)
        side.compute_issued()
        side.poll()
    side.finish()
    assert calls == ["looked", "looked"] and side.timer is None
    assert not side.live  # the step's path calls it no more


def test_gpu_side_stays_live_while_it_looks_and_once_it_times_the_steps():
    from ddp_profile.profiler.rank.gpu_steps import GpuSide

    gpu = FakeGpu()
    available = iter([None, gpu.event])
    side = GpuSide(lambda r: None, lambda: None, lookups=2, factory=lambda: next(available))
    assert side.live
    side.step_started(0, 0)
    assert side.live and side.timer is None  # one lookup left
    side.step_started(0, 1)
    assert side.live and side.timer is not None  # found at the last lookup
    assert not GpuSide(lambda r: None, lambda: None, lookups=0).live


def test_a_gap_across_time_outside_every_step_is_not_measured():
    """An epoch's end: validation and a checkpoint keep the GPU from training steps for 900 ms;
    the next iterator's first batch has no optimizer step (a prefetching loop), so the first
    step kept after the break is the one after it: its gap is None, the next ones are read."""
    gpu, records = FakeGpu(), []
    timer = GpuStepTimer(gpu.event, records.append)

    def step(index: int, optimizer: bool = True) -> None:
        gpu.now_ms = max(gpu.now_ms, gpu.queued_until_ms) + 30.0
        timer.step_started(0, index)
        gpu.enqueue(10.0)
        if optimizer:
            timer.compute_issued()
        timer.poll()

    step(0)
    step(1)
    gpu.now_ms += 900.0  # between the epochs
    timer.between_steps()
    step(2, optimizer=False)
    step(3)
    step(4)
    timer.finish()
    assert [r["step"] for r in records] == [0, 1, 3, 4]
    assert [r["gpu_gap_s"] for r in records][:3] == [None, pytest.approx(0.030), None]
    assert records[3]["gpu_gap_s"] == pytest.approx(0.030)

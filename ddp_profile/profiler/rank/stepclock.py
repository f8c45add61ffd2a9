"""Turn loop boundary events into per-step timing records; pure, with an injected clock.

A training step ``k`` of one DataLoader is split at four boundaries::

    __next__ ──data wait──► batch returned ──compute──► optimizer step done ──other──► __next__
                             └─forward─► first backward()

``compute_s`` ends at the last optimizer step before the next ``__next__`` call; a loop without
an optimizer (or a batch without a step, as in gradient accumulation) counts the whole host time
after the batch as compute and ``other_s`` is zero. Each step record is emitted when the next
``__next__`` call closes it, so the last batch of a script that ends on its own is not recorded.
With a ``runq`` counter (the thread's nanoseconds runnable without a CPU,
``loading.clocks.RunQueueClock``), each record also carries ``runq_s``: the time the loop's
thread sat on a run queue during the step, whoever held its CPU.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

Clock = Callable[[], int]


class StepClock:
    """Timing state of one DataLoader: feed it the boundary events, get step records back."""

    def __init__(self, loader_id: int, warmup: int, clock: Clock = time.perf_counter_ns,
                 wall: Clock = time.time_ns, runq: Optional[Callable[[], Optional[int]]] = None):
        self.loader_id = loader_id
        self.warmup = warmup
        self.steps_closed = 0
        self._clock = clock
        self._wall_offset_ns = wall() - clock()
        self._called: Optional[int] = None
        self._returned: Optional[int] = None
        self._backward: Optional[int] = None
        self._opt_done: Optional[int] = None
        self._samples = 0
        self._loader_start = False
        self._iter_start_s: Optional[float] = None
        self.measured_steps = 0
        self._runq = runq
        self._runq_called: Optional[int] = None

    @property
    def in_step(self) -> bool:
        """True between a batch being returned and the next ``__next__`` call."""
        return self._returned is not None

    def next_called(self) -> Optional[dict[str, Any]]:
        """``__next__`` was entered: close the open step (returned) and start the data wait."""
        now = self._clock()
        runq = self._runq() if self._runq is not None else None
        record = self._close(now) if self._returned is not None else None
        if record is not None and runq is not None and self._runq_called is not None:
            record["runq_s"] = (runq - self._runq_called) / 1e9
        self._called, self._runq_called = now, runq
        return record

    def exhausted(self) -> None:
        """``__next__`` raised StopIteration: the wait that began was no step."""
        self._called = None

    def batch_returned(self, samples: int) -> None:
        self._returned = self._clock()
        if self._called is None:  # defensive: a batch without a recorded call
            self._called = self._returned
        self._samples = samples
        self._backward = None
        self._opt_done = None

    def loader_started(self, first_batch_s: Optional[float] = None) -> None:
        """The open step's batch came from a fresh iterator (a new epoch's workers starting).

        It is recorded with ``loader_start`` and measured like any other step. The reader
        (``store.epochs``) takes the start segment out of the steady steps and charges its
        cost once per epoch: leaving it out flatters many workers twice over (their start-up
        wait is gone, and so is the time they spent making the stock that the following steps
        take without waiting), while counting it as it falls in a window weighs it by where
        the epoch happens to end. ``first_batch_s`` (recorded as ``iter_start_s``) runs from
        the iterator's creation, which starts the workers before the step's wait begins."""
        self._loader_start = True
        self._iter_start_s = first_batch_s

    def backward_called(self) -> None:
        if self._returned is not None and self._backward is None:
            self._backward = self._clock()

    def optimizer_stepped(self) -> None:
        if self._returned is not None:
            self._opt_done = self._clock()

    def _close(self, end_ns: int) -> dict[str, Any]:
        assert self._called is not None and self._returned is not None
        compute_end = self._opt_done if self._opt_done is not None else end_ns
        measured = self.steps_closed >= self.warmup
        self.measured_steps += measured
        record = {
            "kind": "step",
            "loader_id": self.loader_id,
            "step": self.steps_closed,
            "measured": measured,
            "t_ns": self._called + self._wall_offset_ns,
            "data_wait_s": (self._returned - self._called) / 1e9,
            "compute_s": (compute_end - self._returned) / 1e9,
            "other_s": (end_ns - compute_end) / 1e9,
            "forward_s": ((self._backward - self._returned) / 1e9
                          if self._backward is not None else None),
            "samples": self._samples,
        }
        if self._loader_start:
            record["loader_start"] = True
            if self._iter_start_s is not None:
                record["iter_start_s"] = self._iter_start_s
        self.steps_closed += 1
        self._returned = None
        self._loader_start = False
        return record

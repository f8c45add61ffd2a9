"""Turn loop boundary events into per-step timing rows; pure, with an injected clock.

A training step ``k`` of one DataLoader is split at four boundaries::

    __next__ ──data wait──► batch returned ──compute──► optimizer step done ──other──► __next__
                             └─forward─► first backward()

``compute_s`` ends at the last optimizer step before the next ``__next__`` call (without one,
the whole host time after the batch is compute and ``other_s`` is zero). A step closes at the
next ``__next__`` call, so a script's last batch is recorded only where it calls it again.
With a ``runq`` counter (``loading.clocks.RunQueueClock``) a sampled step (``runq_sampled``)
also carries ``runq_s``: the time its thread sat runnable on a run queue. A closed step is a
row (``ROW``): the loop pays for its clock readings alone; ``step_line`` makes its record's
JSON line where the rank's records are flushed, ``step_record`` the same record as a dict.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Optional

from ddp_profile.profiler.rank.loading.clocks import SHORT_NS, runq_delta
from ddp_profile.profiler.store.record import dumps

Clock = Callable[[], int]
# a closed step's row: its fields in this order, times in nanoseconds (None: not measured)
ROW = ("t_ns", "loader_id", "step", "measured", "data_wait_ns", "compute_ns", "other_ns",
       "forward_ns", "samples", "runq_before", "runq_after", "loader_start", "iter_start_s")

# Which steps read the run queue: the first ``RUNQ_FIRST`` measured ones (``warmup`` on: a
# short window has some) and every step ``k`` with ``k % RUNQ_EVERY == 0``: the same steps on
# every rank (the straggler rule compares ranks step by step). A sampled step is read at its
# two boundaries (the ``__next__`` that starts it and the one that ends it); any other boundary
# reads nothing, and an unsampled step's row carries None for both readings.
RUNQ_FIRST, RUNQ_EVERY = 4, 4
_RUNQ_WRAP = RUNQ_EVERY - 1  # a power of two: ``k & _RUNQ_WRAP`` is ``k % RUNQ_EVERY``
assert RUNQ_EVERY & _RUNQ_WRAP == 0


def runq_sampled(step: int, warmup: int = 0) -> bool:
    """Whether step ``step`` (of a loader, from 0) carries its run-queue time."""
    return warmup <= step < warmup + RUNQ_FIRST or step % RUNQ_EVERY == 0


def _flags(step: int, warmup: int) -> int:
    """The closing of ``step``: 1 where its ending boundary reads the run queue (it or the step
    that boundary starts is sampled), 3 where the step is sampled too; else 0."""
    if runq_sampled(step, warmup):
        return 3
    return int(runq_sampled(step + 1, warmup))


# by ``k & _RUNQ_WRAP`` for the steps ``k`` from ``warmup + RUNQ_FIRST`` on (each clock has the
# earlier ones' of its own warm-up)
_FLAGS = bytes(_flags(RUNQ_EVERY * RUNQ_FIRST + k, 0) for k in range(RUNQ_EVERY))


class StepClock:
    """Timing state of one DataLoader: feed it the boundary events, get step rows back.

    ``runq`` reads the run-queue counter: nanoseconds, or what ``RunQueueClock.raw`` read
    (parsed where the row is encoded), at a sampled step's boundaries (``runq_sampled``);
    ``runq_now`` is the reading of the last ``__next__``, None where it read nothing."""

    def __init__(self, loader_id: int, warmup: int, clock: Clock = time.perf_counter_ns,
                 wall: Clock = time.time_ns, runq: Optional[Callable[[], Any]] = None):
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
        # without a counter, ``type(None)``: called, it returns None (no Python frame)
        self._runq: Callable[[], Any] = runq if runq is not None else type(None)
        self.runq_now: Any = None
        self._runq_first = warmup + RUNQ_FIRST  # the steps before it: their flags (``_flags``)
        self._flags_first = bytes(_flags(k, warmup) for k in range(self._runq_first))

    @property
    def in_step(self) -> bool:
        """True between a batch being returned and the next ``__next__`` call."""
        return self._returned is not None

    def next_called(self) -> Optional[tuple]:
        """``__next__`` was entered: close the open step (its row, ``ROW``; None where none
        was open) and start the data wait. The run queue is read where a sampled step starts
        or ends (``runq_sampled``)."""
        now = self._clock()
        returned = self._returned
        step = self.steps_closed
        if returned is None:
            self._called = now
            self.runq_now = self._runq() if runq_sampled(step, self.warmup) else None
            return None
        flags = _FLAGS[step & _RUNQ_WRAP] if step >= self._runq_first else \
            self._flags_first[step]
        if flags:  # its end reads the run queue: it is sampled (3) or the next step is (1)
            runq = self._runq()
            before, after = (self.runq_now, runq) if flags == 3 else (None, None)
        else:
            runq = before = after = None
        called, opt_done, backward = self._called, self._opt_done, self._backward
        assert called is not None
        compute_end = opt_done if opt_done is not None else now
        measured = step >= self.warmup
        self.measured_steps += measured
        loader_start = self._loader_start
        row = (called + self._wall_offset_ns, self.loader_id, step, measured,
               returned - called, compute_end - returned, now - compute_end,
               backward - returned if backward is not None else None, self._samples,
               before, after, loader_start, self._iter_start_s if loader_start else None)
        self.steps_closed = step + 1
        self._returned = None
        self._loader_start = False
        self._called, self.runq_now = now, runq
        return row

    def exhausted(self) -> None:
        """``__next__`` raised StopIteration: the wait that began was no step (nor is its
        reading any step's start)."""
        self._called = self.runq_now = None

    def batch_returned(self, samples: int) -> None:
        """The batch is the loop's (``rank.loaders`` makes this inline, a step's one call)."""
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
        """(The ``Tensor.backward`` patch makes this inline: ``patches.loader``.)"""
        if self._returned is not None and self._backward is None:
            self._backward = self._clock()

    def optimizer_stepped(self) -> None:
        if self._returned is not None:
            self._opt_done = self._clock()


def step_seconds(row: tuple) -> float:
    """The step's whole time: data wait, compute and other."""
    return (row[4] + row[5] + row[6]) / 1e9


# times with nine decimals: the float a reader parses is the one ``ns / 1e9`` makes, written at
# a fraction of the cost of a float's shortest ``repr``
_STEP_HEAD = ('{"kind":"step","loader_id":%d,"step":%d,"measured":%s,"t_ns":%d,"data_wait_s":%.9f,'
              '"compute_s":%.9f,"other_s":%.9f,"forward_s":')
_STEP = _STEP_HEAD + '%s,"samples":%d,"rank":%s'
# the common step, whole in one format: its forward and run queue timed, nothing more to add
_STEP_TIMED = _STEP_HEAD + '%.9f,"samples":%d,"rank":%s,"runq_s":%.9f}'
# ... and where every time of it is under ``clocks.SHORT_NS``: each written from its
# nanoseconds, the text ``%.9f`` makes of ``ns / 1e9`` (an integer's digits, no float formatted)
_STEP_SHORT = _STEP_TIMED.replace("%.9f", "0.%09d")
# the same of a step whose run queue was not read (``runq_sampled``): no ``runq_s``
_STEP_UNSAMPLED = _STEP_TIMED.replace(',"runq_s":%.9f', "")
_STEP_UNSAMPLED_SHORT = _STEP_UNSAMPLED.replace("%.9f", "0.%09d")


def step_line(row: tuple, label: Optional[tuple[int, bool]] = None,
              extra: Optional[dict[str, Any]] = None, rank: Optional[int] = None) -> str:
    """The step record's JSON line: ``row`` (``ROW``), relabelled where ``label`` (a screen's
    window, and whether the step is measured in it) says, ``extra``'s fields (the step's
    communication) added, the rank given."""
    return encode_step((encode_step, row, label, extra), rank)


def encode_step(item: tuple, rank: Optional[int]) -> str:
    """A queued step's line (``step_line``): ``item`` is (``encode_step``, row, label, extra)."""
    _, row, label, extra = item
    (t_ns, loader_id, step, measured, wait, compute, other, forward, samples, runq_before,
     runq_after, loader_start, iter_start_s) = row
    rank_text = "null" if rank is None else int(rank)
    if label is None and forward is not None and not (loader_start or extra):
        if runq_before is None:  # a step not sampled (``runq_sampled``): no run-queue time
            if 0 <= (wait | compute | other | forward) < SHORT_NS:
                return _STEP_UNSAMPLED_SHORT % (loader_id, step, "true" if measured else "false",
                                                t_ns, wait, compute, other, forward, samples,
                                                rank_text)
            return _STEP_UNSAMPLED % (loader_id, step, "true" if measured else "false", t_ns,
                                      wait / 1e9, compute / 1e9, other / 1e9, forward / 1e9,
                                      samples, rank_text)
        if runq_after.__class__ is int and runq_before.__class__ is int:
            runq = runq_after - runq_before  # a step's boundaries' readings, parsed as read
            if 0 <= (wait | compute | other | forward | runq) < SHORT_NS:
                return _STEP_SHORT % (loader_id, step, "true" if measured else "false", t_ns,
                                      wait, compute, other, forward, samples, rank_text, runq)
    if label is not None:
        measured = label[1]
    runq = runq_delta(runq_before, runq_after) if runq_after is not None else None
    flag = "true" if measured else "false"
    if not (loader_start or label is not None or extra) and forward is not None \
            and runq is not None:
        return _STEP_TIMED % (loader_id, step, flag, t_ns, wait / 1e9, compute / 1e9,
                              other / 1e9, forward / 1e9, samples, rank_text, runq / 1e9)
    line = _STEP % (loader_id, step, flag, t_ns, wait / 1e9, compute / 1e9, other / 1e9,
                    "null" if forward is None else "%.9f" % (forward / 1e9), samples, rank_text)
    if runq is not None:
        line += ',"runq_s":%.9f' % (runq / 1e9)
    if loader_start:
        line += ',"loader_start":true'
        if iter_start_s is not None:
            line += ',"iter_start_s":%r' % float(iter_start_s)
    if label is not None:
        line += ',"window":%d' % label[0]
    if extra:
        line += "," + dumps(extra)[1:-1]
    return line + "}"


def step_record(row: tuple, label: Optional[tuple[int, bool]] = None,
                extra: Optional[dict[str, Any]] = None,
                rank: Optional[int] = None) -> dict[str, Any]:
    """The step record ``step_line`` writes, as a dict."""
    return json.loads(step_line(row, label, extra, rank))



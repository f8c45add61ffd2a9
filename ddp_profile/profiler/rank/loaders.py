"""The DataLoader side of a rank's instrumentation: its loaders, iterators and steps.

``LoaderHooks`` is the part of ``instrument.Instrumentation`` that the DataLoader patches
call (``patches.Hooks``): ``DataLoader.__init__`` (the script's settings recorded, the probe's
overrides applied, the workers metered), ``__iter__`` (each iterator adopted: its
``windows.IteratorState``, its batches metered where they are made, ``loading``) and
``__next__`` (the step boundaries, ``stepclock``; a screen's windows and the ceiling's replay,
``windows``). It holds no state of its own: ``Instrumentation`` makes the state declared
below and gives the records' writer, the stop and the samplers' start.
"""

from __future__ import annotations

import inspect
import time
import weakref
from typing import Any, Callable, Optional

from ddp_profile.profiler.rank.comm_meter import CommMeter
from ddp_profile.profiler.rank.facts import (
    FINGERPRINT_BATCHES,
    batch_fingerprint,
    worker_pids,
)
from ddp_profile.profiler.rank.gpu_steps import GpuSide
from ddp_profile.profiler.rank.loading import loadcost
from ddp_profile.profiler.rank.loading.clocks import RunQueueClock
from ddp_profile.profiler.rank.loading.loadcost import batch_size_of
from ddp_profile.profiler.rank.loading.pagecache import FileReads, watch
from ddp_profile.profiler.rank.overrides import apply_overrides, own_settings
from ddp_profile.profiler.rank.process import current_rank
from ddp_profile.profiler.rank.stepclock import StepClock, encode_step
from ddp_profile.profiler.rank.windows import (
    CeilingReplay,
    IteratorState,
    Screen,
    applied_settings,
    loader_length,
    note_yielded,
    rebuilt_iterator,
)
from ddp_profile.profiler.settings import (
    CacheMode,
    Mode,
    ProbePlan,
    backlog_warmup,
    burst_steps,
    capped,
    mode_warmup,
)
from ddp_profile.profiler.store.record import ITERATOR_OUTLIVES_EPOCH, RankRecorder

FLUSH_INTERVAL_S = 0.5  # the rank's records are flushed this often (``maybe_flush``) ...
FLUSH_INTERVAL_NS = int(FLUSH_INTERVAL_S * 1e9)
MAX_PENDING = 20_000  # ... or once this many wait (a bounded buffer)
RUNQ = RunQueueClock()  # the training thread's time runnable, waiting for a CPU


class LoaderHooks:
    """The DataLoader hooks of ``instrument.Instrumentation`` (a mixin over its state)."""

    plan: ProbePlan
    recorder: RankRecorder
    file_reads: Optional[FileReads]
    pin_meter: loadcost.PinMeter
    clocks: dict[int, StepClock]
    _steps: dict[int, int]  # measured steps per loader (burst_steps)
    current: Optional[StepClock]
    loader_count: int
    training_loader_id: Optional[int]
    iterators: "weakref.WeakSet[Any]"
    comm: CommMeter
    worker_pids: tuple[int, ...]
    context_written: bool
    _outliving: set[int]
    _flush_due: int  # ``maybe_flush``'s: when the next flush is due, at the latest
    # (``time.perf_counter_ns``, the step clocks' clock)
    _queue: list[Any]  # and what waits for it
    screen: Screen
    ceiling: CeilingReplay
    gpu: GpuSide

    def event(self, name: str, **data: Any) -> None:
        raise NotImplementedError

    def write_context(self) -> None:
        raise NotImplementedError

    def maybe_flush(self) -> bool:
        raise NotImplementedError

    def stop(self, reason: str) -> None:
        raise NotImplementedError

    def _start_samplers(self) -> None:
        raise NotImplementedError

    def in_step(self) -> bool:
        """A step of some loader is open (a batch returned, its next ``__next__`` not called)."""
        return any(clock.in_step for clock in self.clocks.values())

    # ---- DataLoader ----------------------------------------------------------------------
    def on_loader_init(self, loader: Any, bound: inspect.BoundArguments) -> None:
        """Record the script's settings and rewrite ``bound`` with the probe's overrides."""
        loader_id = self.loader_count
        self.loader_count += 1
        args = bound.arguments
        own = own_settings(args)
        applied, skipped = apply_overrides(args, self.plan.overrides, self.plan.persistent_workers)
        args["worker_init_fn"] = loadcost.WorkerInit(
            args.get("worker_init_fn"), self.plan.out_dir, loader_id,
            cold=self.plan.cache == CacheMode.COLD)
        object.__setattr__(loader, "_ddp_profile_id", loader_id)
        object.__setattr__(loader, "_ddp_profile_iters", 0)
        self.recorder.write({"kind": "loader", "loader_id": loader_id, "rank": current_rank(),
                             "own": own, "applied": applied, "skipped_overrides": skipped,
                             "persistent_workers": bool(args.get("persistent_workers"))})

    def _files(self) -> FileReads:
        """The watch on the files this rank's own fetches open (``num_workers=0``)."""
        if self.file_reads is None:
            self.file_reads = watch(FileReads(self.plan.cache == CacheMode.COLD))
        return self.file_reads

    def before_iter(self, loader: Any) -> None:
        """The loader's workers are about to start: their batch records need the rank."""
        loadcost.before_iter(loader, current_rank())

    def on_iter(self, loader: Any, iterator: Any, started_ns: Optional[int] = None) -> None:
        loader_id = getattr(loader, "_ddp_profile_id", None)
        if loader_id is None:
            return
        meter = self._adopt(iterator, loader_id)
        index = getattr(loader, "_ddp_profile_iters", 0)
        object.__setattr__(loader, "_ddp_profile_iters", index + 1)
        iterator._ddp_profile_state = IteratorState(
            loader_id, index, started_ns or time.perf_counter_ns(), weakref.ref(loader),
            iterator=weakref.ref(iterator), default_bs=getattr(loader, "batch_size", None) or 1,
            epoch_len=loader_length(loader), meter=meter)

    def _adopt(self, iterator: Any, loader_id: int) -> Optional[loadcost.CostMeter]:
        """Follow an iterator of a loader (the script's, or one a window rebuilt): its batches
        metered where they are made (its meter where it makes them in this thread) and
        pinned, its workers known to the samplers."""
        meter = loadcost.meter_in_process(iterator, self.recorder.defer, current_rank(),
                                          loader_id, self._files())
        self.pin_meter.track(iterator, loader_id)
        self.iterators.add(iterator)
        pids = worker_pids(iterator)
        if pids:
            self.worker_pids = tuple(sorted(set(self.worker_pids) | set(pids)))
        return meter

    def _fingerprint(self, state: IteratorState, batch: Any) -> None:
        """The first batches of each loader's first epoch, fingerprinted (sharding check)."""
        if state.iter_index != 0 or state.fingerprints >= FINGERPRINT_BATCHES:
            return
        index = state.fingerprints
        state.fingerprints = index + 1
        try:
            digest = batch_fingerprint(batch)
        except Exception:  # noqa: BLE001 - a batch type we cannot read: no evidence
            digest = None
        if digest is not None:
            self.event("batch_fingerprint", loader_id=state.loader_id, index=index,
                       digest=digest)

    def on_next(self, iterator: Any, original_next: Callable[[Any], Any]) -> Any:
        """A ``__next__`` of an adopted iterator: the step it closes, the batch it takes.

        This runs at every step: the state it needs is held where one lookup finds it (the
        iterator's clock on its state; the GPU side's and the flush's checks made on plain
        attributes; the batch's size from its meter, which just measured it)."""
        state: IteratorState = iterator._ddp_profile_state
        clock = state.clock
        if clock is None:
            clock = state.clock = self._clock_of(state)
        row = clock.next_called()
        quiet = True  # nothing ran since the step's boundary but its row's queuing
        if row is not None:
            quiet = self._close_step(iterator, state, clock, row)
        elif not self.in_step():  # what ran since the last step closed belongs to none
            self.comm.between_steps()
            self.gpu.between_steps()
        loader_id, meter = state.loader_id, state.meter
        if meter is not None:  # the boundary's run-queue reading starts its fetch (None where
            meter.runq_start = clock.runq_now if quiet else None  # it read none: its own)
        self.pin_meter.fetching = loader_id  # pinning in this thread (no workers) is its
        try:
            if self.screen.replays:
                batch = self._fetch(state, iterator, original_next)
            else:  # no pass continued: nothing noted (``windows``)
                batch = original_next(state.delegate or iterator)
        except StopIteration:
            clock.exhausted()
            self.recorder.flush()  # an epoch's end: its records on disk before what follows
            raise
        made = None
        if meter is not None:  # never held past its step (a pinned batch is another object)
            made, meter.made = meter.made, None
        if made is batch:  # the meter's own batch: its size read
            samples = meter.made_samples
            if samples < 0:
                samples = state.default_bs
        else:
            samples = batch_size_of(batch, state.default_bs)
        returned = clock._returned = clock._clock()  # ``StepClock.batch_returned``, inline
        if clock._called is None:
            clock._called = returned
        clock._samples = samples
        clock._backward = clock._opt_done = None
        served = state.served = state.served + 1  # ``IteratorState.serve``, inline
        if served == state.outlived_at and loader_id not in self._outliving:
            self._outliving.add(loader_id)
            self.event(ITERATOR_OUTLIVES_EPOCH, loader_id=loader_id, epoch_len=state.epoch_len)
        if state.iter_index == 0 and state.fingerprints < FINGERPRINT_BATCHES:
            self._fingerprint(state, batch)
        self.current = clock
        gpu = self.gpu
        if gpu.live:
            gpu.step_started(loader_id, clock.steps_closed)
        if state.first:
            state.first = False
            clock.loader_started(self._on_first_batch(state))
        return batch

    def _clock_of(self, state: IteratorState) -> StepClock:
        """The step clock of ``state``'s loader (made at its first batch)."""
        loader_id = state.loader_id
        clock = self.clocks.get(loader_id)
        if clock is None:
            # a boundary's run-queue reading (a sampled step's: ``stepclock.runq_sampled``) ends
            # a step and starts the next and its fetch: parsed once as it is read
            clock = self.clocks[loader_id] = StepClock(loader_id, self._warmup_for(state),
                                                       runq=RUNQ)
            self._steps[loader_id] = self._steps_for(state)
        return clock

    def _close_step(self, iterator: Any, state: IteratorState, clock: StepClock,
                    row: tuple) -> bool:
        """A step ended: queue its row, with its communication and its window, encoded at the
        flush (``stepclock.encode_step``); stop, or begin the next window, where the probe
        says so. True where it did no more (no window began, no flush). ``Screen.done``, the
        check of ``maybe_flush`` and a quiet ``CommMeter.take_step`` are made here, inline:
        no call a step for any of them."""
        screen, comm = self.screen, self.comm
        if comm.modules or comm.coll_n or comm.hsync_n:
            extra = comm.take_step((row[4] + row[5] + row[6]) / 1e9)
        else:  # ``CommMeter.take_step`` where there is nothing to take, inline
            comm.step_syncs = comm.step_unsynced = comm.step_opt = 0
            extra = None
        window = None
        if screen.windows:
            self.recorder.defer((encode_step, row, screen.window_of(row[2]), extra))
            window = screen.boundary(clock.steps_closed)
            done = clock.steps_closed >= screen.total_steps
        else:
            self.recorder.defer((encode_step, row, None, extra))
            done = clock.measured_steps >= self._steps[state.loader_id]
        if self.gpu.live:
            self.gpu.poll()
        if done:
            self.training_loader_id = state.loader_id
            self.stop("steps_done")
        elif window is not None and self.training_loader_id in (None, state.loader_id):
            self.training_loader_id = state.loader_id
            self._switch_window(iterator, state, window)
            self.maybe_flush()
            return False
        # the boundary's own clock reading (``StepClock.next_called``'s): no read of its own
        if clock._called < self._flush_due and len(self._queue) < MAX_PENDING:
            return True  # no flush due
        return not self.maybe_flush()

    def _warmup_for(self, state: IteratorState) -> int:
        """A probe's warm-up also drains the start-up prefetch (``config.backlog_warmup``);
        a screen's windows carry their own."""
        loader = state.loader()
        if self.plan.windows or self.plan.mode != Mode.NORMAL or loader is None:
            return self.plan.warmup if self.plan.windows else \
                mode_warmup(self.plan.warmup, self.plan.mode)
        return capped(backlog_warmup(self.plan.warmup, getattr(loader, "num_workers", 0),
                                     getattr(loader, "prefetch_factor", None)),
                      self.plan.warmup_cap)

    def _steps_for(self, state: IteratorState) -> int:
        """A probe with workers measures several rounds of them (``config.burst_steps``)."""
        loader = state.loader()
        if self.plan.windows or loader is None:
            return self.plan.steps
        return burst_steps(self.plan.steps, getattr(loader, "num_workers", 0), self.plan.mode,
                           self.plan.steps_per_s)

    def _fetch(self, state: IteratorState, iterator: Any,
               original_next: Callable[[Any], Any]) -> Any:
        """A batch where a pass may continue (``Screen.replays``; else ``on_next`` takes it
        itself): each noted as yielded, or the ceiling's replay."""
        source = state.delegate or iterator
        if self.screen.mode(state.loader_id == self.training_loader_id) != Mode.CEILING:
            batch = original_next(source)
            note_yielded(source)
            return batch

        def real_batch() -> Any:
            batch = original_next(source)
            note_yielded(source)
            return batch
        return self.ceiling.fetch(state, real_batch)

    # ---- screens ---------------------------------------------------------------------------
    def gradient_sync(self) -> bool:
        """Whether DDP synchronises gradients in this step (``ProbePlan.gradient_sync``)."""
        return self.plan.gradient_sync(self.screen.window)

    def _switch_window(self, iterator: Any, state: IteratorState, window: int) -> None:
        """Rebuild the training loader's iterator with the settings of ``window``; where they
        are the last window's, in the same mode (windows that differ in gradient
        synchronisation or threads alone), the iterator goes on as it is. Torch's intra-op
        threads switch first (``Screen.switch_threads``); the window's event keeps them."""
        previous = self.screen.window
        same = self.plan.window_settings(window) == self.plan.window_settings(previous) \
            and self.plan.window_mode(window) == self.plan.window_mode(previous)
        self.screen.window = window
        switched_ns = time.time_ns()  # the window begins here, before its workers start
        loader = state.loader()
        settings = self.plan.window_settings(window)
        try:
            threads = self.screen.switch_threads(window)  # every rank at this same step
            rebuilt = None if same else rebuilt_iterator(loader, state, settings)
            if rebuilt is not None:
                fresh, started = rebuilt
                state.meter = self._adopt(fresh, state.loader_id)
                state.delegate, state.t_iter, state.first = fresh, started, True
            self.event("window", window=window, applied=applied_settings(loader),
                       mode=self.plan.window_mode(window), switched_ns=switched_ns,
                       threads=threads)
        except Exception as exc:  # noqa: BLE001 - e.g. a DataLoader subclass that forbids it
            self.event("screen_unsupported", window=window,
                       error=f"{type(exc).__name__}: {exc}"[:500])
            self.stop("screen_unsupported")

    def _on_first_batch(self, state: IteratorState) -> float:
        """Record a fresh iterator's first batch; the seconds since the iterator was made."""
        first_batch_s = (time.perf_counter_ns() - state.t_iter) / 1e9
        if not self.context_written:
            self.screen.start_threads()  # a first window's own threads, once the script set its
            self.write_context()
            self._start_samplers()
        self.recorder.write({"kind": "loader_iter", "rank": current_rank(),
                             "loader_id": state.loader_id, "iter_index": state.iter_index,
                             "t_ns": time.time_ns(), "first_batch_s": first_batch_s,
                             "window": self.screen.window})
        return first_batch_s

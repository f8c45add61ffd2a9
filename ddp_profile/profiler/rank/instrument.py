"""Rank-side instrumentation: patch the DataLoader, time each step, stop cleanly.

Installed by ``profiler.rank.hook`` in a probe's rank processes only (never on a plain import).

* ``DataLoader.__init__`` records the script's own settings and applies the probe's overrides
  (``batch_sampler=BatchSampler(...)`` is rebuilt with the new batch size around the same
  sampler; a value PyTorch forbids is skipped and the skip recorded).
* ``_BaseDataLoaderIter.__next__`` marks the step boundaries (see ``profiler.rank.stepclock``).
* A global optimizer step post hook and ``Tensor.backward`` mark compute boundaries.

**The training loader** is the first DataLoader whose iteration reaches ``warmup + steps``
batches in this rank: the loader iterated most by then. Validation loaders iterated in between
count as the training step's "other" host time. When it gets there, every rank (all ranks reach
the same batch index, since DistributedSampler gives each rank the same number of batches)
writes its records, waits at a barrier, shuts its DataLoader workers down and exits 0.

**A screen** (``plan.windows``) measures several loader configurations in one launch. The
training loader runs ``warmup + steps`` steps per window; at each window boundary the iterator
the script holds is switched, in every rank at the same step, to a fresh iterator of the same
DataLoader built with the next window's ``num_workers`` / ``pin_memory`` / ``prefetch_factor``
(the old workers are shut down first). Step records carry their ``window``; ``measured`` is
false for each window's first ``warmup`` steps, which absorb the new workers' start-up. A
loader that cannot be rebuilt ends the screen early (event ``screen_unsupported``).

The jobs are split: ``profiler.rank.stepclock`` times each loader's steps,
``profiler.rank.windows`` holds each iterator's state (``IteratorState``), the screen's
windows (``Screen``) and the ceiling's replay (``CeilingReplay``), ``profiler.rank.gpu_steps``
the GPU side (``GpuSide``), ``profiler.rank.comm`` communication and host syncs,
``profiler.rank.process`` what the rank says about itself (rank, context and error records)
and how it leaves (the stop barrier); this class wires them to the patched calls.
"""

from __future__ import annotations

import atexit
import inspect
import os
import time
import weakref
from typing import Any, Callable, Optional

from ddp_profile.profiler.rank import loadcost
from ddp_profile.profiler.rank.comm import CommMeter
from ddp_profile.profiler.rank.facts import (
    FINGERPRINT_BATCHES,
    batch_fingerprint,
    worker_pids,
)
from ddp_profile.profiler.rank.gpu_steps import GpuSide
from ddp_profile.profiler.rank.loadcost import batch_size_of
from ddp_profile.profiler.rank.overrides import apply_overrides, own_settings
from ddp_profile.profiler.rank.pagecache import FileReads, watch
from ddp_profile.profiler.rank.process import (
    barrier,
    context_record,
    current_rank,
    error_record,
    flush_std_streams,
)
from ddp_profile.profiler.rank.stepclock import StepClock
from ddp_profile.profiler.rank.windows import (
    CeilingReplay,
    IteratorState,
    Screen,
    applied_settings,
    loader_length,
    note_yielded,
    rebuilt_iterator,
    shutdown_workers,
)
from ddp_profile.profiler.settings import COLD, ProbePlan, backlog_warmup, burst_steps, mode_warmup
from ddp_profile.profiler.store.record import ITERATOR_OUTLIVES_EPOCH, RankRecorder

FLUSH_INTERVAL_S = 0.5
RUNQ = loadcost.RunQueueClock()  # the training thread's time runnable, waiting for a CPU
STOP_BARRIER_TIMEOUT_S = 60.0


class Instrumentation:
    """Process-wide instrumentation state of one rank."""

    def __init__(self, plan: ProbePlan):
        self.plan = plan
        self.file_reads: Optional[FileReads] = None
        self.recorder = RankRecorder(plan.out_dir, current_rank)
        self.pin_meter = loadcost.PinMeter(self.recorder.write_line, current_rank)
        self.clocks: dict[int, StepClock] = {}
        self._steps: dict[int, int] = {}  # measured steps per loader (burst_steps)
        self.current: Optional[StepClock] = None
        self.loader_count = 0
        self.training_loader_id: Optional[int] = None
        self.iterators: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.ddp_modules: list[weakref.ref] = []
        self.comm = CommMeter()  # DDP's reducer timers and the script's collectives per step
        self.worker_pids: tuple[int, ...] = ()  # the DataLoaders' own workers (rebound, not
        # mutated: the host sampler's thread reads it)
        self.context_written = False
        self.samplers: Any = None
        self.stopping = False
        self._last_flush = time.monotonic()
        self._unused_checked = False
        self._outliving: set[int] = set()  # loaders one of whose iterators outlived an epoch:
        # the loader keeps it (and its workers) across epochs, no restart per epoch
        self.screen = Screen(plan)
        self.ceiling = CeilingReplay()
        self.gpu = GpuSide(self._write_gpu_step, self._cuda_found)

    # ---- records -------------------------------------------------------------------------
    def event(self, name: str, **data: Any) -> None:
        self.recorder.write({"kind": "event", "name": name, "rank": current_rank(),
                             "t_ns": time.time_ns(), "data": data})

    def write_context(self) -> None:
        self.recorder.write(context_record(self.plan))
        self.context_written = True

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S:
            self.recorder.flush()
            self._last_flush = time.monotonic()

    # ---- DataLoader ----------------------------------------------------------------------
    def on_loader_init(self, loader: Any, bound: inspect.BoundArguments) -> None:
        """Record the script's settings and rewrite ``bound`` with the probe's overrides."""
        loader_id = self.loader_count
        self.loader_count += 1
        args = bound.arguments
        own = own_settings(args)
        applied, skipped = apply_overrides(args, self.plan.overrides, self.plan.persistent_workers)
        args["worker_init_fn"] = loadcost.WorkerInit(args.get("worker_init_fn"), self.plan.out_dir,
                                                     loader_id, cold=self.plan.cache == COLD)
        object.__setattr__(loader, "_ddp_profile_id", loader_id)
        object.__setattr__(loader, "_ddp_profile_iters", 0)
        self.recorder.write({"kind": "loader", "loader_id": loader_id, "rank": current_rank(),
                             "own": own, "applied": applied, "skipped_overrides": skipped,
                             "persistent_workers": bool(args.get("persistent_workers"))})

    def _files(self) -> FileReads:
        """The watch on the files this rank's own fetches open (``num_workers=0``)."""
        if self.file_reads is None:
            self.file_reads = watch(FileReads(self.plan.cache == COLD))
        return self.file_reads

    def before_iter(self, loader: Any) -> None:
        """The loader's workers are about to start: their batch records need the rank."""
        loadcost.before_iter(loader, current_rank())

    def on_iter(self, loader: Any, iterator: Any, started_ns: Optional[int] = None) -> None:
        loader_id = getattr(loader, "_ddp_profile_id", None)
        if loader_id is None:
            return
        self._adopt(iterator, loader_id)
        index = getattr(loader, "_ddp_profile_iters", 0)
        object.__setattr__(loader, "_ddp_profile_iters", index + 1)
        iterator._ddp_profile_state = IteratorState(
            loader_id, index, started_ns or time.perf_counter_ns(), weakref.ref(loader),
            iterator=weakref.ref(iterator), default_bs=getattr(loader, "batch_size", None) or 1,
            epoch_len=loader_length(loader))

    def _adopt(self, iterator: Any, loader_id: int) -> None:
        """Follow an iterator of a loader (the script's, or one a window rebuilt): its batches
        metered where they are made and pinned, its workers known to the samplers."""
        loadcost.meter_in_process(iterator, self.recorder.write_line, current_rank(), loader_id,
                                  self._files())
        self.pin_meter.track(iterator, loader_id)
        self.iterators.add(iterator)
        pids = worker_pids(iterator)
        if pids:
            self.worker_pids = tuple(sorted(set(self.worker_pids) | set(pids)))

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
        state: IteratorState = iterator._ddp_profile_state
        loader_id = state.loader_id
        clock = self.clocks.get(loader_id)
        if clock is None:
            clock = self.clocks[loader_id] = StepClock(loader_id, self._warmup_for(state),
                                                       runq=RUNQ)
            self._steps[loader_id] = self._steps_for(state)
        record = clock.next_called()
        if record is not None:
            self._close_step(iterator, state, clock, record)
        self.pin_meter.fetching = loader_id  # pinning in this thread (no workers) is its
        try:
            batch = self._fetch(state, iterator, original_next)
        except StopIteration:
            clock.exhausted()
            raise
        clock.batch_returned(batch_size_of(batch, state.default_bs))
        if state.serve() and state.loader_id not in self._outliving:
            self._outliving.add(state.loader_id)
            self.event(ITERATOR_OUTLIVES_EPOCH, loader_id=state.loader_id,
                       epoch_len=state.epoch_len)
        self._fingerprint(state, batch)
        self.current = clock
        self.gpu.step_started(loader_id, clock.steps_closed)
        if state.first:
            state.first = False
            clock.loader_started(self._on_first_batch(state))
        return batch

    def _close_step(self, iterator: Any, state: IteratorState, clock: StepClock,
                    record: dict[str, Any]) -> None:
        """A step ended: complete and write its record; stop, or begin the next window, where
        the probe says so."""
        record["rank"] = current_rank()
        self.comm.close_step(record, record["data_wait_s"] + record["compute_s"]
                             + record["other_s"])
        self.screen.label(record)
        self.recorder.write(record)
        self.gpu.poll()
        window = self.screen.boundary(clock.steps_closed)
        if self.screen.done(clock.steps_closed, clock.measured_steps,
                            self._steps[state.loader_id]):
            self.training_loader_id = state.loader_id
            self.stop("steps_done")
        elif window is not None and self.training_loader_id in (None, state.loader_id):
            self.training_loader_id = state.loader_id
            self._switch_window(iterator, state, window)
        self.maybe_flush()

    def _warmup_for(self, state: IteratorState) -> int:
        """A probe's warm-up also drains the start-up prefetch (``config.backlog_warmup``);
        a screen's windows carry their own."""
        loader = state.loader()
        if self.plan.windows or self.plan.mode != "normal" or loader is None:
            return self.plan.warmup if self.plan.windows else \
                mode_warmup(self.plan.warmup, self.plan.mode)
        return backlog_warmup(self.plan.warmup, getattr(loader, "num_workers", 0),
                              getattr(loader, "prefetch_factor", None))

    def _steps_for(self, state: IteratorState) -> int:
        """A probe with workers measures several rounds of them (``config.burst_steps``)."""
        loader = state.loader()
        if self.plan.windows or loader is None:
            return self.plan.steps
        return burst_steps(self.plan.steps, getattr(loader, "num_workers", 0), self.plan.mode,
                           self.plan.steps_per_s)

    def _fetch(self, state: IteratorState, iterator: Any,
               original_next: Callable[[Any], Any]) -> Any:
        source = state.delegate or iterator
        if self.screen.mode(state.loader_id == self.training_loader_id) != "ceiling":
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
        synchronisation alone), the iterator goes on as it is."""
        previous = self.screen.window
        same = self.plan.window_settings(window) == self.plan.window_settings(previous) \
            and self.plan.window_mode(window) == self.plan.window_mode(previous)
        self.screen.window = window
        switched_ns = time.time_ns()  # the window begins here, before its workers start
        loader = state.loader()
        settings = self.plan.window_settings(window)
        try:
            rebuilt = None if same else rebuilt_iterator(loader, state, settings)
            if rebuilt is not None:
                fresh, started = rebuilt
                self._adopt(fresh, state.loader_id)
                state.delegate, state.t_iter, state.first = fresh, started, True
            self.event("window", window=window, applied=applied_settings(loader),
                       mode=self.plan.window_mode(window), switched_ns=switched_ns)
        except Exception as exc:  # noqa: BLE001 - e.g. a DataLoader subclass that forbids it
            self.event("screen_unsupported", window=window,
                       error=f"{type(exc).__name__}: {exc}"[:500])
            self.stop("screen_unsupported")

    def _cuda_found(self) -> None:
        """The script uses CUDA: its host syncs are counted from now on."""
        from ddp_profile.profiler.rank.patches import watch_host_syncs

        self.event("host_sync_watch", watched=watch_host_syncs(self))

    def _write_gpu_step(self, record: dict[str, Any]) -> None:
        record["rank"] = current_rank()
        self.recorder.write(record)

    def _on_first_batch(self, state: IteratorState) -> float:
        """Record a fresh iterator's first batch; the seconds since the iterator was made."""
        first_batch_s = (time.perf_counter_ns() - state.t_iter) / 1e9
        if not self.context_written:
            self.write_context()
            self._start_samplers()
        self.recorder.write({"kind": "loader_iter", "rank": current_rank(),
                             "loader_id": state.loader_id, "iter_index": state.iter_index,
                             "t_ns": time.time_ns(), "first_batch_s": first_batch_s,
                             "window": self.screen.window})
        return first_batch_s

    def _start_samplers(self) -> None:
        try:
            from ddp_profile.profiler.telemetry.sampler import start_samplers
        except ImportError:  # telemetry is optional for the step records
            return
        device_index = None
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                device_index = torch.cuda.current_device()
        except Exception:  # noqa: BLE001 - telemetry must never break training
            device_index = None
        try:
            self.samplers = start_samplers(self.recorder.write, pid=os.getpid(),
                                           cuda_device_index=device_index,
                                           worker_pids=lambda: self.worker_pids)
        except Exception as exc:  # noqa: BLE001
            self.event("sampler_failed", error=f"{type(exc).__name__}: {exc}")

    # ---- compute boundaries --------------------------------------------------------------
    def on_optimizer_step(self) -> None:
        self.comm.optimizer_stepped()
        if self.current is not None:
            self.current.optimizer_stepped()
            self.gpu.compute_issued()
            if not self._unused_checked and self.ddp_modules:
                self._check_unused_parameters()  # gradients exist until the next zero_grad

    def _check_unused_parameters(self) -> None:
        """How many trainable parameters of each DDP module got no gradient (once)."""
        self._unused_checked = True
        for ref in self.ddp_modules:
            module = ref()
            if module is None:
                continue
            params = [p for p in module.parameters() if p.requires_grad]
            self.event("ddp_unused_parameters", params_total=len(params),
                       params_without_grad=sum(1 for p in params if p.grad is None))

    def on_backward(self) -> None:
        if self.current is not None:
            self.current.backward_called()

    # ---- the end ---------------------------------------------------------------------------
    def finish(self, reason: str) -> None:
        """Write the final records (idempotent)."""
        if self.stopping:
            return
        self.stopping = True
        if self.samplers is not None:
            try:
                self.samplers.stop()
            except Exception:  # noqa: BLE001
                pass
        try:
            self.gpu.finish()
        except Exception:  # noqa: BLE001 - e.g. the CUDA context is already broken
            pass
        self._final_events()
        training = self.training_loader_id
        if training is None and self.clocks:
            training = max(self.clocks, key=lambda k: self.clocks[k].steps_closed)
        self.recorder.write({"kind": "end", "rank": current_rank(), "reason": reason,
                             "training_loader_id": training, "t_ns": time.time_ns(),
                             "steps_recorded": self.clocks[training].steps_closed
                             if training is not None else 0})
        self.recorder.close()

    def _final_events(self) -> None:
        if not self._unused_checked and self.ddp_modules:
            self._check_unused_parameters()  # a loop without an optimizer
        if self.ceiling.unbounded:
            self.event("replay_unbounded", reason=self.ceiling.unbounded)
        for facts in self.comm.module_facts():
            self.event("ddp_config", **facts)
        for name, site in self.comm.site_events():
            self.event(name, **site)
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                device = torch.cuda.current_device()
                self.event("cuda_memory", max_allocated=torch.cuda.max_memory_allocated(device),
                           max_reserved=torch.cuda.max_memory_reserved(device),
                           total=torch.cuda.get_device_properties(device).total_memory)
        except Exception:  # noqa: BLE001
            pass

    def stop(self, reason: str) -> None:
        """Every rank is at the same batch: record, synchronise, release workers, exit 0."""
        self.finish(reason)
        barrier(STOP_BARRIER_TIMEOUT_S)
        for iterator in list(self.iterators):
            shutdown_workers(iterator)
        flush_std_streams()
        os._exit(0)

    def on_exception(self, exc_type: type, exc: BaseException, tb: Any) -> None:
        self.recorder.write(error_record(exc_type, exc))
        self.finish("error")


_INSTALLED: Optional[Instrumentation] = None


def installed() -> Optional[Instrumentation]:
    return _INSTALLED


def install(plan: ProbePlan) -> Instrumentation:
    """Patch torch for this process (idempotent). Called by the start-up hook only."""
    global _INSTALLED
    if _INSTALLED is not None:
        return _INSTALLED
    from ddp_profile.profiler.rank import patches

    _INSTALLED = Instrumentation(plan)
    if plan.threads:  # before the script runs: it may still set its own
        import torch

        torch.set_num_threads(plan.threads)
    patches.apply(_INSTALLED)
    atexit.register(_at_exit)
    return _INSTALLED


def _at_exit() -> None:
    if _INSTALLED is not None and not _INSTALLED.stopping and _INSTALLED.recorder is not None:
        if _INSTALLED.clocks or _INSTALLED.loader_count:
            _INSTALLED.finish("script_exit")

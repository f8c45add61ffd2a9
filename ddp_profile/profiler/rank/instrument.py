"""Rank-side instrumentation: patch the DataLoader, time each step, stop cleanly.

Installed by ``profiler.rank.hook`` in a probe's rank processes only (never on a plain import).
``DataLoader.__init__`` records the script's own settings and applies the probe's overrides;
the iterators' ``__next__`` marks the step boundaries; a global optimizer step post hook and
``Tensor.backward`` mark compute boundaries. **The training loader** is the first DataLoader
whose iteration reaches ``warmup + steps`` batches in this rank; when it gets there, every rank
writes its records, waits at a barrier, shuts its workers down and exits 0. **A screen**
(``plan.windows``) switches the training loader's iterator, in every rank at the same step, to
the next window's settings (docs/internals.md, "Screens").

The jobs are split: ``loaders`` (the DataLoader hooks, ``LoaderHooks``, which this class
completes), ``stepclock``, ``windows`` (``IteratorState``, ``Screen``, ``CeilingReplay``),
``gpu_steps`` (``GpuSide``), ``comm_meter``, ``process`` (what the rank says about itself and
how it leaves); this class wires them to the patched calls.
"""

from __future__ import annotations

import atexit
import os
import time
import weakref
from typing import Any, Optional

from ddp_profile.profiler.rank.comm_meter import CommMeter
from ddp_profile.profiler.rank.gpu_steps import GpuSide
from ddp_profile.profiler.rank.loaders import FLUSH_INTERVAL_NS, MAX_PENDING, LoaderHooks
from ddp_profile.profiler.rank.loading import loadcost
from ddp_profile.profiler.rank.loading.pagecache import FileReads
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
    Screen,
    shutdown_workers,
)
from ddp_profile.profiler.settings import ProbePlan
from ddp_profile.profiler.store.record import SCRIPT_EXIT, RankRecorder

STOP_BARRIER_TIMEOUT_S = 60.0


class Instrumentation(LoaderHooks):
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
        self.comm.in_step = self.in_step  # type: ignore[method-assign]
        self.worker_pids: tuple[int, ...] = ()  # the DataLoaders' own workers (rebound, not
        # mutated: the host sampler's thread reads it)
        self.context_written = False
        self.samplers: Any = None
        self.stopping = False
        self._flush_due = time.perf_counter_ns() + FLUSH_INTERVAL_NS  # the next flush, at the
        # latest (on the step clocks' clock)
        self._queue = self.recorder.queue  # what waits for it (``maybe_flush``)
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

    def maybe_flush(self) -> bool:
        """Every ``FLUSH_INTERVAL_NS``, or once ``MAX_PENDING`` records wait: the records (the
        steps' rows encoded here) appended to the rank's file. Whether it flushed."""
        if time.perf_counter_ns() < self._flush_due and len(self._queue) < MAX_PENDING:
            return False
        self.recorder.flush()
        self._flush_due = time.perf_counter_ns() + FLUSH_INTERVAL_NS
        return True

    # ---- the GPU side and the samplers ----------------------------------------------------
    def _cuda_found(self) -> None:
        """The script uses CUDA: its host syncs are counted from now on."""
        from ddp_profile.profiler.rank.patches.comm_calls import watch_host_syncs

        self.event("host_sync_watch", watched=watch_host_syncs(self))

    def _write_gpu_step(self, record: dict[str, Any]) -> None:
        record["rank"] = current_rank()
        self.recorder.write(record)

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
    def on_optimizer_step(self, *_: Any) -> None:
        """The optimizer step post hook (its optimizer, args and kwargs unused). The meter's
        count (``CommMeter.optimizer_stepped``) and the clock's mark
        (``StepClock.optimizer_stepped``) are made here, inline: one call a step, not three."""
        self.comm.step_opt += 1
        current = self.current
        if current is not None:
            if current._returned is not None:
                current._opt_done = current._clock()
            if self.gpu.live:
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

    def end_of_script(self) -> None:
        """The script is done: it exits, or destroys its default process group, after which
        a teardown can hang. Its final records, where it built a loader or took a batch."""
        if not self.stopping and self.recorder is not None \
                and (self.clocks or self.loader_count):
            self.finish(SCRIPT_EXIT)

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
    if _INSTALLED is not None:
        _INSTALLED.end_of_script()

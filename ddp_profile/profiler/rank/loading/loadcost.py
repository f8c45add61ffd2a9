"""What producing each batch costs, measured where the batch is made.

A DataLoader's fetcher turns one batch of indices into a batch: the dataset fetch and then
``collate_fn``. :class:`CostMeter` wraps a fetcher instance and times both, in wall time and in
the CPU time of the producing thread, and reads the thread's run-queue delay
(``clocks.RunQueueClock``) around the fetch: wall - CPU is the time the producer was off a CPU,
of which ``runq`` it sat runnable waiting for one (CPUs busy) and the rest blocked (storage,
network, sleep, a lock). In workers, the rank replaces the loader's ``worker_init_fn`` by a
picklable :class:`WorkerInit` that wraps the fetcher class's factory and then calls the
script's own; each worker appends one JSON line per batch to its own file under
``<probe_dir>/workers/``, flushed every ``FLUSH_S`` seconds and at exit. With
``num_workers=0`` the rank wraps its iterator's fetcher and writes to its own file. The
``batch_cost`` record's fields: docs/internals.md, "Per-rank records".
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import Any, Callable, Optional

from ddp_profile.profiler.rank.loading.clocks import GcClock, IoCounters, RunQueueClock, private_rss
from ddp_profile.profiler.rank.loading.pagecache import FileReads, watch
from ddp_profile.profiler.store.record import WORKER_DIR

FLUSH_S = 0.25
# Reading /proc/self/smaps_rollup walks every mapping (milliseconds of CPU in a process with
# torch): at every flush, many workers on few CPUs slowed the probe they measured; a worker's
# private memory changes slowly.
RSS_EVERY_S = 10.0
# ... and only worker 0 of a loader reads it, for all of them (forked from one rank, running one
# dataset, they hold about the same): read by every worker at its first flush, 3.8 ms each fell
# at once inside the first measured window (16 workers: 61 ms of CPU), and latency-bound windows
# ran 4-13 % faster in their second half than in their first.
RSS_WORKER = 0

_perf = time.perf_counter_ns
_cpu = time.thread_time_ns


def batch_size_of(batch: Any, default: int) -> int:
    """Number of samples in a batch: the leading dimension of its first tensor."""
    stack = [batch]
    while stack:
        item = stack.pop(0)
        shape = getattr(item, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return default


class CostMeter:
    """Times the fetch and the collate of each batch of one fetcher; ``emit(line)`` gets each
    batch's record as a JSON string (formatted here: no ``json.dumps`` per batch)."""

    def __init__(self, emit: Callable[[str], None], rank: Optional[int], loader_id: int,
                 worker: Optional[int], files: Optional[FileReads] = None):
        self.emit = emit
        self.files = files  # the files the fetches open (``pagecache``), where watched
        self.prefix = (f'{{"kind":"batch_cost","rank":{_json_int(rank)},'
                       f'"loader_id":{int(loader_id)},"worker":{_json_int(worker)},'
                       f'"pid":{os.getpid()},')
        self.files_prefix = self.prefix.replace('"kind":"batch_cost"', '"kind":"files"', 1)
        self.collate_wall = 0
        self.collate_cpu = 0
        self.gc = GcClock()
        self.runq = RunQueueClock()
        self.io = IoCounters()

    def wrap(self, fetcher: Any) -> Any:
        """Time ``fetcher.fetch`` and its ``collate_fn`` from now on; returns the fetcher."""
        fetch, collate = fetcher.fetch, fetcher.collate_fn
        meter = self

        def timed_collate(data: Any) -> Any:
            collected, wall, cpu = meter.gc(), _perf(), _cpu()
            try:
                return collate(data)
            finally:
                cpu, wall = _cpu() - cpu, _perf() - wall
                collected = meter.gc() - collected  # a collection is not the collate's
                meter.collate_wall += max(wall - collected, 0)
                meter.collate_cpu += max(cpu - collected, 0)

        def timed_fetch(index: Any) -> Any:
            meter.collate_wall = meter.collate_cpu = 0
            collected = meter.gc()
            wall = _perf()
            runq, io = meter.runq(), meter.io()
            cpu = _cpu()
            if meter.files is not None:
                meter.files.begin()
            try:
                batch = fetch(index)  # StopIteration and the dataset's errors pass through
            finally:
                cpu = _cpu() - cpu
                after, io_after = meter.runq(), meter.io()
                wall = _perf() - wall
                if meter.files is not None:
                    meter.files.end()
            runq = None if runq is None or after is None else after - runq
            read = None if io is None or io_after is None else \
                (io_after[0] - io[0], io_after[1] - io[1])
            meter.record(wall, cpu, runq, batch, index, read, meter.gc() - collected)
            return batch

        fetcher.collate_fn = timed_collate
        fetcher.fetch = timed_fetch
        return fetcher

    def record(self, wall_ns: int, cpu_ns: int, runq_ns: Optional[int], batch: Any,
               index: Any, read: Optional[tuple[int, int]] = None, gc_ns: int = 0) -> None:
        default = len(index) if isinstance(index, (list, tuple)) else 1
        runq = "null" if runq_ns is None else f"{runq_ns / 1e9:.9f}"
        io = "" if read is None else f',"read_b":{read[0]},"storage_b":{read[1]}'
        self.emit(f'{self.prefix}"t_ns":{time.time_ns()},"wall_s":{wall_ns / 1e9:.9f},'
                  f'"cpu_s":{cpu_ns / 1e9:.9f},"runq_s":{runq},'
                  f'"collate_s":{self.collate_wall / 1e9:.9f},'
                  f'"collate_cpu_s":{self.collate_cpu / 1e9:.9f},"gc_s":{gc_ns / 1e9:.9f},'
                  f'"samples":{batch_size_of(batch, default)}{io}}}')
        if self.files is not None and self.files.new:
            self.emit(f'{self.files_prefix}"paths":{json.dumps(self.files.take_new())}}}')


def _json_int(value: Optional[int]) -> str:
    return "null" if value is None else str(int(value))


class _WorkerFile:
    """A worker's append-only JSON-lines file, flushed every ``FLUSH_S`` and at exit; where
    ``reads_rss``, its private RSS is added to the record of a flush at most every
    ``RSS_EVERY_S``."""

    def __init__(self, path: str, reads_rss: bool = True):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.handle = open(path, "a", encoding="utf-8")
        self.last_flush = time.monotonic()
        self.last_rss = -RSS_EVERY_S if reads_rss else math.inf  # the first flush reads it

    def emit(self, line: str) -> None:
        now = time.monotonic()
        if now - self.last_flush >= FLUSH_S:
            if now - self.last_rss >= RSS_EVERY_S:
                self.last_rss = now
                rss = private_rss()
                if rss is not None and line.endswith("}"):
                    line = f'{line[:-1]},"private_rss":{rss}}}'
            self.handle.write(line + "\n")
            self.handle.flush()
            self.last_flush = now
        else:
            self.handle.write(line + "\n")

    def close(self) -> None:
        try:
            self.handle.close()
        except OSError:
            pass


class WorkerInit:
    """A DataLoader ``worker_init_fn`` that meters the worker's batches, then runs the
    script's own ``worker_init_fn`` (picklable: spawned workers get a copy)."""

    def __init__(self, original: Optional[Callable[[int], Any]], out_dir: str, loader_id: int,
                 cold: bool = False):
        self.original = original
        self.out_dir = out_dir
        self.loader_id = loader_id
        self.cold = cold  # drop each file read from the page cache after use (``pagecache``)
        self.rank: Optional[int] = None  # set by the rank when it starts an iterator

    def __call__(self, worker_id: int) -> Any:
        try:
            self._install(worker_id)
        except Exception:  # noqa: BLE001 - metering must never break the worker
            pass
        if self.original is not None:
            return self.original(worker_id)
        return None

    def _install(self, worker_id: int) -> None:
        import multiprocessing.util

        from torch.utils.data import _DatasetKind

        name = f"r{_json_int(self.rank)}-l{self.loader_id}-w{worker_id}-p{os.getpid()}.jsonl"
        reads_rss = worker_id == RSS_WORKER
        sink = _WorkerFile(os.path.join(self.out_dir, WORKER_DIR, name), reads_rss=reads_rss)
        rss = private_rss() if reads_rss else None
        sink.emit(f'{{"kind":"worker_start","rank":{_json_int(self.rank)},'
                  f'"loader_id":{self.loader_id},"worker":{worker_id},"pid":{os.getpid()},'
                  f'"t_ns":{time.time_ns()},"private_rss":{_json_int(rss)}}}')
        sink.handle.flush()
        meter = CostMeter(sink.emit, self.rank, self.loader_id, worker_id,
                          watch(FileReads(self.cold)))
        factory = _DatasetKind.__dict__["create_fetcher"].__func__

        def create_fetcher(*args: Any, **kwargs: Any) -> Any:
            return meter.wrap(factory(*args, **kwargs))

        _DatasetKind.create_fetcher = staticmethod(create_fetcher)  # this worker only
        multiprocessing.util.Finalize(sink, sink.close, exitpriority=100)


def meter_loader(loader: Any, out_dir: str, loader_id: int) -> None:
    """Give ``loader`` a metering ``worker_init_fn`` (idempotent)."""
    current = getattr(loader, "worker_init_fn", None)
    if not isinstance(current, WorkerInit):
        loader.worker_init_fn = WorkerInit(current, out_dir, loader_id)


def before_iter(loader: Any, rank: Optional[int]) -> None:
    """Tell the loader's ``WorkerInit`` the rank before its workers start."""
    current = getattr(loader, "worker_init_fn", None)
    if isinstance(current, WorkerInit):
        current.rank = rank


def meter_in_process(iterator: Any, emit: Callable[[str], None], rank: Optional[int],
                     loader_id: int, files: Optional[FileReads] = None) -> None:
    """Meter a single-process (``num_workers=0``) iterator's fetcher, if it has one; ``files``:
    the rank's watch on the files its fetches open."""
    fetcher = getattr(iterator, "_dataset_fetcher", None)
    if fetcher is not None and not getattr(fetcher, "_ddp_profile_metered", False):
        CostMeter(emit, rank, loader_id, None, files).wrap(fetcher)
        fetcher._ddp_profile_metered = True


class PinMeter:
    """Times the pinning of each batch (``pin_memory=True`` on an accelerator): in the
    loader's pin-memory thread with workers, in the loop's own thread without. One thread per
    rank pins every batch, so its time per sample bounds the loader whatever the workers do.

    Record (``kind: "pin_cost"``): rank, loader_id, thread ("pin" or "main"), t_ns (the end),
    wall_s, cpu_s (that thread's CPU time), samples. The wrapped function recurses into
    containers by its module name; only the outermost call of a thread is timed.
    """

    def __init__(self, emit: Callable[[str], None], rank_of: Callable[[], Optional[int]]):
        self.emit = emit
        self.rank_of = rank_of
        self.threads: dict[int, int] = {}  # pin-memory thread ident -> loader id
        self.fetching: Optional[int] = None  # the loader the loop is taking a batch from
        self._local = threading.local()

    def track(self, iterator: Any, loader_id: int) -> None:
        """Remember which loader ``iterator``'s pin-memory thread (if any) pins for."""
        thread = getattr(iterator, "_pin_memory_thread", None)
        if thread is not None and thread.ident is not None:
            self.threads[thread.ident] = loader_id

    def wrap(self, pin: Callable[..., Any]) -> Callable[..., Any]:
        meter = self

        def pin_memory(data: Any, *args: Any, **kwargs: Any) -> Any:
            local = meter._local
            if getattr(local, "busy", False):
                return pin(data, *args, **kwargs)
            local.busy = True
            wall, cpu = _perf(), _cpu()
            try:
                return pin(data, *args, **kwargs)
            finally:
                local.busy = False
                meter.record(_perf() - wall, _cpu() - cpu, data)

        pin_memory.__wrapped__ = pin  # type: ignore[attr-defined]
        return pin_memory

    def record(self, wall_ns: int, cpu_ns: int, data: Any) -> None:
        try:
            loader_id = self.threads.get(threading.get_ident())
            thread = "pin" if loader_id is not None else "main"
            if loader_id is None:
                loader_id = self.fetching
            self.emit(f'{{"kind":"pin_cost","rank":{_json_int(self.rank_of())},'
                      f'"loader_id":{_json_int(loader_id)},"thread":"{thread}",'
                      f'"t_ns":{time.time_ns()},"wall_s":{wall_ns / 1e9:.9f},'
                      f'"cpu_s":{cpu_ns / 1e9:.9f},"samples":{batch_size_of(data, 0)}}}')
        except Exception:  # noqa: BLE001 - metering must never break the pinning
            pass

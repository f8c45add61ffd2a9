"""What producing each batch costs, measured where the batch is made.

A DataLoader's fetcher turns one batch of indices into a batch: the dataset fetch and then
``collate_fn``. :class:`CostMeter` wraps a fetcher instance and times both, in wall time and in
the CPU time of the producing thread, and reads the thread's run-queue delay
(``clocks.RunQueueClock``) around the fetch: wall - CPU is the time the producer was off a CPU,
of which ``runq`` it sat runnable waiting for one (CPUs busy) and the rest blocked (storage,
network, sleep, a lock). In workers, the rank replaces the loader's ``worker_init_fn`` by a
picklable :class:`WorkerInit` that wraps the fetcher class's factory and then calls the
script's own; each worker appends one JSON line per metered batch (a producer's first
ones, then one in four: ``sampling``) to its own file under ``<probe_dir>/workers/``,
flushed every ``FLUSH_S`` seconds and at exit. With ``num_workers=0`` the rank wraps its
iterator's fetcher and writes to its own file. The ``batch_cost`` record's fields:
docs/internals.md, "Per-rank records".
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import Any, Callable, Optional

from ddp_profile.profiler.rank.loading import clocks, pagecache, sampling
from ddp_profile.profiler.rank.loading.clocks import (
    SHORT_NS,
    GcClock,
    IoCounters,
    RunQueueClock,
    private_rss,
    runq_delta,
)
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
get_ident = threading.get_ident


_PAIRS = (tuple, list)


def batch_size_of(batch: Any, default: int) -> int:
    """Number of samples in a batch: the leading dimension of its first tensor."""
    if batch.__class__ in _PAIRS and batch:  # the common (inputs, targets): at once
        shape = getattr(batch[0], "shape", None)
        if shape:
            return int(shape[0])
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
    """Times the fetch and the collate of each batch of one fetcher; ``emit(row)`` gets each
    batch's record as a row (a tuple whose first item encodes it: ``encode_row``), turned into
    its JSON line off the loop's path, where the sink flushes (no ``json.dumps`` per batch)."""

    def __init__(self, emit: Callable[[tuple], None], rank: Optional[int], loader_id: int,
                 worker: Optional[int], files: Optional[FileReads] = None):
        self.emit = emit
        self.files = files  # the files the fetches open (``pagecache``), where watched
        self.prefix = (f'{{"kind":"batch_cost","rank":{_json_int(rank)},'
                       f'"loader_id":{int(loader_id)},"worker":{_json_int(worker)},'
                       f'"pid":{os.getpid()},')
        self.files_prefix = self.prefix.replace('"kind":"batch_cost"', '"kind":"files"', 1)
        self.collate_start: Optional[tuple[int, int, int]] = None  # (gc, wall, cpu) ns
        # the loop's own run-queue reading at this batch's ``__next__``, where nothing ran
        # since (``rank.loaders``): the fetch's start, read once
        self.runq_start: Any = None  # (a number: ``rank.loaders``' clock parses it)
        self.batches = 0  # fetches begun (which are metered: ``sampling``)
        self.worker, self.in_loop = worker, worker is None  # the loop's own thread takes
        self.made: Any = None  # the batch the last fetch made, and its size (or -1: none
        self.made_samples = -1  # found), kept until the loop takes it
        self.gc = GcClock()
        self.runq = RunQueueClock()
        self.io = IoCounters()
        self._local = threading.local()  # the producing thread's descriptors

    def _descriptors(self) -> tuple[int, Optional[int], Optional[int], int]:
        """(fork count, run-queue descriptor, io descriptor, ident) of the calling thread."""
        fds = self._local.fds = (clocks.fork_count, self.runq.fd(), self.io.fd(), get_ident())
        return fds

    def wrap(self, fetcher: Any) -> Any:
        """Time ``fetcher.fetch`` and its ``collate_fn`` from now on; returns the fetcher.

        The collate's end is the fetch's: torch's fetchers call ``collate_fn`` once, last; the
        timed collate is the fetcher's for a metered fetch alone (any other calls its own). The
        thread's counters are read with ``os.pread`` on its kept descriptors (``clocks``),
        kept as read and parsed where the row is encoded; the row keeps the readings, and
        the differences are taken there too (``_batch_line``). Only some fetches are
        metered (``sampling``); every fetch's opened files are watched (``pagecache``)."""
        fetch, collate = fetcher.fetch, fetcher.collate_fn
        meter, local, collected_ns = self, self._local, GcClock._total.get
        runq_size, io_size, pread = RunQueueClock.SIZE, IoCounters.SIZE, os.pread
        fetching = pagecache.FETCHING
        meter_first, io_first = sampling.METER_FIRST, sampling.IO_FIRST
        metered, io_read = sampling.masks(self.worker)  # which fetches: ``sampling``
        wrap = sampling.PERIOD - 1  # a power of two: ``n & wrap`` is ``n % PERIOD``

        def timed_collate(data: Any) -> Any:  # a metered fetch's (``timed_fetch``)
            meter.collate_start = (collected_ns(get_ident(), 0), _perf(), _cpu())
            return collate(data)

        def timed_fetch(index: Any) -> Any:
            files, n = meter.files, meter.batches
            meter.batches = n + 1
            if n >= meter_first and not metered[n & wrap]:  # not metered: no clock read, the
                # script's own collate, and no reading left for a later record
                meter.runq_start = meter.collate_start = None
                if files is None:
                    return fetch(index)
                ident = get_ident()  # its files watched as every fetch's are (see below)
                fetching[ident] = files
                try:
                    batch = fetch(index)
                finally:
                    fetching.pop(ident, None)
                    if files.opens:
                        files.end(ident)
                if files.new:
                    meter.emit((_files_line, meter.files_prefix, files.take_new()))
                return batch
            runq_before = meter.runq_start
            meter.runq_start = meter.collate_start = None
            fds = getattr(local, "fds", None)
            if fds is None or fds[0] != clocks.fork_count:
                fds = meter._descriptors()
            _, runq_fd, io_fd, ident = fds
            if n >= io_first and not io_read[n & wrap]:
                io_fd = None
            collected = collected_ns(ident, 0)
            wall = _perf()
            try:
                if runq_before is None and runq_fd is not None:
                    runq_before = pread(runq_fd, runq_size, 0)
                io_before = pread(io_fd, io_size, 0) if io_fd is not None else None
            except OSError:
                runq_before = io_before = None
            cpu = _cpu()
            if files is not None:  # ``files.begin``: its opens are empty since its ``end``
                fetching[ident] = files
            fetcher.collate_fn = timed_collate
            try:
                batch = fetch(index)  # StopIteration and the dataset's errors pass through
            finally:
                cpu_end = _cpu()
                collated = _perf()
                try:
                    runq_after = pread(runq_fd, runq_size, 0) if runq_fd is not None else None
                    io_after = pread(io_fd, io_size, 0) if io_fd is not None else None
                except OSError:
                    runq_after = io_after = None
                wall_end = _perf()
                fetcher.collate_fn = collate
                if files is not None:  # ``files.end``, where the fetch opened any file
                    fetching.pop(ident, None)
                    if files.opens:
                        files.end(ident)
            samples = -1  # ``batch_size_of``: its common case, inline; any other, by it
            if batch.__class__ in _PAIRS and batch:
                shape = getattr(batch[0], "shape", None)
                if shape:
                    samples = int(shape[0])
            if samples < 0:
                samples = batch_size_of(batch, -1)
            if meter.in_loop:  # its size, for the step that takes it (``rank.loaders``)
                meter.made, meter.made_samples = batch, samples
            if samples < 0:  # no tensor in the batch: its indices say
                samples = len(index) if isinstance(index, (list, tuple)) else 1
            meter.emit((_batch_line, meter.prefix, time.time_ns(), wall, wall_end, cpu,
                        cpu_end, runq_before, runq_after, meter.collate_start, collated,
                        collected, collected_ns(ident, 0), samples, io_before, io_after))
            if files is not None and files.new:
                meter.emit((_files_line, meter.files_prefix, files.take_new()))
            return batch

        fetcher.fetch = timed_fetch
        return fetcher


_BATCH = ('%s"t_ns":%d,"wall_s":%.9f,"cpu_s":%.9f,"runq_s":%.9f,"collate_s":%.9f,'
          '"collate_cpu_s":%.9f,"gc_s":%.9f,"samples":%d%s}')
_BATCH_UNQUEUED = _BATCH.replace('"runq_s":%.9f', '"runq_s":null%s')  # its run queue unread
# every time under ``clocks.SHORT_NS``: written from its nanoseconds (the same text)
_BATCH_SHORT = _BATCH.replace("%.9f", "0.%09d")


def _batch_line(row: tuple, _rank: Any = None) -> str:
    """A ``batch_cost`` row's JSON line (``CostMeter``): the differences of its readings.
    A collection is not the collate's: the time in one since the collate began is taken
    out of the collate's."""
    (_, prefix, t_ns, wall, wall_end, cpu, cpu_end, runq_before, runq_after, collate_start,
     collated, collected, gc_end, samples, io_before, io_after) = row
    collate_wall = collate_cpu = 0
    if collate_start is not None:
        in_gc = gc_end - collate_start[0]
        collate_wall = collated - collate_start[1] - in_gc
        collate_cpu = cpu_end - collate_start[2] - in_gc
        if collate_wall < 0:
            collate_wall = 0
        if collate_cpu < 0:
            collate_cpu = 0
    io = ""
    if io_after is not None:  # read on some batches only (``sampling``)
        read_before, read_after = IoCounters.parse(io_before), IoCounters.parse(io_after)
        if read_before is not None and read_after is not None:
            io = ',"read_b":%d,"storage_b":%d' % (read_after[0] - read_before[0],
                                                   read_after[1] - read_before[1])
    if runq_before.__class__ is int and runq_after.__class__ is bytes:  # ``runq_delta``,
        try:  # its common case inline: the step boundary's reading, parsed, and the fetch's
            runq = int(runq_after.split(b" ", 2)[1]) - runq_before
        except (ValueError, IndexError):
            runq = None
    else:
        runq = runq_delta(runq_before, runq_after)
    if runq is not None:
        wall_ns, cpu_ns, gc_ns = wall_end - wall, cpu_end - cpu, gc_end - collected
        if 0 <= (wall_ns | cpu_ns | runq | collate_wall | collate_cpu | gc_ns) < SHORT_NS:
            return _BATCH_SHORT % (prefix, t_ns, wall_ns, cpu_ns, runq, collate_wall,
                                   collate_cpu, gc_ns, samples, io)
    return (_BATCH if runq is not None else _BATCH_UNQUEUED) % (
        prefix, t_ns, (wall_end - wall) / 1e9, (cpu_end - cpu) / 1e9,
        "" if runq is None else runq / 1e9, collate_wall / 1e9, collate_cpu / 1e9,
        (gc_end - collected) / 1e9, samples, io)


_BATCH_KIND = '{"kind":"batch_cost"'  # a batch record's line begins so


def _files_line(row: tuple, _rank: Any = None) -> str:
    return f'{row[1]}"paths":{json.dumps(row[2])}}}'


def encode_row(row: Any, rank: Any = None) -> str:
    """A record's JSON line: a line as it is, a row (``CostMeter``'s) by its encoder."""
    return row if isinstance(row, str) else row[0](row, rank)


def _json_int(value: Optional[int]) -> str:
    return "null" if value is None else str(int(value))


class _WorkerFile:
    """A worker's append-only JSON-lines file: its records (lines, or ``CostMeter``'s rows)
    kept, encoded and written every ``FLUSH_S`` and at exit; where ``reads_rss``, its private
    RSS is added to the last record of a flush at most every ``RSS_EVERY_S``."""

    def __init__(self, path: str, reads_rss: bool = True):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.handle = open(path, "a", encoding="utf-8")
        self.pending: list[Any] = []
        self.last_flush = time.monotonic()
        self.last_rss = -RSS_EVERY_S if reads_rss else math.inf  # the first flush reads it

    def emit(self, line: Any) -> None:
        self.pending.append(line)
        now = time.monotonic()
        if now - self.last_flush >= FLUSH_S:
            self.flush(now)

    def flush(self, now: Optional[float] = None, rss_due: bool = True) -> None:
        now = time.monotonic() if now is None else now
        pending, self.pending = self.pending, []
        lines = [encode_row(row) for row in pending]
        if lines and rss_due and now - self.last_rss >= RSS_EVERY_S:
            # on the last batch record (a ``files`` one may follow it, or be alone: unread)
            last = next((n for n in range(len(lines) - 1, -1, -1)
                         if lines[n].startswith(_BATCH_KIND)), None)
            if last is not None:
                self.last_rss = now
                rss = private_rss()
                if rss is not None and lines[last].endswith("}"):
                    lines[last] = f'{lines[last][:-1]},"private_rss":{rss}}}'
        if lines:
            self.handle.write("\n".join(lines) + "\n")
        self.handle.flush()
        self.last_flush = now

    def close(self) -> None:
        try:
            self.flush(rss_due=False)
            self.handle.close()
        except (OSError, ValueError):  # ValueError: closed already
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
        sink.flush(rss_due=False)
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


def meter_in_process(iterator: Any, emit: Callable[[tuple], None], rank: Optional[int],
                     loader_id: int, files: Optional[FileReads] = None) -> Optional[CostMeter]:
    """Meter a single-process (``num_workers=0``) iterator's fetcher, if it has one (its
    meter; None where it has no fetcher); ``files``: the rank's watch on the files its
    fetches open."""
    fetcher = getattr(iterator, "_dataset_fetcher", None)
    if fetcher is None:
        return None
    meter = getattr(fetcher, "_ddp_profile_meter", None)
    if meter is None:
        meter = CostMeter(emit, rank, loader_id, None, files)
        meter.wrap(fetcher)
        fetcher._ddp_profile_meter = meter
    return meter


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

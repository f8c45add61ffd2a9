"""Per-batch cost where the batch is made: real DataLoaders, real worker processes."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data._utils import pin_memory as pin_memory_module

from ddp_profile.profiler.rank import facts, patches
from ddp_profile.profiler.rank.instrument import Instrumentation
from ddp_profile.profiler.rank.loading import clocks, loadcost, sampling
from ddp_profile.profiler.settings import ProbePlan
from ddp_profile.profiler.store.probedir import read_probe_dir
from tests.conftest import REPO


class Costly(Dataset):
    """Each item sleeps ``sleep_s`` and spins ``spin_s`` of CPU; item ``die_at`` kills its
    worker (as the OOM killer would)."""

    def __init__(self, n: int, sleep_s: float = 0.0, spin_s: float = 0.0, die_at: int = -1):
        self.n, self.sleep_s, self.spin_s, self.die_at = n, sleep_s, spin_s, die_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.die_at:
            os._exit(9)
        time.sleep(self.sleep_s)
        end = time.thread_time() + self.spin_s
        while time.thread_time() < end:
            pass
        return torch.full((4,), float(index))


def _metered(n: int) -> bool:
    """Whether the loop's or worker 0's ``n``-th fetch (from 0) is metered."""
    return sampling.is_metered(n, None)


def _worker_init_called(worker_id: int) -> None:
    os.environ["LOADCOST_TEST_INIT"] = str(worker_id)


@contextlib.contextmanager
def patched(tmp_path) -> Iterator[Instrumentation]:
    """A rank's patches on in this process, writing its records under ``tmp_path``; off, and
    every record flushed, after."""
    instr = Instrumentation(ProbePlan(probe_id="t", out_dir=str(tmp_path), warmup=0,
                                      steps=10 ** 9))
    patches.apply(instr)
    try:
        yield instr
    finally:
        if instr.samplers is not None:
            instr.samplers.stop()
        patches.remove()
        instr.recorder.close()


def step_and_cost_samples(tmp_path, make_loaders: Callable[[], list]) -> tuple[dict, dict]:
    """(the steps' samples, the batch records' samples) of each loader, by loader id, each
    loader made under the patches and run through once."""
    with patched(tmp_path) as instr:
        loaders = make_loaders()
        for loader in loaders:
            for _ in loader:
                pass
    records = [json.loads(line) for line in open(instr.recorder.path)]
    return tuple({loader: [r["samples"] for r in records
                           if r["kind"] == kind and r["loader_id"] == loader]
                  for loader in range(len(loaders))} for kind in ("step", "batch_cost"))


def _run(tmp_path, loader_kwargs: dict, dataset: Dataset) -> list:
    with patched(tmp_path):
        batches = []
        try:
            for batch in DataLoader(dataset, **loader_kwargs):
                batches.append(batch)
        except RuntimeError:
            pass  # a killed worker
    (data,) = read_probe_dir(str(tmp_path))
    return sorted(data.batch_costs, key=lambda r: r["t_ns"])


SPAWNED = """
import sys
from tests.profiler.rank.test_loadcost import Costly, _run
_run(sys.argv[1], {"batch_size": 4, "num_workers": 2, "multiprocessing_context": "spawn"},
     Costly(24, sleep_s=0.004, spin_s=0.002))
"""


@pytest.mark.parametrize("workers,context", [(0, None), (2, "fork"), (2, "spawn")])
def test_each_batch_is_timed_where_it_is_made(tmp_path, workers, context):
    if context == "spawn":  # in a child process: spawn leaves a resource tracker behind
        subprocess.run([sys.executable, "-c", SPAWNED, str(tmp_path)], check=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": REPO})
        (data,) = read_probe_dir(str(tmp_path))
        records = data.batch_costs
    else:
        kwargs = {"batch_size": 4, "num_workers": workers, "multiprocessing_context": context}
        records = _run(tmp_path, kwargs, Costly(24, sleep_s=0.004, spin_s=0.002))
    assert len(records) == 6
    assert {r["worker"] for r in records} == ({None} if workers == 0 else {0, 1})
    for record in records:
        assert record["samples"] == 4
        assert record["loader_id"] == 0
        # 4 samples: 16 ms asleep, 8 ms of CPU (spun on the thread's own CPU clock)
        assert 0.0075 <= record["cpu_s"] <= 0.02, record
        # off the CPU: the sleep, plus any time the worker sat runnable on this busy machine
        assert 0.014 <= record["wall_s"] - record["cpu_s"] <= 0.5, record
        # the runnable part apart (this Linux keeps scheduler statistics): blocked = the sleep
        # (a shared VM once read 13.5 ms of the 16 asleep: its clocks are not exact)
        runq = record["runq_s"]
        assert 0 <= runq <= record["wall_s"] - record["cpu_s"], record
        assert 0.012 <= record["wall_s"] - record["cpu_s"] - runq <= 0.1, record
        assert 0 <= record["collate_s"] < record["wall_s"]


def test_the_scripts_worker_init_fn_still_runs(tmp_path):
    seen = []

    class Probe(Costly):
        def __getitem__(self, index: int) -> torch.Tensor:
            seen.append(os.environ.get("LOADCOST_TEST_INIT"))
            return super().__getitem__(index)

    records = _run(tmp_path, {"batch_size": 2, "num_workers": 1,
                              "worker_init_fn": _worker_init_called}, Probe(4))
    assert len(records) == 2
    # the dataset ran in the worker: its environment had the script's init; here, nothing
    assert seen == [] and "LOADCOST_TEST_INIT" not in os.environ


def test_a_worker_that_dies_keeps_the_batches_it_flushed(tmp_path):
    # one worker; each batch takes 0.1 s; the 9th item kills it after ~0.8 s of batches
    records = _run(tmp_path, {"batch_size": 2, "num_workers": 1},
                   Costly(40, sleep_s=0.05, die_at=9))
    assert 2 <= len(records) <= 4, records
    files = os.listdir(tmp_path / "workers")
    assert len(files) == 1 and files[0].startswith("rnull-l0-w0-")


def test_worker_0_alone_reads_its_private_rss_for_the_loader(tmp_path):
    # each read walks every mapping (3.8 ms with torch loaded): all workers reading at once
    # fell inside the first measured window
    _run(tmp_path, {"batch_size": 4, "num_workers": 3, "multiprocessing_context": "fork"},
         Costly(24, sleep_s=0.001))
    (data,) = read_probe_dir(str(tmp_path))
    starts = {r["worker"]: r.get("private_rss") for r in data.worker_starts}
    assert set(starts) == {0, 1, 2}
    assert starts[0] > 0 and starts[1] is None and starts[2] is None
    assert not any(r.get("private_rss") for r in data.batch_costs if r["worker"] != 0)




GC_CPU_S: list = []  # the thread CPU time of each collection in ``_collate_collecting``


def _collate_collecting(batch: list) -> torch.Tensor:
    """A collate of 4 small tensors in which a full garbage collection falls (its CPU time
    kept in ``GC_CPU_S``)."""
    start = time.thread_time()
    gc.collect()
    GC_CPU_S.append(time.thread_time() - start)
    return torch.stack(batch)


def test_a_garbage_collection_in_the_collate_is_not_the_collates_cost(tmp_path):
    # a full collection lands where an allocation crosses a threshold: in a collate of 0.1 ms
    # it once made the collate read as most of a sample's cost (150 ms of 64 samples)
    GC_CPU_S.clear()
    heap = [(i, [i]) for i in range(300_000)]  # a large heap for a full collection to walk
    records = _run(tmp_path, {"batch_size": 4, "collate_fn": _collate_collecting}, Costly(8))
    assert len(records) == 2 and len(GC_CPU_S) == 2
    for record, gc_cpu_s in zip(records, GC_CPU_S):
        assert record["gc_s"] >= 0.01, record  # a full collection over heap's 600,000 objects
        assert record["collate_cpu_s"] < record["gc_s"] / 5, record
        assert record["collate_s"] < record["gc_s"] / 5, record
        # still the producer's CPU: the collection's own CPU time, read beside it (gc_s is wall
        # time: a busy machine can preempt the collector)
        assert record["cpu_s"] >= gc_cpu_s * 0.95, (record, gc_cpu_s)
    del heap


def test_private_rss_and_memory_available_are_read():
    assert clocks.private_rss() > 0
    assert facts.memory_available() > 0


def test_a_workers_private_rss_is_read_at_its_first_flush_then_seldom(tmp_path, monkeypatch):
    # reading it walks every mapping (ms of CPU): at every 0.25 s flush it cost 16 workers on
    # 2 CPUs 12 % of the CPUs
    now = [100.0]
    monkeypatch.setattr(loadcost.time, "monotonic", lambda: now[0])
    reads = []
    monkeypatch.setattr(loadcost, "private_rss", lambda: reads.append(now[0]) or 4096)
    sink = loadcost._WorkerFile(str(tmp_path / "w" / "f.jsonl"))
    for _ in range(200):  # 0.1 s a batch: 20 s, 80 flushes
        now[0] += 0.1
        sink.emit('{"kind":"batch_cost"}')
    sink.close()
    lines = (tmp_path / "w" / "f.jsonl").read_text().splitlines()
    with_rss = [line for line in lines if "private_rss" in line]
    assert len(reads) == len(with_rss) == 2  # the first flush (0.3 s), then 10 s later
    assert reads[1] - reads[0] >= loadcost.RSS_EVERY_S
    # the loader's other workers never read it: all of them at once fell inside the window
    other = loadcost._WorkerFile(str(tmp_path / "w" / "g.jsonl"), reads_rss=False)
    for _ in range(200):
        now[0] += 0.1
        other.emit('{"kind":"batch_cost"}')
    other.close()
    assert len(reads) == 2 and "private_rss" not in (tmp_path / "w" / "g.jsonl").read_text()


# ---- the run-queue clock -------------------------------------------------------------------

def _target(clock: clocks.RunQueueClock) -> str:
    """The file the calling thread's kept descriptor reads."""
    clock()
    return os.readlink(f"/proc/self/fd/{clock._local.state[1]}")


def test_run_queue_clock_reads_the_calling_threads_own_schedstat():
    if clocks.RunQueueClock()() is None:
        pytest.skip("no /proc/thread-self/schedstat with scheduler statistics here")
    clock = clocks.RunQueueClock()
    before = clock()
    with open(clocks.SCHEDSTAT, "rb") as handle:
        direct = int(handle.read().split()[1])
    assert before <= direct <= clock()
    here = f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat"
    assert _target(clock) == here
    seen = []
    thread = threading.Thread(target=lambda: seen.append(
        (_target(clock), threading.get_native_id())))
    thread.start()
    thread.join()
    assert seen == [(f"/proc/{os.getpid()}/task/{seen[0][1]}/schedstat", seen[0][1])]
    assert seen[0][1] != threading.get_native_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a forked child reopens: the inherited descriptor names the parent's thread
        os.write(write, _target(clock).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 200).decode() == f"/proc/{pid}/task/{pid}/schedstat"
    assert _target(clock) == here


@pytest.mark.parametrize("content,expected", [(b"123 456 7\n", 456), (b"0 0 0\n", None),
                                              (b"garbage\n", None)])
def test_run_queue_clock_without_scheduler_statistics(tmp_path, content, expected):
    path = tmp_path / "schedstat"
    path.write_bytes(content)
    assert clocks.RunQueueClock(str(path))() == expected
    assert clocks.RunQueueClock(str(tmp_path / "missing"))() is None  # not Linux


def test_a_batch_without_the_clock_records_runq_null():
    lines = []
    meter = loadcost.CostMeter(lines.append, 0, 0, None)
    meter.runq = clocks.RunQueueClock("/nonexistent/schedstat")

    class Fetcher:
        collate_fn = staticmethod(torch.stack)

        def fetch(self, index):
            return self.collate_fn([torch.zeros(2) for _ in index])

    meter.wrap(Fetcher()).fetch([0, 1])
    record = json.loads(loadcost.encode_row(lines[0]))  # the row, as the flush encodes it
    assert record["runq_s"] is None and record["samples"] == 2 and record["cpu_s"] >= 0


def test_a_batch_rows_differences_are_taken_at_the_flush_and_a_collection_is_not_the_collates():
    """The loop keeps the meter's readings; the line made at the flush has their differences,
    the time in a garbage collection since the collate began taken out of the collate's."""
    prefix = '{"kind":"batch_cost","rank":0,"loader_id":0,"worker":null,"pid":1,'
    row = (loadcost._batch_line, prefix, 7, 1_000, 31_000, 500, 20_500, 5, 6,
           (2_000, 11_000, 8_500), 29_000, 1_000, 5_000, 4, None, None)
    record = json.loads(loadcost.encode_row(row))
    assert record["wall_s"] == pytest.approx(30e-6) and record["cpu_s"] == pytest.approx(20e-6)
    assert record["gc_s"] == pytest.approx(4e-6)  # 1_000 -> 5_000 collected in the fetch
    # collate: 11_000 -> 29_000 wall, 8_500 -> 20_500 CPU, 3_000 of each in a collection
    assert record["collate_s"] == pytest.approx(15e-6)
    assert record["collate_cpu_s"] == pytest.approx(9e-6)
    assert record["runq_s"] == pytest.approx(1e-9) and record["samples"] == 4
    assert "read_b" not in record
    no_collate = row[:9] + (None,) + row[10:]
    assert json.loads(loadcost.encode_row(no_collate))["collate_s"] == 0


def test_a_step_takes_its_samples_from_the_meter_and_the_loaders_batch_size_without_tensors(
        tmp_path):
    """In-process loading: the step's size is read once, by the meter; a batch with no tensor
    is the loader's ``batch_size`` for the step (as before), its indices for the meter."""
    words = [f"w{i}" for i in range(10)]
    steps, costs = step_and_cost_samples(tmp_path, lambda: [
        DataLoader(torch.arange(10.0), batch_size=4),
        DataLoader(words, batch_size=4, collate_fn=list)])
    assert steps[0] == [4, 4, 2] and costs[0] == [4, 4, 2]
    assert steps[1] == [4, 4, 4] and costs[1] == [4, 4, 2]

    # a batch the loop gets as another object (pinned, in a CUDA run) is sized apart, and
    # the meter's own is never held past its step
    real = pin_memory_module.pin_memory
    pin_memory_module.pin_memory = lambda data, device=None: [t.clone() for t in data]
    try:
        with patched(tmp_path / "pinned"):
            iterator = iter(DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4))
            iterator._pin_memory = True
            taken = next(iterator)
            assert iterator._ddp_profile_state.meter.made is None and taken[0].shape[0] == 4
    finally:
        pin_memory_module.pin_memory = real


class Files(Dataset):
    """Item i reads file i % len(paths) whole, as a one-file-per-sample dataset does."""

    def __init__(self, paths: list, n: int):
        self.paths, self.n = paths, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        with open(self.paths[index % len(self.paths)], "rb") as handle:
            return torch.tensor(len(handle.read()))


def _cold_files(directory, count: int, size: int) -> list:
    paths = []
    for i in range(count):
        path = os.path.join(str(directory), f"sample-{i}.bin")
        with open(path, "wb") as handle:
            handle.write(os.urandom(size))
            handle.flush()
            os.fsync(handle.fileno())
        paths.append(path)
    for path in paths:  # out of the page cache: the next read comes from storage
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    return paths


@pytest.mark.parametrize("workers", [0, 1])
def test_bytes_read_and_bytes_from_storage_are_counted_on_sampled_batches(tmp_path, workers):
    """8 files of 64 KiB dropped from the page cache, read in batches of 4, over and over: the
    producer's first batches and one in eight after (``sampling``) carry their bytes read
    (all of them metered batches), the others none; the first pass comes from storage,
    the later ones from the page cache (on a filesystem that reads through the page cache;
    tmpfs never counts storage reads)."""
    data = tmp_path / "data"
    data.mkdir()
    paths = _cold_files(data, 8, 64 * 1024)
    batches = sampling.IO_FIRST + 17
    records = _run(tmp_path / "probe", {"batch_size": 4, "num_workers": workers},
                   Files(paths, 4 * batches))
    metered = [n for n in range(batches) if _metered(n)]
    assert len(records) == len(metered) < batches
    carried = [metered[k] for k, r in enumerate(records) if "read_b" in r]
    assert carried == [n for n in range(batches) if sampling.reads_io(n, None)], carried
    assert len(carried) < batches
    sampled = [r for r in records if "read_b" in r]
    assert all(r["read_b"] >= 4 * 64 * 1024 and "storage_b" in r for r in sampled), sampled
    first, later = sampled[:2], sampled[2:]
    if sum(r["storage_b"] for r in first) == 0:
        pytest.skip("this filesystem reads nothing from storage (tmpfs?)")
    assert sum(r["storage_b"] for r in first) >= 0.9 * 8 * 64 * 1024
    assert all(r["storage_b"] < 4096 for r in later), later


@pytest.mark.parametrize("before, after, expected", [
    (b"900 1000 3\n", b"950 4000 4\n", 3000),  # two raw readings: parsed where encoded
    (1000, 4000, 3000), (1000, b"950 4000 4\n", 3000),  # numbers, or one of each (a step
    (b"900 1000 3\n", 4000, 3000),  # boundary's reading is parsed as it is read)
    (None, b"950 4000 4\n", None), (b"900 1000 3\n", None, None),  # one unread: unknown
    (b"900 1000 3\n", b"torn", None), (b"x y z", b"950 4000 4\n", None),  # unparsable
])
def test_the_run_queue_between_two_readings_is_unknown_where_either_is(before, after, expected):
    assert clocks.runq_delta(before, after) == expected


def test_a_batch_lines_run_queue_is_the_difference_of_its_raw_readings_or_null():
    prefix = '{"kind":"batch_cost","rank":0,"loader_id":0,"worker":null,"pid":1,'
    row = (loadcost._batch_line, prefix, 7, 1_000, 31_000, 500, 20_500, b"0 2000 1\n",
           b"0 9000 2\n", None, 29_000, 1_000, 1_000, 4, None, None)
    record = json.loads(loadcost.encode_row(row))
    assert record["runq_s"] == pytest.approx(7e-6) and record["wall_s"] == pytest.approx(30e-6)
    assert record["samples"] == 4 and record["gc_s"] == 0 and record["collate_s"] == 0
    for unread in (row[:7] + (None,) + row[8:], row[:8] + (b"torn",) + row[9:]):
        same = json.loads(loadcost.encode_row(unread))
        assert same["runq_s"] is None and same == {**record, "runq_s": None}


@pytest.mark.parametrize("ns", [0, 1, 999_999, 123_456_789, (1 << 29) - 1, 1 << 29,
                                2_718_281_828])
def test_a_batch_lines_times_written_from_nanoseconds_are_the_text_of_their_seconds(ns):
    """A batch's times under ``clocks.SHORT_NS`` are written from their nanoseconds: the same
    line as the seconds' ``%.9f`` make (two raw run-queue readings take that path)."""
    prefix = '{"kind":"batch_cost","rank":0,"loader_id":0,"worker":null,"pid":1,'
    row = (loadcost._batch_line, prefix, 7, 1_000, 1_000 + ns, 500, 500 + ns, 2_000,
           b"0 %d 2\n" % (2_000 + ns), (3, 1_000, 500), 1_000 + ns, 1, 3, 4, None, None)
    raw = row[:7] + (b"0 2000 1\n",) + row[8:]
    line = loadcost.encode_row(row)
    assert line == loadcost.encode_row(raw)
    record = json.loads(line)
    assert record["wall_s"] == record["cpu_s"] == record["runq_s"] == ns / 1e9
    assert record["collate_s"] == record["collate_cpu_s"] == ns / 1e9  # no collection in it
    assert record["gc_s"] == 2e-9

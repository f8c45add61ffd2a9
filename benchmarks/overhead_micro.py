"""Per-step cost of ddp-profile's rank-side instrumentation, measured in one process.

Launch-to-launch noise on a shared 2-core machine (5-15 % in median step time) hides a 1 %
overhead in ``overhead.py``. This benchmark measures the added cost directly: the same tight
training loop (a tiny model, so the loop is dominated by the per-step hooks) runs with and
without the instrumentation installed, interleaved, in one process; the difference per step,
divided by a real step time, is the overhead ratio. The rank's loop loads in-process
(``num_workers=0``), so its per-batch meter is included; a DataLoader worker's side (the meter
and its per-worker file) is timed the same way on a worker's fetch loop and added per step.
The watch on the files a fetch opens (``profiler.rank.loading.pagecache``) is timed on fetches of
small files read whole from the page cache, the loading where it weighs most: its added time
per file, and the fetch's time with it against without (``files_fetch_ratio``).

    python benchmarks/overhead_micro.py [--quick] [--step-ms 36]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import builtins
import statistics
import sys
import tempfile
import time
from typing import Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import _bench
from ddp_profile.profiler.rank import patches
from ddp_profile.profiler.rank.instrument import Instrumentation
from ddp_profile.profiler.rank.loading import loadcost, pagecache
from ddp_profile.profiler.settings import ProbePlan


def loop(steps: int) -> float:
    """Seconds per step of a minimal training loop over a real DataLoader."""
    data = TensorDataset(torch.randn(steps * 4, 8), torch.randn(steps * 4, 1))
    loader = DataLoader(data, batch_size=4)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.perf_counter()
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return (time.perf_counter() - start) / steps


def instrumented(steps: int, out_dir: str) -> float:
    instr = Instrumentation(ProbePlan(probe_id="bench", out_dir=out_dir, warmup=0,
                                      steps=10 ** 9))
    patches.apply(instr)
    try:
        return loop(steps)
    finally:
        if instr.samplers is not None:
            instr.samplers.stop()
        patches.remove()
        instr.recorder.close()


class _Fetcher:
    """The shape of torch's fetchers: ``fetch(indices)`` calls ``collate_fn`` on the items."""

    def __init__(self, data: torch.Tensor):
        self.data = data
        self.collate_fn = torch.stack

    def fetch(self, indices: list) -> torch.Tensor:
        return self.collate_fn([self.data[i] for i in indices])


def worker_batches(batches: int, out_dir: str, metered: bool) -> float:
    """Seconds per batch of a DataLoader worker's fetch loop, with or without the meter and
    its per-worker file (what ``loadcost.WorkerInit`` installs in each worker)."""
    fetcher = _Fetcher(torch.randn(64, 8))
    sink = None
    if metered:
        sink = loadcost._WorkerFile(f"{out_dir}/workers/w.jsonl")
        loadcost.CostMeter(sink.emit, 0, 0, 0).wrap(fetcher)
    indices = [0, 1, 2, 3]
    start = time.perf_counter()
    for _ in range(batches):
        fetcher.fetch(indices)
    elapsed = time.perf_counter() - start
    if sink is not None:
        sink.close()
    return elapsed / batches


FILES, FILE_BYTES, FILES_PER_FETCH = 1024, 32 * 1024, 64


def write_files(folder: str) -> list[str]:
    paths = []
    for index in range(FILES):
        path = f"{folder}/{index:05d}.bin"
        with open(path, "wb") as handle:
            handle.write(bytes(range(256)) * (FILE_BYTES // 256))
        paths.append(path)
    return paths


def file_fetches(paths: list[str], reads: Optional[pagecache.FileReads]) -> float:
    """Seconds per file of fetches reading ``FILES_PER_FETCH`` files whole, each fetch
    watched by ``reads`` (as the meter does) where given."""
    start = time.perf_counter()
    for first in range(0, len(paths), FILES_PER_FETCH):
        if reads is not None:
            reads.begin()
        for path in paths[first:first + FILES_PER_FETCH]:
            with open(path, "rb") as handle:
                handle.read()
        if reads is not None:
            reads.end()
    return (time.perf_counter() - start) / len(paths)


def files_watch(reps: int) -> tuple[float, float]:
    """(seconds per file unwatched, added seconds per file watched): interleaved, over files
    every fetch has seen before (the steady state after a probe's first epoch). Unwatched is
    Python's own ``open``: the watch's wrapper of it is part of the added time."""
    plain_open = pagecache._original_open  # the rank loop above left the watch installed
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_files(tmp)
        reads = pagecache.watch(pagecache.FileReads(cold=False))
        watched_open = builtins.open
        file_fetches(paths, reads)  # first reads: records every file once
        bare, watched = [], []
        try:
            for rep in range(reps * 4):
                order = [(None, bare), (reads, watched)][::1 if rep % 2 == 0 else -1]
                for watcher, results in order:
                    builtins.open = plain_open if watcher is None else watched_open
                    results.append(file_fetches(paths, watcher))
        finally:
            builtins.open = plain_open
    return statistics.median(bare), statistics.median(w - b for w, b in zip(watched, bare))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--step-ms", type=float, default=36.1,
                        help="a real step time to express the cost against (overhead.py's "
                             "compute-bound workload: 36.1 ms on the reference machine)")
    args = parser.parse_args()
    reps = args.reps or (5 if args.quick else 15)
    steps = args.steps or (1000 if args.quick else 3000)
    torch.set_num_threads(1)
    loop(200)  # warm up allocator and kernels
    plain, hooked = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            order = [("plain", plain), ("hooked", hooked)][::1 if rep % 2 == 0 else -1]
            for name, results in order:
                results.append(loop(steps) if name == "plain" else
                               instrumented(steps, f"{tmp}/rep{rep}"))
    bare, metered = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            bare.append(worker_batches(steps, tmp, False))
            metered.append(worker_batches(steps, f"{tmp}/{rep}", True))
    worker_us = statistics.median(m - b for m, b in zip(metered, bare)) * 1e6
    file_s, file_added_s = files_watch(reps)
    step_us = statistics.median(h - p for h, p in zip(hooked, plain)) * 1e6
    # a step consumes one batch: a worker's added time lands on the step where loading is
    # the bottleneck, so the whole instrumentation costs the sum per step
    added_us = step_us + worker_us
    result = {
        "benchmark": "overhead_micro", "mode": "quick" if args.quick else "full",
        "reps": reps, "steps_per_rep": steps,
        "plain_step_us": round(statistics.median(plain) * 1e6, 2),
        "instrumented_step_us": round(statistics.median(hooked) * 1e6, 2),
        "rank_added_us_per_step": round(step_us, 2),
        "worker_plain_batch_us": round(statistics.median(bare) * 1e6, 2),
        "worker_added_us_per_batch": round(worker_us, 2),
        "added_us_per_step": round(added_us, 2),
        "file_read_us": round(file_s * 1e6, 2),
        "files_added_us_per_file": round(file_added_s * 1e6, 3),
        "files_fetch_ratio": round(1 + file_added_s / file_s, 4),
        "reference_step_ms": args.step_ms,
        "overhead_ratio_at_reference_step": round(1 + added_us / (args.step_ms * 1e3), 5),
        "target_ratio": 1.01,
    }
    result["within_target"] = result["overhead_ratio_at_reference_step"] <= 1.01
    _bench.finish("overhead_micro", result)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

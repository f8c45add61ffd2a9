"""Per-step cost of ddp-profile's rank-side instrumentation, measured in one process.

Launch-to-launch noise on a shared 2-core machine (5-15 % in median step time) hides a 1 %
overhead in ``overhead.py``. This benchmark measures the added cost directly: the same tight
training loop runs in short blocks, plain and instrumented in turn (the order flipped each
pair, the patches applied and removed between blocks, outside the timed region); the figure is
the median over pairs of the difference per step, with a distribution-free 95 % interval of
that median. Each block takes its first batches untimed (a fresh iterator's start is an
epoch's cost, not a step's) and ends with its records flushed, timed (their encoding is the
step path's, deferred). Two loops: the tiny model of before (``rank_added_us_per_step``) and a
lighter one (a 4-float batch, a 4-parameter model, a one-line optimizer) whose short plain step
leaves less noise in the difference. Both load in-process (``num_workers=0``): the rank's
per-batch meter is included. The host sampler's thread is stopped (``sampler_cost.py``).
A DataLoader worker's side (its meter and file) is timed on a worker's fetch loop and added per
step; the watch on the files a fetch opens, on fetches of small cached files read whole.

    python benchmarks/overhead_micro.py [--quick] [--pairs 40] [--step-ms 36]

Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import builtins
import itertools
import math
import statistics
import sys
import tempfile
import time
from typing import Any, Iterator, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import _bench
from ddp_profile.profiler.rank import patches
from ddp_profile.profiler.rank.instrument import Instrumentation
from ddp_profile.profiler.rank.loading import loadcost, pagecache
from ddp_profile.profiler.settings import ProbePlan

BLOCK_WARMUP = 3  # batches a block takes before its clock starts


class TinyLoop:
    """The loop of before: a 4-sample batch of a TensorDataset through the default collate,
    ``nn.Linear(8, 1)``, MSE loss, ``backward()``, SGD's step and ``zero_grad``."""

    name = "tiny"

    def __init__(self, steps: int):
        self.data = TensorDataset(torch.randn(steps * 4, 8), torch.randn(steps * 4, 1))
        self.model = nn.Linear(8, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def loader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=4)

    def run(self, batches: Iterator[Any], steps: int) -> None:
        model, optimizer, loss_of = self.model, self.optimizer, nn.functional.mse_loss
        for x, y in itertools.islice(batches, steps):
            loss = loss_of(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


def _first(batch: list) -> Any:
    return batch[0]


class _Update(torch.optim.Optimizer):
    """The least an optimizer step does: one in-place update, its gradient dropped (torch's
    wrapper of ``step``, which runs the post hooks, is the same as any optimizer's)."""

    def __init__(self, params: Any):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for param in self.param_groups[0]["params"]:
            param.sub_(param.grad, alpha=0.01)
            param.grad = None


class LightLoop:
    """The same hooks on a shorter step: one 4-float sample a batch (its collate returns it),
    a 4-parameter model, ``backward()`` and a one-line optimizer step."""

    name = "light"

    def __init__(self, steps: int):
        self.items = list(torch.randn(steps, 4))
        self.weight = nn.Parameter(torch.zeros(4))
        self.optimizer = _Update([self.weight])

    def loader(self) -> DataLoader:
        return DataLoader(self.items, batch_size=1, collate_fn=_first)

    def run(self, batches: Iterator[Any], steps: int) -> None:
        weight, optimizer = self.weight, self.optimizer
        for x in itertools.islice(batches, steps):
            (weight * x).sum().backward()
            optimizer.step()


def alternate(loop: Any, pairs: int, block_steps: int, out_dir: str) -> tuple[list, list]:
    """Seconds per step of ``pairs`` plain and instrumented blocks of ``block_steps`` steps,
    in turn, the order flipped each pair; one instrumentation across them (as in a probe),
    its patches applied only around the instrumented blocks' iterations."""
    instr = Instrumentation(ProbePlan(probe_id="bench", out_dir=out_dir, warmup=0,
                                      steps=10 ** 9))
    plain_loader = loop.loader()
    patches.apply(instr)
    hooked_loader = loop.loader()  # built patched: the instrumentation follows it
    patches.remove()
    plain: list[float] = []
    hooked: list[float] = []
    try:
        for pair in range(pairs):
            order = [(plain_loader, plain), (hooked_loader, hooked)][::1 if pair % 2 else -1]
            for loader, results in order:
                results.append(block(loop, loader, block_steps, instr
                                     if loader is hooked_loader else None))
    finally:
        patches.remove()
        instr.recorder.close()
    return plain, hooked


def block(loop: Any, loader: DataLoader, steps: int, instr: Optional[Instrumentation]) -> float:
    """Seconds per step of one block: a fresh iterator, ``BLOCK_WARMUP`` steps untimed, then
    ``steps`` timed; where instrumented, its records flushed at its end, timed."""
    if instr is not None:
        patches.apply(instr)
    try:
        batches = iter(loader)
        loop.run(batches, BLOCK_WARMUP)
        if instr is not None:
            if instr.samplers is not None:  # started at the first batch; sampler_cost.py
                instr.samplers.stop()
                instr.samplers = None
            instr.recorder.flush()
        start = time.perf_counter()
        loop.run(batches, steps)
        if instr is not None:
            instr.recorder.flush()
        return (time.perf_counter() - start) / steps
    finally:
        if instr is not None:
            patches.remove()


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval of the median: the order statistics k and n+1-k, k the
    largest with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2 (the extremes where n is too
    small for any)."""
    ordered, n = sorted(values), len(values)
    tail, k, below = (1 - confidence) / 2, 0, 0.0
    while k < n and below + math.comb(n, k) / 2 ** n <= tail:
        below += math.comb(n, k) / 2 ** n
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def rank_cost(loop: Any, pairs: int, block_steps: int, out_dir: str) -> dict[str, Any]:
    plain, hooked = alternate(loop, pairs, block_steps, out_dir)
    added = [(h - p) * 1e6 for h, p in zip(hooked, plain)]
    low, high = median_interval(added)
    # the same per microsecond of the pair's plain step: the machine's speed, which changes
    # between sittings on a shared VM, scales both (what compares sittings)
    share = statistics.median((h - p) / p for h, p in zip(hooked, plain))
    return {"plain_step_us": round(statistics.median(plain) * 1e6, 2),
            "added_share_of_plain": round(share, 4),
            "instrumented_step_us": round(statistics.median(hooked) * 1e6, 2),
            "added_us": round(statistics.median(added), 2),
            "added_interval_us": [round(low, 2), round(high, 2)],
            "added_quartiles_us": [round(q, 2) for q in
                                   statistics.quantiles(added, n=4)[::2]]}


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
    parser.add_argument("--pairs", type=int, default=None,
                        help="plain/instrumented block pairs of each rank loop")
    parser.add_argument("--block-steps", type=int, default=200,
                        help="steps of a block of the tiny loop (the light loop's: twice)")
    parser.add_argument("--reps", type=int, default=None, help="of the worker's and files' side")
    parser.add_argument("--steps", type=int, default=None, help="batches of a worker's rep")
    parser.add_argument("--step-ms", type=float, default=36.1,
                        help="a real step time to express the cost against (overhead.py's "
                             "compute-bound workload: 36.1 ms on the reference machine)")
    args = parser.parse_args()
    pairs = args.pairs or (16 if args.quick else 40)
    reps = args.reps or (5 if args.quick else 15)
    steps = args.steps or (1000 if args.quick else 3000)
    torch.set_num_threads(1)
    rank = {}
    with tempfile.TemporaryDirectory() as tmp:
        for loop, block_steps in ((TinyLoop, args.block_steps), (LightLoop, 2 * args.block_steps)):
            shape = loop(block_steps + BLOCK_WARMUP)
            shape.run(iter(shape.loader()), block_steps)  # warm up allocator and kernels
            rank[shape.name] = rank_cost(shape, pairs, block_steps, f"{tmp}/{shape.name}")
            print(f"rank, {shape.name} loop: {rank[shape.name]}", flush=True)
    bare, metered = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            bare.append(worker_batches(steps, tmp, False))
            metered.append(worker_batches(steps, f"{tmp}/{rep}", True))
    worker_us = statistics.median(m - b for m, b in zip(metered, bare)) * 1e6
    file_s, file_added_s = files_watch(reps)
    tiny, light = rank["tiny"], rank["light"]
    step_us = tiny["added_us"]
    # a step consumes one batch: a worker's added time lands on the step where loading is
    # the bottleneck, so the whole instrumentation costs the sum per step
    added_us = step_us + worker_us
    result = {
        "benchmark": "overhead_micro", "mode": "quick" if args.quick else "full",
        "pairs": pairs, "block_steps": args.block_steps,
        "reps": reps, "steps_per_rep": steps,
        "plain_step_us": tiny["plain_step_us"],
        "instrumented_step_us": tiny["instrumented_step_us"],
        "rank_added_us_per_step": step_us,
        "rank_added_interval_us": tiny["added_interval_us"],
        "rank_added_quartiles_us": tiny["added_quartiles_us"],
        "rank_added_share_of_plain": tiny["added_share_of_plain"],
        "light_plain_step_us": light["plain_step_us"],
        "light_rank_added_us_per_step": light["added_us"],
        "light_rank_added_interval_us": light["added_interval_us"],
        "light_rank_added_quartiles_us": light["added_quartiles_us"],
        "light_rank_added_share_of_plain": light["added_share_of_plain"],
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

"""Benchmark workload for ``benchmarks/peers.py``: one ordinary training script, six known causes.

The costs are parameters, so every peer gets the same dataset and model:

* ``--load-ms`` per sample asleep (latency-bound loading), ``--cpu-ms`` per sample busy
  (CPU-bound loading), ``--hidden``/``--layers``/``--batch-size`` (compute);
* ``--straggle-ms``: rank 1 sleeps this long in every step (a straggling rank);
* ``--unsharded``: no DistributedSampler, every rank reads the same samples;
* ``--files DIR``: one file per sample read with ``open().read()`` (the first ``--features``
  x 4 bytes become the sample), as image scripts read theirs; the dataset's length is the
  number of files;
* ``--spawn N``: started without a launcher, the script starts N ranks itself
  (``torch.multiprocessing.spawn``, as a PyTorchJob or srun starts them in place): nobody sets
  ``OMP_NUM_THREADS``, so each rank sizes torch's thread pool to the whole machine.

Under torchrun (``WORLD_SIZE`` set) it is one DDP rank; with neither torchrun nor ``--spawn``
it is one process without DDP. ``--traceml`` adds traceml-ai's two lines
(``traceml_ai.init()``, ``with traceml_ai.trace_step(model):``); ``--fournex`` fournex's
(``frx.init``, ``frx.instrument_dataloader(loader)``, ``with frx.step_context(...)``; its
trace is written under ``frx collect``); ``--datapath-doctor`` datapath-doctor's (its
``DataLoaderProfiler`` around the loader, ``record_compute_done()`` after each step, and at the
end every rank's samples through ``analyze_distributed``, its report printed by rank 0).
Without them the script is plain PyTorch: each tool is imported only under its flag.

Each rank times its own steps with ``time.perf_counter`` (the period between the starts of
consecutive iterations) and writes ``{"median_step_s", "mean_step_s",
"throughput", ...}`` to ``--out`` (``{rank}`` replaced); ``throughput`` is global samples/s
(batch size x ranks / mean step).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from ddp_profile.examples.demo_train import SyntheticDataset


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--steps", type=int, default=60, help="loop iterations in all (warm-up included)")
    add("--warmup", type=int, default=5)
    add("--samples", type=int, default=1 << 14)
    add("--features", type=int, default=64)
    add("--batch-size", type=int, default=16)
    add("--num-workers", type=int, default=0)
    add("--prefetch-factor", type=int, default=0, help="0: the DataLoader's default")
    add("--load-ms", type=float, default=0.0)
    add("--cpu-ms", type=float, default=0.0)
    add("--hidden", type=int, default=64)
    add("--layers", type=int, default=1)
    add("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    add("--straggle-ms", type=float, default=0.0, help="rank 1 sleeps this long per step")
    add("--unsharded", action="store_true", help="no DistributedSampler")
    add("--files", default="", help="a folder of one file per sample")
    add("--spawn", type=int, default=0, help="start this many ranks in place")
    add("--traceml", action="store_true", help="traceml-ai's two lines")
    add("--fournex", action="store_true", help="fournex's SDK lines")
    add("--datapath-doctor", action="store_true", help="datapath-doctor's SDK lines")
    add("--out", default="", help="JSON result path; {rank} is replaced")
    return parser.parse_args(argv)


def build(args: argparse.Namespace, world: int, rank: int):
    """The dataset, loader, sampler and model: the same for every peer."""
    torch.manual_seed(0)
    dataset = make_dataset(args)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True) \
        if world > 1 and not args.unsharded else None
    extra = {"prefetch_factor": args.prefetch_factor} \
        if args.num_workers and args.prefetch_factor else {}
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                        shuffle=sampler is None, drop_last=True, num_workers=args.num_workers,
                        **extra)
    return loader, sampler, make_model(args)


class FileDataset(torch.utils.data.Dataset):
    """One file per sample, read whole each time it is fetched; with ``drop``, each file is
    dropped from the page cache once read, so every epoch reads from storage (as a dataset
    larger than memory does)."""

    def __init__(self, root: str, features: int, drop: bool = False):
        self.paths = sorted(os.path.join(root, name) for name in os.listdir(root))
        self.features = features
        self.drop = drop

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        with open(self.paths[index], "rb") as handle:
            raw = handle.read()
            if self.drop:
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        x = torch.frombuffer(bytearray(raw[:4 * self.features]), dtype=torch.uint8).float()
        x = x.view(self.features, 4).mean(dim=1) / 255.0
        return x, index % 2


def make_dataset(args: argparse.Namespace):
    if args.files:
        return FileDataset(args.files, args.features)
    return SyntheticDataset(args.samples, args.features, args.load_ms, args.cpu_ms)


def make_model(args: argparse.Namespace) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(args.features, args.hidden), nn.ReLU()]
    for _ in range(args.layers - 1):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(args.hidden, 2))


def train(args: argparse.Namespace, world: int, rank: int) -> dict:
    loader, sampler, model = build(args, world, rank)
    if args.traceml:
        import traceml_ai

        traceml_ai.init()
    frx = doctor = None
    if args.fournex:
        import fournex as frx

        frx.init(job_name="peers")
        loader = frx.instrument_dataloader(loader)
    if args.datapath_doctor:
        from datapath_doctor.collectors.dataloader_profiler import DataLoaderProfiler

        loader = doctor = DataLoaderProfiler(loader, num_workers=args.num_workers,
                                             prefetch_factor=loader.prefetch_factor)
    if world > 1:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    straggle_s = args.straggle_ms / 1000.0 if rank == 1 else 0.0
    starts: list[float] = []
    epoch = 0
    iterator = iter(loader)
    while True:
        starts.append(time.perf_counter())
        if len(starts) > args.steps:
            break
        try:
            x, y = next(iterator)
        except StopIteration:
            epoch += 1
            if sampler is not None:
                sampler.set_epoch(epoch)
            iterator = iter(loader)
            x, y = next(iterator)
        if args.traceml:
            import traceml_ai

            with traceml_ai.trace_step(model):
                step(model, optimizer, loss_fn, x, y, straggle_s)
        elif frx is not None:
            with frx.step_context(step=len(starts) - 1, batch=(x, y), model=model):
                step(model, optimizer, loss_fn, x, y, straggle_s)
        else:
            step(model, optimizer, loss_fn, x, y, straggle_s)
        if doctor is not None:
            doctor.record_compute_done()
    if doctor is not None:
        datapath_doctor_report(doctor.samples, world, rank)
    steps = [b - a for a, b in zip(starts, starts[1:])][args.warmup:]
    mean = statistics.fmean(steps)
    return {"rank": rank, "world_size": world, "steps": len(steps),
            "median_step_s": statistics.median(steps), "mean_step_s": mean,
            "throughput": args.batch_size * world / mean, "threads": torch.get_num_threads()}


def datapath_doctor_report(samples: list, world: int, rank: int) -> None:
    """datapath-doctor's documented analysis: every rank's samples on rank 0, its rules per rank,
    its cross-rank straggler check, its report printed."""
    from datapath_doctor.distributed import analyze_distributed
    from datapath_doctor.engine import RuleEngine
    from datapath_doctor.report import render_findings

    if world > 1:
        gathered: list = [None] * world
        dist.all_gather_object(gathered, samples)
        samples = [sample for part in gathered for sample in part]
    if world == 1:
        print(render_findings(RuleEngine.with_default_rules().run(samples), len(samples)))
        return
    if rank == 0:
        analysis = analyze_distributed(samples)
        for each, findings in analysis.per_rank_findings.items():
            count = sum(1 for sample in samples if sample.rank == each)
            print(f"== datapath-doctor rank {each} ==\n{render_findings(findings, count)}")
        straggler = analysis.straggler.message if analysis.straggler else "none"
        print(f"== datapath-doctor straggler: {straggler}", flush=True)
    dist.barrier()  # the ranks leave together


def step(model, optimizer, loss_fn, x, y, straggle_s: float) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    if straggle_s:
        time.sleep(straggle_s)
    loss.backward()
    optimizer.step()


def run_rank(rank: int, world: int, args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world)
    result = train(args, world, rank)
    if args.out:
        with open(args.out.format(rank=rank), "w") as handle:
            json.dump(result, handle)
    if world > 1:
        dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    run_rank(rank, world, args)


def main(argv=None) -> None:
    args = parse_args(argv)
    if "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
        if world > 1:
            dist.init_process_group("gloo")
        run_rank(int(os.environ.get("RANK", "0")), world, args)
    elif args.spawn > 1:
        import torch.multiprocessing as mp

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        mp.spawn(_spawned, args=(args.spawn, port, args), nprocs=args.spawn, join=True)
    else:
        run_rank(0, 1, args)


if __name__ == "__main__":
    main()

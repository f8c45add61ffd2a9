"""GPU check workload: an ordinary DDP loop on CUDA whose GPU and host costs are parameters.

``benchmarks/gpu_check.py`` profiles it with ddp-profile and compares what the tool recorded
with what the parameters construct:

* the GPU's work per step: ``--width`` x ``--layers`` matrix products on a batch of
  ``--features`` floats per sample (a plain launch without a per-step wait keeps the GPU busy:
  its mean step is the GPU's time per step);
* a known host wait per step: ``--host-sleep-ms`` after reading the loss (``.item()``, which
  waits for the GPU): the GPU idles for the sleep plus the host's own work per step;
* the loading: ``--load-ms`` asleep per sample or ``--batch-load-ms`` per batch, batches of
  ``--features`` floats from a pool of ready samples (large batches: ``--features 150528``
  is one 3x224x224 image), copied with ``.to(device, non_blocking=True)``;
* host-GPU synchronisations the tool must find by line (each marked ``# site:``):
  ``--read-loss`` (``.item()``), ``--synchronize`` (``torch.cuda.synchronize()``),
  ``--blocking-copy`` (the batch copied without ``non_blocking``); ``--reduce-loss`` adds the
  script's own ``dist.all_reduce`` of the loss every step;
* ``--backend gloo`` with CUDA tensors (a backend mismatch), a batch too large for the GPU's
  memory (``--width 65536`` at a batch of 262,144 samples).

With ``--steps N`` the loop ends itself after N steps and rank 0 writes ``{"median_step_s",
"mean_step_s", "steps"}`` to ``--out`` (the mean is the throughput's: steps of a loader with
workers come in bursts) (a plain launch, the reference); without it, it runs until ddp-profile
stops the probe. ``--device cpu`` runs the same loop without a GPU (the tests use it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate

POOL = 256  # distinct samples kept ready; item i is sample i % POOL


class PoolDataset(Dataset):
    """``samples`` items of ``features`` floats from a pool of ready ones, each costing
    ``load_ms`` asleep (slow storage)."""

    def __init__(self, samples: int, features: int, load_ms: float):
        self.samples, self.load_s = samples, load_ms / 1000.0
        self.pool = torch.randn(min(POOL, samples), features)

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int):
        if self.load_s:
            time.sleep(self.load_s)
        return self.pool[index % len(self.pool)], index % 2


class SlowCollate:
    """The default collate, ``ms`` asleep first (a per-batch loading cost)."""

    def __init__(self, ms: float):
        self.s = ms / 1000.0

    def __call__(self, batch):
        if self.s:
            time.sleep(self.s)
        return default_collate(batch)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--device", choices=("cuda", "cpu"), default="cuda")
    add("--backend", choices=("nccl", "gloo"), default=None,
        help="default: nccl on cuda, gloo on cpu")
    add("--samples", type=int, default=1 << 16)
    add("--features", type=int, default=1024)
    add("--width", type=int, default=4096)
    add("--layers", type=int, default=4)
    add("--batch-size", type=int, default=256)
    add("--num-workers", type=int, default=0)
    add("--pin-memory", action="store_true")
    add("--prefetch-factor", type=int, default=None, help="with workers (torch's default 2)")
    add("--load-ms", type=float, default=0.0, help="per-sample sleep (slow storage)")
    add("--batch-load-ms", type=float, default=0.0, help="per-batch sleep (in the collate)")
    add("--host-sleep-ms", type=float, default=0.0,
        help="per-step sleep after reading the loss (a known GPU idle)")
    add("--read-loss", action="store_true", help="loss.item() every step (waits for the GPU)")
    add("--synchronize", action="store_true", help="torch.cuda.synchronize() every step")
    add("--blocking-copy", action="store_true", help="copy batches without non_blocking")
    add("--reduce-loss", action="store_true", help="dist.all_reduce of the loss every step")
    add("--steps", type=int, default=0, help="end after N steps (0: run until stopped)")
    add("--warmup", type=int, default=10, help="steps left out of --out's median")
    add("--out", default="", help="rank 0's JSON result with --steps")
    return parser.parse_args()


def build_model(args: argparse.Namespace) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(args.features, args.width), nn.ReLU()]
    for _ in range(args.layers - 1):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(args.width, 2))


def write(path: str, result: dict) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(result, fh)
    print(json.dumps(result))


def main() -> None:
    args = parse_args()
    cuda = args.device == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank % max(1, torch.cuda.device_count())) if cuda \
        else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    backend = args.backend or ("nccl" if cuda else "gloo")
    dist.init_process_group(backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    dataset = PoolDataset(args.samples, args.features, args.load_ms)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.num_workers, pin_memory=args.pin_memory,
                        collate_fn=SlowCollate(args.batch_load_ms),
                        prefetch_factor=args.prefetch_factor if args.num_workers else None)
    model = DistributedDataParallel(build_model(args).to(device),
                                    device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    starts: list[float] = []
    step = 0
    for epoch in range(1 << 20):
        sampler.set_epoch(epoch)
        for x, y in loader:
            starts.append(time.perf_counter())
            if args.blocking_copy:
                x, y = x.to(device), y.to(device)  # site: blocking-copy
            else:
                x = x.to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if args.reduce_loss:
                dist.all_reduce(loss.detach())  # site: reduce-loss
            if args.synchronize and cuda:
                torch.cuda.synchronize()  # site: synchronize
            if args.read_loss or args.host_sleep_ms:
                loss.item()  # site: read-loss
            if args.host_sleep_ms:
                time.sleep(args.host_sleep_ms / 1000.0)
            step += 1
            if args.steps and step >= args.steps:
                break
        if args.steps and step >= args.steps:
            break
    if cuda:
        torch.cuda.synchronize(device)
    starts.append(time.perf_counter())
    if rank == 0 and args.steps:
        periods = [b - a for a, b in zip(starts[args.warmup:], starts[args.warmup + 1:])]
        write(args.out, {"median_step_s": statistics.median(periods),
                         "mean_step_s": statistics.fmean(periods), "steps": len(periods)})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

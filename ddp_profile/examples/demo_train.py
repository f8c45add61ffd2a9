"""The built-in workload: a small DDP training script whose costs are parameters.

It is an ordinary, unmodified DDP script — torchrun environment-variable init, a
DistributedSampler, a DataLoader, an MLP wrapped in DistributedDataParallel — used by
``ddp-profile demo``, the tests and the benchmarks. Its knobs set the per-sample loading cost
(``--load-ms``: sleeping, like slow storage; ``--cpu-ms``: busy, like decoding), the model cost
(``--hidden``, ``--layers``) and inject the problems ddp-profile should recognise. On a machine
with a GPU the model trains there (``--device auto``: one GPU per rank, nccl; ``--device cpu``
keeps it on the CPU with gloo).

Run it directly with ``torchrun --nproc-per-node 2 demo_train.py`` or through
``ddp-profile run demo_train.py -- --load-ms 2``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler


class SyntheticDataset(Dataset):
    """Random features and labels; each item costs ``load_ms`` asleep and ``cpu_ms`` of CPU."""

    def __init__(self, samples: int, features: int, load_ms: float, cpu_ms: float):
        self.samples, self.features = samples, features
        self.load_s, self.cpu_s = load_ms / 1000.0, cpu_ms / 1000.0

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int):
        if self.load_s:
            time.sleep(self.load_s)
        if self.cpu_s:  # busy for cpu_ms of this thread's CPU time, however long that takes
            end = time.thread_time() + self.cpu_s
            while time.thread_time() < end:
                pass
        generator = torch.Generator().manual_seed(index)
        x = torch.randn(self.features, generator=generator)
        return x, int(x.sum() > 0)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--samples", type=int, default=4096, help="dataset size")
    add("--features", type=int, default=64)
    add("--batch-size", type=int, default=16)
    add("--num-workers", type=int, default=0)
    add("--pin-memory", action="store_true")
    add("--persistent-workers", action="store_true")
    add("--epochs", type=int, default=1000)
    add("--load-ms", type=float, default=0.0, help="per-sample sleep (storage latency)")
    add("--cpu-ms", type=float, default=0.0, help="per-sample busy time (preprocessing)")
    add("--hidden", type=int, default=256)
    add("--layers", type=int, default=2)
    add("--step-sleep-ms", type=float, default=0.0, help="extra compute time per step")
    add("--straggler-rank", type=int, default=-1)
    add("--straggler-ms", type=float, default=0.0)
    add("--checkpoint-every", type=int, default=0, help="save a checkpoint every N steps")
    add("--checkpoint-ms", type=float, default=0.0, help="extra time per checkpoint")
    add("--batch-sampler", action="store_true", help="pass batch_sampler=BatchSampler(...)")
    add("--no-distributed-sampler", action="store_true")
    add("--no-set-epoch", action="store_true")
    add("--no-optimizer", action="store_true")
    add("--no-ddp", action="store_true", help="join the process group but never wrap the model")
    add("--validate", action="store_true", help="iterate a validation loader every epoch")
    add("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    add("--no-sync", action="store_true", help="skip the all-reduce of all but the last "
        "micro-batch of an accumulation (DDP.no_sync)")
    add("--reduce-loss", action="store_true", help="all-reduce the loss and read it every step")
    # fault injection, for the tests
    # each fault can be limited to probes whose loader runs with a given number of workers
    add("--crash-at-step", type=int, default=-1)
    add("--crash-workers", type=int, default=-1, help="-1: any number of workers")
    add("--crash-rank", type=int, default=-1, help="-1: every rank")
    add("--hang-at-step", type=int, default=-1)
    add("--hang-rank", type=int, default=1)
    add("--hang-workers", type=int, default=-1)
    add("--kill-worker-at-step", type=int, default=-1)
    add("--kill-worker-workers", type=int, default=-1)
    add("--oom-above-batch", type=int, default=0)
    add("--no-dataloader", action="store_true")
    add("--device", choices=("auto", "cpu", "cuda"), default="auto",
        help="auto: a GPU per rank where CUDA is available")
    return parser.parse_args()


def build_loader(args: argparse.Namespace, dataset: Dataset, rank: int, world: int):
    sampler = None if args.no_distributed_sampler else \
        DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True)
    common = dict(num_workers=args.num_workers, pin_memory=args.pin_memory,
                  persistent_workers=args.persistent_workers and args.num_workers > 0)
    if args.batch_sampler:
        base = sampler if sampler is not None else torch.utils.data.RandomSampler(dataset)
        batches = BatchSampler(base, args.batch_size, drop_last=True)
        return DataLoader(dataset, batch_sampler=batches, **common), sampler
    return DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                      shuffle=sampler is None, drop_last=True, **common), sampler


def main() -> None:
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    # a GPU job under a launcher is DDP over nccl even on one GPU; on the CPU, 2 ranks or more
    distributed = world > 1 or (cuda and "RANK" in os.environ)
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    if args.no_dataloader:
        print("this script never builds a DataLoader")
        return
    dataset = SyntheticDataset(args.samples, args.features, args.load_ms, args.cpu_ms)
    loader, sampler = build_loader(args, dataset, rank, world)
    val_loader = DataLoader(SyntheticDataset(64, args.features, 0, 0), batch_size=32) \
        if args.validate else None
    layers: list[nn.Module] = [nn.Linear(args.features, args.hidden), nn.ReLU()]
    for _ in range(args.layers - 1):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    model: nn.Module = nn.Sequential(*layers, nn.Linear(args.hidden, 2)).to(device)
    if distributed and not args.no_ddp:
        model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = None if args.no_optimizer else torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    # faults count steps since the loader last changed its worker count: the same step of a
    # probe whether ddp-profile runs it alone or as one window of a screen
    config_step, workers_seen = 0, loader.num_workers
    checkpoint = os.path.join(tempfile.gettempdir(), f"ddp-profile-demo-ckpt-{os.getpid()}.pt")
    for epoch in range(args.epochs):
        if sampler is not None and not args.no_set_epoch:
            sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if loader.num_workers != workers_seen:
                config_step, workers_seen = 0, loader.num_workers
            inject_faults(args, config_step, rank, loader, x.shape[0])
            config_step += 1
            if rank == args.straggler_rank and args.straggler_ms:
                time.sleep(args.straggler_ms / 1000.0)
            last = (step + 1) % args.accumulate == 0
            skip_sync = args.no_sync and not last and isinstance(model, DistributedDataParallel)
            with model.no_sync() if skip_sync else contextlib.nullcontext():
                loss = loss_fn(model(x), y)
                if args.step_sleep_ms:
                    time.sleep(args.step_sleep_ms / 1000.0)
                (loss / args.accumulate).backward()
            if args.reduce_loss and distributed:
                reduced = loss.detach().clone()
                dist.all_reduce(reduced)
                reduced.item()
            if last:
                if optimizer is not None:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                else:
                    model.zero_grad(set_to_none=True)
            step += 1
            if args.checkpoint_every and step % args.checkpoint_every == 0 and rank == 0:
                torch.save(model.state_dict(), checkpoint)
                time.sleep(args.checkpoint_ms / 1000.0)
        if val_loader is not None:
            with torch.no_grad():
                for x, _ in val_loader:
                    model(x.to(device))
    if os.path.exists(checkpoint):
        os.remove(checkpoint)
    if distributed:
        dist.destroy_process_group()


def inject_faults(args: argparse.Namespace, step: int, rank: int, loader, batch: int) -> None:
    def armed(workers: int) -> bool:
        return workers < 0 or loader.num_workers == workers

    if step == args.crash_at_step and args.crash_rank in (-1, rank) and armed(args.crash_workers):
        raise RuntimeError(f"injected failure at step {step} on rank {rank}")
    if step == args.hang_at_step and rank == args.hang_rank and armed(args.hang_workers):
        time.sleep(3600)  # the other ranks block in the next collective
    if step == args.kill_worker_at_step and rank == 0 and armed(args.kill_worker_workers):
        import multiprocessing

        workers = multiprocessing.active_children()
        if workers:
            os.kill(workers[0].pid, signal.SIGKILL)
    if args.oom_above_batch and batch > args.oom_above_batch:
        torch.empty(1 << 62, dtype=torch.uint8)  # a real allocation failure


if __name__ == "__main__":
    main()

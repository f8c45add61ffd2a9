"""A 2-rank script that starts its ranks itself (``torch.multiprocessing.spawn``) and whose
DataLoader workers are spawned too (``multiprocessing_context="spawn"``, as scripts that must
not fork a CUDA context write it): each worker imports torch again, about a second on 2 CPUs,
and starts again every epoch. Samples sleep 2 ms (a read); 62-step epochs of batch 16; 2 epochs.

    OMP_NUM_THREADS=1 ddp-profile run benchmarks/workloads/spawn_sleep.py --launcher none
    python benchmarks/workloads/spawn_sleep.py [--workers N] [--epochs E]   # a plain run
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SAMPLES = 2 * 62 * 16  # 62 steps of 16 on each of 2 ranks


class Sleepy(Dataset):
    def __len__(self):
        return SAMPLES

    def __getitem__(self, index):
        time.sleep(0.002)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(64, generator=generator), index % 4


def worker(rank, world_size, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    data = Sleepy()
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank)
    extra = {"multiprocessing_context": "spawn"} if args.workers else {}
    loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=args.workers, **extra)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--port", type=int, default=29761)
    mp.spawn(worker, args=(2, parser.parse_args()), nprocs=2, join=True)

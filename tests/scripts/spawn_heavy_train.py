"""Compute-heavy DDP ranks started in place by the script itself (torch.multiprocessing.spawn),
as a PyTorchJob or srun starts them: nobody sets OMP_NUM_THREADS, so each rank sizes torch's
thread pool to the whole machine."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def worker(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(8192, 128, generator=generator),
                         torch.randint(0, 2, (8192,), generator=generator))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank)
    loader = DataLoader(data, batch_size=64, sampler=sampler)
    # many small layers: a parallel region each, forward and backward, so threads that do not
    # fit the CPUs wait at every one of them (2 ranks x 2 threads on 2 CPUs: 3-4x slower,
    # steadily; a few large layers lose 2-10x, unsteadily)
    layers = [module for _ in range(24) for module in (nn.Linear(128, 128), nn.ReLU())]
    model = DDP(nn.Sequential(*layers, nn.Linear(128, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(100):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 29741
    mp.spawn(worker, args=(2, port), nprocs=2, join=True)

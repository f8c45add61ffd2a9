"""A DDP script that starts its own ranks with torch.multiprocessing.spawn (no torchrun)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def worker(rank, world_size, port, epochs=100, fail_rank=-1):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    data = TensorDataset(torch.randn(4096, 16), torch.randint(0, 2, (4096,)))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DDP(nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    if rank == fail_rank:
        raise RuntimeError(f"rank {rank} failed after its loop")
    dist.destroy_process_group()


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 29731
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 100  # the loop's length
    fail_rank = int(sys.argv[3]) if len(sys.argv) > 3 else -1  # this rank raises after it
    mp.spawn(worker, args=(2, port, epochs, fail_rank), nprocs=2, join=True)

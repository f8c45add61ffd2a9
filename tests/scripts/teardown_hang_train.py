"""A short torchrun script (8 steps a rank) whose rank 0 never returns after it destroys its
process group: torch's gloo teardown can deadlock there (a DDP module freed after the call
destroys its group while a worker thread waits for the GIL); this makes it certain."""

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=16, sampler=sampler)
model = DDP(nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in loader:
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
rank = dist.get_rank()
dist.destroy_process_group()
if rank == 0:
    time.sleep(600)  # the teardown that never returns

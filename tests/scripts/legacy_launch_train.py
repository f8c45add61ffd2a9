"""A script written for `python -m torch.distributed.launch`: it requires --local_rank and
initialises the process group only when WORLD_SIZE > 1."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, required=True)
parser.add_argument("--epochs", type=int, default=100)
args = parser.parse_args()
assert args.local_rank == int(os.environ.get("LOCAL_RANK", "0")), "wrong --local_rank"

distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
if distributed:
    dist.init_process_group(backend="gloo", init_method="env://")
data = TensorDataset(torch.randn(2048, 8), torch.randn(2048, 1))
sampler = DistributedSampler(data) if distributed else None
loader = DataLoader(data, batch_size=32, sampler=sampler, shuffle=sampler is None)
model = nn.Linear(8, 1)
if distributed:
    model = nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(args.epochs):
    if sampler is not None:
        sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

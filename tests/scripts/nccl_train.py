"""A script that hard-codes nccl and CUDA devices."""

import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8)
for (x,) in loader:
    x = x.cuda()

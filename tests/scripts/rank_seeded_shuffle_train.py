"""A DDP script whose loader shuffles without a sampler, seeded by rank (for augmentation
diversity): every rank walks the whole dataset in its own order."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data_rng = torch.Generator().manual_seed(0)  # the same data on every rank
    data = TensorDataset(torch.randn(2048, 16, generator=data_rng),
                         torch.randint(0, 2, (2048,), generator=data_rng))
    torch.manual_seed(1234 + rank)  # ... shuffled differently on each
    loader = DataLoader(data, batch_size=int(os.environ.get("BATCH", "16")), shuffle=True)
    model = DDP(nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(100):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A DDP script whose own batch sampler decides what each rank reads (no DistributedSampler).

``--shard``: the batch sampler takes every world_size-th sample from the rank's offset, as
accelerate's and Lightning's shards do; without it every rank walks the same batches.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, Sampler


class Numbers(Dataset):
    def __len__(self) -> int:
        return 2048

    def __getitem__(self, index: int):
        x = torch.randn(16, generator=torch.Generator().manual_seed(index))
        return x, int(x.sum() > 0)


class RankBatches(Sampler):
    def __init__(self, size: int, batch: int, rank: int, world: int, shard: bool):
        self.size, self.batch, self.rank, self.world, self.shard = size, batch, rank, world, shard

    def __iter__(self):
        indices = list(range(self.size))
        if self.shard:
            indices = indices[self.rank::self.world]
        for start in range(0, len(indices) - self.batch + 1, self.batch):
            yield indices[start:start + self.batch]

    def __len__(self) -> int:
        return (self.size // (self.world if self.shard else 1)) // self.batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shard", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = Numbers()
    loader = DataLoader(data, batch_sampler=RankBatches(len(data), 16, rank, world, args.shard))
    model = DistributedDataParallel(nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(100):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

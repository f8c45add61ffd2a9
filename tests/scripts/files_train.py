"""A DDP script reading one file per sample with open().read(), as image scripts do; the folder
is DATA (written by the test), the script's own loader has 1 worker."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Files(Dataset):
    def __init__(self, root):
        self.paths = sorted(os.path.join(root, name) for name in os.listdir(root))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        with open(self.paths[index], "rb") as handle:
            raw = handle.read()
        return torch.frombuffer(bytearray(raw[:256]), dtype=torch.uint8).float(), index % 2


def main():
    dist.init_process_group("gloo")
    data = Files(os.environ["DATA"])
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=1)
    model = DDP(nn.Linear(256, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(20):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

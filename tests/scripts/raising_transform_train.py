"""A DDP script whose per-sample transform raises in DataLoader workers, when it has 2 of them:
the probe that runs it fails, the others measure (tests of ddp-profile's loading measurement).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, get_worker_info


class Decoded(Dataset):
    def __len__(self) -> int:
        return 2048

    def __getitem__(self, index: int):
        info = get_worker_info()
        if info is not None and info.num_workers == 2 and index % 97 == 5:
            raise ValueError(f"corrupt sample {index}")
        time.sleep(0.001)
        return torch.full((8,), float(index % 7)), index % 2


def main() -> None:
    dist.init_process_group("gloo")
    data = Decoded()
    loader = DataLoader(data, batch_size=16, num_workers=int(os.environ.get("WORKERS", "0")),
                        sampler=DistributedSampler(data))
    model = DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _epoch in range(50):
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            time.sleep(0.015)  # a step's compute: a worker overlaps the 16 ms of loading with
            # it, so 1 worker wins beyond noise and the ladder goes on to the 2 that crash
            opt.step()
            opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

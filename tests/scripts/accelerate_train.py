"""An HF accelerate script for torchrun: accelerator.prepare() shards the loader with its own
batch sampler (no DistributedSampler) and wraps the model in DistributedDataParallel."""

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int):
        x = torch.randn(32, generator=torch.Generator().manual_seed(index))
        return x, int(x.sum() > 0)


def main() -> None:
    accelerator = Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Numbers(), batch_size=16, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(20):
        for x, y in loader:
            optimizer.zero_grad()
            accelerator.backward(nn.functional.cross_entropy(model(x), y))
            optimizer.step()


if __name__ == "__main__":
    main()

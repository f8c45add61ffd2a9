"""An HF accelerate script for torchrun: accelerator.prepare() shards the loader with its own
batch sampler (no DistributedSampler) and wraps the model in DistributedDataParallel.

``--samples N --epochs E --step-sleep S``: a shorter epoch (96 samples: 3 batches a rank, each
taken one call ahead of the loop by accelerate's prepared loader) and a step no faster than S."""

import argparse
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):
    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int):
        x = torch.randn(32, generator=torch.Generator().manual_seed(index))
        return x, int(x.sum() > 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Numbers(args.samples), batch_size=16, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            accelerator.backward(nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            if args.step_sleep:
                time.sleep(args.step_sleep)


if __name__ == "__main__":
    main()

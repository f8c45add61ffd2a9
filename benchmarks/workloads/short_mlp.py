"""Benchmark workload: a short DDP run, as people profile one (a few epochs, in memory).

A 24-layer MLP (256 wide) over 4,096 in-memory samples, ``--epochs`` epochs (4: 128 steps at
batch 64 on 2 ranks, 32 at batch 256), the DataLoader's ``--num-workers`` and ``--batch-size``
from the command line. Started by torchrun (gloo). ``benchmarks/real_scripts.py`` runs the tool
on it and checks its recommendation against a plain grid; rank 0 prints how long the training
loop took ("training loop: S s"), the whole loop timed as a user would time it.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.num_workers)
    layers: list[nn.Module] = [nn.Linear(64, 256), nn.ReLU()]
    for _ in range(22):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    model = DDP(nn.Sequential(*layers, nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    started = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    if dist.get_rank() == 0:
        print(f"training loop: {time.perf_counter() - started:.4f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

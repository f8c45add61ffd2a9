"""An HF accelerate script whose epochs are 3 batches a rank: accelerate's prepared loader takes
each batch one call ahead of the loop. Every step sleeps 40 ms, so no step can be faster."""

import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STEP_S = 0.04


def main() -> None:
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(96, 8), torch.randint(0, 2, (96,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(12):
        for x, y in loader:
            optimizer.zero_grad()
            accelerator.backward(nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            time.sleep(STEP_S)


if __name__ == "__main__":
    main()

"""An HF accelerate loop with ``gradient_accumulation_steps=3`` (launched by torchrun):
``accelerator.accumulate`` syncs and steps every third batch and at the end of the loader,
which accelerate finds by looking one batch ahead. Each epoch must see ``len(loader)``
batches and ``ceil(len(loader) / 3)`` optimizer steps; the loop asserts both and prints each
finished epoch as ``epoch E rank R: N batches of len L.``.
"""

import math
import sys
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset

ACCUMULATE = 3


class Samples(Dataset):
    def __init__(self, load_ms: float):
        self.load_ms = load_ms

    def __len__(self) -> int:
        return 368

    def __getitem__(self, index: int):
        time.sleep(self.load_ms / 1000)
        x = torch.randn(16, generator=torch.Generator().manual_seed(index))
        return x, int(x.sum() > 0)


def main() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    model = nn.Linear(16, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    load_ms = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0  # per sample, asleep
    loader = DataLoader(Samples(load_ms), batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(1000):
        batches = steps = 0
        for x, y in loader:
            batches += 1
            with accelerator.accumulate(model):
                accelerator.backward(nn.functional.cross_entropy(model(x), y))
                if accelerator.sync_gradients:
                    steps += 1
                optimizer.step()
                optimizer.zero_grad()
        if batches != len(loader) or steps != math.ceil(len(loader) / ACCUMULATE):
            raise RuntimeError(f"epoch {epoch}: {batches} batches of {len(loader)}, "
                               f"{steps} optimizer steps")
        print(f"epoch {epoch} rank {accelerator.process_index}: {batches} batches of len "
              f"{len(loader)}.", flush=True)


if __name__ == "__main__":
    main()

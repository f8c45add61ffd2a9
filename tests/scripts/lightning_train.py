"""A PyTorch Lightning script: Trainer(strategy="ddp", accelerator="cpu", devices=2).

Lightning starts rank 1 itself, as a child process of rank 0 (so ddp-profile runs it with
``--launcher none``), and gives the training loader a DistributedSampler of its own.
"""

import sys
import time

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int):
        x = torch.randn(32, generator=torch.Generator().manual_seed(index))
        return x, int(x.sum() > 0)


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        end = time.process_time() + 0.02  # a busy step: each rank uses a core
        while time.process_time() < end:
            pass
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    loader = DataLoader(Numbers(), batch_size=16, shuffle=True, num_workers=workers)
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=20,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(Classifier(), train_dataloaders=loader)


if __name__ == "__main__":
    main()

"""A PyTorch Lightning fit loop sized from its loaders: Trainer(strategy="ddp",
accelerator="cpu", devices=2), validation after every epoch, a one-cycle LR schedule stepped
every batch over ``trainer.estimated_stepping_batches``.

Each training epoch must see ``trainer.num_training_batches`` batches, each validation
``len(val_loader)``; the module asserts both and prints each finished training epoch as
``epoch E rank R: N batches of len L.``. Lightning starts rank 1 itself (``--launcher none``).
"""

import sys
import time

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, size: int, load_ms: float):
        self.size, self.load_ms = size, load_ms

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        time.sleep(self.load_ms / 1000)
        x = torch.randn(16, generator=torch.Generator().manual_seed(index))
        return x, int(x.sum() > 0)


class Counted(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(16, 2)
        self.seen = self.validated = 0

    def on_train_epoch_start(self) -> None:
        self.seen = 0

    def training_step(self, batch, batch_idx):
        self.seen += 1
        if batch_idx >= self.trainer.num_training_batches:
            raise RuntimeError(f"batch {batch_idx} of {self.trainer.num_training_batches}")
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def on_train_epoch_end(self) -> None:
        expected = self.trainer.num_training_batches
        if self.seen != expected:
            raise RuntimeError(f"epoch {self.current_epoch} saw {self.seen} of {expected}")
        print(f"epoch {self.current_epoch} rank {self.global_rank}: {self.seen} batches of "
              f"len {expected}.", flush=True)

    def on_validation_epoch_start(self) -> None:
        self.validated = 0

    def validation_step(self, batch, batch_idx):
        self.validated += 1

    def on_validation_epoch_end(self) -> None:
        expected = self.trainer.num_val_batches[0]
        if not self.trainer.sanity_checking and self.validated != expected:
            raise RuntimeError(f"validation saw {self.validated} of {expected}")

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=0.1, total_steps=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    load_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0  # per sample, asleep
    train = DataLoader(Samples(368, load_ms), batch_size=8, shuffle=True, num_workers=workers)
    val = DataLoader(Samples(64, 0.0), batch_size=8)
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=200,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Counted(), train_dataloaders=train, val_dataloaders=val)


if __name__ == "__main__":
    main()

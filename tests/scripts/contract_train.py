"""A DDP loop that depends on its loader's length and epochs, as real training loops do.

Every epoch must see exactly ``len(loader)`` batches, else the loop fails the way real ones
fail: a one-cycle LR schedule sized ``epochs * len(loader)`` raises when stepped past its
end, the last accumulation group is sized ``len(loader) % accum`` and divides by it on a
batch past the end (``ZeroDivisionError`` where the remainder is 0), a progress counter with a
total overruns, and the loop asserts the count itself. At each epoch's end it prints
``epoch E rank R: N batches of len L.``.

``--shape`` picks the loader the loop iterates:

* ``plain``: a DataLoader over a DistributedSampler;
* ``persistent``: the same with ``persistent_workers=True``;
* ``wrapper``: a class around the DataLoader that moves and normalises each batch one ahead
  of the loop (the shape of image-training loaders that prefetch to the device);
* ``repeat``: a DataLoader subclass that keeps one iterator over a batch sampler repeated
  forever, so its workers live across epochs, and ends each epoch by counting to its length;
* ``iterable``: an IterableDataset with a length, split by rank and worker.
"""

import argparse
import functools
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    get_worker_info,
)

FEATURES = 16


def sample(index: int, load_ms: float):
    if load_ms:
        time.sleep(load_ms / 1000)
    x = torch.randn(FEATURES, generator=torch.Generator().manual_seed(index))
    return x, int(x.sum() > 0)


def start_worker(start_ms: float, worker_id: int) -> None:
    """A worker's own start-up (a dataset opening its files or database in each worker)."""
    time.sleep(start_ms / 1000)


class Samples(Dataset):
    def __init__(self, size: int, load_ms: float):
        self.size, self.load_ms = size, load_ms

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        return sample(index, self.load_ms)


class Stream(IterableDataset):
    """This rank's share of the samples, split again between the loader's workers batch by
    batch (so that the epoch has ``len(loader)`` batches whatever the workers)."""

    def __init__(self, size: int, load_ms: float, rank: int, world: int, batch: int):
        self.size, self.load_ms, self.rank, self.world = size, load_ms, rank, world
        self.batch = batch

    def __len__(self) -> int:
        return self.size // self.world

    def __iter__(self):
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        mine = list(range(self.rank, self.size - self.size % self.world, self.world))
        batches = [mine[i:i + self.batch] for i in range(0, len(mine), self.batch)]
        for batch in batches[worker::workers]:
            for index in batch:
                yield sample(index, self.load_ms)


class Forever:
    """A batch sampler repeated without end."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        while True:
            yield from self.batches

    def __len__(self) -> int:
        return len(self.batches)


class KeepsWorkers(DataLoader):
    """One iterator for the whole run: the workers are started once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "batch_sampler", Forever(self.batch_sampler))
        self.iterator = super().__iter__()

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self):
        for _ in range(len(self)):
            yield next(self.iterator)


class Normalised:
    """Wraps a loader: each batch is moved and normalised while the loop trains on the last."""

    def __init__(self, loader):
        self.loader = loader
        self.sampler = loader.sampler

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        previous = None
        for x, y in self.loader:
            current = ((x - x.mean()) / (x.std() + 1e-6), y)
            if previous is not None:
                yield previous
            previous = current
        if previous is not None:
            yield previous


def build_loader(args, rank: int, world: int):
    if args.shape == "iterable":
        return DataLoader(Stream(args.samples, args.load_ms, rank, world, args.batch_size),
                          batch_size=args.batch_size, num_workers=args.workers)
    data = Samples(args.samples, args.load_ms)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=1)
    kwargs = dict(batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
    if args.worker_start_ms:
        kwargs["worker_init_fn"] = functools.partial(start_worker, args.worker_start_ms)
    if args.shape == "persistent":
        return DataLoader(data, persistent_workers=args.workers > 0, **kwargs)
    if args.shape == "repeat":
        return KeepsWorkers(data, **kwargs)
    loader = DataLoader(data, **kwargs)
    return Normalised(loader) if args.shape == "wrapper" else loader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="plain",
                        choices=("plain", "persistent", "wrapper", "repeat", "iterable"))
    parser.add_argument("--samples", type=int, default=368)  # 23 batches of 8 per rank
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--load-ms", type=float, default=1.0)
    parser.add_argument("--worker-start-ms", type=float, default=0.0)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=1000)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = build_loader(args, rank, world)
    model = DistributedDataParallel(nn.Linear(FEATURES, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1,
                                                   total_steps=args.epochs * len(loader))
    for epoch in range(args.epochs):
        sampler = getattr(loader, "sampler", None)
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        batches = len(loader)
        last_accum = batches % args.accum
        first_of_last_group = batches - last_accum
        accum, progress = args.accum, 0
        for index, (x, y) in enumerate(loader):
            if index >= first_of_last_group:
                accum = last_accum
            loss = nn.functional.cross_entropy(model(x), y) / accum
            loss.backward()
            if (index + 1) % accum == 0 or index == batches - 1:
                optimizer.step()
                optimizer.zero_grad()
                schedule.step()
            progress += 1
            if progress > batches:
                raise RuntimeError(f"epoch {epoch}: batch {progress} of {batches}")
        if progress != batches:
            raise RuntimeError(f"epoch {epoch} saw {progress} batches, len(loader) {batches}")
        print(f"epoch {epoch} rank {rank}: {progress} batches of len {batches}.", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A rebuilt iterator serves the rest of the current pass: real DataLoaders, real workers."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler

from ddp_profile.profiler.rank.windows import (
    cannot_continue,
    note_yielded,
    rest_of_pass,
    serving,
)


class Indices(Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> int:
        return index


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(40))


def loader_of(workers: int, **kwargs) -> DataLoader:
    return DataLoader(Indices(), batch_size=4, num_workers=workers,
                      sampler=RandomSampler(Indices(), generator=torch.Generator().manual_seed(3)),
                      **kwargs)


def switched(loader: DataLoader, running, workers: int):
    """What a screen does at a window's start: the rest of the pass, the running iterator's
    workers shut down, the loader's settings changed, a new iterator serving the rest."""
    rest = rest_of_pass(running)
    running._shutdown_workers() if hasattr(running, "_workers") else None
    loader.num_workers, loader.prefetch_factor = workers, 2 if workers else None
    return serving(loader, rest)


def epoch(iterator) -> list[list[int]]:
    """The batches an iterator yields to its end, each noted as yielded."""
    batches = []
    for batch in iterator:
        note_yielded(iterator)
        batches.append(batch.tolist())
    return batches


def first(iterator, count: int) -> list[list[int]]:
    batches = []
    for _ in range(count):
        batches.append(next(iterator).tolist())
        note_yielded(iterator)
    return batches


@pytest.mark.parametrize("before, after", [(0, 2), (2, 0), (2, 1)])
def test_a_switch_mid_epoch_serves_exactly_the_rest_of_the_pass(noted, before, after):
    expected = epoch(iter(loader_of(0)))  # the pass the script sees without a probe
    loader = loader_of(before)
    running = iter(loader)
    seen = first(running, 3)  # with workers, more were prefetched than yielded
    seen += epoch(switched(loader, running, after))
    assert seen == expected  # same batches, same order, and the epoch ends where it would
    assert len(seen) == len(loader) == 10
    assert epoch(iter(loader)) != expected and len(epoch(iter(loader))) == 10  # next epochs:
    # the sampler's own new passes (a new permutation), at the new settings


def test_a_persistent_loader_starts_its_next_epoch_from_its_own_sampler(noted):
    loader = loader_of(2, persistent_workers=True)
    running = iter(loader)
    seen = first(running, 2)
    fresh = switched(loader, running, 1)
    loader._iterator = fresh  # as a screen does for a persistent loader
    seen += epoch(fresh)
    assert len(seen) == 10 and sorted(sum(seen, [])) == list(range(40))
    again = iter(loader)  # the persistent iterator's reset: a whole new pass
    assert again is fresh and len(epoch(again)) == 10
    fresh._shutdown_workers()


def test_building_the_iterator_leaves_the_scripts_random_stream_alone(noted):
    loader = loader_of(2)
    running = iter(loader)
    first(running, 1)
    torch.manual_seed(7)
    state = torch.random.get_rng_state()
    running._shutdown_workers()
    fresh = serving(loader, rest_of_pass(running))
    assert torch.equal(torch.random.get_rng_state(), state)
    fresh._shutdown_workers()


def test_a_loader_that_repeats_its_sampler_keeps_its_own_epoch_count(noted):
    """A DataLoader subclass that keeps one iterator over a sampler repeated forever and ends
    each epoch by counting to its length (workers kept across epochs)."""

    class Repeat:
        def __init__(self, batches):
            self.batches = batches

        def __iter__(self):
            while True:
                yield from self.batches

        def __len__(self):
            return len(self.batches)

    class KeepsWorkers(DataLoader):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            object.__setattr__(self, "batch_sampler", Repeat(self.batch_sampler))
            self.iterator = super().__iter__()

        def __len__(self):
            return len(self.batch_sampler)

        def __iter__(self):
            for _ in range(len(self)):
                batch = next(self.iterator)
                note_yielded(self.iterator)
                yield batch

    loader = KeepsWorkers(Indices(), batch_size=4, num_workers=2)
    first_epoch = [b.tolist() for b in loader]
    second = iter(loader)
    second_epoch = [next(second).tolist()]
    loader.iterator = switched(loader, loader.iterator, 0)  # one batch into epoch 2
    second_epoch += [b.tolist() for b in second]
    assert second_epoch == first_epoch  # the repeated sampler goes on from where it was
    assert [b.tolist() for b in loader] == first_epoch


def test_an_iterable_dataset_cannot_be_continued():
    assert "IterableDataset" in cannot_continue(DataLoader(Stream(), batch_size=4))
    assert cannot_continue(loader_of(0)) is None

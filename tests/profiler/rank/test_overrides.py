"""Overrides applied to the arguments of a real DataLoader, and what gets recorded."""

from __future__ import annotations

import inspect

import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from ddp_profile.profiler.rank.loading.loadcost import batch_size_of
from ddp_profile.profiler.rank.overrides import apply_overrides
from ddp_profile.profiler.settings import LoaderSettings

DATA = TensorDataset(torch.arange(64.0))


def bound(**kwargs):
    signature = inspect.signature(DataLoader.__init__)
    arguments = signature.bind(None, DATA, **kwargs)
    arguments.apply_defaults()
    return arguments


def build(arguments) -> DataLoader:
    values = dict(arguments.arguments)
    values.pop("self")
    return DataLoader(**values)


def test_batch_sampler_is_rebuilt_around_the_same_sampler():
    sampler = DistributedSampler(DATA, num_replicas=2, rank=1, shuffle=False)
    arguments = bound(batch_sampler=BatchSampler(sampler, 4, drop_last=True))
    applied, skipped = apply_overrides(arguments.arguments, LoaderSettings(batch_size=8))
    assert skipped == [] and applied["batch_size"] == 8
    rebuilt = arguments.arguments["batch_sampler"]
    assert rebuilt.sampler is sampler and rebuilt.batch_size == 8 and rebuilt.drop_last
    batches = list(build(arguments))
    assert [len(b[0]) for b in batches] == [8, 8, 8, 8]
    assert batches[0][0][:2].tolist() == [1.0, 3.0]  # still rank 1's shard


def test_custom_batch_sampler_is_kept_and_the_skip_recorded():
    class Buckets(BatchSampler):
        pass

    arguments = bound(batch_sampler=Buckets(SequentialSampler(DATA), 4, drop_last=False))
    applied, skipped = apply_overrides(arguments.arguments, LoaderSettings(batch_size=16))
    assert applied["batch_size"] == 4
    assert skipped[0]["setting"] == "batch_size" and "Buckets" in skipped[0]["reason"]


def test_prefetch_without_workers_is_skipped_and_the_loader_still_builds():
    arguments = bound(batch_size=4, num_workers=2, prefetch_factor=4, persistent_workers=True)
    applied, skipped = apply_overrides(arguments.arguments,
                                       LoaderSettings(num_workers=0, prefetch_factor=8))
    assert applied == {"num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                       "batch_size": 4}
    assert skipped[0]["setting"] == "prefetch_factor"
    assert arguments.arguments["persistent_workers"] is False
    assert len(list(build(arguments))) == 16  # PyTorch accepts what is left


def test_workers_and_prefetch_are_applied():
    arguments = bound(batch_size=4)
    applied, skipped = apply_overrides(arguments.arguments,
                                       LoaderSettings(num_workers=2, prefetch_factor=3,
                                                      pin_memory=True))
    assert applied == {"num_workers": 2, "pin_memory": True, "prefetch_factor": 3,
                       "batch_size": 4}
    assert skipped == []


def test_no_automatic_batching_keeps_batch_size_none():
    arguments = bound(batch_size=None)
    applied, skipped = apply_overrides(arguments.arguments, LoaderSettings(batch_size=8))
    assert applied["batch_size"] is None and skipped[0]["setting"] == "batch_size"


def test_batch_size_of_nested_batches():
    assert batch_size_of({"x": [torch.zeros(5, 2)], "y": 3}, default=1) == 5
    assert batch_size_of((torch.tensor(3.0), torch.zeros(7)), default=1) == 7
    assert batch_size_of(["no", "tensors"], default=9) == 9


def test_the_samples_an_epoch_covers_and_the_dataset_digest_are_recorded():
    from ddp_profile.profiler.rank.overrides import own_settings

    whole = own_settings(bound(batch_size=8, shuffle=True).arguments)
    assert whole["epoch_samples"] == 64 == whole["dataset_len"]
    shard = own_settings(bound(batch_size=8, sampler=DistributedSampler(
        DATA, num_replicas=2, rank=0)).arguments)
    assert shard["epoch_samples"] == 32
    batches = own_settings(bound(batch_sampler=BatchSampler(
        SequentialSampler(DATA), 5, drop_last=True)).arguments)
    assert batches["epoch_samples"] == 60  # 12 whole batches of 5
    # the same data built again digests alike; other data does not
    assert whole["dataset_fingerprint"] == own_settings(bound(
        batch_size=8).arguments)["dataset_fingerprint"] is not None
    other = TensorDataset(torch.arange(64.0) + 1)
    signature = inspect.signature(DataLoader.__init__)
    arguments = signature.bind(None, other, batch_size=8)
    assert own_settings(arguments.arguments)["dataset_fingerprint"] != whole["dataset_fingerprint"]


def test_a_dataset_holding_nothing_readable_gets_no_digest():
    from ddp_profile.profiler.rank.facts import dataset_fingerprint

    class Generated(torch.utils.data.Dataset):
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return torch.randn(4)

    assert dataset_fingerprint(Generated(10)) is None
    files = type("Files", (torch.utils.data.Dataset,), {"__len__": lambda self: 3})()
    files.paths = ["/data/a.jpg", "/data/b.jpg", "/data/c.jpg"]
    assert dataset_fingerprint(files) is not None

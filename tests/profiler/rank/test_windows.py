"""A probe's windows and the ceiling's replay as the instrumentation drives them."""

from __future__ import annotations

import weakref

import pytest
from torch.utils.data import DataLoader, IterableDataset

from ddp_profile.profiler.rank.windows import CeilingReplay, IteratorState, Screen, note_yielded
from ddp_profile.profiler.settings import CEILING_CACHE_BATCHES, ProbePlan


def test_a_probe_is_one_window_done_after_its_measured_steps():
    screen = Screen(ProbePlan(probe_id="p", out_dir="/tmp/x", warmup=3, steps=10))
    record = {"step": 7, "measured": True}
    screen.label(record)
    assert record == {"step": 7, "measured": True}  # a probe labels nothing
    assert screen.boundary(0) is None and screen.mode(True) == "normal"
    assert not screen.done(12, 9, 10) and screen.done(13, 10, 10)


def test_a_screen_labels_windows_switches_at_their_starts_and_ends_after_the_last():
    windows = [{"overrides": {"num_workers": 0}, "warmup": 2, "steps": 5},
               {"overrides": {"num_workers": 2}, "warmup": 3, "steps": 5, "mode": "ceiling"}]
    screen = Screen(ProbePlan(probe_id="p", out_dir="/tmp/x", warmup=2, steps=5,
                              windows=windows))
    assert screen.starts == [0, 7] and screen.total_steps == 15
    labelled = []
    for step in (1, 2, 7, 9, 10):
        record = {"step": step}
        screen.label(record)
        labelled.append((record["window"], record["measured"]))
    assert labelled == [(0, False), (0, True), (1, False), (1, False), (1, True)]
    assert [screen.boundary(s) for s in (0, 3, 7)] == [0, None, 1]
    screen.window = 1
    assert screen.mode(True) == "ceiling"  # the training loader
    assert screen.mode(False) == "normal"  # another loader keeps the probe's mode
    assert not screen.done(14, 0, 10) and screen.done(15, 0, 10)


@pytest.fixture
def own_threads():
    """Torch's intra-op threads as the test found them, put back after it."""
    import torch

    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_a_screen_switches_torchs_threads_per_window_and_restores_the_scripts(own_threads):
    """A B A with B at 1 thread: the script's count is read before the first switch (here
    one more than it started with: what the script set), and every A window gets it back."""
    import torch

    windows = tuple({"overrides": {}, "warmup": 1, "steps": 2, **extra}
                    for extra in ({}, {"threads": 1}, {}))
    screen = Screen(ProbePlan(probe_id="p", out_dir="/tmp/x", windows=windows))
    screen.start_threads()  # window 0 runs the script's own: nothing set
    assert torch.get_num_threads() == own_threads and screen.script_threads is None
    torch.set_num_threads(own_threads + 1)  # the script's own
    assert screen.switch_threads(1) == 1 == torch.get_num_threads()
    assert screen.switch_threads(2) == own_threads + 1 == torch.get_num_threads()


def test_a_screen_that_starts_with_threads_of_its_own_sets_them_at_its_first_batch(own_threads):
    import torch

    windows = tuple({"overrides": {}, **extra} for extra in ({"threads": 1}, {}))
    screen = Screen(ProbePlan(probe_id="p", out_dir="/tmp/x", windows=windows))
    screen.start_threads()
    assert torch.get_num_threads() == 1 and screen.script_threads == own_threads
    assert screen.switch_threads(1) == own_threads


def test_windows_without_threads_leave_torchs_alone(own_threads):
    import torch

    screen = Screen(ProbePlan(probe_id="p", out_dir="/tmp/x",
                              windows=({"overrides": {}}, {"overrides": {}})))
    torch.set_num_threads(1)
    assert screen.switch_threads(1) == 1 and screen.script_threads is None


def replayed_epochs(workers: int, epochs: int) -> tuple[list[list[int]], DataLoader]:
    """The batches a ceiling serves a loop of ``epochs`` epochs, as the instrumentation
    asks for them: a real DataLoader, each epoch's iterator with its state."""
    loader = DataLoader(list(range(40)), batch_size=4, num_workers=workers)
    replay, served = CeilingReplay(), []
    for _ in range(epochs):
        iterator = iter(loader)
        state = IteratorState(0, 0, 0, weakref.ref(loader), iterator=weakref.ref(iterator))
        batches = []

        def real_batch(iterator=iterator):  # as the instrumentation serves one
            batch = next(iterator)
            note_yielded(iterator)
            return batch
        while True:
            try:
                batches.append(replay.fetch(state, real_batch).tolist())
            except StopIteration:
                break
        served.append(batches)
    return served, loader


@pytest.mark.parametrize("workers", [0, 2])
def test_the_ceiling_replays_its_first_batches_and_ends_each_epoch_where_it_would(noted,
                                                                                   workers):
    served, loader = replayed_epochs(workers, epochs=3)
    assert [len(batches) for batches in served] == [10, 10, 10]  # len(loader), every epoch
    cached = served[0][:CEILING_CACHE_BATCHES]
    assert cached == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert all(batch in cached for batches in served for batch in batches)  # loaded once
    assert loader.num_workers == 0  # later epochs start no workers


def test_a_replayed_iterable_dataset_without_length_says_its_epochs_have_no_end():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(1000))

    loader = DataLoader(Stream(), batch_size=4)
    iterator = iter(loader)
    state = IteratorState(0, 0, 0, weakref.ref(loader), iterator=weakref.ref(iterator))
    replay = CeilingReplay()
    for _ in range(CEILING_CACHE_BATCHES + 2):
        replay.fetch(state, lambda: next(iterator))
    assert "no length" in replay.unbounded

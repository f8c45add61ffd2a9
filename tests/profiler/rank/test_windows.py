"""A probe's windows and the ceiling's replay as the instrumentation drives them."""

from __future__ import annotations

from ddp_profile.profiler.rank.windows import CeilingReplay, Screen
from ddp_profile.profiler.settings import CEILING_CACHE_BATCHES, ProbePlan


def test_a_probe_is_one_window_done_after_its_measured_steps():
    screen = Screen(ProbePlan(probe_id="p", out_dir="/tmp/x", warmup=3, steps=10))
    record = {"step": 7, "measured": True}
    screen.label(record)
    assert record == {"step": 7, "measured": True}  # a probe labels nothing
    assert screen.boundary(0) is None and screen.mode(True, 7) == ("normal", 7)
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
    assert screen.mode(True, 9) == ("ceiling", 2)  # the training loader, 2 steps in
    assert screen.mode(False, 9) == ("normal", 9)  # another loader keeps the probe's mode
    assert not screen.done(14, 0, 10) and screen.done(15, 0, 10)


def test_the_ceiling_replays_its_first_batches():
    replay, fetched = CeilingReplay(), []

    def next_batch():
        fetched.append(len(fetched))
        return fetched[-1]

    served = [replay.fetch(0, step, next_batch) for step in range(CEILING_CACHE_BATCHES + 3)]
    assert fetched == list(range(CEILING_CACHE_BATCHES))  # loaded once, then replayed
    assert served[CEILING_CACHE_BATCHES:] == [s % CEILING_CACHE_BATCHES for s in
                                              range(CEILING_CACHE_BATCHES,
                                                    CEILING_CACHE_BATCHES + 3)]

"""The compute-only ceiling of a sweep: whether to measure it, measuring it, and vetting it.

A ceiling probe (``Kind.CEILING``) replays a few cached batches instead of loading
(``rank.windows.CeilingReplay``): the loop's rate without waiting for data, against which
every configuration is scored. Replaying cannot be slower than loading, so a ceiling that ran
below a rate measured with loading at its batch size measured something else (worker
start-ups, a loop that rebuilt its iterators, a busy machine), or nothing above the loading
rates (within its noise, the best configuration is at the ceiling): either way it is no
ceiling to score against. It is marked failed with why
(``store.probes.CEILING_FAILED``, an appended ledger line) and read as none
(``store.probes.latest_ceiling``). ``search``: the ``sweep.search.Search`` that calls in
(``sweep.state.SearchState``).
"""

from __future__ import annotations

from typing import Optional

from ddp_profile.profiler.settings import Mode
from ddp_profile.profiler.store.probes import Kind, ProbeRecord, latest_ceiling, not_a_ceiling
from ddp_profile.profiler.sweep.climb import winnable_share, worth_tuning
from ddp_profile.profiler.sweep.state import SearchState, Window


def wanted(search: SearchState) -> bool:
    """The compute-only probe is worth a launch only when loading settings could win back a
    measurable share of the baseline's steps (``climb.worth_tuning``): otherwise the loop is
    at its ceiling already. Nor where a replay could not end the script's epochs where they
    end (an IterableDataset without a length). A note says why not, once."""
    if not search.options.ceiling or search.baseline is None:
        return False
    loader = search.loader()
    why = None
    if search.baseline.ok and not worth_tuning(search.baseline):
        why = "loading takes too little of the baseline's steps to win back"
    elif loader.get("iterable") and loader.get("dataset_len") is None:
        why = ("the training loader's IterableDataset has no length: replayed batches could "
               "not end its epochs where they end")
    if why is None:
        return True
    search.note_once("no ceiling", f"no compute-only ceiling probe: {why}")
    return False


def measure(search: SearchState) -> None:
    """The compute-only probe, at the recommended configuration's batch size (unless the
    ceiling measured already is at that batch size, ``refused`` says one is not worth a
    launch there, or, a ceiling measured at another batch size, ``settled`` does)."""
    best = search.best() or search.baseline
    config = best.config
    kept = latest_ceiling(search.entries)
    if (kept is None or kept.config.batch_size != config.batch_size) \
            and not refused(search, config.batch_size) \
            and not (kept is not None and settled(search, best)):
        search.measurer.measure(Window(config, Kind.CEILING, mode=Mode.CEILING,
                                       steps_per_s=search.steps_per_s(config, Mode.CEILING)))


def settled(search: SearchState, best: ProbeRecord) -> bool:
    """Whether ``best``, measured, wins back too little of its steps by loading
    (``climb.worth_tuning``) for a second ceiling, at its batch size, to show anything: a
    loop without loading runs at most ``1 / (1 - its winnable share)`` of it, a bound
    measured in ``best`` itself. Said once, with that bound."""
    if not best.ok or worth_tuning(best):
        return False
    share = winnable_share(best)
    assert share is not None  # ``worth_tuning`` counts unknown as worth it
    search.note_once("no ceiling", f"no compute-only ceiling probe at batch "
                     f"{best.config.batch_size}: loading could win back {share:.0%} of "
                     f"{best.id}'s steps, so without it the loop runs at most "
                     f"{1 / (1 - share):.2f}x as fast")
    return True


def refused(search: SearchState, batch: Optional[int]) -> bool:
    """Whether a ceiling at ``batch`` replayed below a loading rate already (``vet``) in a
    script that ends before a probe's steps: each launch of it is a whole run, which a second
    replay is not worth. Said once."""
    if not any(e.short for e in search.entries):
        return False
    failed = next((e for e in search.entries if e.kind == Kind.CEILING and e.ceiling_failed
                   and e.config.batch_size == batch), None)
    if failed is None:
        return False
    search.note_once("no ceiling", f"no compute-only ceiling probe: {failed.id} at batch "
                     f"{batch} replayed below a loading rate, and a launch of this script "
                     "runs it to its end")
    return True


def vet(search: SearchState) -> None:
    """Mark every ceiling measured below a loading rate at its batch size."""
    for entry in search.entries:
        if entry.kind != Kind.CEILING or not entry.ok or entry.ceiling_failed:
            continue
        batch = entry.config.batch_size
        faster = [e for e in search.ok_entries() if e.config.batch_size == batch
                  and e.throughput > entry.throughput]
        if not faster:
            continue
        top = max(faster, key=lambda e: e.throughput)
        why = (f"replaying cached batches ran {entry.throughput:,.1f} samples/s, below the "
               f"{top.throughput:,.1f} that {top.id} ({top.config.label()}) "
               "measured with loading")
        search.measurer.amend(entry, not_a_ceiling(why))
        search.progress("note", {"text": f"{entry.id}: not a ceiling: {why}"})

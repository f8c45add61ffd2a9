"""The communication counterfactuals of a sweep: ``measure(search)``, called by ``Search.run``.

Each is a probe of kind ``ddp`` (``store.probes.Kind.DDP``): the script's own settings with
other DDP options (``ProbePlan.ddp``, applied by the rank hook), never in the choice. Each is
measured beside the script's own DDP options, alternated (``decide.paired.rounds``), so that
what a launch's level and the machine's drift add cancels (a single launch against another
can misread an option's gain several times over): the step without gradient synchronisation
in windows of one launch (``GRADIENT_SYNC`` switches between steps), DDP constructor options
in launches of their own, ``A B A C A ...``, a reference launch next to each. The rules read
the alternations (``rules.findings.synchronisation``). With ``--pairs 0`` the step without
synchronisation is one launch beside one of the script's (its twin), and no DDP option is
measured. Larger per-rank batches are ordinary sweep probes, which the choice weighs under
its batch-size clause.
"""

from __future__ import annotations

from typing import Any

from ddp_profile.profiler.decide.choose import (
    UNSTABLE_RSE,
    ChoiceThresholds,
    comm_bound,
    exposed_share,
    relative_se,
    run_thresholds,
)
from ddp_profile.profiler.decide.ddp import (
    alternation_fit,
    ddp_counterfactuals,
    effect_interval,
    options_key,
)
from ddp_profile.profiler.decide.paired import (
    CANDIDATE,
    REFERENCE,
    alternations,
    room_for_noise,
    rounds,
)
from ddp_profile.profiler.settings import GRADIENT_SYNC, LoaderSettings
from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.sweep.adaptive import measure_larger_batches
from ddp_profile.profiler.sweep.claim import LAUNCH_PAIRS, WINDOW_PAIRS
from ddp_profile.profiler.sweep.space import normalise
from ddp_profile.profiler.sweep.state import SearchState, Window, where_windows


def measure(search: SearchState, larger_batches: bool = True) -> None:
    """Where DDP's timers show exposed communication (``choose.exposed_share``), first the
    step without gradient synchronisation (every forward as under ``no_sync()``) alternated
    with the script's (``unsynchronised``): what communication costs. Where it costs
    ``comm_exposed_share`` or more: unless the batch-size axis was given (or
    ``larger_batches`` is off: not an adaptive search), the best configuration with 2x, then
    4x the per-rank batch (the all-reduce moves the same gradients per step whatever the
    batch; the finding says that a batch size changes the optimisation); then other DDP
    options (``ddp_counterfactuals``), alternated with the script's own. ``search``: the
    ``sweep.search.Search`` that calls in (``sweep.state.SearchState``)."""
    baseline = search.baseline
    if baseline is None or not baseline.ok or not exposed_share(baseline):
        return
    if not unsynchronised(search):
        return
    if larger_batches and search.space.batch_size is None:
        measure_larger_batches(search, search.best() or baseline)
    options = ddp_counterfactuals(baseline)
    if options and search.options.pairs > 0:
        alternate(search, options, in_one_launch=False)


def unsynchronised(search: SearchState) -> bool:
    """Measure the step without gradient synchronisation; whether it saves
    ``comm_exposed_share`` of the step or more, beyond noise (as ``exposed-communication``
    reads it: a saving the noise could make costs no further launch). Alternated with the
    script's step in windows of one launch (``A B A B A B A`` for ``--pairs 3``; launches
    ``A B A B A`` where the loader cannot be rebuilt), the saving read from the alternation's
    fit; with ``--pairs 0`` one launch beside a twin of the script's, as ``choose.comm_bound``
    judges them."""
    unsynced = {GRADIENT_SYNC: False}
    if search.options.pairs > 0:
        entries = next((group for group in alternations(search.entries, Kind.DDP)
                        if any(e.comm.options == unsynced for e in group)), None) \
            or alternate(search, [unsynced], in_one_launch=True)  # measured already, or now
        fit, thresholds = alternation_fit(entries), run_thresholds(ChoiceThresholds(),
                                                                   search.entries)
        if fit is not None:  # as the finding reads it: faster beyond noise, by the share or more
            key = options_key(unsynced)
            low, _ = effect_interval(fit, key, len({e.launch for e in entries}),
                                     thresholds.interval_confidence, thresholds.launch_sd)
            return low > 1.0 and 1.0 - 1.0 / fit.ratio(key) >= thresholds.comm_exposed_share
    twin = _ddp_probe(search, {})  # the script as it is, beside its counterfactual
    return comm_bound(search.baseline, _ddp_probe(search, unsynced), twin)


def riding_windows(search: SearchState, others: list[Window]) -> list[Window]:
    """The step without gradient synchronisation alternated with the script's
    (``unsynchronised``), as windows for the worker ladder's launch where ``measure`` would
    alternate them in windows of a launch of their own, and one launch holds them and
    ``others`` (``epoch_holds``): that launch's start-up saved. Each window names the
    script's settings (a screen's window applies its own over the last's)."""
    baseline = search.baseline
    if not search.options.comm or search.options.pairs <= 0 or baseline is None \
            or not baseline.ok or not exposed_share(baseline) \
            or search.measurer.screen_unsupported or search.loader().get("iterable"):
        return []
    config, unsynced = normalise(baseline.config), {GRADIENT_SYNC: False}
    rate = search.steps_per_s(config)
    trial = [Window(config, Kind.DDP, steps_per_s=rate, ddp=unsynced if i >= 0 else {})
             for i in rounds(1, max(search.options.pairs, WINDOW_PAIRS))]
    if not epoch_holds(search, [*trial, *others]):
        return []  # the ladder's rungs first: windows past the script's end go on in launches
    placed = _placed(search, [unsynced], f"ddp-{len(search.entries):03d}", True,
                     where="in the worker ladder's launch")
    return [Window(config, Kind.DDP, steps_per_s=rate, pair=pair, ddp=ddp)
            for ddp, pair in placed]


def epoch_holds(search: SearchState, windows: list[Window]) -> bool:
    """Whether one launch holds ``windows``: as a launch that ran the script to its end says
    (``screen_launches``), else within one epoch of the training loader (its dataset over the
    batch on every rank: the least a run of the script makes)."""
    counts = search.measurer.screen_launches(windows)
    if counts is not None:
        return len(counts) == 1
    loader, base = search.loader(), search.baseline
    batch = base.config.batch_size if base is not None else None
    ranks = len(base.ranks) if base is not None else 0
    if not loader.get("dataset_len") or not batch or not ranks:
        return False
    return search.measurer.screen_steps(windows) <= loader["dataset_len"] // (batch * ranks)


def alternate(search: SearchState, candidates: list[dict[str, Any]], in_one_launch: bool
              ) -> list[ProbeRecord]:
    """The script's own settings with its own DDP options (the reference) and with each of
    ``candidates`` (DDP options), alternated ``A B A C A ...`` (``decide.paired.rounds``):
    windows of one launch where ``in_one_launch`` and the loader can be rebuilt (gradient
    synchronisation alone switches between steps; at least ``WINDOW_PAIRS`` rounds), else a
    launch each (at most ``LAUNCH_PAIRS`` rounds). Each entry carries its
    place (``pair``: role, index, group); a failed launch ends the alternation."""
    assert search.baseline is not None
    config = normalise(search.baseline.config)
    rate = search.steps_per_s(config)
    group = f"ddp-{len(search.entries):03d}"
    windows = in_one_launch and not search.measurer.screen_unsupported
    placed = _placed(search, candidates, group, windows)
    if not placed:
        return []
    if windows:
        entries = search.measurer.measure_screen([
            Window(LoaderSettings(), Kind.DDP, steps_per_s=rate, pair=pair, ddp=ddp)
            for ddp, pair in placed])
        if entries or not search.measurer.screen_unsupported:
            return entries
        placed = _placed(search, candidates, group, False)
    entries = []
    for ddp, pair in placed:
        entry = search.measurer.measure(Window(LoaderSettings(), Kind.DDP, ddp=ddp,
                                               steps_per_s=rate, pair=pair))
        entries.append(entry)
        if not entry.ok:
            break  # a crash or an OOM would only repeat itself
    return entries


def _placed(search: SearchState, candidates: list[dict[str, Any]], group: str, windows: bool,
            where: str = "") -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The alternation's DDP options and places, in order; told to the user (or why it is
    not run)."""
    # windows of one launch are cheap: at least WINDOW_PAIRS of them, for a fit with room
    pairs = max(search.options.pairs, WINDOW_PAIRS) if windows \
        else min(search.options.pairs, LAUNCH_PAIRS)
    sequence = rounds(len(candidates), pairs)
    letters = " ".join("A" if i < 0 else chr(ord("B") + i) for i in sequence)
    names = "; ".join(f"{chr(ord('B') + i)}: {options_key(c)}" for i, c in enumerate(candidates))
    if not room_for_noise(len(sequence), len(candidates)):
        search.progress("note", {"text": f"DDP options not measured ({names}): {letters} leaves "
                                         "no room for its noise (--pairs 2 or more)"})
        return []
    rate = search.steps_per_s(normalise(search.baseline.config)) if search.baseline else None
    where = where or where_windows(search.measurer, [
        Window(LoaderSettings(), Kind.DDP, steps_per_s=rate, ddp=candidates[i] if i >= 0 else {})
        for i in sequence]) if windows else "a launch each"
    search.progress("note", {"text": f"DDP options against the script's own (A), alternated "
                                     f"{letters}, {where} ({names})"})
    return [(candidates[i] if i >= 0 else {},
             {"role": REFERENCE if i < 0 else CANDIDATE, "index": index, "group": group})
            for index, i in enumerate(sequence)]


def _ddp_probe(search: SearchState, options: dict[str, Any]) -> ProbeRecord:
    """The script's own settings with DDP ``options``, one launch."""
    assert search.baseline is not None
    rate = search.steps_per_s(normalise(search.baseline.config))
    entry = search.measurer.measure(Window(LoaderSettings(), Kind.DDP, ddp=options,
                                           steps_per_s=rate))
    if entry.ok and relative_se(entry) > UNSTABLE_RSE:
        entry = search.measurer.measure(Window(LoaderSettings(), Kind.DDP, ddp=options,
                                               steps=search.options.steps * 2,
                                               steps_per_s=rate))
    return entry



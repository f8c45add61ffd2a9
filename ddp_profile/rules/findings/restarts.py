"""Rule about the epoch boundary: DataLoader workers started again at every epoch.

Each rule is ``rule(run, thresholds, known) -> Finding | None`` (see ``rules.base``). A probe of a
loader that restarts carries what the restarts cost (``store.epochs``): ``epoch_restart_s``
per epoch of ``epoch_steps`` steps, its ``throughput`` as the script runs (one restart per
epoch) and its ``steady_throughput`` between restarts.
"""

from __future__ import annotations

from typing import Optional

from ddp_profile.profiler.decide.paired import one_time_start
from ddp_profile.profiler.decide.worker_restarts import KeptAlive, kept_alive
from ddp_profile.profiler.store.epochs import restart_share
from ddp_profile.profiler.store.probe_parts import Epochs
from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.alternations import Evidence, PairedClaim, sides
from ddp_profile.rules.base import Finding, Thresholds, describe_config, finite, pct
from ddp_profile.rules.recommend import choose
from ddp_profile.rules.tables import (
    baseline_probe,
    loader_info,
    ok_probes,
    probe_steps,
)


def keeps_its_iterator(run: Run) -> bool:
    """The script's training loader was seen, in some launch of the run, to keep one iterator
    past an epoch (``iterator_outlives_epoch``): it starts its workers once, in every launch,
    whether or not a probe ran long enough to see it. Probes that made its workers persistent
    (``Kind.PERSISTENT``) say nothing of the script's own loader."""
    forced = {p.id for p in run.records if p.kind == Kind.PERSISTENT}
    return any(context.get("keeps_iterator") for (probe_id, _), context in run.contexts.items()
               if probe_id not in forced)


Restarting = tuple[ProbeRecord, Epochs]  # a probe, its epochs


def _restarting(run: Run) -> list[Restarting]:
    """Ok probes whose loader restarts every epoch, measured with its cost."""
    if keeps_its_iterator(run):
        return []
    found = []
    for probe in ok_probes(run):
        epochs = probe.epochs
        if epochs is not None and finite(epochs.steady_throughput) \
                and epochs.steady_throughput > 0 and finite(epochs.restart_s) \
                and finite(probe.throughput):
            found.append((probe, epochs))
    return found


def persistent_workers(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                       ) -> Optional[Finding]:
    """Workers are started again every epoch, and that start-up is a significant share of it.

    Trigger: an ok probe of a loader that restarts (workers, ``persistent_workers`` false) whose
    restart costs ``restart_share`` or more of its epoch (``1 - throughput /
    steady_throughput``), and that is the baseline (the script's own loader pays it) or whose
    steady rate beats the recommendation by ``restart_share`` or more (else keeping those
    workers alive would still be slower than what is recommended: no finding). The finding
    cites the probe that ran fastest between restarts, and
    predicts what keeping its workers alive would give: its steady rate, measured in this run
    but without the restarts, against the recommended configuration as the script runs it.
    "high" when that is ``clear_gain`` or more above the recommendation by more than half.
    Runs recorded before the restart was measured fall back to the restarts' first batches.
    None where the loader keeps one iterator across epochs (``keeps_its_iterator``). Where an
    alternation measured persistent workers (``known``: the evaluation's ``claim.Evidence``;
    None: read here), the finding says what it measured instead.
    """
    costly = [found for found in _restarting(run)
              if (restart_share(found[0]) or 0.0) >= thresholds.restart_share]
    evidence = known or Evidence(run, thresholds)
    measured = evidence.persistent
    if measured is not None:
        if not measured.faster and evidence.persistent_per_epoch is not None:
            return _too_short(run, measured, evidence.persistent_per_epoch)
        return _measured(run, measured, costly)
    if not costly:
        return _from_first_batches(run, thresholds)
    base = baseline_probe(run)
    chosen = choose(run, base, thresholds) if base is not None else None

    def gain(found: Restarting) -> Optional[float]:
        if chosen is None or not finite(chosen.throughput) or chosen.throughput <= 0:
            return None
        return found[1].steady_throughput / float(chosen.throughput)

    # the script's own loader pays the restarts; another configuration's only matter where
    # keeping its workers alive is predicted to beat the recommendation
    costly = [found for found in costly if (base is not None and found[0].id == base.id)
              or (gain(found) or 0.0) >= 1 + thresholds.restart_share]
    if not costly:
        return None
    top = max(costly, key=lambda found: found[1].steady_throughput)
    probe, epochs = top
    steady, restart = epochs.steady_throughput, epochs.restart_s
    # where the script's settings are kept (as the sweep skips the check: the recommendation
    # is them), a whole run too short to win the start back is said as such
    kept = base is not None and chosen is not None \
        and chosen.config == base.config
    script = base if kept else None
    whole = kept_alive(run.records, probe, script) \
        if script is not None and script.id != probe.id else None
    if whole is not None and whole.loses:
        return _predicted_too_short(probe, epochs, whole, gain(top))
    share = restart_share(probe) or 0.0
    ratio = gain(top)
    workers = probe.config.num_workers or 0
    versus = (f", {ratio:.2f}x the recommended {describe_config(chosen.config)} as the script "
              "runs it" if ratio is not None and chosen is not None and chosen.id != probe.id
              else "")
    return Finding(
        rule="persistent-workers",
        severity="high" if ratio is not None and ratio >= 1.5 else "medium",
        title="DataLoader workers restart every epoch",
        evidence=(f"With {describe_config(probe.config)}, starting the workers again costs "
                  f"{restart:.2f} s per epoch of {epochs.steps} steps, "
                  f"{pct(share)} of the epoch: {probe.throughput:,.0f} samples/s as run, "
                  f"{steady:,.0f} samples/s between restarts."),
        recommendation=(f"Keep the workers alive: DataLoader(..., num_workers={workers}, "
                        f"persistent_workers=True). Predicted: "
                        f"{steady:,.0f} samples/s{versus}; the rate this probe measured "
                        "between restarts, not a measurement of persistent workers."))


def _measured(run: Run, measured: PairedClaim, costly: list[Restarting]) -> Optional[Finding]:
    """The finding where ``persistent_workers=True`` was measured
    (``sweep.claim.confirm_persistence``): only where it ran faster beyond noise, with the
    restarts it removes."""
    if not measured.faster:
        return None
    low, high = measured.interval  # measured, and no gain this check can tell from none
    reference, kept = sides(run, measured)
    restarts = [epochs for p, epochs in costly
                if describe_config(p.config) == describe_config(kept)]
    paid = ""
    if restarts:
        epochs = restarts[-1]
        paid = (f"Starting the workers again costs {epochs.restart_s:.2f} s per "
                f"epoch of {epochs.steps} steps. ")
    figure = f"{measured.ratio:.2f}x [{low:.2f}-{high:.2f}]"
    if describe_config(reference) == describe_config(kept):
        against = "the same settings restarting their workers (A) and keeping them (B)"
        ran = f"With {describe_config(kept)}, persistent_workers=True ran {figure}"
    else:  # the script's own settings kept, and a restarting configuration kept alive
        against = (f"the script's own {describe_config(reference)} (A) and "
                   f"{describe_config(kept)} keeping its workers (B)")
        ran = (f"{describe_config(kept)} with persistent_workers=True ran {figure} the "
               "script's own settings")
    alternated = (f"alternated {measured.letters} in launches, {against}, probes "
                  f"{measured.probes[0]}-{measured.probes[-1]}")
    start = one_time_start(run.records, measured)
    if start is not None:
        alternated += f"; {start.words()}"
    return Finding(
        rule="persistent-workers",
        severity="high" if measured.ratio >= 1.5 else "medium",
        title="DataLoader workers restart every epoch",
        evidence=f"{paid}{ran} ({alternated}), each probe crossing an epoch boundary.",
        recommendation=(f"Keep the workers alive: DataLoader(..., num_workers="
                        f"{kept.get('num_workers')}, persistent_workers=True). Measured: "
                        f"{figure}, {alternated}."))


def _too_short(run: Run, whole: PairedClaim, per_epoch: PairedClaim) -> Optional[Finding]:
    """What was seen where persistent workers ran faster per epoch beyond noise, but not as
    whole runs of the script (each launch of the alternation ran it to its end): their
    one-time start-up outweighs what a run this short wins. Low: the script's settings are
    kept; the gain of a longer run is a prediction, with its basis."""
    if not per_epoch.faster:
        return None
    reference, kept = sides(run, whole)
    start = one_time_start(run.records, per_epoch)
    low, high = per_epoch.bounds  # the fit of the launches alone: what ``faster`` read
    figure = (f"{per_epoch.ratio:.2f}x (the fit of its {per_epoch.launches} launches: "
              f"{low:.2f}-{high:.2f}x; a plain check of 3 launches each: "
              f"{per_epoch.interval[0]:.2f}-{per_epoch.interval[1]:.2f}x)")
    runs = f"{whole.ratio:.2f}x [{whole.interval[0]:.2f}-{whole.interval[1]:.2f}]"
    pays = "a longer run"
    if start is not None and start.break_even_s is not None:
        pays = (f"a run training past about {start.break_even_s:.0f} s (the start-up, "
                f"{start.seconds:.1f} s, over the {1 - 1 / per_epoch.ratio:.0%} saved)")
    return Finding(
        rule="persistent-workers",
        severity="low",
        title="Keeping the workers alive pays per epoch, not over a run this short",
        evidence=(f"{describe_config(kept)} with persistent_workers=True ran {figure} per "
                  f"epoch once its workers ran, against the script's own "
                  f"{describe_config(reference)}, but {runs} as whole runs of the script "
                  f"(alternated {whole.letters} in launches, probes {whole.probes[0]}-"
                  f"{whole.probes[-1]}, each running the script to its end, its first "
                  f"batch's wait charged)."),
        recommendation=(f"For runs this short, keep the script's settings. Predicted, not "
                        f"measured: DataLoader(..., num_workers={kept.get('num_workers')}, "
                        f"persistent_workers=True) pays in {pays}."))


def _predicted_too_short(probe: ProbeRecord, epochs: Epochs, whole: KeptAlive,
                         ratio: Optional[float]) -> Finding:
    """What was seen where a configuration's workers ran faster between restarts than the
    script's settings, but over the script's whole run (a launch ran it to its end) their
    start is predicted to outweigh what they save (``restarts.kept_alive``); the sweep then
    measures no alternation. Low, and a prediction with its basis."""
    versus = f", {ratio:.2f}x the script's settings" if ratio is not None else ""
    pays = (f"a run training past about {whole.break_even_s:.0f} s"
            if whole.break_even_s is not None else "no run")
    return Finding(
        rule="persistent-workers",
        severity="low",
        title="Keeping the workers alive pays per epoch, not over a run this short",
        evidence=(f"With {describe_config(probe.config)}, starting the workers again costs "
                  f"{epochs.restart_s:.2f} s per epoch of {epochs.steps} steps: "
                  f"{probe.throughput:,.0f} samples/s as run, "
                  f"{epochs.steady_throughput:,.0f} between restarts{versus}. But "
                  f"{whole.words()}, so persistent_workers=True was not measured."),
        recommendation=(f"For runs this short, keep the script's settings. Predicted, not "
                        f"measured: DataLoader(..., num_workers="
                        f"{probe.config.num_workers or 0}, persistent_workers=True) "
                        f"pays in {pays}."))


def _first_batches(run: Run, probe: ProbeRecord) -> Optional[tuple[float, float, int]]:
    """(share of run time, seconds, epochs) spent starting workers after the first epoch."""
    iters = run.loader_iters
    if iters is None or iters.empty or "first_batch_s" not in iters:
        return None
    steps = probe_steps(run, probe.id, measured_only=False)
    if steps.empty:
        return None
    rows = iters[iters["probe_id"] == probe.id]
    if "loader_id" in steps and steps["loader_id"].notna().any():
        rows = rows[rows["loader_id"].isin(steps["loader_id"].dropna().unique())]
    rows = rows[(rows["iter_index"] > 0) & rows["first_batch_s"].notna()]
    run_s = float(steps["step_s"].sum())
    if rows.empty or run_s <= 0:
        return None
    restart_s = float(rows["first_batch_s"].sum())
    epochs = int(rows.groupby("rank")["iter_index"].count().max())
    return restart_s / (run_s + restart_s), restart_s / rows["rank"].nunique(), epochs


def _from_first_batches(run: Run, thresholds: Thresholds) -> Optional[Finding]:
    """The finding of a run without ``epoch_restart_s``: the later epochs' first batches."""
    if keeps_its_iterator(run):
        return None
    worst = None
    for probe in ok_probes(run):
        if probe.epochs is not None:
            continue  # measured by the epochs: below the threshold there
        if loader_info(run, probe.id).get("persistent_workers") is not False \
                or (probe.config.num_workers or 0) <= 0:
            continue
        measured = _first_batches(run, probe)
        if measured and measured[0] >= thresholds.restart_share and (
                worst is None or measured[0] > worst[1][0]):
            worst = (probe, measured)
    if worst is None:
        return None
    probe, (share, restart_s, epochs) = worst
    return Finding(
        rule="persistent-workers", severity="medium",
        title="DataLoader workers restart every epoch",
        evidence=(f"With {describe_config(probe.config)}, starting the workers again for {epochs} "
                  f"later epoch(s) took {restart_s:.2f} s per rank, {pct(share)} of the run."),
        recommendation="Keep the workers alive: DataLoader(..., persistent_workers=True).")


RULES = [persistent_workers]

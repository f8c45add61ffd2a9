"""The thread-oversubscription finding: the ranks' torch thread pools against the CPUs.

``thread_oversubscription(run, thresholds, known) -> Finding | None`` is registered with the
host rules (``rules.findings.host``); it lives below the findings because the recommendation's
notes cite it (``rules.notes``) and the data and straggler rules ask whether the baseline
oversubscribed (``baseline_oversubscribed``): what the recommendation reads sits below it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ddp_profile.profiler.cpus import threads_to_fit
from ddp_profile.profiler.decide.choose import better, candidate_of
from ddp_profile.profiler.decide.paired import (
    CANDIDATE,
    REFERENCE,
    PairedClaim,
    alternations,
    paired,
    settings_key,
)
from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.alternations import Evidence
from ddp_profile.rules.base import Finding, Thresholds, describe_config, finite
from ddp_profile.rules.tables import (
    baseline_probe,
    cpus_available,
    local_ranks,
    ok_probes,
)


def _how_to_set_threads(launcher: str, fit: int) -> str:
    """How to give each rank ``fit`` intra-op threads under the launcher in use."""
    env = f"OMP_NUM_THREADS={fit}"
    if launcher == "torchrun":
        return (f"Start torchrun with {env} in its environment ({env} torchrun ...): torchrun "
                "sets it to 1 only when it is unset; or call torch.set_num_threads"
                f"({fit}) at the start of the script.")
    if launcher == "inplace":
        return (f"Set {env} in the job's environment (the pod spec's env, srun --export, "
                f"the sbatch script), or call torch.set_num_threads({fit}) at the start of "
                "the script: ranks started in place get torch's default of one thread per "
                "core each.")
    return (f"Call torch.set_num_threads({fit}) at the start of each rank (the function the "
            f"script spawns), or start the script with {env}: processes it starts itself "
            "get torch's default of one thread per core each.")


def _threads_counterfactuals(run: Run) -> list[tuple[ProbeRecord, ProbeRecord]]:
    """Each single ``threads`` probe (not of an alternation) with the probe it is the
    counterfactual of: the baseline or the sweep probe of the same settings (the latest),
    latest counterfactual first."""
    probes = [p for p in ok_probes(run, kinds=(Kind.THREADS,))
              if finite(p.throughput) and p.pair is None]
    measured = ok_probes(run)
    pairs = []
    for probe in reversed(probes):
        same = [p for p in measured if p.config == probe.config]
        if same:
            pairs.append((probe, same[-1]))
    return pairs


def _threads_alternation(run: Run, thresholds: Thresholds) -> Optional[PairedClaim]:
    """The alternation of a configuration with the script's threads (A) and with the
    threads that fit (B) (``sweep.threads_check``: in windows of one launch, then in launches
    where those left it open), read as the claim's (``decide.paired.paired``): the last of
    each configuration; of those, the largest gain beyond noise, else the largest gain; None
    where none finished."""
    latest: dict[tuple, list[ProbeRecord]] = {}
    for group in alternations(run.records, Kind.THREADS):
        latest[settings_key(group[0])] = group  # a later one measured it again
    claims = [paired(run.records, group, thresholds.interval_confidence, thresholds.launch_sd)
              for group in latest.values()]
    return max((c for c in claims if c is not None), key=lambda c: (c.faster, c.ratio),
               default=None)


@dataclass(frozen=True)
class _Reading:
    """What the run measured of its threads: the threads that fit and what competes for the
    CPUs (``fit``, ``demand``), the measured side (``subject``: the probe or alternation's
    reference, ``counterfactual``: with the threads that fit) and its figure. ``claim``:
    the alternation (None: two single probes, or nothing measured: ``ratio`` None)."""

    fit: int
    demand: str
    subject: ProbeRecord
    counterfactual: Optional[ProbeRecord] = None
    ratio: Optional[float] = None
    claim: Optional[PairedClaim] = None
    established: bool = False  # faster beyond noise by at least ``threads_gain``


def _read(run: Run, thresholds: Thresholds) -> Optional[_Reading]:
    """The one reading of the threads counterfactuals, which the finding and the
    recommendation's threads change both state: the alternation where one ran (see
    ``thread_oversubscription``), else the largest single gain, else the baseline's own
    oversubscription, unmeasured. None where nothing oversubscribes, or where what was
    measured shows no gain (within the noise, or below ``threads_gain``)."""
    base = baseline_probe(run)
    if base is None:
        return None
    claim = _threads_alternation(run, thresholds)
    if claim is not None:
        reference, counterfactual = (run.probe(claim.first(role))
                                     for role in (REFERENCE, CANDIDATE))
        test = _oversubscribed(run, reference)
        if test is None or claim.ratio < thresholds.threads_gain \
                or not claim.faster and claim.bounds[1] <= thresholds.threads_gain:
            return None
        return _Reading(*test, reference, counterfactual, claim.ratio, claim, claim.faster)
    measured = []
    for probe, subject in _threads_counterfactuals(run):
        test = _oversubscribed(run, subject)
        if test is None or not finite(subject.throughput) or subject.throughput <= 0:
            continue
        measured.append((float(probe.throughput / subject.throughput), probe, subject, test))
    if not measured:
        test = _oversubscribed(run, base)
        return None if test is None else _Reading(*test, base)
    gain, probe, subject, test = max(measured, key=lambda item: item[0])
    if gain < thresholds.threads_gain or not better(candidate_of(probe),
                                                    candidate_of(subject), thresholds):
        return None  # no gain, or one within the noise of two launches
    return _Reading(*test, subject, probe, gain, established=True)


def measured_threads_change(run: Run, thresholds: Thresholds) -> Optional[dict[str, Any]]:
    """The threads change this run measured faster beyond noise, as plain data for the
    recommendation (``Recommendation.threads``) and every reader of it: ``threads`` (per
    rank, what fits the CPUs), ``script_threads``, ``setting`` (the environment variable
    that sets it), ``config`` (the loader settings both sides ran with), ``speedup``,
    ``interval`` (None without an alternation), ``check`` (``speedup_check``'s shape, with
    ``windows``: in windows of one launch) and ``probes``. None where the finding does not
    stand as measured (not established, a prediction, or no finding)."""
    reading = _read(run, thresholds)
    if reading is None or not reading.established or reading.counterfactual is None:
        return None
    claim = reading.claim
    probes = claim.probes if claim is not None else (reading.subject.id,
                                                     reading.counterfactual.id)
    check = ({"alternated": True, "launches": claim.launches, "rounds": claim.candidates,
              "whole_runs": claim.whole_runs, "windows": claim.launches == 1}
             if claim is not None else
             {"alternated": False, "launches": None, "rounds": None, "whole_runs": False,
              "windows": False})
    return {"threads": reading.fit, "script_threads": reading.subject.host.intra_op_threads,
            "setting": f"OMP_NUM_THREADS={reading.fit}",
            "config": reading.subject.config.to_dict(), "speedup": reading.ratio,
            "interval": list(claim.interval) if claim is not None else None,
            "check": check, "probes": list(probes), "finding": "thread-oversubscription"}


def thread_oversubscription(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                            ) -> Optional[Finding]:
    """The ranks' torch thread pools oversubscribe the CPUs, and that measurably costs.

    Trigger (a measured probe, its summary entry): intra-op threads (the most of any rank) x
    local ranks + the cores its DataLoader workers were busy on > ``cpus_available``
    (``profiler.cpus.threads_to_fit``, the sweep's own test), and the same settings with the
    threads that fit ran >= ``threads_gain`` x faster ("high" at or above
    ``threads_severe_gain``), beyond noise. The sweep measures the counterfactual of the
    baseline and of the best configuration it found (more workers can be what tips the CPUs
    over), alternated with its subject in windows of one launch (then in launches where
    those left the gain open; where one launch cannot hold them, in launches where a single
    launch read a gain), and the finding is the largest gain of those alternations, with its
    interval (``decide.paired``: faster where its interval lies above 1; where it stays open,
    ``decide.paired.still_open``, after the check's extensions, a "low" finding says what was
    seen, as not established). Without an alternation (``--pairs 0``) the largest single gain
    beyond the noise of the two launches (``choose.better``) is the finding. Where the
    baseline oversubscribes and nothing was measured, the finding is "low" and labelled a
    prediction; measured without a gain, there is no finding. The reading is ``_read``'s,
    which the recommendation's threads change states too (``measured_threads_change``).
    """
    reading = _read(run, thresholds)
    if reading is None:
        return None
    launcher = str(run.summary.get("launcher") or "torchrun")
    if reading.claim is not None:
        return _alternated_finding(run, reading, launcher, thresholds)
    fit, demand, subject, probe = (reading.fit, reading.demand, reading.subject,
                                   reading.counterfactual)
    if probe is None:
        return Finding(
            rule="thread-oversubscription", severity="low",
            title="Torch thread pools oversubscribe the CPUs",
            evidence=f"{demand}; no probe with fewer threads was measured.",
            recommendation=f"Prediction (not measured): {fit} thread(s) per rank. "
                           f"{_how_to_set_threads(launcher, fit)}")
    gain = float(reading.ratio)
    own = subject.id == baseline_probe(run).id
    settings = "the script's own settings" if own else describe_config(subject.config)
    where = "" if own else f" with {describe_config(subject.config)}"
    return Finding(
        rule="thread-oversubscription",
        severity="high" if gain >= thresholds.threads_severe_gain else "medium",
        title="Torch thread pools oversubscribe the CPUs",
        evidence=(f"{demand}{where}. Measured: with {fit} thread(s) per rank {settings} ran "
                  f"{probe.throughput:,.1f} samples/s (probe {probe.id}) against "
                  f"{subject.throughput:,.1f} ({subject.kind} {subject.id}), "
                  f"{gain:.2f}x."),
        recommendation=(f"Measured in this run: {fit} thread(s) per rank"
                        f"{where}. {_how_to_set_threads(launcher, fit)}"))


def _alternated_finding(run: Run, reading: _Reading, launcher: str,
                        thresholds: Thresholds) -> Finding:
    """The finding from the threads alternation of ``reading``, whose subject oversubscribes
    the CPUs and whose threads that fit read at least ``threads_gain`` x: faster beyond
    noise, "medium" or "high"; else, its interval still holding that gain, "low": what was
    seen, said as not established."""
    claim, counterfactual, fit, demand = (reading.claim, reading.counterfactual, reading.fit,
                                          reading.demand)
    config = reading.subject.config.to_dict()
    own = config == baseline_probe(run).config.to_dict()
    where = "" if own else f" with {describe_config(config)}"
    low, high = claim.interval
    figure = f"{claim.ratio:.2f}x [{low:.2f}-{high:.2f}]"
    probes = f"probes {claim.probes[0]}-{claim.probes[-1]}"
    whole = all(run.probe(p).epochs_throughput for p in claim.probes)
    unit = "windows of one launch" if claim.launches == 1 else "launches"
    evidence = (f"{demand}{where}. Measured: with {counterfactual.threads} thread(s) per rank "
                f"{'the script' if own else 'it'} ran {figure} as fast as with its own "
                f"threads, alternated {claim.letters} in {unit} ({probes})"
                + (", each over whole epochs" if whole else ""))
    how = _how_to_set_threads(launcher, fit)
    if not reading.established:
        return Finding(
            rule="thread-oversubscription", severity="low",
            title="Torch thread pools oversubscribe the CPUs (a gain not established)",
            evidence=evidence + f": faster, but not beyond the noise of those {unit.split()[0]}.",
            recommendation=(f"Not established: {fit} thread(s) per rank{where} measured "
                            f"{figure} in alternated {unit}, a gain they cannot tell from none. "
                            f"Check it in launches of your own, alternating the two: {how}"))
    return Finding(
        rule="thread-oversubscription",
        severity="high" if claim.ratio >= thresholds.threads_severe_gain else "medium",
        title="Torch thread pools oversubscribe the CPUs",
        evidence=evidence + ".",
        recommendation=(f"Measured in this run, alternated in {unit}: {fit} thread(s) per rank"
                        f"{where}, {figure}. {how}"))


def baseline_oversubscribed(run: Run, thresholds: Thresholds) -> bool:
    """The ``thread-oversubscription`` finding stands and the baseline's own ranks
    oversubscribe the CPUs: what the baseline measured as waiting can be waiting for a CPU.
    (Where only the best configuration's workers tip the CPUs over, the baseline's loading
    was measured on CPUs its threads fit.)"""
    base = baseline_probe(run)
    return base is not None and _oversubscribed(run, base) is not None \
        and thread_oversubscription(run, thresholds) is not None


def _oversubscribed(run: Run, probe: ProbeRecord) -> Optional[tuple[int, str]]:
    """The threads that fit and what competes for the CPUs, where the ranks of ``probe``
    oversubscribe them (``threads_to_fit``); else None."""
    ranks, cpus = local_ranks(run, probe.id), cpus_available(run, probe.id)
    threads, workers = probe.host.intra_op_threads, probe.host.worker_cores or 0.0
    fit = threads_to_fit(threads, ranks, workers, cpus)
    if fit is None:
        return None
    busy = f" + DataLoader workers busy on {workers:.1f} cores" if workers else ""
    return fit, (f"{ranks} rank(s) per machine x {threads} intra-op threads{busy} compete "
                 f"for {cpus} available CPUs")

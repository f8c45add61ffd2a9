"""The recommended DataLoader configuration: the best measured probe, with its uncertainty.

``recommend(run, thresholds) -> Recommendation`` builds a ``Candidate`` of each ok probe of
kind baseline or sweep (``decide.choose.candidate_of``, the one builder) and asks
``profiler.decide.choose.choose``, the one author of the choice (the sweep asks the same
function what to confirm and what to ``--repeat``): the highest global throughput; probes
within noise of it are a tie, won by the cheapest setting; a compute-bound baseline is kept
unless another probe is faster by more than both the noise and ``clear_gain``. A probe's
relative standard error is its own batch-means estimate (recorded before it was kept: from
its global step times, ``store.results.completed``). This module adds what the choice does
not decide: the expected speedup and its interval (from the alternation of the script's
settings and the recommendation that checked the claim, ``rules.alternations``; without one,
a seeded bootstrap over the global steps of both probes, said to be so), the ceiling share,
the notes (``rules.notes``) and the snippet.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np
import pandas as pd

from ddp_profile.profiler.decide import evidence
from ddp_profile.profiler.decide.choose import candidate_of, relative_se
from ddp_profile.profiler.decide.choose import choose as choose_candidate
from ddp_profile.profiler.decide.paired import CANDIDATE, one_time_start
from ddp_profile.profiler.settings import SETTING_KEYS, LoaderSettings
from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.alternations import Evidence, PairedClaim, sides
from ddp_profile.rules.base import Thresholds, describe_config, finite
from ddp_profile.rules.notes import recommendation_notes
from ddp_profile.rules.tables import (
    baseline_probe,
    cache_mismatch,
    ceiling_probe,
    global_steps,
    loader_info,
    measured_probes,
    storage_share,
)
from ddp_profile.rules.threads import measured_threads_change


@dataclass(frozen=True)
class Recommendation:
    """The configuration to use and what it is expected to gain over the baseline probe."""

    config: dict[str, Any]  # num_workers, pin_memory, prefetch_factor, batch_size
    probe_id: Optional[str]  # the probe that measured it (None: nothing measured)
    expected_speedup: Optional[float]  # throughput / baseline throughput
    expected_speedup_interval: Optional[tuple[float, float]]
    snippet: str  # copy-paste DataLoader(...) call
    ceiling_share: Optional[float] = None  # throughput / compute-only ceiling throughput
    notes: tuple[str, ...] = ()
    throughput: Optional[float] = None  # global samples/s of the recommended probe
    baseline_probe_id: Optional[str] = None
    like_for_like: Optional[bool] = None  # False: baseline and pick read in other cache states
    speedup_basis: Optional[str] = None  # what the expected speedup was measured from
    persistent_workers: bool = False  # the snippet keeps the workers alive (measured so)
    persistent_in_speedup: bool = False  # the expected speedup was measured with them kept
    unsettled: tuple[dict[str, Any], ...] = ()  # measured faster, not established
    # (``decide.evidence.seen``): probe, config, ratio, why, settle (the command that would)
    # how the expected speedup was measured (``speedup_check``): alternated (bool), launches,
    # rounds, whole_runs; None where the script's own settings are kept
    check: Optional[dict[str, Any]] = None
    # the intra-op threads per rank measured faster beyond noise, beside the loader's settings
    # (``rules.threads.measured_threads_change``); None where no threads change was measured
    threads: Optional[dict[str, Any]] = None


def speedup_check(claim: Optional[PairedClaim], moved: bool) -> Optional[dict[str, Any]]:
    """How the expected speedup was measured, as plain data for the readers' short phrase:
    the claim's alternation (its launches, the rounds of each side, whole runs or not), else
    two probes of the search, not alternated (``moved``); None where nothing moved."""
    if claim is not None:
        return {"alternated": True, "launches": claim.launches, "rounds": claim.candidates,
                "whole_runs": claim.whole_runs}
    return {"alternated": False, "launches": None, "rounds": None, "whole_runs": False} \
        if moved else None


def recommendation_to_dict(rec: Recommendation) -> dict[str, Any]:
    """Plain JSON-able data (tuples become lists)."""
    data = asdict(rec)
    data["expected_speedup_interval"] = (list(rec.expected_speedup_interval)
                                         if rec.expected_speedup_interval else None)
    data["notes"] = list(rec.notes)
    data["unsettled"] = [dict(item) for item in rec.unsettled]
    return data


def _persistent_measured(run: Run, known: Evidence
                         ) -> Optional[tuple[PairedClaim, dict[str, Any], dict[str, Any]]]:
    """``persistent_workers=True`` where it was measured faster beyond noise
    (``rules.alternations.Evidence.persistent``), with the settings of its two sides; else None."""
    measured = known.persistent
    if measured is None or not measured.faster:
        return None
    return (measured, *sides(run, measured))


def kept_alive(run: Run, config: dict[str, Any], known: Evidence) -> Optional[PairedClaim]:
    """``persistent_workers=True`` where it was measured with exactly ``config`` on both
    sides and ran faster beyond noise; else None."""
    found = _persistent_measured(run, known)
    if found is None:
        return None
    measured, reference, with_persistent = found
    wanted = describe_config(config)
    return measured if describe_config(reference) == describe_config(with_persistent) == wanted \
        else None


def kept_alive_instead(run: Run, base: ProbeRecord, known: Evidence
                       ) -> Optional[tuple[PairedClaim, ProbeRecord]]:
    """Where the script's own settings (``base``) are kept: another configuration with
    ``persistent_workers=True``, where it was alternated with them launch by launch and ran
    faster beyond noise (``sweep.claim.persistence_subject``), and its first probe; else None."""
    found = _persistent_measured(run, known)
    if found is None:
        return None
    measured, reference, with_persistent = found
    if describe_config(reference) != describe_config(base.config) \
            or describe_config(with_persistent) == describe_config(reference):
        return None
    return measured, run.probe(measured.first(CANDIDATE))


def snippet_for(config: dict[str, Any], persistent: bool = False) -> str:
    """``DataLoader(dataset, ...)`` with the settings that were measured: no prefetch without
    workers, and ``persistent_workers=True`` where the measured loader ran with it or where it
    was measured faster beyond noise with these settings (``kept_alive``)."""
    parts = ["dataset"]
    if config.get("batch_size") is not None:
        parts.append(f"batch_size={config['batch_size']}")
    workers = config.get("num_workers") or 0
    parts.append(f"num_workers={workers}")
    if config.get("pin_memory") is not None:
        parts.append(f"pin_memory={bool(config['pin_memory'])}")
    if workers > 0:
        if config.get("prefetch_factor") is not None:
            parts.append(f"prefetch_factor={config['prefetch_factor']}")
        if persistent:
            parts.append("persistent_workers=True")
    return f"DataLoader({', '.join(parts)})"


def choose(run: Run, base: ProbeRecord, thresholds: Thresholds) -> ProbeRecord:
    """The recommended probe: ``profiler.decide.choose.choose`` over the ok probes."""
    probes = {p.id: p for p in measured_probes(run)}
    if not probes or not finite(base.throughput):
        return base
    best = choose_candidate([candidate_of(p) for p in probes.values()], candidate_of(base),
                            thresholds)
    return probes.get(best.id, base) if best is not None else base


def settle_command(run: Run, config: LoaderSettings, short: bool) -> str:
    """The run that would settle an undecided configuration: it alone against the script's
    settings, with a longer alternation; more epochs first where its probes ran short."""
    summary = run.summary
    flags = [f"--{key.replace('_', '-')} {str(value).lower()}"
             for key, value in config.to_dict().items() if value is not None]
    if summary.get("launcher") == "none":
        flags.append("--launcher none")
    elif summary.get("nproc_per_node"):
        flags.append(f"--nproc-per-node {summary['nproc_per_node']}")
    args = summary.get("script_args") or []
    command = (f"ddp-profile run {shlex.quote(str(summary.get('script') or 'train.py'))} "
               f"{' '.join(flags)} --pairs 5" + (f" -- {shlex.join(args)}" if args else ""))
    if short:
        return ("give the script more epochs (or data) in its arguments, so that each probe "
                f"reaches --warmup + --steps, then: {command}")
    return command


def _unsettled(run: Run, base: ProbeRecord, decision: evidence.Verdict,
               thresholds: Thresholds) -> tuple[dict[str, Any], ...]:
    return tuple({"probe": seen.probe, "config": seen.config.to_dict(),
                  "ratio": round(seen.ratio, 4), "why": seen.why,
                  "settle": settle_command(run, seen.config, seen.short)}
                 for seen in evidence.seen(run.records, base, decision, thresholds))


def speedup_interval(run: Run, pick: ProbeRecord, base: ProbeRecord, point: float,
                     thresholds: Thresholds) -> tuple[float, float]:
    """Bootstrap interval of throughput(pick) / throughput(base), containing ``point``."""
    a, b = global_steps(run, pick.id), global_steps(run, base.id)
    if len(a) < 2 or len(b) < 2:
        spread = thresholds.noise_sigmas * math.hypot(relative_se(pick), relative_se(base))
        return point * (1 - spread), point * (1 + spread)
    rng = np.random.default_rng(thresholds.bootstrap_seed)

    def resampled(table: pd.DataFrame) -> np.ndarray:
        index = rng.integers(0, len(table), size=(thresholds.bootstrap_resamples, len(table)))
        return (table["samples"].to_numpy()[index].sum(axis=1)
                / table["step_s"].to_numpy()[index].sum(axis=1))

    measured = (a["samples"].sum() / a["step_s"].sum()) / (b["samples"].sum() / b["step_s"].sum())
    ratios = resampled(a) / resampled(b) * (point / measured if measured > 0 else 1.0)
    tail = (1 - thresholds.interval_confidence) / 2
    lo, hi = np.quantile(ratios, [tail, 1 - tail])
    return min(float(lo), point), max(float(hi), point)


def _unconfirmed(decision: evidence.Verdict, base: ProbeRecord,
                 thresholds: Thresholds) -> Optional[str]:
    """The note that a configuration was checked and not established, where one was."""
    if decision.checked is None or decision.checked_probe is None:
        return None
    how = ("ran faster in the search" if not decision.undecided
           else "measured faster than the script's settings in the search, though not "
           "beyond its noise" if decision.because == evidence.STEP_FASTER
           else f"was checked, as {decision.because}")
    return (f"{describe_config(decision.checked_probe.config)} {how}, but "
            + evidence.not_established(decision.checked, candidate_of(base),
                                       decision.checked_probe.config, thresholds)
            + ", so the script's settings are kept.")


def _claim_basis(run: Run, claim: PairedClaim, decision: evidence.Verdict,
                 persistent: bool) -> str:
    """What the expected speedup was measured from: the alternation that established it."""
    basis = claim.basis("the recommendation with persistent_workers=True" if persistent
                        else "the recommendation")
    if decision.undecided and not persistent:
        basis += f"; {decision.because}, so it was alternated"
        outran = decision.rival_claim if decision.because == evidence.OUTRAN else None
        if outran is not None and decision.rival is not None:
            basis += (f" ({describe_config(decision.rival.config)}: {outran.ratio:.2f}x "
                      f"[{outran.interval[0]:.2f}-{outran.interval[1]:.2f}], "
                      f"{outran.probes[0]}-{outran.probes[-1]})")
    start = one_time_start(run.records, claim)
    return basis + (f"; {start.words()}" if start is not None else "")


def recommend(run: Run, thresholds: Optional[Thresholds] = None,
              known: Optional[Evidence] = None) -> Recommendation:
    """The best measured configuration, or the script's own settings if none was measured.
    ``known``: the evaluation's reading of the run's alternations (``claim.Evidence``; None:
    read here)."""
    thresholds = thresholds or Thresholds()
    known = known or Evidence(run, thresholds)
    base = baseline_probe(run)
    if base is None:
        config = {k: (run.summary.get("baseline") or {}).get(k) for k in SETTING_KEYS}
        return Recommendation(config=config, probe_id=None, expected_speedup=None,
                              expected_speedup_interval=None, snippet=snippet_for(config),
                              notes=("No probe finished: nothing was measured to recommend.",))
    decision = evidence.verdict(run.records, base, choose(run, base, thresholds), thresholds)
    claim, pick = decision.claim, decision.pick
    unconfirmed = _unconfirmed(decision, base, thresholds)
    # the script's settings kept: persistent workers measured faster with them, the claim
    persistent_instead = kept_alive_instead(run, base, known) if pick.id == base.id else None
    if persistent_instead is not None:
        claim, pick = persistent_instead
    speedup, interval, basis = None, None, None
    if claim is not None:
        speedup, interval = claim.ratio, claim.interval
        basis = _claim_basis(run, claim, decision, persistent_instead is not None)
    elif finite(pick.throughput) and finite(base.throughput) and base.throughput > 0:
        speedup = float(pick.throughput / base.throughput)
        interval = speedup_interval(run, pick, base, speedup, thresholds)
        if pick.id != base.id:
            basis = (f"probes {base.id} and {pick.id}, not alternated: the machine's "
                     "drift between them is in the figure")
    config = pick.config.to_dict()
    persistent_on_top = kept_alive(run, config, known) if persistent_instead is None else None
    ceiling = ceiling_probe(run)
    share = None  # against a ceiling at the pick's batch size alone: like for like
    if ceiling is not None and ceiling.throughput > 0 and finite(pick.throughput) \
            and ceiling.config.batch_size == pick.config.batch_size:
        share = float(pick.throughput / ceiling.throughput)
    persistent = bool(config.get("num_workers")) and (
        loader_info(run, pick.id).get("persistent_workers") is True
        or persistent_on_top is not None or persistent_instead is not None)
    unsettled = _unsettled(run, base, decision, thresholds) if persistent_instead is None \
        else ()
    like_for_like = None  # unknown: the same probe, or a cache share not measured on either
    if pick.id != base.id and all(storage_share(p) is not None for p in (base, pick)):
        like_for_like = cache_mismatch(base, pick, thresholds) is None
    return Recommendation(
        config=config, probe_id=pick.id, expected_speedup=speedup,
        expected_speedup_interval=interval, ceiling_share=share,
        snippet=snippet_for(config, persistent), persistent_workers=persistent,
        persistent_in_speedup=persistent_instead is not None,
        notes=((unconfirmed,) if unconfirmed else ())
        + recommendation_notes(run, base, pick, thresholds, share, unsettled)
        + _persistent_note(persistent_on_top),
        throughput=float(pick.throughput) if finite(pick.throughput) else None,
        baseline_probe_id=base.id, like_for_like=like_for_like, speedup_basis=basis,
        unsettled=unsettled, check=speedup_check(claim, pick.id != base.id),
        threads=measured_threads_change(run, thresholds))


def _persistent_note(claim: Optional[PairedClaim]) -> tuple[str, ...]:
    if claim is None:
        return ()
    return (f"persistent_workers=True on top of it ran {claim.ratio:.2f}x [{claim.interval[0]:.2f}"
            f"-{claim.interval[1]:.2f}] (probes {claim.probes[0]}-{claim.probes[-1]}, alternated "
            "A B A B A in launches; not in the expected speedup): see the persistent-workers "
            "finding.",)

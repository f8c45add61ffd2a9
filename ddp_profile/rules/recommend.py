"""The recommended DataLoader configuration: the best measured probe, with its uncertainty.

``recommend(run, thresholds) -> Recommendation`` builds a ``Candidate`` of each ok probe of
kind baseline or sweep and asks ``profiler.decide.choose.choose``, the one author of the
choice (the sweep asks the same function what to confirm and what to ``--repeat``): the
highest global throughput; probes within noise of it are a tie, won by the cheapest setting;
a compute-bound baseline is kept unless another probe is faster by more than both the noise
and ``clear_gain``. A probe's relative standard error is its own batch-means estimate when
recorded, else ``cv / sqrt(n)`` of its global step times. This module adds what the choice
does not decide: the expected speedup and its interval (from the alternation of the script's
settings and the recommendation that checked the claim, ``rules.claim``; without one, a seeded
bootstrap over the global steps of both probes, said to be so), the ceiling share, the notes
(``rules.notes``) and the snippet.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np
import pandas as pd

from ddp_profile.profiler.decide import evidence
from ddp_profile.profiler.decide.choose import candidate_of
from ddp_profile.profiler.decide.choose import choose as choose_candidate
from ddp_profile.profiler.decide.paired import CANDIDATE, one_time_start
from ddp_profile.profiler.settings import SETTING_KEYS, LoaderSettings
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.base import Thresholds, describe_config, finite
from ddp_profile.rules.claim import Evidence, PairedClaim, sides
from ddp_profile.rules.notes import recommendation_notes
from ddp_profile.rules.tables import (
    baseline_probe,
    cache_mismatch,
    candidate,
    ceiling_probe,
    config_of,
    global_steps,
    loader_info,
    ok_probes,
    relative_error,
    storage_share,
)


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


def _alive(run: Run, known: Evidence
           ) -> Optional[tuple[PairedClaim, dict[str, Any], dict[str, Any]]]:
    """``persistent_workers=True`` where it was measured faster beyond noise
    (``rules.claim.Evidence.persistent``), with the settings of its two sides; else None."""
    measured = known.persistent
    if measured is None or not measured.faster:
        return None
    return (measured, *sides(run, measured))


def kept_alive(run: Run, config: dict[str, Any], known: Evidence) -> Optional[PairedClaim]:
    """``persistent_workers=True`` where it was measured with exactly ``config`` on both
    sides and ran faster beyond noise; else None."""
    found = _alive(run, known)
    if found is None:
        return None
    measured, reference, kept = found
    wanted = describe_config(config)
    return measured if describe_config(reference) == describe_config(kept) == wanted else None


def _row(run: Run, probe_id: str) -> pd.Series:
    """The probes-table row of ``probe_id``."""
    probes = run.probes
    return probes[probes["id"] == probe_id].iloc[0]


def kept_alive_instead(run: Run, base: pd.Series, known: Evidence
                       ) -> Optional[tuple[PairedClaim, pd.Series]]:
    """Where the script's own settings (``base``) are kept: another configuration with
    ``persistent_workers=True``, where it was alternated with them launch by launch and ran
    faster beyond noise (``sweep.claim.persistence_subject``), and its first probe; else None."""
    found = _alive(run, known)
    if found is None:
        return None
    measured, reference, kept = found
    if describe_config(reference) != describe_config(config_of(base)) \
            or describe_config(kept) == describe_config(reference):
        return None
    return measured, _row(run, measured.first(CANDIDATE))


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


def choose(run: Run, base: pd.Series, thresholds: Thresholds) -> pd.Series:
    """The recommended probe row: ``profiler.decide.choose.choose`` over the ok probes."""
    probes = ok_probes(run)
    probes = probes[probes["throughput"].apply(finite) & (probes["throughput"] > 0)]
    if probes.empty or not finite(base.get("throughput")):
        return base
    rows = {str(row["id"]): row for _, row in probes.iterrows()}
    chosen = choose_candidate([candidate(run, row) for row in rows.values()],
                              candidate(run, base), thresholds)
    return rows.get(chosen.id, base) if chosen is not None else base


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


def _unsettled(run: Run, base: pd.Series, decided: evidence.Verdict,
               thresholds: Thresholds) -> tuple[dict[str, Any], ...]:
    return tuple({"probe": seen.probe, "config": seen.config.to_dict(),
                  "ratio": round(seen.ratio, 4), "why": seen.why,
                  "settle": settle_command(run, seen.config, seen.short)}
                 for seen in evidence.seen(run.records, run.probe(str(base["id"])), decided,
                                           thresholds))


def speedup_interval(run: Run, chosen: str, base: str, point: float,
                     thresholds: Thresholds) -> tuple[float, float]:
    """Bootstrap interval of throughput(chosen) / throughput(base), containing ``point``."""
    a, b = global_steps(run, chosen), global_steps(run, base)
    if len(a) < 2 or len(b) < 2:
        spread = thresholds.noise_sigmas * math.hypot(relative_error(run, chosen),
                                                      relative_error(run, base))
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
    chosen = choose(run, base, thresholds)
    speedup, interval, basis, unconfirmed = None, None, None, None
    own = run.probe(str(base["id"]))
    decided = evidence.verdict(run.records, own, run.probe(str(chosen["id"])), thresholds)
    claim, chosen = decided.claim, _row(run, decided.pick.id)
    if decided.checked is not None and decided.checked_probe is not None:
        checked = decided.checked
        how = ("ran faster in the search" if not decided.undecided
               else "measured faster than the script's settings in the search, though not "
               "beyond its noise" if decided.because == evidence.STEP_FASTER
               else f"was checked, as {decided.because}")
        unconfirmed = (f"{describe_config(_row(run, decided.checked_probe.id))} {how}, but "
                       + evidence.not_established(checked, candidate_of(own),
                                                  decided.checked_probe.config, thresholds)
                       + ", so the script's settings are kept.")
    alive = kept_alive_instead(run, base, known) if chosen["id"] == base["id"] else None
    if alive is not None:  # measured against the script's settings: the claim itself
        claim, chosen = alive
    if claim is not None:
        speedup, interval, basis = claim.ratio, claim.interval, claim.basis(
            "the recommendation with persistent_workers=True" if alive else "the recommendation")
        if decided.undecided and alive is None:
            basis += f"; {decided.because}, so it was alternated"
            first = decided.rival_claim if decided.because == evidence.OUTRAN else None
            if first is not None and decided.rival is not None:
                basis += (f" ({describe_config(_row(run, decided.rival.id))}: {first.ratio:.2f}x "
                          f"[{first.interval[0]:.2f}-{first.interval[1]:.2f}], "
                          f"{first.probes[0]}-{first.probes[-1]})")
        start = one_time_start(run.records, claim)
        if start is not None:
            basis += f"; {start.words()}"
    elif finite(chosen["throughput"]) and finite(base["throughput"]) and base["throughput"] > 0:
        speedup = float(chosen["throughput"] / base["throughput"])
        interval = speedup_interval(run, chosen["id"], base["id"], speedup, thresholds)
        if chosen["id"] != base["id"]:
            basis = (f"probes {base['id']} and {chosen['id']}, not alternated: the machine's "
                     "drift between them is in the figure")
    kept = kept_alive(run, config_of(chosen), known) if alive is None else None
    ceiling = ceiling_probe(run)
    share = None
    if ceiling is not None and ceiling["throughput"] > 0 and finite(chosen["throughput"]):
        share = float(chosen["throughput"] / ceiling["throughput"])
    config = config_of(chosen)
    persistent = bool(config.get("num_workers")) and (
        loader_info(run, chosen["id"]).get("persistent_workers") is True or kept is not None
        or alive is not None)
    unsettled = _unsettled(run, base, decided, thresholds) if alive is None else ()
    like = None  # unknown: the same probe, or a cache share not measured on either side
    if chosen["id"] != base["id"] and all(storage_share(run, p["id"]) is not None
                                          for p in (base, chosen)):
        like = cache_mismatch(run, base, chosen, thresholds) is None
    return Recommendation(
        config=config, probe_id=str(chosen["id"]), expected_speedup=speedup,
        expected_speedup_interval=interval, ceiling_share=share,
        snippet=snippet_for(config, persistent), persistent_workers=persistent,
        persistent_in_speedup=alive is not None,
        notes=((unconfirmed,) if unconfirmed else ())
        + recommendation_notes(run, base, chosen, thresholds, share, unsettled)
        + ((f"persistent_workers=True on top of it ran {kept.ratio:.2f}x [{kept.interval[0]:.2f}"
            f"-{kept.interval[1]:.2f}] (probes {kept.probes[0]}-{kept.probes[-1]}, alternated "
            "A B A B A in launches; not in the expected speedup): see the persistent-workers "
            "finding.",) if kept is not None else ()),
        throughput=float(chosen["throughput"]) if finite(chosen["throughput"]) else None,
        baseline_probe_id=str(base["id"]), like_for_like=like, speedup_basis=basis,
        unsettled=unsettled, check=speedup_check(claim, chosen["id"] != base["id"]))

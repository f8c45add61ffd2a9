"""The expected speedup from the claim's own check: the script's settings and the
recommendation, alternated close in time (the sweep's ``claim``).

The probes of one alternation (kind ``paired``, ``pair``: role, position, group) are read as
``log rate = level + gain x [candidate] + drift x position``: every candidate stands between two
references, so the launch's level and a linear drift between them cancel, and ``gain`` is
the log of the speedup. Its interval is for what a user's check would measure: plain launches
of the script, ``CHECK_ROUNDS`` of each setting, alternating. So it holds the alternation's
own uncertainty (Student's, on the residual degrees of freedom: 7 windows, 4; 5 launches, 2: a
few noisy windows give a wide interval rather than a confident figure) and what plain
launches of the two settings add: each launch runs at a level of its own, as the spread
between this run's launches of the same settings shows (``choose.launch_spread``, at least
``launch_sd``), averaged over the check's rounds. (On 2 CPUs, plain launches of 10
latency-bound workers ran 3,069 and 2,150 samples/s: an interval of the windows' noise alone,
4.83-5.07x, missed the 4.62x they measured.) Without such an alternation (``--pairs 0``, the
script's own settings chosen, a probe of it failed) there is no paired claim and the
recommendation says what its figure rests on instead.

The fit, the interval and the verdict (``PairedClaim``, ``paired``) are the decision layer's
(``profiler.decide.paired``), which the sweep's claim reads too, to decide what it measures
next; this module finds the alternations in a stored run and words what they say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from ddp_profile.profiler.decide.ddp import alternation_fit, options_key
from ddp_profile.profiler.decide.evidence import alternation
from ddp_profile.profiler.decide.paired import (
    CANDIDATE,
    REFERENCE,
    PairedClaim,
    alternations,
    as_run,
    check_interval,
    fitted,
    paired,
)
from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.store.results import Run


def paired_claim(run: Run, reference: ProbeRecord, candidate: ProbeRecord,
                 confidence: float, launch_sd: float = 0.025) -> Optional[PairedClaim]:
    """The speedup of ``candidate`` over ``reference`` (probes, read by their settings)
    from their alternation; None where there is none, or a probe of it failed. ``launch_sd``:
    the least relative SD between launches of one setting."""
    probes = alternation(run.records, reference, candidate)
    return paired(run.records, probes, confidence, launch_sd)


def persistent_effect(run: Run, confidence: float, launch_sd: float
                      ) -> Optional[PairedClaim]:
    """``persistent_workers=True`` against the same settings restarting their workers, from
    the last alternation that measured it (``sweep.claim.confirm_persistence``; launches: the
    fit's uncertainty and the spread between launches, as for the claim); None where none
    finished. Derived once per Run (the rule and the snippet read it)."""
    def derive() -> Optional[PairedClaim]:
        groups = alternations(run.records, Kind.PERSISTENT)
        probes = groups[-1] if groups else []
        return fitted(probes, as_run(probes), confidence,
                      lambda fit: max(launch_sd, fit.residual_sd))
    return run.derived(("persistent_effect", confidence, launch_sd), derive)


def sides(run: Run, claim: PairedClaim) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings of an alternation's reference (``A``) and of its candidate (``B``)."""
    return (run.probe(claim.first(REFERENCE)).config.to_dict(),
            run.probe(claim.first(CANDIDATE)).config.to_dict())


@dataclass(frozen=True)
class DdpEffect:
    """A DDP counterfactual (the script's settings with other DDP options, kind ``ddp``)
    against the script's own DDP options."""

    options: dict[str, Any]
    ratio: float
    interval: Optional[tuple[float, float]]  # None: not alternated (one launch against others)
    faster: bool  # beyond noise: the interval above 1 (not alternated: ``choose.better``)
    slower: bool
    probes: str  # the probes that measured it ("probe p012", "probes p011, p013")
    reference: str  # what it was measured against: the probes, and how the reference ran

    def figure(self) -> str:
        interval = f" [{self.interval[0]:.2f}-{self.interval[1]:.2f}]" if self.interval else ""
        return f"{self.ratio:.2f}x{interval}"


def alternated_effects(run: Run, confidence: float, launch_sd: float
                       ) -> dict[str, DdpEffect]:
    """options text -> what the last alternation measuring those options says. Windows of
    one launch: the fit's own interval (the step without synchronisation is a measurement,
    no user launches it). Launches: what a user's check would measure, as for the claim: the
    fit's uncertainty and the spread between launches (the fit's residual, at least
    ``launch_sd``) over ``CHECK_ROUNDS`` launches of each."""
    effects: dict[str, DdpEffect] = {}
    for probes in alternations(run.records, Kind.DDP):  # DDP options with the script's own
        fit = alternation_fit(list(probes))
        if fit is None:
            continue
        launches = len({p.launch for p in probes})
        between = max(launch_sd, fit.residual_sd) if launches > 1 else 0.0
        reference = _alternation_text(probes, fit.drift, launches)
        for key, gain in fit.gains.items():
            low, high = check_interval(fit, key, between, confidence)
            mine = [p for p in probes if p.pair and p.pair.role == CANDIDATE
                    and options_key(dict(p.comm.options or {})) == key]
            effects[key] = DdpEffect(options=dict(mine[0].comm.options or {}),
                                     ratio=math.exp(gain), interval=(low, high),
                                     faster=low > 1.0, slower=high < 1.0,
                                     probes="probes " + ", ".join(p.id for p in mine),
                                     reference=reference)
    return effects


def _alternation_text(probes: list[ProbeRecord], drift: float, launches: int) -> str:
    """How an alternation ran, and what the script's own options did meanwhile."""
    letters, names = [], {}
    reference = [p for p in probes if p.pair and p.pair.role == REFERENCE]
    for probe in probes:
        if probe.pair and probe.pair.role == REFERENCE:
            letters.append("A")
            continue
        key = options_key(dict(probe.comm.options or {}))
        letters.append(names.setdefault(key, chr(ord("B") + len(names))))
    rates = [float(p.throughput or 0.0) for p in reference]
    unit = "windows of one launch" if launches == 1 else "launches"
    return (f"alternated {' '.join(letters)} in {unit}, probes {probes[0].id}-"
            f"{probes[-1].id}; the script's own options ran {min(rates):,.0f}-"
            f"{max(rates):,.0f} samples/s in its {len(rates)} {unit.split()[0]}, "
            f"a drift of {math.expm1(drift):+.1%} per place")

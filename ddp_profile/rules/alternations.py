"""The expected speedup from the claim's own check: the script's settings and the
recommendation, alternated close in time (the sweep's ``claim``).

The probes of one alternation (kind ``paired``, ``pair``: role, position, group) are read as
``log rate = level + gain x [candidate] + drift x position``, so the launch's level and a
linear drift cancel, and ``gain`` is the log of the speedup. Its interval is for what a user's
check would measure, ``CHECK_ROUNDS`` plain launches of each setting: the alternation's own
uncertainty (Student's, on the residual degrees of freedom) and the spread between launches
(``choose.launch_spread``, at least ``launch_sd``); the windows' noise alone would miss what
plain launches measure. Without such an alternation there is no paired claim, and the
recommendation says what its figure rests on instead. The fit, the interval and the verdict
are the decision layer's (``profiler.decide.paired``); this module finds the alternations in
a stored run and words what they say (``Evidence``: read once per evaluation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any, Mapping, Optional

from ddp_profile.profiler.decide.choose import Candidate, better, candidate_of, not_worse, pool
from ddp_profile.profiler.decide.ddp import alternation_fit, effect_interval, options_key
from ddp_profile.profiler.decide.evidence import alternation
from ddp_profile.profiler.decide.paired import (
    CANDIDATE,
    REFERENCE,
    PairedClaim,
    alternations,
    as_run,
    fitted,
    paired,
    whole_runs,
)
from ddp_profile.profiler.settings import GRADIENT_SYNC
from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.base import Thresholds, finite
from ddp_profile.rules.tables import baseline_probe, ok_probes


def paired_claim(run: Run, reference: ProbeRecord, candidate: ProbeRecord,
                 confidence: float, launch_sd: float = 0.025) -> Optional[PairedClaim]:
    """The speedup of ``candidate`` over ``reference`` (probes, read by their settings)
    from their alternation; None where there is none, or a probe of it failed. ``launch_sd``:
    the least relative SD between launches of one setting."""
    probes = alternation(run.records, reference, candidate)
    return paired(run.records, probes, confidence, launch_sd)


def persistent_effect(run: Run, confidence: float, launch_sd: float, per_epoch: bool = False
                      ) -> Optional[PairedClaim]:
    """``persistent_workers=True`` against the same settings restarting their workers, from
    the last alternation that measured it (``sweep.claim.confirm_persistence``; launches: the
    fit's uncertainty and the spread between launches, as for the claim); None where none
    finished. The rule and the snippet read it once per evaluation (``Evidence.persistent``).
    Where its launches ran the script to its end, read as whole runs unless ``per_epoch``."""
    groups = alternations(run.records, Kind.PERSISTENT)
    probes = groups[-1] if groups else []
    whole = None if per_epoch else whole_runs(probes)  # the script's start-up charged
    return fitted(probes, whole or as_run(probes), confidence,
                  lambda fit: max(launch_sd, fit.residual_sd), whole=whole is not None)


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
    """options text -> what the last alternation measuring those options says, each ratio with
    its interval (``decide.ddp.effect_interval``)."""
    effects: dict[str, DdpEffect] = {}
    for probes in alternations(run.records, Kind.DDP):  # DDP options with the script's own
        fit = alternation_fit(list(probes))
        if fit is None:
            continue
        launches = len({p.launch for p in probes})
        reference = _alternation_text(probes, fit.drift, launches)
        for key, gain in fit.gains.items():
            low, high = effect_interval(fit, key, launches, confidence, launch_sd)
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


def latest_ddp_probes(run: Run) -> dict[str, tuple[dict[str, Any], ProbeRecord]]:
    """options text -> (options, probe) of the last ok ``ddp`` probe with those options
    measured on its own, not in an alternation (a re-measurement, twice as long, comes last)."""
    latest: dict[str, tuple[dict[str, Any], ProbeRecord]] = {}
    for probe in ok_probes(run, kinds=(Kind.DDP,)):
        options = dict(probe.comm.options) if probe.comm.options is not None else None
        if options is not None and finite(probe.throughput) and probe.pair is None:
            latest[options_key(options)] = (options, probe)
    return latest


def reference(run: Run, base: ProbeRecord) -> tuple[Candidate, str]:
    """What a DDP counterfactual measured on its own is judged against: the baseline pooled
    with its twin (the script's settings and DDP options measured again beside them:
    ``ddp_options`` {}), and how to name it."""
    twin = latest_ddp_probes(run).get(options_key({}))
    if twin is None:
        return candidate_of(base), f"probe {base.id}"
    return (pool([candidate_of(base), candidate_of(twin[1])]),
            f"probes {base.id} and {twin[1].id}, pooled")


def ddp_effects(run: Run, thresholds: Thresholds) -> dict[str, DdpEffect]:
    """options text -> each DDP counterfactual against the script's own DDP options: from the
    last alternation that measured it (``alternated_effects``), else (``--pairs 0``, a run
    written before alternations) its last probe on its own, against the baseline pooled with
    its twin: launch against launch, which no verdict may rest on alone. Four rules read it,
    once per evaluation (``Evidence.ddp_effects``)."""
    effects: dict[str, DdpEffect] = {}
    base = baseline_probe(run)
    if base is not None:
        theirs, name = reference(run, base)
        for key, (options, probe) in latest_ddp_probes(run).items():
            if not options or not theirs.throughput > 0:
                continue
            mine = candidate_of(probe)
            effects[key] = DdpEffect(
                options=options, ratio=float(probe.throughput / theirs.throughput),
                interval=None, faster=better(mine, theirs, thresholds),
                slower=not not_worse(mine, theirs, thresholds), probes=f"probe {probe.id}",
                reference=name)
    effects.update(alternated_effects(run, thresholds.interval_confidence,
                                      thresholds.launch_sd))
    return effects


class Evidence:
    """What a run's alternations and counterfactuals establish, read at most once per
    evaluation: ``rules.evaluate`` makes one and hands it to the rules and the recommendation
    that cite it (several read the same fits). A rule called on its own reads its own."""

    def __init__(self, run: Run, thresholds: Thresholds) -> None:
        self._run, self._thresholds = run, thresholds
        # the evaluation's recommendation (``rules.recommend``), set once it is made from this
        # evidence: the rules that explain it cite its figure rather than compute their own
        self.recommendation: Any = None

    @cached_property
    def ddp_effects(self) -> Mapping[str, DdpEffect]:
        """options text -> each DDP counterfactual against the script's own (``ddp_effects``)."""
        return MappingProxyType(ddp_effects(self._run, self._thresholds))

    @cached_property
    def persistent(self) -> Optional[PairedClaim]:
        """``persistent_workers=True`` against restarting workers (``persistent_effect``)."""
        return persistent_effect(self._run, self._thresholds.interval_confidence,
                                 self._thresholds.launch_sd)

    @cached_property
    def persistent_per_epoch(self) -> Optional[PairedClaim]:
        """The same alternation read per epoch once the workers run, where ``persistent`` is
        read as whole runs (else None): what a longer run would gain."""
        whole = self.persistent
        if whole is None or not whole.whole_runs:
            return None
        return persistent_effect(self._run, self._thresholds.interval_confidence,
                                 self._thresholds.launch_sd, per_epoch=True)

    def sync_effect(self) -> Optional[DdpEffect]:
        """The script's settings without gradient synchronisation against with it, if
        measured."""
        return self.ddp_effects.get(options_key({GRADIENT_SYNC: False}))

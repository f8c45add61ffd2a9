"""What the run's evidence establishes: the recommendation's verdict, and what stays open.

``choose`` names the best measured configuration; this module decides what the run says of
it, from the alternations that checked it (``decide.paired``). The sweep reads the same
functions to decide what to alternate next, the rules to write the recommendation, so the
two never read one probe two ways:

- ``subject``: what the claim's check alternates with the script's settings (the best, or an
  undecided gain: a question for an alternation, not a "no");
- ``verdict``: the subject where its alternation established it, else the script's settings;
- ``contender``: behind an established check, a faster configuration alternated too;
- ``seen``: what measured faster than the recommendation and is not established, with what
  would settle it.

Each clause in full: docs/internals.md, "The verdict (decide/evidence)".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from ddp_profile.profiler.decide.choose import (
    Candidate,
    ChoiceThresholds,
    candidate_of,
    compute_bound,
    most_certain,
    noise,
)
from ddp_profile.profiler.decide.paired import (
    CANDIDATE,
    REFERENCE,
    PairedClaim,
    alternations,
    paired,
    settings_key,
)
from ddp_profile.profiler.settings import LoaderSettings
from ddp_profile.profiler.store.probes import Kind, ProbeRecord

DEFAULTS = ChoiceThresholds()
STEP_FASTER = "the search measured it faster but not beyond its noise"  # ``checked_because``


@dataclass(frozen=True)
class Verdict:
    """What the run recommends and what it rests on."""

    pick: ProbeRecord  # the recommendation's probe (the baseline where nothing is established)
    claim: Optional[PairedClaim] = None  # the alternation that established it
    checked: Optional[PairedClaim] = None  # an alternation that did not establish its subject
    checked_probe: Optional[ProbeRecord] = None  # that subject's probe
    undecided: bool = False  # the subject was not the search's best but an undecided gain
    because: str = ""  # why that subject was checked (``checked_because``)
    rival: Optional[ProbeRecord] = None  # the other configuration alternated (``contender``):
    # the pick's contender where it did not win, the subject it outran where it did
    rival_claim: Optional[PairedClaim] = None  # that one's alternation


@dataclass(frozen=True)
class Seen:
    """A configuration that measured faster than the recommendation and is not it."""

    probe: str  # the probe that speaks for it
    config: LoaderSettings
    ratio: float  # its pooled throughput / the script's settings'
    why: str  # why it is not established
    short: bool  # every measurement of it ran fewer steps than asked


def _pooled(records: Sequence[ProbeRecord]) -> list[Candidate]:
    """One candidate per configuration (``choose.most_certain``), short ones included."""
    usable = [candidate_of(r) for r in records if r.counts_for_choice and r.measured]
    return most_certain([c for c in usable if math.isfinite(c.throughput)
                         and c.throughput > 0])


def _probe_by_id(records: Sequence[ProbeRecord], probe_id: str) -> ProbeRecord:
    return next(r for r in records if r.id == probe_id)


def needed_gain(base: Candidate, config: LoaderSettings,
                thresholds: ChoiceThresholds = DEFAULTS) -> float:
    """The gain a configuration must show over the script's settings to move them: a
    ``clear_gain`` for another batch size or a compute-bound baseline, else ``noise_floor``."""
    if config.batch_size != base.config.batch_size or compute_bound(base, thresholds):
        return max(thresholds.clear_gain, thresholds.noise_floor)
    return thresholds.noise_floor


def check_gain(base: Candidate, config: LoaderSettings,
               thresholds: ChoiceThresholds = DEFAULTS) -> float:
    """The gain over the script's settings that makes a configuration worth checking by
    alternation: ``clear_gain`` for another batch size, else ``noise_floor``, compute-bound
    or not (the check, not the search's probes, decides: module docstring)."""
    if config.batch_size != base.config.batch_size:
        return max(thresholds.clear_gain, thresholds.noise_floor)
    return thresholds.noise_floor


def outside_steps(base: ProbeRecord, thresholds: ChoiceThresholds = DEFAULTS
                  ) -> Optional[float]:
    """The share by which the script's whole run at its settings, timed from its first batch
    to its end (``script_samples / script_run_s``), ran slower than its measured steps, where
    that exceeds ``clear_gain``; None where no launch timed it or it is within that."""
    if not (base.script_samples and base.script_run_s and base.throughput):
        return None
    share = 1.0 - base.script_samples / base.script_run_s / float(base.throughput)
    return share if share > thresholds.clear_gain else None


def asked_gain(base: ProbeRecord, target: ProbeRecord, best: Optional[ProbeRecord],
               thresholds: ChoiceThresholds = DEFAULTS) -> float:
    """The gain over the script's settings (``base``) that an alternation must measure
    ``target`` at to move them: ``noise_floor`` for the search's best (``best``), else
    ``needed_gain``. The verdict reads it, and the sweep, to stop a check whose interval
    already lies below it."""
    if best is not None and target.id == best.id:
        return thresholds.noise_floor
    return needed_gain(candidate_of(base), target.config, thresholds)


def worth_checking(candidate: Candidate, own: Candidate,
                   thresholds: ChoiceThresholds = DEFAULTS) -> bool:
    """Faster than ``own`` by more than ``check_gain``: a gain worth an alternation."""
    return candidate.throughput > own.throughput * (1 + check_gain(own, candidate.config,
                                                                   thresholds))


def _step_faster(pooled: list[Candidate], own: Candidate,
                 thresholds: ChoiceThresholds) -> list[Candidate]:
    return [c for c in pooled if c.config != own.config and worth_checking(c, own, thresholds)]


def _unranked(pooled: list[Candidate], own: Candidate, share: float) -> list[Candidate]:
    """Other worker counts at the script's batch size whose steps are slower than its own by
    less than ``share``, what its whole run pays beyond its steps (``outside_steps``): what
    they might save outside the steps could still make up for it."""
    return [c for c in pooled if c.config.batch_size == own.config.batch_size
            and c.config.num_workers != own.config.num_workers
            and c.throughput > own.throughput * (1 - share)]


def _undecided_gain(records: Sequence[ProbeRecord], base: ProbeRecord,
                    thresholds: ChoiceThresholds) -> Optional[tuple[Candidate, str]]:
    """The configuration ``undecided`` names, and why (``checked_because``)."""
    pooled = _pooled(records)
    own = next((c for c in pooled if c.config == candidate_of(base).config), None)
    if own is None:
        return None
    faster, because = _step_faster(pooled, own, thresholds), STEP_FASTER
    share = outside_steps(base, thresholds)
    if not faster and share is not None:
        faster = _unranked(pooled, own, share)
        because = (f"its steps cannot rank it below the script's settings, whose whole run "
                   f"took {share / (1 - share):.0%} longer than their steps (validation, "
                   "checkpoints, epoch boundaries, the workers' start-ups: what whole launches "
                   "measure)")
    if not faster:
        return None
    return max(faster, key=lambda c: c.throughput), because


def undecided(records: Sequence[ProbeRecord], base: ProbeRecord,
              thresholds: ChoiceThresholds = DEFAULTS) -> Optional[ProbeRecord]:
    """The configuration that measured fastest, by more than ``check_gain`` over the
    script's settings (pooled), where ``choose`` kept those; else, where the script's run
    pays beyond its steps, the fastest other worker count its steps cannot rank
    (``outside_steps``); None where there is neither."""
    gain = _undecided_gain(records, base, thresholds)
    return _probe_by_id(records, gain[0].id) if gain is not None else None


def checked_because(records: Sequence[ProbeRecord], base: ProbeRecord, target: ProbeRecord,
                    thresholds: ChoiceThresholds = DEFAULTS) -> str:
    """Why ``target``, not the search's best, is the subject of the check (``undecided``)."""
    gain = _undecided_gain(records, base, thresholds)
    if gain is None or gain[0].config != candidate_of(target).config:
        return STEP_FASTER
    return gain[1]


def checked_words(records: Sequence[ProbeRecord], base: ProbeRecord,
                  best: Optional[ProbeRecord], target: ProbeRecord) -> str:
    """``target``, the check's subject, as the sweep's note names it: the recommendation
    (the search's ``best``), or what it is and why it is checked (``checked_because``)."""
    if best is not None and best.id == target.id:
        return "the recommendation"
    because = checked_because(records, base, target)
    label = target.config.label()
    return (f"{label}, faster in the search but not beyond its noise,"
            if because == STEP_FASTER else f"{label} ({because})")


def subject(records: Sequence[ProbeRecord], base: ProbeRecord, best: Optional[ProbeRecord],
            thresholds: ChoiceThresholds = DEFAULTS) -> Optional[ProbeRecord]:
    """What the claim's alternation checks against the script's settings (module docstring)."""
    if best is not None and best.id != base.id \
            and settings_key(best) != settings_key(base):
        return best
    return undecided(records, base, thresholds)


def alternation(records: Sequence[ProbeRecord], reference: ProbeRecord,
                candidate: ProbeRecord) -> list[ProbeRecord]:
    """The last alternation of ``reference``'s settings and ``candidate``'s, in order."""
    wanted = {REFERENCE: settings_key(reference), CANDIDATE: settings_key(candidate)}
    for group in reversed(alternations(records, Kind.PAIRED)):
        if all(p.pair and settings_key(p) == wanted.get(p.pair.role) for p in group):
            return group
    return []


OUTRAN = "it measured faster in the search than the configuration checked first"


def verdict(records: Sequence[ProbeRecord], base: ProbeRecord, best: Optional[ProbeRecord],
            thresholds: ChoiceThresholds = DEFAULTS) -> Verdict:
    """The recommendation's probe and the alternation it rests on (module docstring)."""
    first = _first_verdict(records, base, best, thresholds)
    rival = _contender(records, base, first, thresholds)
    claim = paired(records, alternation(records, base, rival), thresholds.interval_confidence,
                   thresholds.launch_sd) if rival is not None else None
    if rival is None or claim is None or first.claim is None:
        return first
    if claim.faster and claim.ratio > 1 + needed_gain(candidate_of(base), rival.config,
                                                      thresholds) \
            and claim.ratio > first.claim.ratio:
        return Verdict(pick=rival, claim=claim, undecided=True, because=OUTRAN,
                       rival=first.pick, rival_claim=first.claim)
    return replace(first, rival=rival, rival_claim=claim)


def contender(records: Sequence[ProbeRecord], base: ProbeRecord, best: Optional[ProbeRecord],
              thresholds: ChoiceThresholds = DEFAULTS) -> Optional[ProbeRecord]:
    """What is alternated with the script's settings after the check (module docstring):
    where the check established its subject, the configuration that measured fastest above
    it in the search; else None."""
    return _contender(records, base, _first_verdict(records, base, best, thresholds), thresholds)


def likely_contender(records: Sequence[ProbeRecord], base: ProbeRecord, target: ProbeRecord,
                     thresholds: ChoiceThresholds = DEFAULTS) -> Optional[ProbeRecord]:
    """The contender were the check to establish ``target``, as the records stand before it:
    what the check's own launch can alternate beside it (``sweep.claim.confirm``)."""
    return _contender(records, base, Verdict(pick=target), thresholds, established=True)


def _contender(records: Sequence[ProbeRecord], base: ProbeRecord, first: Verdict,
               thresholds: ChoiceThresholds, established: bool = False
               ) -> Optional[ProbeRecord]:
    if not established and first.claim is None or first.pick.id == base.id:
        return None
    own = candidate_of(base)
    found = [s for s in seen(records, base, first, thresholds)
             if s.ratio > 1 + check_gain(own, s.config, thresholds)]
    return _probe_by_id(records, found[0].probe) if found else None


def _first_verdict(records: Sequence[ProbeRecord], base: ProbeRecord,
                   best: Optional[ProbeRecord], thresholds: ChoiceThresholds) -> Verdict:
    """The verdict of the first check: its subject, or the script's settings."""
    target = subject(records, base, best, thresholds)
    if target is None:
        return Verdict(pick=best or base)
    claim = paired(records, alternation(records, base, target),
                   thresholds.interval_confidence, thresholds.launch_sd)
    is_best = best is not None and target.id == best.id
    gain = asked_gain(base, target, best, thresholds)
    because = "" if is_best else checked_because(records, base, target, thresholds)
    if is_best and claim is None or claim is not None and claim.faster \
            and claim.ratio > 1 + gain:
        return Verdict(pick=target, claim=claim, undecided=not is_best, because=because)
    return Verdict(pick=base, checked=claim, checked_probe=target, undecided=not is_best,
                   because=because)


def seen(records: Sequence[ProbeRecord], base: ProbeRecord, decided: Verdict,
         thresholds: ChoiceThresholds = DEFAULTS) -> list[Seen]:
    """Every configuration that measured faster than the recommendation (by more than
    ``noise_floor``, pooled; or the check's subject, where its alternation alone measured it
    so) and is not it, fastest first, with why it is not established."""
    pooled = _pooled(records)
    by_config = {c.config: c for c in pooled}
    own = by_config.get(candidate_of(base).config)
    pick = by_config.get(candidate_of(decided.pick).config)
    if own is None or pick is None:
        return []

    checked_probe = decided.checked_probe
    checked_c = by_config.get(candidate_of(checked_probe).config) \
        if checked_probe is not None else None

    def found_at(c: Candidate, ratio: float) -> Seen:
        short = all(r.short for r in records if r.counts_for_choice and r.measured
                    and candidate_of(r).config == c.config)
        return Seen(probe=c.id, config=c.config, ratio=ratio,
                    why=_why_not_settled(c, own, pick, decided, short, thresholds, checked_c),
                    short=short)

    found = [found_at(c, c.throughput / own.throughput) for c in pooled
             if c.config not in (pick.config, own.config)
             and c.throughput > pick.throughput * (1 + thresholds.noise_floor)]
    checked, claim = decided.checked_probe, decided.checked
    if checked is not None and claim is not None and claim.ratio > 1 + thresholds.noise_floor:
        c = by_config.get(candidate_of(checked).config)  # faster in its alternation alone
        if c is not None and all(s.config != c.config for s in found):
            found.append(found_at(c, claim.ratio))
    return sorted(found, key=lambda s: -s.ratio)


def not_established(claim: PairedClaim, own: Candidate, config: LoaderSettings,
                    thresholds: ChoiceThresholds = DEFAULTS) -> str:
    """Why an alternation of ``config`` with the script's settings (``own``) that did not
    establish it did not, in the words every note and list of the run reads: faster beyond
    noise but short of the gain the choice asks of it (``needed_gain``), a gain it cannot
    tell from none, or slower (within its noise, or beyond it)."""
    measured = alternated(claim)
    if not claim.faster:  # no gain: said as the check read it, never as a gain of its own
        if claim.interval[1] < 1:  # the interval the words print, wholly below 1
            return f"{measured}: slower, beyond its noise"
        if claim.ratio < 1:
            return f"{measured}: no gain (slower, within its noise)"
        return f"{measured}: a gain this check cannot tell from none"
    why = ("it is another batch size" if config.batch_size != own.config.batch_size
           else "their steps wait little for data" if compute_bound(own, thresholds) else "")
    return (f"{measured}: faster, but the script's settings move only for a gain above "
            f"{needed_gain(own, config, thresholds):.0%}" + (f" ({why})" if why else ""))


def alternated(claim: PairedClaim) -> str:
    """What an alternation with the script's settings measured, as the notes say it."""
    return (f"alternated with the script's settings it measured {claim.ratio:.2f}x "
            f"[{claim.interval[0]:.2f}-{claim.interval[1]:.2f}] ({claim.probes[0]}-"
            f"{claim.probes[-1]})")


def _why_not_settled(faster: Candidate, own: Candidate, pick: Candidate, decided: Verdict,
                     short: bool, thresholds: ChoiceThresholds,
                     checked_c: Optional[Candidate] = None) -> str:
    """Why ``faster``, which measured faster than the recommendation ``pick``, is not
    established: the check that did not establish it, else what its measurements lack.
    ``checked_c``: the check's subject, pooled as ``faster`` is (where a check ran)."""
    rival, claim = decided.rival, decided.rival_claim
    if rival is not None and claim is not None and candidate_of(rival).config == faster.config:
        if claim.faster and claim.ratio > 1 + needed_gain(own, faster.config, thresholds) \
                and decided.claim is not None:
            return (f"{alternated(claim)}: less than the recommendation's "
                    f"{decided.claim.ratio:.2f}x")
        return not_established(claim, own, faster.config, thresholds)
    checked = decided.checked_probe
    if decided.checked is not None and checked is not None \
            and candidate_of(checked).config == faster.config:
        return not_established(decided.checked, own, faster.config, thresholds)
    parts = []
    if short:
        parts.append("its probes ran fewer steps than asked (the script ended first)")
    margin = noise(faster, pick, thresholds)
    if faster.throughput <= pick.throughput * (1 + margin):
        parts.append(f"within the noise of its measurement (±{margin:.0%})")
    if faster.config.batch_size != own.config.batch_size \
            and faster.throughput <= pick.throughput * (1 + max(margin, thresholds.clear_gain)):
        parts.append(f"another batch size moves only for a gain beyond noise and "
                     f"{thresholds.clear_gain:.0%}")
    if checked is not None and candidate_of(checked).config != faster.config:
        # named with its figure, pooled as this one's is: not always the fastest (the choice
        # takes the cheapest of the settings within noise of the fastest)
        figure = f" ({checked_c.throughput / own.throughput:.2f}x in the search)" \
            if checked_c is not None else ""
        parts.append(f"the check went to {candidate_of(checked).config.label()}{figure}")
    return "; ".join(parts) or "not checked against the script's settings"

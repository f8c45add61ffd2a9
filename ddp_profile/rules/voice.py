"""One voice: a finding that advises a setting says what the recommendation decided.

The declared wording step of ``rules.evaluate``, after the rules decided: a rule that advises
a setting leaves its finding's recommendation empty and states the setting as an ``Advice``
(``rules.base``); ``in_one_voice(findings, run, rec, thresholds)`` words it from the one
recommendation (``rules.recommend``):

* the recommended probe runs the advised setting: "Measured in this run: (...) runs Nx the
  script's settings; use the recommended configuration: DataLoader(...)";
* another ok probe ran it but the recommendation chose otherwise: "Measured in this run: ...
  (...) ran at Nx the recommended configuration's samples/s (within noise | slower | ...), so
  the recommendation stays DataLoader(...). Not measured as such: ...": never a setting the
  recommendation contradicts. Probe ids stay in the evidence: it speaks of settings.
* nothing ran it: "Prediction (not measured): ..., because ...; measure it: ddp-profile run
  SCRIPT <options>". Other findings are named (``Advice.see``) only when they fired.
"""

from __future__ import annotations

from dataclasses import replace

from ddp_profile.profiler.decide.choose import better, candidate_of, compute_bound, noise, pool
from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.base import Finding, Thresholds, describe_config, finite
from ddp_profile.rules.recommend import Recommendation
from ddp_profile.rules.tables import fastest, find_probe, ok_probes


def in_one_voice(findings: list[Finding], run: Run, rec: Recommendation,
                 thresholds: Thresholds) -> list[Finding]:
    """The findings, those with advice given their recommendation, worded from the one
    recommendation (order kept)."""
    fired = {f.rule for f in findings}
    return [_voiced(f, run, rec, thresholds, fired) if f.advice is not None else f
            for f in findings]


def _setting_text(finding: Finding, run: Run, rec: Recommendation,
                  thresholds: Thresholds) -> str:
    advice = finding.advice
    assert advice is not None
    probes = [p for p in ok_probes(run) if finite(p.throughput)]
    # of any kind: the recommendation may rest on its alternation with persistent workers
    # (rules.recommend)
    pick = find_probe(run, rec.probe_id) if rec.probe_id is not None else None
    pick = pick if pick is not None and pick.ok else None
    if pick is not None and advice.wants(pick.config):
        if rec.probe_id == rec.baseline_probe_id:
            return (f"Measured in this run: the script's own settings "
                    f"({describe_config(pick.config)}) already have {advice.change}, and the "
                    "recommendation keeps them.")
        gain = f" runs {rec.expected_speedup:.2f}x the script's settings" \
            if rec.expected_speedup else ""
        return (f"Measured in this run: {describe_config(pick.config)}{gain}; use the "
                f"recommended configuration: {rec.snippet}.")
    best = fastest(p for p in probes if advice.wants(p.config))
    if pick is not None and best is not None and finite(pick.throughput) \
            and pick.throughput > 0:
        ratio = float(best.throughput / pick.throughput)
        if abs(ratio - 1) <= noise(candidate_of(best), candidate_of(pick), thresholds):
            verdict = "within noise"
        elif ratio < 1:
            verdict = "slower"
        else:
            verdict = _why_not_taken(run, best, pick, rec, thresholds)
        ran = describe_config(best.config)
        # the advice's own example (num_workers=12) may be a setting no probe ran: said apart
        unmeasured = "" if advice.change in ran else f" Not measured as such: {advice.change}."
        return (f"Measured in this run: {ran} "
                f"ran at {ratio:.2f}x the recommended configuration's samples/s ({verdict}), "
                f"so the recommendation stays {rec.snippet}.{unmeasured}")
    return (f"Prediction (not measured): {advice.change}, because {advice.basis}. Measure it: "
            f"ddp-profile run SCRIPT {advice.measure}.")


def _why_not_taken(run: Run, best: ProbeRecord, pick: ProbeRecord, rec: Recommendation,
                   thresholds: Thresholds) -> str:
    """Why a probe faster than the recommendation beyond noise was not recommended: its
    configuration measured again and pooled within noise, or a compute-bound baseline that
    moves only for a clear gain."""
    probes = [p for p in ok_probes(run) if finite(p.throughput)]
    again = [p for p in probes if p.id != best.id and p.config == best.config]
    if again:
        pooled = pool([candidate_of(best), *(candidate_of(p) for p in again)])
        ratio = pooled.throughput / float(pick.throughput)
        rates = ", ".join(f"{p.throughput:,.0f}" for p in again)
        return (f"measured again in probe(s) {', '.join(p.id for p in again)} at {rates} "
                f"samples/s: pooled, {ratio:.2f}x, "
                + ("within noise" if not better(pooled, candidate_of(pick), thresholds)
                   else "faster beyond noise"))
    base = next((p for p in probes if p.id == rec.baseline_probe_id), None)
    if base is not None and compute_bound(candidate_of(base), thresholds):
        return "not the clear gain a compute-bound script needs to change"
    return "not chosen: see the recommendation's notes"


def _voiced(finding: Finding, run: Run, rec: Recommendation, thresholds: Thresholds,
            fired: set[str]) -> Finding:
    advice = finding.advice
    assert advice is not None
    parts = [_setting_text(finding, run, rec, thresholds)]
    if advice.extra:
        parts.append(advice.extra)
    see = [rule for rule in advice.see if rule in fired]
    if see:
        parts.append(f"See the {' and '.join(see)} finding{'s' if len(see) > 1 else ''}.")
    return replace(finding, recommendation=" ".join(parts))

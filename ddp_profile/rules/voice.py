"""One voice: a finding that advises a setting says what the recommendation decided.

The declared wording step of ``rules.evaluate``, after the rules decided: a rule that advises
a setting leaves its finding's recommendation empty and states the setting as an ``Advice``
(``rules.base``); ``in_one_voice(findings, run, rec, thresholds)`` words it from the one
recommendation (``rules.recommend``):

* the recommended probe runs the advised setting: "Measured: probe P (...) runs Nx the
  script's settings; use the recommended configuration: DataLoader(...)";
* another ok probe ran it but the recommendation chose otherwise: "Measured: ... in probe P
  ran at Nx the recommended configuration's samples/s (within noise | slower | ...), so the
  recommendation stays DataLoader(...)": never a setting the recommendation contradicts;
* nothing ran it: "Prediction (not measured): ..., because ...; measure it: ddp-profile run
  SCRIPT <options>". Other findings are named (``Advice.see``) only when they fired.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import pandas as pd

from ddp_profile.profiler.decide.choose import better, compute_bound, noise, pool
from ddp_profile.profiler.store.probes import Kind
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.base import Finding, Thresholds, describe_config, finite
from ddp_profile.rules.recommend import Recommendation, candidate
from ddp_profile.rules.tables import config_of, ok_probes


def in_one_voice(findings: list[Finding], run: Run, rec: Recommendation,
                 thresholds: Thresholds) -> list[Finding]:
    """The findings, those with advice given their recommendation, worded from the one
    recommendation (order kept)."""
    fired = {f.rule for f in findings}
    return [_voiced(f, run, rec, thresholds, fired) if f.advice is not None else f
            for f in findings]


def _measured(run: Run) -> pd.DataFrame:
    probes = ok_probes(run)
    return probes[probes["throughput"].apply(finite)] if not probes.empty else probes


def _row(probes: pd.DataFrame, probe_id: Optional[str]) -> Optional[pd.Series]:
    rows = probes[probes["id"] == probe_id] if probe_id is not None else probes.iloc[0:0]
    return None if rows.empty else rows.iloc[0]


def _setting_text(finding: Finding, run: Run, rec: Recommendation,
                  thresholds: Thresholds) -> str:
    advice = finding.advice
    assert advice is not None
    probes = _measured(run)
    chosen = _row(ok_probes(run, kinds=[k.value for k in Kind]), rec.probe_id)  # of any kind:
    # the recommendation may rest on its alternation with persistent workers (rules.recommend)
    if chosen is not None and advice.wants(chosen):
        if rec.probe_id == rec.baseline_probe_id:
            return (f"Measured: the script's own settings (probe {chosen['id']}, "
                    f"{describe_config(chosen)}) already have {advice.change}, and the "
                    "recommendation keeps them.")
        gain = f" runs {rec.expected_speedup:.2f}x the script's settings" \
            if rec.expected_speedup else ""
        return (f"Measured: probe {chosen['id']} ({describe_config(chosen)}){gain}; use the "
                f"recommended configuration: {rec.snippet}.")
    wanted = probes[probes.apply(advice.wants, axis=1)] if not probes.empty else probes
    if chosen is not None and not wanted.empty and chosen["throughput"] > 0:
        best = wanted.loc[wanted["throughput"].idxmax()]
        ratio = float(best["throughput"] / chosen["throughput"])
        if abs(ratio - 1) <= noise(candidate(run, best), candidate(run, chosen), thresholds):
            verdict = "within noise"
        elif ratio < 1:
            verdict = "slower"
        else:
            verdict = _why_not_taken(run, best, chosen, rec, thresholds)
        return (f"Measured: {advice.change} in probe {best['id']} ({describe_config(best)}) "
                f"ran at {ratio:.2f}x the recommended configuration's samples/s ({verdict}), "
                f"so the recommendation stays {rec.snippet} (probe {chosen['id']}).")
    return (f"Prediction (not measured): {advice.change}, because {advice.basis}. Measure it: "
            f"ddp-profile run SCRIPT {advice.measure}.")


def _why_not_taken(run: Run, best: pd.Series, chosen: pd.Series, rec: Recommendation,
                   thresholds: Thresholds) -> str:
    """Why a probe faster than the recommendation beyond noise was not recommended: its
    configuration measured again and pooled within noise, or a compute-bound baseline that
    moves only for a clear gain."""
    probes = _measured(run)
    again = probes[(probes["id"] != best["id"])
                   & probes.apply(lambda p: config_of(p) == config_of(best), axis=1)]
    if not again.empty:
        pooled = pool([candidate(run, best), *(candidate(run, p) for _, p in again.iterrows())])
        ratio = pooled.throughput / float(chosen["throughput"])
        rates = ", ".join(f"{p['throughput']:,.0f}" for _, p in again.iterrows())
        return (f"measured again in probe(s) {', '.join(again['id'])} at {rates} samples/s: "
                f"pooled, {ratio:.2f}x, "
                + ("within noise" if not better(pooled, candidate(run, chosen), thresholds)
                   else "faster beyond noise"))
    base = _row(probes, rec.baseline_probe_id)
    if base is not None and compute_bound(candidate(run, base), thresholds):
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

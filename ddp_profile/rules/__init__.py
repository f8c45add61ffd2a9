"""Rules: pure functions from a loaded run's tables to findings and a recommendation.

Every rule has one calling convention, ``rule(run, thresholds, known=None) -> Finding | None``:
the run (``ddp_profile.profiler.store.results.Run``: its probe records and its tables), the
numbers it decides with (``Thresholds``: ``evaluate(run, Thresholds(data_wait_fraction=0.3))``)
and what the evaluation established (``known``: one ``alternations.Evidence`` per evaluation,
its fits read once, with the recommendation made from them; a rule called alone builds its own).
``RULES`` is the one registry. Rules do no I/O and no plotting, and return None where what
they need is missing.
Triggers are documented on each rule and in ``docs/rules.md``.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from ddp_profile.profiler.decide.choose import run_thresholds
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.alternations import Evidence
from ddp_profile.rules.base import SEVERITIES, Finding, Rule, Thresholds
from ddp_profile.rules.findings import data, distributed, gpu, host, restarts, synchronisation
from ddp_profile.rules.recommend import Recommendation, recommend, recommendation_to_dict
from ddp_profile.rules.voice import in_one_voice

RULES: list[Rule] = [*data.RULES, *restarts.RULES, *host.RULES, *gpu.RULES, *distributed.RULES,
                     *synchronisation.RULES]
# the findings on the loading: one of them explains a recommendation that changes the loader
LOADING_RULES = ("data-loader-bound", "cpu-bound-preprocessing", "io-bound-loading")


def run_rules(run: Run, thresholds: Optional[Thresholds] = None,
              known: Optional[Evidence] = None) -> list[Finding]:
    """Every registered rule's finding, most severe first (registry order within a severity),
    as the rules decided it: a finding that advises a setting has its ``advice`` and no
    recommendation yet (``evaluate`` words it, ``rules.voice``). ``known``: what the run's
    alternations established and the recommendation (None: read here, once)."""
    thresholds = thresholds or Thresholds()
    known = known or Evidence(run, thresholds)
    if known.recommendation is None:  # the figure a finding cites is the recommendation's
        known.recommendation = recommend(run, thresholds, known)
    findings = [f for f in (rule(run, thresholds, known) for rule in RULES) if f is not None]
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


class Analysis(NamedTuple):
    """What the rules make of one run: the findings, most severe first, and the
    recommendation. ``findings, rec = evaluate(run)`` unpacks it."""

    findings: list[Finding]
    recommendation: Recommendation

    def cause(self) -> Optional[Finding]:
        """The finding that says what holds the job back: where the recommendation moves
        from the script's settings, the finding that explains the move (the loading's, or
        persistent workers' where the speedup was measured with them); else the most
        severe; None without findings."""
        rec = self.recommendation
        explains = ("persistent-workers",) if rec.persistent_in_speedup else LOADING_RULES
        moved = rec.probe_id is not None and rec.probe_id != rec.baseline_probe_id
        found = next((f for f in self.findings if f.rule in explains), None) if moved else None
        return found or (self.findings[0] if self.findings else None)

    def summary_fields(self) -> dict[str, Any]:
        """The summary.json keys the analysis authors: ``findings``, ``recommendation``,
        ``cause`` (the rule id of ``cause()``, or None) and, where a probe was recommended,
        ``recommended``, ``recommended_probe``, ``expected_speedup`` and
        ``expected_speedup_interval``."""
        rec = self.recommendation
        cause = self.cause()
        fields: dict[str, Any] = {"findings": [finding_to_dict(f) for f in self.findings],
                                  "recommendation": recommendation_to_dict(rec),
                                  "cause": cause.rule if cause is not None else None}
        if rec.probe_id is not None:
            interval = rec.expected_speedup_interval
            fields.update(recommended=dict(rec.config), recommended_probe=rec.probe_id,
                          expected_speedup=rec.expected_speedup,
                          expected_speedup_interval=list(interval) if interval else None)
        return fields


def measured_thresholds(run: Run, thresholds: Thresholds) -> Thresholds:
    """``thresholds`` with the spread between launches this run showed, where larger than
    the default (``choose.with_launch_spread``, as the choice itself uses it): every verdict
    across launches (faster beyond noise, within noise) then speaks with the run's own noise."""
    return run_thresholds(thresholds, run.records)


def evaluate(run: Run, thresholds: Optional[Thresholds] = None) -> Analysis:
    """The findings (sorted by severity) and the recommended configuration of one run; reads
    ``run`` and writes nothing into it.

    The rules decide; then one declared step words the advice (``rules.voice``): a finding
    that advises a setting says what the recommendation decided (the measured probe it cites,
    or a prediction labelled as such).
    """
    thresholds = measured_thresholds(run, thresholds or Thresholds())
    known = Evidence(run, thresholds)  # the alternations' fits, read once for every reader
    rec = known.recommendation = recommend(run, thresholds, known)
    return Analysis(in_one_voice(run_rules(run, thresholds, known), run, rec, thresholds),
                    rec)


def finding_to_dict(finding: Finding) -> dict[str, Any]:
    """The summary.json shape: rule, severity, title, evidence, recommendation, ranks (list)."""
    return {"rule": finding.rule, "severity": finding.severity, "title": finding.title,
            "evidence": finding.evidence, "recommendation": finding.recommendation,
            "ranks": list(finding.ranks)}


__all__ = ["RULES", "Analysis", "Finding", "Recommendation", "Rule", "Thresholds", "evaluate",
           "finding_to_dict", "recommend", "recommendation_to_dict", "run_rules"]

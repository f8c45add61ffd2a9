"""Rules: pure functions from a loaded run's tables to findings and a recommendation.

A rule is ``rule(run, thresholds) -> Finding | None`` over the tables of
``ddp_profile.profiler.store.results.Run``; ``RULES`` is the one registry. Rules do no I/O and no
plotting, and return None when the tables they need are empty. Every number they decide with
is a field of ``Thresholds``: ``evaluate(run, Thresholds(data_wait_fraction=0.3))``. The rules
that cite what the run's alternations established (``READ_EVIDENCE``) take it as a third
argument, ``known``: one ``claim.Evidence`` per evaluation, so that each fit is read once.
Triggers are documented on each rule and in ``docs/rules.md``.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from ddp_profile.profiler.decide.choose import with_launch_spread
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.base import SEVERITIES, Finding, Rule, Thresholds, finite
from ddp_profile.rules.claim import Evidence
from ddp_profile.rules.findings import comm, data, distributed, gpu, host, restarts
from ddp_profile.rules.recommend import Recommendation, recommend, recommendation_to_dict
from ddp_profile.rules.tables import candidate, ok_probes
from ddp_profile.rules.voice import in_one_voice

RULES: list[Rule] = [*data.RULES, *restarts.RULES, *host.RULES, *gpu.RULES, *distributed.RULES,
                     *comm.RULES]
# the rules handed the evaluation's reading of the alternations (``known``)
READ_EVIDENCE = (restarts.persistent_workers, distributed.find_unused_parameters,
                 comm.exposed_communication, comm.allreduce_per_micro_batch)
# the findings on the loading: one of them explains a recommendation that changes the loader
LOADING_RULES = ("data-loader-bound", "cpu-bound-preprocessing", "io-bound-loading")
# the rules handed the evaluation's recommendation (``rec``), whose figure they cite
READ_RECOMMENDATION = (data.data_loader_bound,)


def run_rules(run: Run, thresholds: Optional[Thresholds] = None,
              known: Optional[Evidence] = None,
              rec: Optional[Recommendation] = None) -> list[Finding]:
    """Every registered rule's finding, most severe first (registry order within a severity),
    as the rules decided it: a finding that advises a setting has its ``advice`` and no
    recommendation yet (``evaluate`` words it, ``rules.voice``). ``known``: what the run's
    alternations established; ``rec``: the recommendation (None: each read here, once)."""
    thresholds = thresholds or Thresholds()
    known = known or Evidence(run, thresholds)
    rec = rec or recommend(run, thresholds, known)

    def finding(rule: Rule) -> Optional[Finding]:
        if rule in READ_EVIDENCE:
            return rule(run, thresholds, known)
        return rule(run, thresholds, rec) if rule in READ_RECOMMENDATION \
            else rule(run, thresholds)

    findings = [f for f in map(finding, RULES) if f is not None]
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
    probes = ok_probes(run)
    measured = [candidate(run, row) for _, row in probes.iterrows() if finite(row["throughput"])]
    return with_launch_spread(thresholds, measured)


def evaluate(run: Run, thresholds: Optional[Thresholds] = None) -> Analysis:
    """The findings (sorted by severity) and the recommended configuration of one run; reads
    ``run`` and writes nothing into it.

    The rules decide; then one declared step words the advice (``rules.voice``): a finding
    that advises a setting says what the recommendation decided (the measured probe it cites,
    or a prediction labelled as such).
    """
    thresholds = measured_thresholds(run, thresholds or Thresholds())
    known = Evidence(run, thresholds)  # the alternations' fits, read once for every reader
    rec = recommend(run, thresholds, known)
    return Analysis(in_one_voice(run_rules(run, thresholds, known, rec), run, rec, thresholds),
                    rec)


def finding_to_dict(finding: Finding) -> dict[str, Any]:
    """The summary.json shape: rule, severity, title, evidence, recommendation, ranks (list)."""
    return {"rule": finding.rule, "severity": finding.severity, "title": finding.title,
            "evidence": finding.evidence, "recommendation": finding.recommendation,
            "ranks": list(finding.ranks)}


__all__ = ["RULES", "Analysis", "Finding", "Recommendation", "Rule", "Thresholds", "evaluate",
           "finding_to_dict", "recommend", "recommendation_to_dict", "run_rules"]

"""The gate's outputs for CI: a console table, JUnit XML, Markdown and JSON.

Every renderer takes the plain ``GateResult`` built by the gate (``rules.gate``) and only
formats it; nothing here measures or decides. All of the gate's wording lives here: the
verdict's reason (:func:`reason`), the warnings under it (:func:`detectability_warning`,
:func:`launch_warning`, :func:`baseline_warnings`), and the tables.

- JUnit: one ``<testsuite>`` (inside ``<testsuites>``), one ``<testcase>`` per compared
  configuration; ``<failure>`` on a regression, ``<skipped>`` when inconclusive.
- Markdown: a heading with the overall verdict, the comparison table (with the slowdown each
  comparison could detect), the warnings, the environment of both sides;
  :func:`write_github_summary` appends it to ``$GITHUB_STEP_SUMMARY`` (kept under the 1 MiB
  GitHub allows per step).
"""

from __future__ import annotations

import math
import os
import re
import xml.etree.ElementTree as ET
from typing import Any, Mapping, Optional

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ddp_profile.profiler.numbers import finite
from ddp_profile.rules.gate.statistics import REACH_FACTOR
from ddp_profile.rules.gate.verdict import (
    BEYOND,
    INCONCLUSIVE,
    NOT_SIGNIFICANT,
    PASS,
    REGRESSION,
    TOO_FEW,
    Comparison,
    GateResult,
    Verdict,
)

GITHUB_SUMMARY_LIMIT = 1024 * 1024  # bytes GitHub accepts in one step's summary
ENV_ROWS = ("device", "world_size", "torch_version", "cpu_model", "gpu_name", "hostname")
STATUS_WORD = {PASS: "pass", REGRESSION: "REGRESSION", INCONCLUSIVE: "inconclusive"}
STATUS_STYLE = {PASS: "green", REGRESSION: "bold red", INCONCLUSIVE: "yellow"}
STATUS_ICON = {PASS: "\u2705", REGRESSION: "\u274c", INCONCLUSIVE: "\u26a0\ufe0f"}
_XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _rate(value: Any) -> str:
    return f"{value:,.1f}" if finite(value) else "-"


def _change(ratio: Any) -> str:
    return f"{(ratio - 1) * 100:+.1f} %" if finite(ratio) else "-"


def _interval(comparison: Comparison) -> str:
    verdict = comparison.verdict
    if not (finite(verdict.ratio_ci_low) and finite(verdict.ratio_ci_high)):
        return "-"
    return (f"{(verdict.ratio_ci_low - 1) * 100:+.1f} .. "
            f"{(verdict.ratio_ci_high - 1) * 100:+.1f} %")


def _detectable(comparison: Comparison) -> str:
    """The smallest slowdown flagged with 95 % power, signed like the change (-8.3 %)."""
    value = comparison.verdict.min_detectable
    return f"{-value * 100:+.1f} %" if finite(value) else "-"


def _p(value: Any) -> str:
    return f"{value:.2g}" if finite(value) else "-"


def _percent(change: float) -> str:
    return f"{change * 100:+.1f} %"


def _step_reason(verdict: Verdict) -> str:
    if verdict.basis == TOO_FEW:
        return (f"too few samples to decide: {verdict.n_baseline} baseline, "
                f"{verdict.n_current} current step(s), need {verdict.min_samples} each")
    tolerance = f"the {verdict.max_regression * 100:g} % tolerance"
    change = (f"ratio (Hodges-Lehmann) {_percent(verdict.ratio - 1)} "
              f"({verdict.confidence * 100:g} % CI {_percent(verdict.ratio_ci_low - 1)} .. "
              f"{_percent(verdict.ratio_ci_high - 1)})")
    p, alpha = verdict.p_value, verdict.alpha
    if verdict.basis == BEYOND:
        return f"slower beyond {tolerance}: {change}, p={p:.2g} < {alpha:g}"
    if verdict.basis == NOT_SIGNIFICANT:
        return f"no significant slowdown: {change}, p={p:.2g} >= {alpha:g}"
    return f"slowdown not shown beyond {tolerance}: {change}, p={p:.2g}"


def reason(verdict: Verdict) -> str:
    """One line saying why the verdict is what it is (the launch check included)."""
    steps = _step_reason(verdict)
    check = verdict.launch
    if check is None:
        return steps
    launches = (f"launch medians {_percent(check.ratio - 1)} "
                f"({check.n_baseline} / {check.n_current} launches)")
    if check.overruled:
        return (f"{launches}: not beyond the {verdict.max_regression * 100:g} % tolerance, "
                f"though the pooled steps are ({steps})")
    return f"{steps}; {launches}"


def detectability_warning(verdict: Verdict) -> Optional[str]:
    """One line when ``verdict.min_detectable`` is beyond reach, naming the steps needed."""
    if verdict.steps_needed is None or not math.isfinite(verdict.min_detectable):
        return None
    steps = verdict.steps_needed
    text = (f"this comparison can only see a slowdown of {verdict.min_detectable * 100:.1f} % "
            f"or more (95 % power), over {REACH_FACTOR:g}x the "
            f"{verdict.max_regression * 100:g} % tolerance: measure about {steps} steps per "
            f"side (steps = {steps})")
    if verdict.n_baseline < steps:
        text += (f"; the baseline holds only {verdict.n_baseline}, so re-make it from a run "
                 f"with that many")
    return text


def launch_warning(verdict: Verdict) -> Optional[str]:
    """One line when the launch-to-launch variation is unmeasured, or too large for the
    tolerance with this many launches; None otherwise (and when inconclusive)."""
    if verdict.status == INCONCLUSIVE:
        return None
    check = verdict.launch
    if check is None:
        return ("a single launch on at least one side: how much launches of unchanged code "
                "differ on this machine is not measured, and a launch that runs slow or fast "
                "as a whole can pass for a change; measure 3 or more per side "
                "(ddp-profile run --repeat 3, docs/ci.md)")
    if check.launches_needed is None:
        return None
    return (f"launches of the same configuration differ by {check.spread * 100:.1f} % (SD of "
            f"their medians): with {min(verdict.launches_baseline, verdict.launches_current)} "
            f"per side, unchanged code fails this gate about {check.false_alarm_risk * 100:.1f} "
            f"% of the time; measure {check.launches_needed} per side "
            f"(--repeat {check.launches_needed}) or loosen the tolerance")


def baseline_warnings(verdict: Verdict) -> list[str]:
    """What a baseline compared with itself (``verdict``) says about the gate it can support."""
    if verdict.status == INCONCLUSIVE:
        return [f"the baseline holds only {verdict.n_baseline} usable step(s): the gate needs "
                f"at least {verdict.min_samples} on each side and stays inconclusive"]
    if verdict.steps_needed is None:
        return []
    return [f"the baseline holds {verdict.n_baseline} steps: with as many in the current run the "
            f"gate could only see a slowdown of {verdict.min_detectable * 100:.1f} % or more "
            f"(95 % power, {verdict.max_regression * 100:g} % tolerance); export it from a run "
            f"with about {verdict.steps_needed} steps (steps = {verdict.steps_needed}) and "
            f"measure as many in CI"]


def _rows(result: GateResult) -> list[dict[str, str]]:
    """The comparison table as strings, shared by the console and Markdown renderers."""
    return [{"config": c.label, "baseline": _rate(c.baseline_median),
             "current": _rate(c.current_median), "change": _change(c.verdict.ratio),
             "interval": _interval(c), "p": _p(c.verdict.p_value),
             "detectable": _detectable(c),
             "steps": f"{c.verdict.n_baseline} / {c.verdict.n_current}",
             "status": c.verdict.status, "reason": reason(c.verdict)}
            for c in [result.comparison]]


SPLIT_NAMES = {"data_wait_s": "data wait", "compute_s": "compute", "comm_s": "exposed comm",
               "other_s": "other"}


def split_rows(result: GateResult) -> list[list[str]]:
    """Where a step's time goes on each side: [part, baseline ms, current ms, change ms];
    empty unless both sides recorded their split."""
    base, current = result.baseline.get("split"), result.current.get("split")
    if not base or not current:
        return []
    return [[name, f"{base[key] * 1000:.2f}", f"{current[key] * 1000:.2f}",
             f"{(current[key] - base[key]) * 1000:+.2f}"]
            for key, name in SPLIT_NAMES.items() if key in base and key in current]


def _confidence(result: GateResult) -> float:
    return result.comparison.verdict.confidence


def _headline(result: GateResult) -> str:
    return (f"ddp-profile gate: {STATUS_WORD[result.status]} "
            f"(tolerance {result.max_regression * 100:g} %, alpha {result.alpha:g})")


def render_console(result: GateResult, console: Optional[Console] = None) -> None:
    """Print the comparison table and each verdict's reason to a rich console (fits 80 cols)."""
    console = console or Console()
    table = Table(title=_headline(result), title_justify="left", box=box.SIMPLE_HEAD,
                  padding=0, show_edge=False,
                  caption="median global samples/s per step (number of steps); change: "
                  "Hodges-Lehmann ratio; detectable: the least change flagged with 95 % power",
                  caption_justify="left")
    for name in ("Config", "Baseline", "Current",
                 f"Change, {_confidence(result) * 100:g} % CI", "p", "Detectable", "Verdict"):
        table.add_column(name, justify="left" if name in ("Config", "Verdict") else "right",
                         no_wrap=name != "Config", min_width=13 if name == "Config" else None)
    for row in _rows(result):
        status = row["status"]
        n_base, n_cur = row["steps"].split(" / ")
        table.add_row(escape(row["config"]), f"{row['baseline']}\n({n_base})",
                      f"{row['current']}\n({n_cur})",
                      escape(f"{row['change']}\n[{row['interval'].rstrip(' %')}]"), row["p"],
                      row["detectable"],
                      f"[{STATUS_STYLE[status]}]{STATUS_WORD[status]}[/]")
    console.print(table)
    split = split_rows(result)
    if split:
        console.print("ms per step, baseline -> current: " + ", ".join(
            f"{name} {b} -> {c}" for name, b, c, _ in split), markup=False, highlight=False)
    comparison = result.comparison
    console.print(f"{comparison.label}: {reason(comparison.verdict)}", markup=False,
                  highlight=False)
    for warning in result.warnings:
        console.print(f"warning: {warning}", style="yellow", markup=False, highlight=False)


def xml_text(text: Any) -> str:
    return _XML_INVALID.sub("\ufffd", str(text))


def _details(result: GateResult, comparison: Comparison) -> str:
    verdict = comparison.verdict
    return "\n".join([
        f"config: {comparison.label}",
        f"baseline: {result.baseline.get('source')} (probe {comparison.baseline_probe_id}), "
        f"median {_rate(comparison.baseline_median)} samples/s over {verdict.n_baseline} steps",
        f"current: {result.current.get('source')} (probe {comparison.current_probe_id}), "
        f"median {_rate(comparison.current_median)} samples/s over {verdict.n_current} steps",
        f"detectable: a change of {_detectable(comparison)} or worse (95 % power)",
        f"launches: {verdict.launches_baseline} baseline, {verdict.launches_current} current"
        + (f"; launch medians {_change(verdict.launch.ratio)}, spread "
           f"{verdict.launch.spread * 100:.1f} %, false-alarm risk "
           f"{verdict.launch.false_alarm_risk * 100:.1f} %" if verdict.launch else ""),
        f"verdict: {verdict.status}: {reason(verdict)}"])


def junit_xml(result: GateResult) -> str:
    """JUnit XML: one testsuite, one testcase per compared configuration."""
    statuses = [result.status]
    suites = ET.Element("testsuites", name="ddp-profile gate")
    suite = ET.SubElement(suites, "testsuite", name="ddp-profile gate",
                          tests=str(len(statuses)), failures=str(statuses.count(REGRESSION)),
                          errors="0", skipped=str(statuses.count(INCONCLUSIVE)), time="0")
    properties = ET.SubElement(suite, "properties")
    for name, value in (("baseline", result.baseline.get("source")),
                        ("current", result.current.get("source")),
                        ("max_regression", result.max_regression), ("alpha", result.alpha)):
        ET.SubElement(properties, "property", name=name, value=xml_text(value))
    comparison = result.comparison
    verdict = comparison.verdict
    case = ET.SubElement(suite, "testcase", classname="ddp_profile.gate",
                         name=xml_text(f"throughput [{comparison.label}]"), time="0")
    if verdict.status == REGRESSION:
        failure = ET.SubElement(case, "failure", type="ThroughputRegression",
                                message=xml_text(reason(verdict)))
        failure.text = xml_text(_details(result, comparison))
    elif verdict.status == INCONCLUSIVE:
        ET.SubElement(case, "skipped", message=xml_text(reason(verdict)))
    ET.SubElement(case, "system-out").text = xml_text(_details(result, comparison))
    if result.warnings:
        ET.SubElement(suite, "system-err").text = xml_text("\n".join(result.warnings))
    ET.indent(suites)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            + ET.tostring(suites, encoding="unicode") + "\n")


def md_cell(text: Any) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return lines


def _environment_lines(result: GateResult) -> list[str]:
    base_env: Mapping[str, Any] = result.baseline.get("environment") or {}
    cur_env: Mapping[str, Any] = result.current.get("environment") or {}
    rows = [[key, "-" if base_env.get(key) is None else str(base_env.get(key)),
             "-" if cur_env.get(key) is None else str(cur_env.get(key))] for key in ENV_ROWS]
    rows.append(["source", str(result.baseline.get("source")), str(result.current.get("source"))])
    return (["<details><summary>Environment</summary>", ""]
            + md_table(["", "Baseline", "Current"], rows) + ["", "</details>"])


def markdown(result: GateResult, limit_bytes: int = GITHUB_SUMMARY_LIMIT - 4096) -> str:
    """The gate's Markdown summary; table rows are cut to stay under ``limit_bytes``."""
    status = result.status
    lines = [f"## {STATUS_ICON[status]} {_headline(result)}", "",
             f"A configuration fails when a one-sided Mann-Whitney U test gives p < "
             f"{result.alpha:g} **and** the {_confidence(result) * 100:g} % interval of the "
             f"Hodges-Lehmann throughput ratio (current / baseline, from all pairs of steps) "
             f"lies wholly below -{result.max_regression * 100:g} %"
             + (" **and**, with several launches a side, the Hodges-Lehmann shift of the "
                "launch medians does too" if result.comparison.verdict.launch
                else "")
             + ". *Detectable* is the slowdown this comparison would flag with 95 % power.", ""]
    header = ["Config", "Baseline samples/s", "Current samples/s", "Change",
              f"{_confidence(result) * 100:g} % CI", "p", "Detectable", "Steps b / c",
              "Verdict"]
    rows = [[r["config"], r["baseline"], r["current"], r["change"], r["interval"], r["p"],
             r["detectable"], r["steps"], f"{STATUS_ICON[r['status']]} {r['status']}"]
            for r in _rows(result)]
    comparison = result.comparison
    tail = ["", f"- **{md_cell(comparison.label)}**: {md_cell(reason(comparison.verdict))}"]
    tail += [f"- warning: {md_cell(w)}" for w in result.warnings]
    split = split_rows(result)
    if split:
        tail += ["", "Where a step's time goes (mean ms per measured step):", ""]
        tail += md_table(["Part", "Baseline", "Current", "Change"], split)
    tail += [""] + _environment_lines(result) + [""]
    text = "\n".join(lines + md_table(header, rows) + tail)
    kept = len(rows)
    while len(text.encode("utf-8")) > limit_bytes and kept > 0:
        kept //= 2  # drop the reasons and environment, then halve the table until it fits
        note = f"_{len(rows) - kept} more row(s) left out to stay under {limit_bytes} bytes._"
        text = "\n".join(lines + md_table(header, rows[:kept]) + ["", note, ""])
    return text


def _comparison_dict(comparison: Comparison) -> dict[str, Any]:
    return {"config": comparison.config, "label": comparison.label,
            "baseline_probe_id": comparison.baseline_probe_id,
            "current_probe_id": comparison.current_probe_id,
            "baseline_median": comparison.baseline_median if finite(
                comparison.baseline_median) else None,
            "current_median": comparison.current_median if finite(
                comparison.current_median) else None,
            "verdict": {**comparison.verdict.to_dict(), "reason": reason(comparison.verdict)}}


def to_json(result: GateResult) -> dict[str, Any]:
    """The gate's result as a JSON-ready dict (no NaN: missing numbers are null)."""
    return {"status": result.status, "max_regression": result.max_regression,
            "alpha": result.alpha, "baseline": result.baseline, "current": result.current,
            "comparisons": [_comparison_dict(result.comparison)],
            "warnings": list(result.warnings)}


def write_github_summary(md: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Append ``md`` to ``$GITHUB_STEP_SUMMARY`` if set, within the 1 MiB limit.

    Best effort: return the path written, or ``None`` when unset, full or unwritable.
    """
    environ = os.environ if environ is None else environ
    path = environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return None
    try:
        used = os.path.getsize(path) if os.path.exists(path) else 0
        budget = GITHUB_SUMMARY_LIMIT - used - 1
        data = (md if md.endswith("\n") else md + "\n").encode("utf-8")
        if budget <= 0:
            return None
        if len(data) > budget:
            note = "\n\n_(ddp-profile: summary truncated at GitHub's 1 MiB limit)_\n".encode()
            data = data[: max(0, budget - len(note))].decode("utf-8", "ignore").encode() + note
            data = data[:budget]
        with open(path, "ab") as handle:
            handle.write(data)
    except OSError:
        return None
    return path

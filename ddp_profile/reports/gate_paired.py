"""The paired gate's outputs (``gate --against REF``): console, Markdown, JUnit and JSON.

Each takes the plain ``commands.against.PairedResult`` and only formats it; the verdict is
``decide.gate``'s. All of the paired gate's wording is here (:func:`reason`). Every output
shows both sides per launch in the order they ran, the drift, and the fitted ratio.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from typing import Any, Optional

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ddp_profile.profiler.decide import gate
from ddp_profile.profiler.decide.paired import REFERENCE
from ddp_profile.reports.ci import (
    STATUS_ICON,
    STATUS_STYLE,
    STATUS_WORD,
    md_cell,
    md_table,
    xml_text,
)

TOLERANCE = "the {:g} % tolerance"


def _percent(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f} %" if math.isfinite(ratio) else "-"


def _side(role: str) -> str:
    return "A reference" if role == REFERENCE else "B current"


def change(verdict: gate.PairedVerdict) -> str:
    """``-3.1 % [-5.0 .. -1.2 %]``: the fitted change and its interval."""
    if not math.isfinite(verdict.ratio):
        return "-"
    return (f"{_percent(verdict.ratio)} [{_percent(verdict.low).rstrip(' %')} .. "
            f"{_percent(verdict.high)}]")


def reason(result: Any) -> str:
    """One line: why the verdict is what it is."""
    verdict: gate.PairedVerdict = result.verdict
    tolerance = TOLERANCE.format(verdict.max_regression * 100)
    fit = (f"current / reference {verdict.ratio:.3f}, {verdict.confidence * 100:g} % interval "
           f"{verdict.low:.3f}-{verdict.high:.3f}, over {verdict.launches_reference} + "
           f"{verdict.launches_current} launches alternated"
           if math.isfinite(verdict.ratio) else "")
    if verdict.basis == gate.TOO_FEW:
        return "too few launches measured to fit the change"
    if verdict.basis == gate.ENVIRONMENT:
        return (f"the sides ran in different environments ({'; '.join(verdict.differences)}), "
                f"which is not the change under test: {fit}")
    if verdict.basis == gate.BEYOND:
        return f"slower beyond {tolerance}: {fit}"
    if verdict.basis == gate.WITHIN:
        return f"within {tolerance}: {fit}"
    needed = (f"; about {verdict.launches_needed} launches in all would decide it "
              f"(--max-launches {verdict.launches_needed})" if verdict.launches_needed
              else "; the change sits on the tolerance")
    return (f"the interval straddles {tolerance} ({fit}; at most {result.max_launches})"
            f"{needed}")


def _fit_line(result: Any) -> str:
    verdict: gate.PairedVerdict = result.verdict
    if not math.isfinite(verdict.ratio):
        return ""
    if verdict.local:
        return (f"each current launch against the mean of the reference launches beside it "
                f"(the line's drift {_percent(math.exp(verdict.drift))} a launch); a "
                f"launch's level about its neighbours {verdict.residual_sd * 100:.1f} % (SD, "
                f"{verdict.dof} degrees of freedom)")
    return (f"fit: log rate = level + change x current + drift x launch; drift "
            f"{_percent(math.exp(verdict.drift))} a launch, a launch's level about the fit "
            f"{verdict.residual_sd * 100:.1f} % (SD, {verdict.dof} degrees of freedom)")


def _headline(result: Any) -> str:
    return (f"ddp-profile gate: {STATUS_WORD[result.status]} (the working tree against "
            f"{result.against}, tolerance {result.verdict.max_regression * 100:g} %)")


def launch_rows(result: Any) -> list[list[str]]:
    """[#, side, probe, samples/s] of every launch, in the order they ran."""
    return [[str(launch.position + 1), _side(launch.side), launch.probe_id,
             f"{launch.rate:,.1f}" if launch.rate else "-"] for launch in result.launches]


def render_console(result: Any, console: Optional[Console] = None) -> None:
    console = console or Console()
    console.print(_headline(result), markup=False, highlight=False)
    console.print(f"{result.config.label()}, {result.steps} measured steps a launch, global "
                  f"samples/s:", markup=False, highlight=False)
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False)
    for name in ("#", "Side", "Probe", "Samples/s"):
        table.add_column(name, justify="right" if name in ("#", "Samples/s") else "left")
    for row in launch_rows(result):
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)
    verdict = result.verdict
    console.print(f"change {change(verdict)} ({verdict.confidence * 100:g} % interval): "
                  f"[{STATUS_STYLE[verdict.status]}]{STATUS_WORD[verdict.status]}[/]",
                  highlight=False)
    for line in (reason(result), _fit_line(result)):
        if line:
            console.print(line, markup=False, highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", style="yellow", markup=False, highlight=False)


def markdown(result: Any) -> str:
    verdict = result.verdict
    lines = [f"## {STATUS_ICON[result.status]} {_headline(result)}", "",
             f"The reference (A) and the working tree (B) ran {result.config.label()} in "
             f"alternate launches, A B A B A and one more B A at a time while the interval "
             f"straddled the tolerance (up to {result.max_launches}). A regression is an "
             f"interval of current / reference wholly below "
             f"{1 - verdict.max_regression:g}; a pass, wholly above it.", "",
             f"**Change: {change(verdict)}** ({verdict.confidence * 100:g} % interval). "
             f"{md_cell(reason(result))}", ""]
    fit = _fit_line(result)
    if fit:
        lines += [md_cell(fit), ""]
    lines += md_table(["#", "Side", "Probe", "Samples/s"], launch_rows(result))
    lines += [""] + [f"- note: {md_cell(note)}" for note in result.notes]
    return "\n".join(lines).rstrip() + "\n"


def _details(result: Any) -> str:
    return "\n".join([f"reference: {result.against}", f"current: {result.current}",
                      f"config: {result.config.label()}", f"change: {change(result.verdict)}",
                      reason(result), _fit_line(result)]
                     + [f"{row[0]}. {row[1]} {row[2]}: {row[3]} samples/s"
                        for row in launch_rows(result)])


def junit_xml(result: Any) -> str:
    status = result.status
    suites = ET.Element("testsuites", name="ddp-profile gate")
    suite = ET.SubElement(suites, "testsuite", name="ddp-profile gate", tests="1",
                          failures=str(int(status == gate.REGRESSION)), errors="0",
                          skipped=str(int(status == gate.INCONCLUSIVE)), time="0")
    properties = ET.SubElement(suite, "properties")
    for name, value in (("against", result.against), ("current", result.current),
                        ("max_regression", result.verdict.max_regression)):
        ET.SubElement(properties, "property", name=name, value=xml_text(value))
    case = ET.SubElement(suite, "testcase", classname="ddp_profile.gate",
                         name=xml_text(f"throughput [{result.config.label()}] against "
                                       f"{result.against}"), time="0")
    if status == gate.REGRESSION:
        failure = ET.SubElement(case, "failure", type="ThroughputRegression",
                                message=xml_text(reason(result)))
        failure.text = xml_text(_details(result))
    elif status == gate.INCONCLUSIVE:
        ET.SubElement(case, "skipped", message=xml_text(reason(result)))
    ET.SubElement(case, "system-out").text = xml_text(_details(result))
    ET.indent(suites)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            + ET.tostring(suites, encoding="unicode") + "\n")


def to_json(result: Any) -> dict[str, Any]:
    return {"status": result.status, "mode": "paired", "against": result.against,
            "current": result.current, "config": result.config.to_dict(),
            "steps": result.steps, "max_launches": result.max_launches,
            "verdict": {**result.verdict.to_dict(), "reason": reason(result)},
            "launches": [{"position": launch.position, "side": _side(launch.side).split()[1],
                          "probe_id": launch.probe_id, "throughput": launch.rate,
                          "environment": environment}
                         for launch, environment in zip(result.launches, result.environments)],
            "notes": list(result.notes), "out": result.out}

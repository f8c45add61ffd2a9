"""The HTML report: one self-contained file that works offline.

Shape the data, then render: ``build_report_data(run, findings)`` turns a loaded ``Run`` into
plain data (strings, numbers, lists, dicts and plotly figure dicts; tested directly), and
``render_report`` only fills the jinja2 template with it. Every user-controlled string goes
through jinja2's autoescape, and the data the page's scripts read goes through ``tojson``
(which escapes ``<``, ``>``, ``&`` and ``'``), so a script name or an error message can never
close a tag or a ``<script>``. plotly.js is inlined exactly once; the page makes no network
request of any kind (a Content-Security-Policy forbids them too).
"""

from __future__ import annotations

import functools
import json
import math
import os
from typing import Any, Optional

import jinja2
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline

from ddp_profile.profiler.settings import SETTING_KEYS, LoaderSettings
from ddp_profile.profiler.store.atomic import write_text_atomic
from ddp_profile.profiler.store.probes import Kind, baseline_probe, ok_mask
from ddp_profile.profiler.store.results import Run
from ddp_profile.reports import figures
from ddp_profile.reports.run_verdict import build_verdict
from ddp_profile.rules.base import SEVERITIES

CEILING_NONE = ("not established: replaying cached batches ran no faster than the script with "
                "its loading (the per-probe table has the probes)")
FULL_DETAIL_PROBES = 6      # runs up to this size get full-resolution timelines for every probe
COARSE_POINTS = 100         # points per rank for the other probes' timelines in bigger runs
ENVIRONMENT_LABELS = (("torch_version", "torch"), ("cuda_version", "CUDA"),
                      ("driver_version", "NVIDIA driver"), ("gpu_name", "GPU model"),
                      ("cpu_count", "CPU count"), ("hostname", "host"), ("python", "Python"),
                      ("command_line", "command line"))


@functools.lru_cache(maxsize=1)
def template_env() -> jinja2.Environment:
    """The cached jinja2 environment over ``ddp_profile/reports/templates``."""
    return jinja2.Environment(loader=jinja2.PackageLoader("ddp_profile", "reports/templates"),
                              autoescape=True, undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True)


@functools.lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js, to be inlined once; it must not be able to end its own ``<script>``."""
    js = plotly.offline.get_plotlyjs()
    if "</script" in js.lower():  # pragma: no cover - a packaging accident, not user input
        raise RuntimeError("plotly.js contains '</script'; cannot inline it safely")
    return js


def figure_json(fig: go.Figure) -> dict[str, Any]:
    """A plotly figure as plain JSON-ready data (numpy arrays become base64 typed arrays)."""
    return json.loads(pio.to_json(fig, validate=False))


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt(value: Any, spec: str = "", suffix: str = "", missing: str = "–") -> str:
    """Format a number for display; ``missing`` for None/NaN."""
    if _missing(value):
        return missing
    if isinstance(value, float) and value.is_integer() and not spec:
        value = int(value)
    return f"{value:{spec}}{suffix}"


def settings_text(config: Optional[dict[str, Any]]) -> str:
    if not config:
        return "–"
    return ", ".join(f"{k}={fmt(config.get(k), missing='default')}" for k in SETTING_KEYS
                     if k in config)


def baseline_probe_id(run: Run) -> Optional[str]:
    """The probe the run's gains are measured against: the recommendation's
    (``baseline_probe_id``), else (no recommendation) the one lookup it uses
    (``store.probes.baseline_probe``)."""
    recommended = (run.summary.get("recommendation") or {}).get("baseline_probe_id")
    if recommended is not None:
        return str(recommended)
    base = baseline_probe(run.records)
    return base.id if base is not None else None


def probe_roles(run: Run) -> dict[str, str]:
    """Probe id -> baseline / recommended / ceiling, for the probes that play one of those:
    each read from what decided it (the recommendation, the summary's ceiling)."""
    roles: dict[str, str] = {}
    ids = {r.id for r in run.records}
    baseline = baseline_probe_id(run)
    if baseline is not None:
        roles[baseline] = "baseline"
    ceiling = run.summary.get("ceiling_probe")
    if ceiling is None and "ceiling_probe" not in run.summary:  # written before it was kept
        ceiling = next((r.id for r in run.records if r.kind == Kind.CEILING), None)
    if ceiling is not None:
        roles[str(ceiling)] = "ceiling"
    recommended = run.summary.get("recommended_probe")  # the probe the recommendation names
    if recommended is not None and str(recommended) in ids:
        roles[str(recommended)] = "recommended"
    return roles


def _throughput_of(run: Run, probe_id: Optional[str]) -> Optional[float]:
    record = next((r for r in run.records if r.id == probe_id), None)
    return record.throughput if record is not None else None


def build_headline(run: Run, roles: dict[str, str]) -> dict[str, Any]:
    summary = run.summary
    by_role = {role: pid for pid, role in roles.items()}
    recommendation = summary.get("recommendation") or {}
    speedup = summary.get("expected_speedup")
    interval = summary.get("expected_speedup_interval") or []
    ceiling = summary.get("ceiling_throughput")
    share = recommendation.get("ceiling_share")
    baseline_id = baseline_probe_id(run)  # also where it is the recommended probe
    rec_tp = _throughput_of(run, by_role.get("recommended"))
    # the recommendation's share alone (``rules.recommend``: a ceiling at its batch size),
    # never one made here against a ceiling measured at another batch size
    unshared = "not at this batch size" if not _missing(ceiling) and ceiling else "unknown"
    has_interval = len(interval) == 2 and not any(_missing(v) for v in interval)
    return {
        "recommended": summary.get("recommended") or {},
        "recommended_text": settings_text(summary.get("recommended")),
        "baseline_text": settings_text(summary.get("baseline")),
        "recommended_probe": by_role.get("recommended"),
        "expected_speedup": None if _missing(speedup) else float(speedup),
        "speedup_text": fmt(speedup, ".2f", "×", missing="not measured"),
        "interval_text": (f"{interval[0]:.2f}–{interval[1]:.2f}×" if has_interval else None),
        "ceiling_share": None if _missing(share) else float(share),
        "ceiling_share_text": fmt(share, ".0%", missing=unshared),
        "ceiling_throughput_text": fmt(ceiling, ",.1f", " samples/s",
                                       missing=CEILING_NONE if summary.get("ceiling_failed")
                                       else "not measured"),
        "baseline_throughput_text": fmt(_throughput_of(run, baseline_id), ",.1f",
                                        " samples/s"),
        "recommended_throughput_text": fmt(rec_tp, ",.1f", " samples/s"),
        "snippet": recommendation.get("snippet") or "",
        "notes": [str(n) for n in recommendation.get("notes") or []],
        "basis": str(recommendation.get("speedup_basis") or ""),
    }


def build_verdict_data(run: Run) -> dict[str, Any]:
    """The first screen (``reports.run_verdict``): the cause, the change and its snippet, the
    speedup with its interval and how it was checked, what is not established."""
    verdict = build_verdict(run.summary, run.records, run.warnings)
    speedup, threads = verdict.speedup, verdict.threads
    return {
        "cause_title": verdict.cause_title, "cause_text": verdict.cause_text,
        "cause_rule": verdict.cause_rule or "", "severity": verdict.severity or "",
        "moves": verdict.moves, "change_text": verdict.change_text(),
        "snippet": verdict.snippet,
        # the script's settings kept: their own speed, whatever the bootstrap read
        "speedup_text": fmt(speedup if verdict.moves or speedup is None else 1.0, ".2f", "×",
                            missing="not measured"),
        "interval_text": (f"{verdict.interval[0]:.2f}–{verdict.interval[1]:.2f}×"
                          if verdict.interval and verdict.moves else None),
        "check": verdict.check,
        "threads": None if threads is None else {
            "text": threads.text(), "measured_with": threads.measured_with,
            "speedup_text": fmt(threads.speedup, ".2f", "×", missing="not measured"),
            "interval_text": (f"{threads.interval[0]:.2f}–{threads.interval[1]:.2f}×"
                              if threads.interval else None),
            "check": threads.check},
        "not_established": [dict(item) for item in verdict.not_established],
        "warnings": list(verdict.warnings),
    }


def _evidence(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {"pairs": [(str(k), json.dumps(v) if isinstance(v, (dict, list)) else str(v))
                          for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"items": [str(v) for v in value]}
    return {"text": "" if value is None else str(value)}


def build_findings(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings grouped by severity, high first; unknown severities come last as 'other'."""
    groups: dict[str, list[dict[str, Any]]] = {s: [] for s in (*SEVERITIES, "other")}
    for finding in findings:
        severity = str(finding.get("severity", "other")).lower()
        ranks = [str(r) for r in finding.get("ranks") or []]
        groups[severity if severity in groups else "other"].append({
            "rule": str(finding.get("rule") or ""), "title": str(finding.get("title") or ""),
            "evidence": _evidence(finding.get("evidence")),
            "recommendation": str(finding.get("recommendation") or ""),
            "ranks_text": _ranks_text(ranks)})
    return [{"severity": s, "items": items} for s, items in groups.items() if items]


def _ranks_text(ranks: list[str]) -> str:
    """"rank 1", "ranks 0, 3"; a process without a process group (rank -1): "the process"."""
    if ranks == ["-1"]:
        return "the process"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(ranks) if ranks else ""


def _cell(text: str, sort: Any = None) -> dict[str, Any]:
    if isinstance(sort, float) and math.isnan(sort):
        sort = None
    return {"text": text, "sort": text if sort is None and text != "–" else sort}


def build_table(run: Run, roles: dict[str, str]) -> dict[str, Any]:
    """Every probe as a row of display text plus a sort key per column."""
    columns = ["probe", "role", "status", *SETTING_KEYS, "samples/s", "% of ceiling",
               "data wait", "exposed comm", "wall s"]
    rows = []
    for row in run.probes.to_dict("records"):
        pid = str(row["id"])
        rows.append({"id": pid, "recommended": roles.get(pid) == "recommended", "cells": [
            _cell(pid), _cell(roles.get(pid, row.get("kind") or "")),
            _cell(str(row.get("status")) + (", short" if row.get("short") in (True,) else "")),
            *[_cell(fmt(row.get(k), missing="default"),
                    None if _missing(row.get(k)) else float(row[k])) for k in SETTING_KEYS],
            _cell(fmt(row["throughput"], ",.1f"), row["throughput"]),
            _cell(fmt(row["score"], ".0%"), row["score"]),
            _cell(fmt(row["data_wait_fraction"], ".0%"), row["data_wait_fraction"]),
            _cell(fmt(row["comm_fraction"], ".0%"), row["comm_fraction"]),
            _cell(fmt(row["wall_s"], ".1f"), row["wall_s"])]})
    return {"columns": columns, "rows": rows}


def build_failed(run: Run) -> list[dict[str, Any]]:
    failed = []
    for probe in run.records:
        if probe.ok:
            continue
        failed.append({"id": probe.id, "status": probe.status.value,
                       "settings": settings_text(probe.config.to_dict()
                                                 if probe.config != LoaderSettings() else None),
                       "reason": probe.reason or "",
                       "error": probe.error or "",
                       "root_cause_rank": fmt(probe.root_cause_rank)})
    return failed


def build_environment(run: Run) -> list[tuple[str, str]]:
    summary = run.summary
    env = summary.get("environment") or {}
    gpu_keys = {"cuda_version", "driver_version", "gpu_name"}
    no_gpu = "none" if summary.get("gpu_available") is False else "unknown"
    pairs = [(label, fmt(env.get(key), missing=no_gpu if key in gpu_keys else "unknown"))
             for key, label in ENVIRONMENT_LABELS]
    if env.get("cpu_model"):
        pairs.insert(5, ("CPU model", str(env["cpu_model"])))
    args = summary.get("script_args", run.meta.get("script_args")) or []
    pairs += [("script", str(summary.get("script") or run.meta.get("script") or "unknown")),
              ("script arguments", " ".join(str(a) for a in args) or "none"),
              ("world size", fmt(summary.get("world_size"), missing="unknown")),
              ("device", str(summary.get("device") or "unknown")),
              ("backend", str(summary.get("backend") or "unknown")),
              ("run directory", os.path.abspath(run.path))]
    return pairs


def has_gpu_samples(samples: pd.DataFrame) -> bool:
    return (not samples.empty and "gpu_util_percent" in samples.columns
            and bool((samples["source"] == "gpu").any())
            and bool(samples.loc[samples["source"] == "gpu", "gpu_util_percent"].notna().any()))


def probe_detail_figures(steps: pd.DataFrame, samples: pd.DataFrame, probe_id: str, gpu: bool,
                         max_points: int) -> list[dict[str, Any]]:
    """The per-probe charts: per-rank split, step-time timeline, GPU, CPU timelines."""
    figs = [("ranks", figures.time_split_by_rank(steps, probe_id)),
            ("steps", figures.step_timeline(steps, probe_id, max_points))]
    if gpu:
        figs.append(("gpu_util", figures.sample_timeline(
            samples, probe_id, "gpu", "gpu_util_percent", "GPU utilisation per rank (%)",
            "%", max_points=max_points)))
        figs.append(("gpu_mem", figures.sample_timeline(
            samples, probe_id, "gpu", "gpu_mem_used_bytes", "GPU memory used per rank (GiB)",
            "GiB", scale=1 / 2**30, max_points=max_points)))
    figs.append(("cpu", figures.sample_timeline(
        samples, probe_id, "host", "cpu_percent", "Host CPU utilisation per rank (%)", "%",
        max_points=max_points)))
    return [{"name": name, "figure": figure_json(fig)} for name, fig in figs]


def build_probe_details(run: Run, roles: dict[str, str],
                        labels: dict[str, str]) -> list[dict[str, Any]]:
    """Probes with data, baseline / recommended / ceiling first; the rest coarser if many."""
    with_data = set(run.steps["probe_id"]) | (set(run.samples["probe_id"])
                                              if not run.samples.empty else set())
    ids = [str(pid) for pid in run.probes["id"] if pid in with_data]
    first = [pid for role in ("recommended", "baseline", "ceiling")
             for pid, r in roles.items() if r == role and pid in ids]
    ordered = first + [pid for pid in ids if pid not in first]
    gpu = has_gpu_samples(run.samples)
    steps_of = {str(k): v for k, v in run.steps.groupby("probe_id", sort=False)}
    samples_of = ({str(k): v for k, v in run.samples.groupby("probe_id", sort=False)}
                  if not run.samples.empty else {})
    details = []
    for pid in ordered:
        full = pid in first or len(ids) <= FULL_DETAIL_PROBES
        label = labels.get(pid) or pid
        details.append({"id": pid, "role": roles.get(pid, ""),
                        "label": label + (f" ({roles[pid]})" if pid in roles else ""),
                        "figures": probe_detail_figures(
                            steps_of.get(pid, run.steps.iloc[:0]),
                            samples_of.get(pid, run.samples.iloc[:0]), pid, gpu,
                            figures.MAX_POINTS if full else COARSE_POINTS)})
    return details


def probe_labels(run: Run) -> dict[str, str]:
    """Probe id -> short label, successful probes by throughput (best first)."""
    ok = run.probes[ok_mask(run.probes)].sort_values("throughput", ascending=False)
    return {str(row["id"]): figures.probe_label(row) for row in ok.to_dict("records")}


def build_report_data(run: Run, findings: Optional[list[dict[str, Any]]] = None
                      ) -> dict[str, Any]:
    """Everything the template shows, as plain data; no HTML here."""
    summary = run.summary
    if findings is None:
        findings = summary.get("findings") or []
    roles = probe_roles(run)
    labels = probe_labels(run)
    charts = {"throughput": figures.throughput_by_config(run.probes, roles),
              "split": figures.time_split_by_config(run.steps, labels),
              "cpu": figures.cpu_by_probe(run.samples, labels)}
    heatmap = figures.workers_batch_heatmap(run.probes)
    if heatmap is not None:
        charts["heatmap"] = heatmap
    capacity = figures.capacity_by_workers(summary.get("capacity"), run.probes)
    if capacity is not None:
        charts["capacity"] = capacity
    details = build_probe_details(run, roles, labels)
    gpu = has_gpu_samples(run.samples)
    script = str(summary.get("script") or run.meta.get("script") or "training script")
    return {
        "title": f"ddp-profile: {os.path.basename(script)}",
        "script": script,
        "headline": build_headline(run, roles),
        "verdict": build_verdict_data(run),
        "findings": build_findings(findings),
        "finding_count": len(findings),
        "table": build_table(run, roles),
        "failed": build_failed(run),
        "environment": build_environment(run),
        "gpu": {"available": gpu, "reason": str(summary.get("gpu_unavailable_reason")
                                                or "no GPU samples were recorded")},
        "probe_count": len(run.probes),
        "client": {"figures": {name: figure_json(fig) for name, fig in charts.items()},
                   "probes": details,
                   "default_probe": details[0]["id"] if details else None},
    }


def render_report(run: Run, findings: Optional[list[dict[str, Any]]] = None) -> str:
    """The report as one HTML string (plotly.js inlined, no network access needed)."""
    data = build_report_data(run, findings)
    return template_env().get_template("report.html").render(data=data, plotly_js=plotly_js())


def write_report(run: Run, path: str, findings: Optional[list[dict[str, Any]]] = None) -> str:
    """Render the report and write it atomically to ``path``; return ``path``."""
    write_text_atomic(path, render_report(run, findings))
    return path

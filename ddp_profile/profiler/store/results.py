"""Load a run directory into pandas tables with one call: ``load_run(path)``.

A run directory is the single source of truth; ``report`` and ``gate`` only read it (its
layout: docs/internals.md, "Run directory"). ``load_run`` returns a ``Run``: the summary, the
probes as records, and the tables ``probes`` (one row per probe record), ``steps`` (the
training loader's steps of every rank, with their GPU timings and exposed communication),
``samples`` (telemetry, one float column per metric), ``loader_iters`` and ``events``; all
times in seconds, ``t_s`` relative to the probe's first record. Every column:
docs/internals.md, "Tables".
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd

from ddp_profile.errors import BadRunDir
from ddp_profile.profiler.settings import SETTING_KEYS
from ddp_profile.profiler.store.probe_comm import step_comm
from ddp_profile.profiler.store.probedir import RankData, read_probe_dir
from ddp_profile.profiler.store.probes import BadProbeRecord, ProbeRecord
from ddp_profile.profiler.store.probes import records as probe_records
from ddp_profile.profiler.store.record import read_jsonl

STEP_COLUMNS = ["probe_id", "rank", "node", "loader_id", "step", "measured", "t_s",
                "data_wait_s", "compute_s", "other_s", "forward_s", "step_s", "samples",
                "gpu_busy_s", "gpu_gap_s", "comm_s", "coll_s", "coll_n", "syncs",
                "runq_s"]
PROBE_COLUMNS = ["id", "kind", "status", *SETTING_KEYS, "throughput", "data_wait_fraction",
                 "gpu_idle_fraction", "gpu_starved_fraction", "comm_fraction", "score", "wall_s",
                 "error", "root_cause_rank", "steps_measured", "short", "short_reason", "launch"]


STEP_PARTS = ("data_wait_s", "compute_s", "comm_s", "other_s")  # they add up to step_s


def step_split(steps: pd.DataFrame, by: Optional[str] = None) -> pd.DataFrame:
    """Mean seconds per measured step of each of ``STEP_PARTS``, per ``by`` group (one row,
    index 0, without). Exposed communication lies inside ``compute_s``: it is taken out of
    compute, averaged over the steps DDP's timers were read for (0 where none were)."""
    measured = steps[steps["measured"].astype(bool)] if not steps.empty else steps
    if measured.empty:
        return pd.DataFrame(columns=list(STEP_PARTS))
    grouped = measured.groupby(by if by is not None else np.zeros(len(measured), dtype=int))
    parts = grouped[["data_wait_s", "compute_s", "other_s"]].mean()
    comm = grouped["comm_s"].mean().fillna(0.0) if "comm_s" in measured else 0.0
    parts["comm_s"] = np.minimum(comm, parts["compute_s"])
    parts["compute_s"] = parts["compute_s"] - parts["comm_s"]
    return parts[list(STEP_PARTS)]


def _nan(value: Any) -> float:
    return float("nan") if value is None else float(value)


@dataclass(frozen=True)
class Run:
    """A loaded run directory: the summary plus the tables described in the module docstring.
    Read-only to its readers (the rules, the reports): a composed summary makes a new one
    (``dataclasses.replace``)."""

    path: str
    meta: dict[str, Any]
    summary: dict[str, Any]
    probes: pd.DataFrame
    steps: pd.DataFrame
    samples: pd.DataFrame
    loader_iters: pd.DataFrame
    events: pd.DataFrame
    contexts: dict[tuple[str, int], dict[str, Any]]
    warnings: list[str] = field(default_factory=list)

    @cached_property
    def records(self) -> tuple[ProbeRecord, ...]:
        """Every probe of the summary, typed (``store.probes.ProbeRecord``), in run order, with
        what a line recorded before a figure was kept completed from its steps
        (``completed``)."""
        return tuple(completed(r, self.steps) for r in probe_records(self.summary.get("probes")
                                                                      or []))

    def probe(self, probe_id: str) -> ProbeRecord:
        for record in self.records:
            if record.id == probe_id:
                return record
        raise KeyError(probe_id)


def read_json(path: str, what: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except FileNotFoundError:
        raise BadRunDir(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRunDir(f"{what} is unreadable ({path}): {exc}") from None
    if not isinstance(value, dict):
        raise BadRunDir(f"{what} is not a JSON object: {path}")
    return value


AMENDS = "amends"  # a ledger line that corrects an earlier one: {"amends": id, "fields": {...}}


def read_ledger(run_dir: str) -> tuple[list[dict[str, Any]], int]:
    """The finished probes in ledger order, each with its later corrections folded in (the
    ledger is only ever appended to: a correction is a line of its own); a torn last line
    (killed mid-append) is skipped."""
    path = os.path.join(run_dir, "ledger.jsonl")
    if not os.path.exists(path):
        return [], 0
    lines, torn = read_jsonl(path)
    return fold_amendments(lines), torn


def fold_amendments(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ledger lines as probes: each ``amends`` line's fields laid over the probe it names."""
    entries: list[dict[str, Any]] = []
    by_id: dict[Any, dict[str, Any]] = {}
    for line in lines:
        if AMENDS in line:
            target = by_id.get(line[AMENDS])
            if target is not None and isinstance(line.get("fields"), dict):
                target.update(line["fields"])
            continue
        entries.append(line)
        by_id[line.get("id")] = line
    return entries


def _measured_steps(steps: pd.DataFrame, probe_id: str) -> pd.DataFrame:
    if steps is None or steps.empty or "probe_id" not in steps:
        return pd.DataFrame(columns=STEP_COLUMNS)
    rows = steps[(steps["probe_id"] == probe_id) & steps["measured"].astype(bool)].copy()
    if rows["step_s"].isna().any():
        rows["step_s"] = rows["data_wait_s"] + rows["compute_s"] + rows["other_s"]
    return rows


def global_steps(steps: pd.DataFrame, probe_id: str) -> pd.DataFrame:
    """One row per measured step of ``probe_id`` complete on every rank: step_s = the slowest
    rank's, samples = every rank's."""
    rows = _measured_steps(steps, probe_id)
    if rows.empty:
        return pd.DataFrame(columns=["step_s", "samples"])
    rows = rows.assign(samples=rows["samples"].fillna(0))
    ranks = rows["rank"].nunique()
    grouped = rows.groupby("step").agg(step_s=("step_s", "max"), samples=("samples", "sum"),
                                       ranks=("rank", "nunique"))
    grouped = grouped[(grouped["ranks"] == ranks) & (grouped["step_s"] > 0)]
    return grouped[["step_s", "samples"]]


def completed(record: ProbeRecord, steps: pd.DataFrame) -> ProbeRecord:
    """``record`` with the figures a line recorded before they were kept lacks, taken from
    its measured steps (a new record; its line, what is written, unchanged):

    * ``throughput_rse``: the spread of its global step times (``std / mean / sqrt(n)``);
    * the data wait's share of each step: on CUDA, where its steps' GPU gaps were timed, the
      GPU's idle time while its host waited (``gpu.starved_fraction``), else the host's
      wait (``data_wait_fraction``).
    """
    if not record.ok:
        return record
    changes: dict[str, Any] = {}
    if record.throughput_rse is None:
        times = global_steps(steps, record.id)["step_s"]
        if len(times) >= 2 and times.mean() > 0:
            changes["throughput_rse"] = float(times.std(ddof=1) / times.mean()
                                              / np.sqrt(len(times)))
    starved = record.gpu.starved_fraction
    if starved is None:
        rows = _measured_steps(steps, record.id)
        timed = not rows.empty and bool(rows["gpu_gap_s"].notna().any())
        total = float(rows["step_s"].sum()) if not rows.empty else 0.0
        if timed and total > 0:  # a step without a timed gap: its wait
            waited = pd.concat([rows["data_wait_s"], rows["gpu_gap_s"]], axis=1).min(axis=1)
            changes["gpu"] = replace(record.gpu, starved_fraction=float(waited.sum() / total))
        elif not timed and record.data_wait_fraction is None and total > 0:
            changes["data_wait_fraction"] = float(rows["data_wait_s"].sum() / total)
    return replace(record, **changes) if changes else record


def probes_table(records: Sequence[ProbeRecord]) -> pd.DataFrame:
    """The probes as a table (``Run.probes``), for the charts and tables that need one: made
    here alone, from the records."""
    return pd.DataFrame([_probe_row(p) for p in records], columns=PROBE_COLUMNS)


def _probe_row(record: ProbeRecord) -> dict[str, Any]:
    """A record's row of the probes table."""
    return {"id": record.id, "kind": record.kind.value, "status": record.status.value,
            **record.config.to_dict(),
            "throughput": _nan(record.throughput),
            "data_wait_fraction": _nan(record.data_wait_fraction),
            "gpu_idle_fraction": _nan(record.gpu.idle_fraction),
            "gpu_starved_fraction": _nan(record.gpu.starved_fraction),
            "comm_fraction": _nan(record.comm.exposed_fraction),
            "score": _nan(record.score), "wall_s": _nan(record.wall_s),
            "error": record.error, "root_cause_rank": record.root_cause_rank,
            "steps_measured": record.steps_measured, "short": record.short,
            "short_reason": record.short_reason, "launch": record.launch}


def _rank_rows(probe_id: str, data: RankData, out: dict[str, list]) -> None:
    node = data.context.get("node_rank", 0)
    t0 = min([s["t_ns"] for s in data.steps if s.get("t_ns")] or [0])
    training = data.training_steps()
    comm = step_comm(training)
    for step in training:
        gpu = data.gpu_steps.get((step.get("loader_id"), step.get("step")), {})
        timed = comm.get(step.get("step"), {})
        out["steps"].append({
            "probe_id": probe_id, "rank": data.rank, "node": node,
            "loader_id": step.get("loader_id"), "step": step.get("step"),
            "measured": bool(step.get("measured")), "t_s": (step.get("t_ns", t0) - t0) / 1e9,
            "data_wait_s": step["data_wait_s"], "compute_s": step["compute_s"],
            "other_s": step["other_s"], "forward_s": _nan(step.get("forward_s")),
            "step_s": step["data_wait_s"] + step["compute_s"] + step["other_s"],
            "samples": step.get("samples") or 0,
            "gpu_busy_s": _nan(gpu.get("gpu_busy_s")), "gpu_gap_s": _nan(gpu.get("gpu_gap_s")),
            "comm_s": _nan(timed.get("exposed_s")), "coll_s": float(step.get("coll_s") or 0.0),
            "coll_n": int(step.get("coll_n") or 0), "syncs": _nan(step.get("syncs")),
            "runq_s": _nan(step.get("runq_s"))})
    for sample in data.samples:
        row = {k: v for k, v in sample.items() if k not in ("kind", "t_ns", "rank")}
        row.update(probe_id=probe_id, rank=data.rank, node=node,
                   t_s=(sample.get("t_ns", t0) - t0) / 1e9)
        out["samples"].append(row)
    for item in data.loader_iters:
        out["loader_iters"].append({"probe_id": probe_id, "rank": data.rank,
                                    "loader_id": item.get("loader_id"),
                                    "iter_index": item.get("iter_index"),
                                    "first_batch_s": _nan(item.get("first_batch_s"))})
    for event in data.events:
        out["events"].append({"probe_id": probe_id, "rank": data.rank,
                              "name": event.get("name"), "data": event.get("data") or {}})


def load_run(run_dir: str, summary: Optional[dict[str, Any]] = None) -> Run:
    """Load a run directory; raise ``BadRunDir`` with a one-line reason if it is unusable.

    ``summary``: the run's summary when the caller holds it (the sweep that has just built
    it), instead of reading ``summary.json``."""
    if not os.path.isdir(run_dir):
        raise BadRunDir(f"run directory not found: {run_dir}")
    meta_path = os.path.join(run_dir, "run.json")
    meta = read_json(meta_path, "run metadata") if os.path.exists(meta_path) else {}
    summary_path = os.path.join(run_dir, "summary.json")
    ledger, torn = read_ledger(run_dir)
    if summary is not None:
        pass
    elif os.path.exists(summary_path):
        summary = read_json(summary_path, "summary")
    elif ledger or meta:
        summary = {"probes": ledger}
    else:
        raise BadRunDir(f"not a ddp-profile run directory (no summary.json, ledger or run.json): "
                        f"{run_dir}")
    probes_list = summary.get("probes")
    if not isinstance(probes_list, list):
        raise BadRunDir(f"summary.json has no probe list: {summary_path}")
    tables = read_probes(run_dir, [str(p.get("id")) for p in probes_list])
    warnings = [f"ledger.jsonl: skipped {torn} unreadable line(s)"] if torn else []
    return assemble(run_dir, meta, summary, tables, warnings)


@dataclass(frozen=True)
class ProbeTables:
    """What the ranks recorded for a run's probes (``read_probes``), in the probes' order."""

    rows: dict[str, list]  # steps, samples, loader_iters, events
    contexts: dict[tuple[str, int], dict[str, Any]]
    warnings: list[str]

    def first_context(self) -> dict[str, Any]:
        """The first probe's first rank context that holds anything (the run's device, world
        size, torch, CPUs), {} where none does."""
        return next((c for c in self.contexts.values() if c), {})


def read_probes(run_dir: str, probe_ids: list[str],
                read: Optional[Callable[[str], list[RankData]]] = None) -> ProbeTables:
    """Every rank's records of ``probe_ids``: read once per run, for the summary (its first
    context) and the run's tables alike. ``read``: a probe's rank records where the caller
    holds them already (the sweep that measured it: ``LedgerMeasurer.rank_data``)."""
    rows: dict[str, list] = {"steps": [], "samples": [], "loader_iters": [], "events": []}
    contexts: dict[tuple[str, int], dict[str, Any]] = {}
    warnings = []
    read = read or (lambda probe_id: read_probe_dir(os.path.join(run_dir, "probes", probe_id)))
    for probe_id in probe_ids:
        for data in read(probe_id):
            contexts[(probe_id, data.rank)] = data.context
            _rank_rows(probe_id, data, rows)
            if data.torn_lines:
                warnings.append(f"probe {probe_id} rank {data.rank}: skipped "
                                f"{data.torn_lines} unreadable line(s)")
    return ProbeTables(rows, contexts, warnings)


def assemble(run_dir: str, meta: dict[str, Any], summary: dict[str, Any],
             tables: ProbeTables, warnings: Optional[list[str]] = None) -> Run:
    """The ``Run`` of a summary and its probes' records."""
    rows = tables.rows
    try:
        typed = probe_records(summary.get("probes") or [])
    except BadProbeRecord as exc:
        raise BadRunDir(f"{run_dir}: {exc}") from None
    steps = pd.DataFrame(rows["steps"], columns=STEP_COLUMNS)
    typed = tuple(completed(r, steps) for r in typed)
    run = Run(path=run_dir, meta=meta, summary=summary, probes=probes_table(typed),
              steps=steps,
              samples=pd.DataFrame(rows["samples"]),
              loader_iters=pd.DataFrame(rows["loader_iters"],
                                        columns=["probe_id", "rank", "loader_id", "iter_index",
                                                 "first_batch_s"]),
              events=pd.DataFrame(rows["events"], columns=["probe_id", "rank", "name", "data"]),
              contexts=dict(tables.contexts), warnings=[*(warnings or []), *tables.warnings])
    run.__dict__["records"] = typed  # the records the table was made from
    return run

"""Figures of the HTML report: pure functions ``table -> plotly Figure``.

Every function takes the pandas tables of ``profiler.results.Run`` (or a slice of them) and
returns a ``plotly.graph_objects.Figure``; none reads files or the summary, none mutates its
input, each copes with an empty table (an empty figure with a note). Long timelines are
downsampled with min/max buckets (``downsample``) so spikes and stragglers survive.
Large arrays are float32 numpy arrays, which plotly serialises as compact base64.
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ddp_profile.profiler.store.probes import choice_mask, gate_mask, ok_mask
from ddp_profile.profiler.store.results import step_split

MAX_POINTS = 500
PART_COLOURS = {"data_wait_s": "#e4572e", "compute_s": "#2e86ab", "comm_s": "#f2a541",
                "other_s": "#a3a3a3"}
PART_NAMES = {"data_wait_s": "data wait", "compute_s": "compute", "comm_s": "exposed comm",
              "other_s": "other"}
KIND_COLOURS = {"baseline": "#7f7f7f", "recommended": "#2ca02c", "ceiling": "#9467bd",
                "sweep": "#2e86ab"}
RANK_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                "#7f7f7f", "#bcbd22", "#17becf"]


def _layout(title: str, height: int = 320, **extra) -> dict:
    layout = dict(template="none", title=dict(text=title, x=0, xanchor="left",
                                              font=dict(size=14)),
                  height=height, margin=dict(l=60, r=20, t=60, b=50),
                  font=dict(family="system-ui, -apple-system, Segoe UI, sans-serif", size=12),
                  legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
                  hovermode="closest")
    layout.update(extra)
    for axis in ("xaxis", "yaxis"):
        layout[axis] = {"automargin": True, **layout.get(axis, {})}
    return layout


def _rank_layout(title: str, unit: str) -> dict:
    """A timeline with one line per rank: the rank legend stands right of the plot."""
    return _layout(title, xaxis=dict(title=dict(text="time in probe (s)")),
                   yaxis=dict(title=dict(text=unit), rangemode="tozero"),
                   margin=dict(l=60, r=10, t=40, b=50),
                   legend=dict(orientation="v", x=1.01, y=1, xanchor="left", yanchor="top"))


def _figure(traces: list[dict], layout: dict) -> go.Figure:
    """A figure from plain trace/layout dicts, skipping plotly's per-property validation.

    Validation costs ~15 ms a figure and a 100-probe report has hundreds; the tests validate
    every figure once instead (``go.Figure(fig.to_dict())``).
    """
    spec = {"data": traces, "layout": layout}
    try:
        return go.Figure(spec, _validate=False)
    except (TypeError, ValueError):  # pragma: no cover - a plotly without the private switch
        return go.Figure(spec)


def _empty(title: str, note: str) -> go.Figure:
    return _figure([], _layout(title, height=160, xaxis=dict(visible=False),
                               yaxis=dict(visible=False),
                               annotations=[dict(text=note, showarrow=False, x=0.5, y=0.5,
                                                 xref="paper", yref="paper")]))


def downsample(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS
               ) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points: each of ``max_points // 2`` equal buckets keeps its
    minimum and maximum, in time order, so spikes (and a straggler's slow steps) survive.
    NaN points are dropped first."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    finite = ~np.isnan(y)
    if not finite.all():
        x, y = x[finite], y[finite]
    n = len(x)
    if n <= max_points:
        return x, y
    buckets = max(1, max_points // 2)
    bucket = np.arange(n) * buckets // n
    order = np.lexsort((y, bucket))              # by bucket, then by value
    starts = np.searchsorted(bucket[order], np.arange(buckets))
    ends = np.append(starts[1:], n) - 1
    keep = np.unique(np.concatenate([order[starts], order[ends]]))
    return x[keep], y[keep]


def probe_label(row: Mapping) -> str:
    """A short label for a probe's configuration: ``p003 w4 pin bs64 pf2``."""
    parts = [str(row.get("id"))]
    if pd.notna(row.get("num_workers")):
        parts.append(f"w{int(row['num_workers'])}")
    if row.get("pin_memory") is True:
        parts.append("pin")
    if pd.notna(row.get("batch_size")):
        parts.append(f"bs{int(row['batch_size'])}")
    if pd.notna(row.get("prefetch_factor")):
        parts.append(f"pf{int(row['prefetch_factor'])}")
    return " ".join(parts)


def throughput_by_config(probes: pd.DataFrame, highlight: Mapping[str, str]) -> go.Figure:
    """Horizontal bars of global samples/s per successful probe, best on top.

    ``highlight`` maps probe id to a role (baseline, recommended, ceiling) for its colour.
    """
    title = "Throughput per configuration (global samples/s)"
    ok = probes[ok_mask(probes) & probes["throughput"].notna()]
    if ok.empty:
        return _empty(title, "no probe finished successfully")
    ok = ok.sort_values("throughput")
    roles = [highlight.get(pid, "sweep") for pid in ok["id"]]
    labels = [probe_label(row) + (f" ({role})" if role != "sweep" else "")
              for row, role in zip(ok.to_dict("records"), roles)]
    bar = dict(type="bar", x=ok["throughput"].round(2).tolist(), y=labels, orientation="h",
               marker=dict(color=[KIND_COLOURS[r] for r in roles]),
               hovertemplate="%{y}<br>%{x:.1f} samples/s<extra></extra>")
    return _figure([bar], _layout(title, height=max(220, 80 + 18 * len(ok)),
                                  margin=dict(l=20, r=20, t=40, b=40)))


def _mean_parts(steps: pd.DataFrame, by: str) -> pd.DataFrame:
    """Mean ms per step of each part (``store.results.step_split``)."""
    return step_split(steps, by)[list(PART_NAMES)] * 1000.0


def _category_layout(title: str, barmode: str, unit: str) -> dict:
    """Bars over many probe labels: slanted labels, legend above the plot."""
    return _layout(title, height=400, barmode=barmode, margin=dict(l=60, r=20, t=60, b=120),
                   yaxis=dict(title=dict(text=unit)), xaxis=dict(tickangle=-45))


def _part_bars(names: list[str], parts: pd.DataFrame) -> list[dict]:
    """One stacked trace per part; exposed communication only where it was measured."""
    return [dict(type="bar", name=PART_NAMES[col], x=names, y=parts[col].round(3).tolist(),
                 marker=dict(color=PART_COLOURS[col]),
                 hovertemplate="%{x}<br>" + PART_NAMES[col] + ": %{y:.2f} ms<extra></extra>")
            for col in PART_NAMES if col != "comm_s" or bool((parts[col] > 0).any())]


def time_split_by_config(steps: pd.DataFrame, labels: Mapping[str, str]) -> go.Figure:
    """Stacked bars: mean data wait / compute / exposed comm / other per step (ms) for each
    probe."""
    title = "Where a step's time goes, per configuration (ms per step, mean over ranks)"
    if steps.empty or not steps["measured"].any():
        return _empty(title, "no measured steps")
    parts = _mean_parts(steps, "probe_id")
    order = [pid for pid in labels if pid in parts.index]
    parts = parts.loc[order]
    names = [labels[pid] for pid in parts.index]
    return _figure(_part_bars(names, parts), _category_layout(title, "stack", "ms per step"))


def time_split_by_rank(steps: pd.DataFrame, probe_id: str) -> go.Figure:
    """Stacked bars per rank of one probe: mean data wait / compute / exposed comm / other per
    step (ms)."""
    title = "Per rank: ms per step"
    probe_steps = steps[steps["probe_id"] == probe_id]
    if probe_steps.empty or not probe_steps["measured"].any():
        return _empty(title, "no measured steps in this probe")
    parts = _mean_parts(probe_steps, "rank")
    nodes = _node_of_rank(probe_steps)
    ranks = [rank_name(int(r), nodes) for r in parts.index]
    return _figure(_part_bars(ranks, parts), _layout(
        title, barmode="stack", yaxis=dict(title=dict(text="ms per step"))))


def _node_of_rank(frame: pd.DataFrame) -> dict[int, int]:
    """rank -> node, when the ranks span more than one node (else empty: no node labels)."""
    if "node" not in frame.columns or frame["node"].nunique() < 2:
        return {}
    return {int(r): int(n) for r, n in frame.groupby("rank")["node"].first().items()}


def rank_name(rank: int, nodes: Mapping[int, int]) -> str:
    """"rank 3", "node 1 · rank 3"; a process without a process group (recorded as rank -1)
    is "the process"."""
    if rank < 0:
        return "the process"
    return f"node {nodes[rank]} · rank {rank}" if rank in nodes else f"rank {rank}"


def _rank_lines(frame: pd.DataFrame, column: str, scale: float, max_points: int,
                unit: str) -> list[dict]:
    traces = []
    nodes = _node_of_rank(frame)
    for i, (rank, group) in enumerate(frame.groupby("rank", sort=True)):
        name = rank_name(int(rank), nodes)
        group = group.sort_values("t_s")
        x, y = downsample(group["t_s"].to_numpy(), group[column].to_numpy() * scale,
                          max_points)
        traces.append(dict(  # a series of one or two points would draw no visible line
            type="scatter", x=x.astype(np.float32), y=y.astype(np.float32),
            mode="lines" if len(x) > 2 else "lines+markers",
            name=name,
            line=dict(width=1.2, color=RANK_COLOURS[i % len(RANK_COLOURS)]),
            hovertemplate=f"{name}<br>t=%{{x:.2f}} s<br>%{{y:.1f}} {unit}<extra></extra>"))
    return traces


def step_timeline(steps: pd.DataFrame, probe_id: str, max_points: int = MAX_POINTS
                  ) -> go.Figure:
    """Step time (ms) against time, one line per rank; a straggler's line sits above."""
    title = "Step time per rank (ms)"
    frame = steps[(steps["probe_id"] == probe_id) & steps["measured"]]
    if frame.empty:
        return _empty(title, "no measured steps in this probe")
    return _figure(_rank_lines(frame, "step_s", 1000.0, max_points, "ms"),
                   _rank_layout(title, "ms"))


def sample_timeline(samples: pd.DataFrame, probe_id: str, source: str, column: str,
                    title: str, unit: str, scale: float = 1.0,
                    max_points: int = MAX_POINTS) -> go.Figure:
    """One telemetry metric (``samples`` of one source) against time, one line per rank."""
    if samples.empty or column not in samples.columns:
        return _empty(title, f"no {column} samples")
    frame = samples[(samples["probe_id"] == probe_id) & (samples["source"] == source)
                    & samples[column].notna()]
    if frame.empty:
        return _empty(title, f"no {column} samples in this probe")
    return _figure(_rank_lines(frame, column, scale, max_points, unit),
                   _rank_layout(title, unit))


def cpu_by_probe(samples: pd.DataFrame, labels: Mapping[str, str]) -> go.Figure:
    """Grouped bars: mean host CPU % and DataLoader-worker CPU % per probe (mean over ranks)."""
    title = "CPU utilisation per probe (mean %)"
    columns = [c for c in ("cpu_percent", "worker_cpu_percent") if c in samples.columns]
    if samples.empty or not columns:
        return _empty(title, "no host samples")
    host = samples[samples["source"] == "host"]
    means = host.groupby("probe_id")[columns].mean()
    order = [pid for pid in labels if pid in means.index]
    if not order:
        return _empty(title, "no host samples")
    means = means.loc[order]
    names = {"cpu_percent": "host CPU %", "worker_cpu_percent": "DataLoader workers CPU %"}
    colours = {"cpu_percent": "#2e86ab", "worker_cpu_percent": "#f18f01"}
    bars = [dict(type="bar", name=names[c], x=[labels[p] for p in order],
                 y=means[c].round(2).tolist(), marker=dict(color=colours[c])) for c in columns]
    return _figure(bars, _category_layout(title, "group", "%"))


def swept_values(probes: pd.DataFrame, column: str) -> list:
    """The distinct values of a setting among the probes that ran the script as the user
    would (``store.probes.GATE_KINDS``), sorted."""
    ok = probes[gate_mask(probes)]
    return sorted(ok[column].dropna().unique().tolist())


def workers_batch_heatmap(probes: pd.DataFrame) -> Optional[go.Figure]:
    """num_workers x batch size heatmap of the best throughput; None unless both were swept."""
    workers, batches = swept_values(probes, "num_workers"), swept_values(probes, "batch_size")
    if len(workers) < 2 or len(batches) < 2:
        return None
    ok = probes[gate_mask(probes)]
    grid = ok.pivot_table(index="batch_size", columns="num_workers", values="throughput",
                          aggfunc="max").reindex(index=batches, columns=workers)
    z = [[None if pd.isna(v) else round(float(v), 1) for v in row] for row in grid.to_numpy()]
    text = [["" if v is None else f"{v:,.1f}" for v in row] for row in z]  # unmeasured: blank
    heat = dict(
        type="heatmap", z=z, x=[str(int(w)) for w in workers], y=[str(int(b)) for b in batches],
        colorscale="Viridis", colorbar=dict(title=dict(text="samples/s")), text=text,
        texttemplate="%{text}", hoverongaps=False,
        hovertemplate="num_workers=%{x}<br>batch_size=%{y}<br>%{z:.1f} samples/s"
                      "<extra></extra>")
    return _figure([heat], _layout("Best throughput: num_workers × batch size (samples/s; "
                                   "blank: not measured)",
                                  height=max(260, 100 + 40 * len(batches)),
                                  xaxis=dict(title=dict(text="num_workers"), type="category"),
                                  yaxis=dict(title=dict(text="batch size"), type="category")))



def _level(x: list[int], value: float, name: str, color: str, dash: str, hover: str) -> dict:
    """A horizontal line across the worker counts ``x``: a rate the capacity chart compares."""
    return dict(type="scatter", mode="lines", x=[min(x), max(x)], y=[value] * 2, name=name,
                line=dict(color=color, dash=dash), hovertemplate=hover + "<extra></extra>")


def capacity_by_workers(capacity: Optional[Mapping], probes: pd.DataFrame) -> Optional[go.Figure]:
    """The input pipeline's modelled capacity and the loop's demand by worker count, with the
    probes' measured throughput on it; None without a capacity model (see ``decide.capacity``).
    """
    if not capacity or not capacity.get("curve"):
        return None
    curve = capacity["curve"]
    x = [int(p["num_workers"]) for p in curve]
    supply = [p.get("supply") for p in curve]
    traces = [
        dict(type="scatter", mode="lines+markers", x=x, y=supply, name="loading capacity",
             line=dict(color="#e4572e"),
             hovertemplate="%{x} workers: loaders deliver %{y:,.0f} samples/s<extra></extra>"),
        _level(x, capacity["demand"], "loop demand", "#2e86ab", "dash",
               "the loop consumes %{y:,.0f} samples/s")]
    if capacity.get("cpu_limit"):
        traces.append(_level(x, capacity["cpu_limit"], "CPU limit", "#a3a3a3", "dot",
                             "the CPUs make at most %{y:,.0f} samples/s"))
    if capacity.get("pin_limit"):
        traces.append(_level(x, capacity["pin_limit"], "pinning limit", "#7b2cbf", "dot",
                             "one pinning thread per rank keeps up with at most "
                             "%{y:,.0f} samples/s"))
    ok = probes[choice_mask(probes) & probes["throughput"].notna() & probes["num_workers"].notna()]
    if len(ok):
        traces.append(dict(
            type="scatter", mode="markers", x=ok["num_workers"].astype(int).tolist(),
            y=ok["throughput"].astype(float).round(1).tolist(), name="measured",
            text=ok["id"].tolist(), marker=dict(color="#2ca02c", size=9),
            hovertemplate="%{text}: %{x} workers, %{y:,.1f} samples/s<extra></extra>"))
    title = "Loading capacity vs the loop's demand (samples/s, all ranks)"
    runq = capacity.get("runq") or {}
    if runq.get("notable"):  # the producers queued for CPUs: the model's supply is optimistic
        where = f" with {runq['workers']} workers" if runq.get("workers") else ""
        title += (f"<br><sup>producers sat {1000 * runq['per_sample_s']:.2f} ms per sample "
                  f"runnable, waiting for a CPU{where}: the CPUs were busy</sup>")
    return _figure(traces, _layout(
        title, xaxis=dict(title=dict(text="num_workers per rank (modelled; dots measured)")),
        yaxis=dict(title=dict(text="samples/s"), rangemode="tozero")))

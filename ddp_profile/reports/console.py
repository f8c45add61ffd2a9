"""Console output: sweep progress (a rich bar on a terminal, one line per probe otherwise) and
the concise end-of-run summary."""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

from ddp_profile.profiler.settings import LoaderSettings, config_label
from ddp_profile.profiler.store.probes import (
    Kind,
    ProbeRecord,
    baseline_probe,
    counts_for_choice,
    records,
)

# Probes of an alternation: one that the script ended is no advice to run more epochs (a
# check of a short script runs each launch to its end on purpose, and is read as such)
ALTERNATED = (Kind.PAIRED, Kind.PERSISTENT)


def _fmt_tp(value: Optional[float]) -> str:
    return f"{value:,.1f} samples/s" if value else "-"


def loading_line(capacity: dict[str, Any]) -> str:
    """"X ms CPU + Y ms waiting per sample" of a capacity model (``Capacity.to_dict`` of
    ``decide.capacity``), with the time its producers sat runnable, waiting for a CPU, where
    that is notable."""
    text = (f"{1000 * capacity['cpu_per_sample_s']:.2f} ms CPU + "
            f"{1000 * capacity['wait_per_sample_s']:.2f} ms waiting")
    runq = capacity.get("runq") or {}
    if runq.get("notable"):
        text += f" + {1000 * runq['per_sample_s']:.2f} ms runnable (CPUs busy"
        text += f", {runq['workers']} workers)" if runq.get("workers") else ")"
    return text + " per sample"


class ConsoleProgress:
    """The sweep's progress callback: ``progress(event, data)``."""

    def __init__(self, quiet: bool = False, stream: Any = None):
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.count = 0
        self.total: Optional[int] = None
        self.best: Optional[ProbeRecord] = None
        self.started = time.monotonic()
        self._bar: Any = None
        self._task: Any = None

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        if self.quiet:
            return
        if event == "axes":  # adaptive: how many probes it needs is not known in advance
            self.total = len(data["grid"]) + 2 if data.get("counted", True) else None
            self._start_bar()
        elif event == "start" and data.get("windows"):
            self._describe(f"probes {self.count + 1}-{self.count + data['windows']}: one launch, "
                           f"from {config_label(data['config'].to_dict())}")
        elif event == "start":
            self._describe(f"probe {self.count + 1}: {data['kind']} "
                           f"{config_label(data['config'].to_dict())}")
        elif event == "note":
            self._note(data["text"])
        elif event == "loading":  # the capacity model, before the climb
            self._note(f"loading: {loading_line(data['capacity'])}; {data['predicted']} "
                       "worker(s) per rank predicted to meet the loop's demand")
        elif event in ("done", "reused"):
            self._finished(data["entry"], reused=event == "reused")

    def _start_bar(self) -> None:
        if not self.tty or self._bar is not None:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeRemainingColumn(), transient=True)
        self._bar.start()
        self._task = self._bar.add_task("probes", total=self.total, completed=self.count)

    def _describe(self, text: str) -> None:
        if self._bar is not None:
            best = f" | best {_fmt_tp(self.best.throughput)}" if self.best else ""
            self._bar.update(self._task, description=text + best)

    def _finished(self, entry: ProbeRecord, reused: bool) -> None:
        self.count += 1
        if counts_for_choice(entry) and entry.throughput and (
                self.best is None or entry.throughput > (self.best.throughput or 0.0)):
            self.best = entry
        result = _fmt_tp(entry.throughput) if entry.ok else f"{entry.status}: {entry.error}"
        wait_text = step_parts(entry) if entry.ok else ""
        options = {**({"threads": entry.threads} if entry.threads else {}),
                   **(entry.comm.options or {})}
        option_text = "".join(f" {k}={v}" for k, v in options.items())
        total = f"/{max(self.total, self.count)}" if self.total else ""
        short = "" if not entry.short else f" SHORT: {entry.short_reason}" \
            if entry.kind not in ALTERNATED else " (ran to the script's end)"
        ran = entry.config if entry.config != LoaderSettings() else entry.requested
        line = (f"[{self.count}{total}] {entry.id} {entry.kind} "
                f"{ran.label()}{option_text}: "
                f"{result}"
                f"{wait_text}{' (from the ledger)' if reused else ''}{short}")
        if self._bar is not None:
            self._bar.console.print(line, highlight=False, markup=False)
            if self.total is not None and self.count > self.total:
                self._bar.update(self._task, total=self.count)
            self._bar.update(self._task, completed=self.count)
        else:
            print(line, file=self.stream, flush=True)

    def _note(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text, highlight=False, markup=False)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


BOUNDS = {"cpu": "CPU-bound", "wait": "wait-bound", "mixed": "CPU and waiting mixed"}


def step_parts(entry: ProbeRecord) -> str:
    """", data wait 12%, exposed comm 31%": the measured parts of a probe's steps; on CUDA
    ", data wait 25% (GPU idle for it 0%)": what the wait cost the GPU."""
    wait, comm = entry.data_wait_fraction, entry.comm.exposed_fraction
    starved = entry.gpu.starved_fraction
    text = f", data wait {wait:.0%}" if wait is not None else ""
    if text and starved is not None:
        text += f" (GPU idle for it {starved:.0%})"
    loading = entry.loading
    read = loading.read_per_sample_bytes if loading is not None else None
    share = loading.storage_share if loading is not None else None
    if read and share is not None:
        text += f", {read / 1e6:.2f} MB read per sample, {share:.0%} from storage"
    return text + (f", exposed comm {comm:.0%}" if comm is not None else "")


def summary_lines(summary: dict[str, Any], out: str) -> list[str]:
    """The concise end-of-run text (plain lines; tested directly)."""
    # a probe recorded before its data wait was kept: read as one that waited none
    probes = records({"data_wait_fraction": 0, **line} for line in summary.get("probes", []))
    ok = [p for p in probes if p.ok]
    baseline_id = (summary.get("recommendation") or {}).get("baseline_probe_id")
    baseline = next((p for p in probes if p.id == baseline_id), None) if baseline_id \
        else baseline_probe(probes)  # the recommendation's, else the lookup it made
    lines = [f"ddp-profile: {summary.get('script')} on {summary.get('world_size') or '?'} rank(s), "
             f"device {summary.get('device')}; {len(ok)}/{len(probes)} probe(s) ok"]
    if not summary.get("gpu_available"):
        lines.append(f"GPU metrics unavailable: {summary.get('gpu_unavailable_reason')}")
    if baseline and baseline.ok:
        lines.append(f"baseline  {config_label(baseline.config.to_dict())}: "
                     f"{_fmt_tp(baseline.throughput)}{step_parts(baseline)}")
    recommendation = summary.get("recommendation") or {}
    if summary.get("recommended"):
        speedup = summary.get("expected_speedup")
        interval = summary.get("expected_speedup_interval")
        spread = f" [{interval[0]:.2f}-{interval[1]:.2f}]" if interval else ""
        basis = recommendation.get("speedup_basis") or ""
        label = config_label(summary["recommended"]) + (  # in the figure where measured so
            " persistent_workers" if recommendation.get("persistent_in_speedup") else "")
        lines.append(f"recommended {label}: {speedup:.2f}x{spread} vs baseline" if speedup
                     else f"recommended {label}")
        if speedup and basis:
            lines.append(f"  measured from {basis}")
    for item in recommendation.get("unsettled") or []:  # measured faster, not established
        lines.append(f"  not established: {config_label(item['config'])} measured "
                     f"{item['ratio']:.2f}x the script's settings ({item['probe']}): "
                     f"{item['why']}")
        lines.append(f"    to settle it: {item['settle']}")
    if summary.get("ceiling_throughput"):
        lines.append(f"compute-only ceiling: {_fmt_tp(summary['ceiling_throughput'])}")
    elif summary.get("ceiling_failed"):
        lines.append(f"compute-only ceiling: none ({summary['ceiling_failed']})")
    capacity = summary.get("capacity")
    if isinstance(capacity, dict) and capacity.get("bound"):
        kind = BOUNDS.get(capacity["bound"], capacity["bound"])
        lines.append(f"loading: {loading_line(capacity)} ({kind})")
    for finding in summary.get("findings", [])[:8]:
        lines.append(f"  [{finding['severity']}] {finding['rule']}: {finding['title']}")
    for probe in [p for p in probes if not p.ok][:5]:
        lines.append(f"  probe {probe.id} {probe.status}: {probe.error}")
    for probe in [p for p in probes if p.short and p.kind not in ALTERNATED][:5]:
        lines.append(f"  probe {probe.id} short ({probe.steps_measured} of "
                     f"{probe.steps_asked} steps): {probe.short_reason}")
    told = ("Not like for like", "persistent_workers=True on top")  # notes the figure needs
    lines.extend(f"  note: {note}" for note in recommendation.get("notes") or []
                 if " is short, " in note or note.startswith(told))
    if recommendation.get("snippet") and (summary.get("recommended") != summary.get("baseline")
                                          or recommendation.get("persistent_workers")):
        lines.append("  " + recommendation["snippet"])
    lines.append(f"run directory: {out}")
    return lines


def print_summary(summary: dict[str, Any], out: str, stream: Any = None) -> None:
    print("\n".join(summary_lines(summary, out)), file=stream or sys.stdout, flush=True)

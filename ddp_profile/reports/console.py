"""Console output: sweep progress (a rich bar on a terminal, one line per probe otherwise) and
the end-of-run summary: the verdict first in at most ~15 lines of at most 100 characters
(``reports.run_verdict``), the method's detail with ``--verbose``."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from typing import Any, Optional

from ddp_profile.profiler.settings import LoaderSettings, config_label
from ddp_profile.profiler.store.probes import (
    ProbeRecord,
    baseline_probe,
    counts_for_choice,
    records,
)
from ddp_profile.reports.run_verdict import ALTERNATED, Verdict, build_verdict


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


WIDTH = 100  # no console line wider


def _wrapped(text: str, indent: str = "  ", max_lines: Optional[int] = None) -> list[str]:
    """``text`` in lines of at most ``WIDTH`` characters, each indented by ``indent`` (the
    first included), cut with " …" after ``max_lines``."""
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent or "  ",
                         break_long_words=True, break_on_hyphens=False,
                         max_lines=max_lines, placeholder=" …") or [indent.rstrip()]


def _process_text(summary: dict[str, Any]) -> str:
    world = summary.get("world_size")
    return "1 process" if world == 1 else f"{world or '?'} ranks"


def verdict_lines(summary: dict[str, Any], verdict: Verdict) -> list[str]:
    """The verdict in a few lines: what to change and what it gains, how it was checked,
    the cause, what is not established."""
    lines = []
    if not summary.get("recommended"):
        lines.append("No recommendation: no probe finished, nothing was measured.")
    elif verdict.moves:
        gain = ""
        if verdict.speedup is not None:
            gain = f": {verdict.speedup:.2f}x as fast"
            if verdict.interval:
                gain += f" [{verdict.interval[0]:.2f}-{verdict.interval[1]:.2f}]"
        lines += _wrapped(f"Change {verdict.change_text('->')}{gain}", indent="")
        if verdict.snippet:
            lines += _wrapped(verdict.snippet, indent="  ", max_lines=2)
        lines += _wrapped(f"checked: {verdict.check}", max_lines=1)
    else:
        lines += _wrapped(f"Keep the script's settings ({config_label(summary['recommended'])}):"
                          f" {verdict.check}", indent="", max_lines=2)
    lines += _wrapped(f"Cause: {verdict.cause_title}" + (f" [{verdict.severity}]"
                                                         if verdict.severity else ""),
                      indent="", max_lines=1)
    if verdict.cause_text:
        lines += _wrapped(verdict.cause_text, max_lines=2)
    for item in verdict.not_established[:2]:
        lines += _wrapped(f"Not established: {item['text'].replace('×', 'x')}", indent="",
                          max_lines=1)
    if len(verdict.not_established) > 2:
        lines.append(f"  and {len(verdict.not_established) - 2} more not established")
    return lines


def summary_lines(summary: dict[str, Any], out: str, verbose: bool = False) -> list[str]:
    """The end-of-run text (plain lines; tested directly): by default a summary read in ten
    seconds, the verdict first, at most ``WIDTH`` characters a line; ``verbose`` adds the
    method's detail (also in summary.json)."""
    # a probe recorded before its data wait was kept: read as one that waited none
    probes = records({"data_wait_fraction": 0, **line} for line in summary.get("probes", []))
    ok = [p for p in probes if p.ok]
    verdict = build_verdict(summary, probes)
    script = os.path.basename(str(summary.get("script") or "the script"))
    lines = _wrapped(f"ddp-profile: {script}, {_process_text(summary)} on "
                     f"{summary.get('device')}; {len(ok)} of {len(probes)} probes ok",
                     indent="", max_lines=1)
    lines += verdict_lines(summary, verdict)
    findings = summary.get("findings") or []
    if findings:
        lines += _wrapped(f"Findings ({len(findings)}): " + ", ".join(
            f"{f['rule']} ({f['severity']})" for f in findings), indent="", max_lines=1)
    failed = [p for p in probes if not p.ok]
    if failed:
        lines += _wrapped("Failed probes: " + ", ".join(f"{p.id} {p.status}" for p in failed),
                          indent="", max_lines=1)
    for warning in verdict.warnings:
        lines += _wrapped(f"Warning: {warning}", indent="", max_lines=1)
    if not summary.get("gpu_available"):
        lines += _wrapped(f"GPU metrics unavailable: {summary.get('gpu_unavailable_reason')}",
                          indent="", max_lines=1)
    lines += _wrapped(f"Report: {os.path.join(out, 'report.html')}", indent="")
    if not verbose:
        lines.append("The method and every probe: --verbose, summary.json")
        return lines
    lines.append("Detail:")
    for line in detail_lines(summary, probes):
        lines += _wrapped(line.strip(), indent="  " + " " * (len(line) - len(line.lstrip())))
    lines += _wrapped(f"run directory: {out}", indent="")
    return lines


def detail_lines(summary: dict[str, Any], probes: list[ProbeRecord]) -> list[str]:
    """The method's detail, as long lines (``summary_lines`` wraps them): the baseline's
    measurement, what the speedup was measured from, the ceiling, the loading, each finding,
    failed and short probes, the notes and the commands that would settle an open gain."""
    baseline_id = (summary.get("recommendation") or {}).get("baseline_probe_id")
    baseline = next((p for p in probes if p.id == baseline_id), None) if baseline_id \
        else baseline_probe(probes)  # the recommendation's, else the lookup it made
    lines = []
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
    for finding in summary.get("findings", []):
        lines.append(f"  [{finding['severity']}] {finding['rule']}: {finding['title']}")
    for probe in [p for p in probes if not p.ok]:
        lines.append(f"  probe {probe.id} {probe.status}: {probe.error}")
    for probe in [p for p in probes if p.short and p.kind not in ALTERNATED]:
        lines.append(f"  probe {probe.id} short ({probe.steps_measured} of "
                     f"{probe.steps_asked} steps): {probe.short_reason}")
    lines.extend(f"  note: {note}" for note in recommendation.get("notes") or [])
    return lines


def print_summary(summary: dict[str, Any], out: str, stream: Any = None,
                  verbose: bool = False) -> None:
    print("\n".join(summary_lines(summary, out, verbose)), file=stream or sys.stdout,
          flush=True)

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
        self.launches = 0
        self.total: Optional[int] = None
        self.best: Optional[ProbeRecord] = None
        self.started = time.monotonic()
        self.budget_s: Optional[float] = None
        self.expected_s: Optional[float] = None  # the estimate of the whole run, from the start
        self.usual: Optional[int] = None  # the plan's usual launches
        self.high: Optional[int] = None  # ... and its most
        self._bar: Any = None
        self._task: Any = None

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        if self.quiet:
            return
        if event == "plan":
            self.budget_s = data.get("budget_s")
            self._note(plan_line(data["plan"], self.budget_s))
        elif event == "estimate":
            self._estimate(data)
        elif event == "budget":
            self._note(budget_line(data))
        elif event == "ladder":
            self._note(_note_text(data["text"]))
        elif event == "axes":  # adaptive: how many probes it needs is not known in advance
            self.total = len(data["grid"]) + 2 if data.get("counted", True) else None
            self._start_bar()
        elif event == "start" and data.get("windows"):
            self.launches += 1
            self._describe(f"launch {self.launches}: {data['windows']} windows from "
                           f"{config_label(data['config'].to_dict())}")
        elif event == "start":
            self.launches += 1
            self._describe(f"launch {self.launches}: {data['kind']} "
                           f"{config_label(data['config'].to_dict())}")
        elif event == "note":
            self._note(data["text"])
        elif event == "loading":  # the capacity model, before the climb
            self._note(f"loading: {loading_line(data['capacity'])}; {data['predicted']} "
                       "worker(s) per rank predicted to meet the loop's demand")
        elif event in ("done", "reused"):
            self._finished(data["entry"], reused=event == "reused")

    def _estimate(self, data: dict[str, Any]) -> None:
        """After the baseline: the plan's time from its launch, and the bar over that time."""
        launch_s = data.get("launch_s")
        if not launch_s:
            return
        usual = self.usual = sum(step.usual for step in data["plan"])
        high = self.high = sum(step.high for step in data["plan"])
        self.expected_s = time.monotonic() - self.started + (usual - 1) * launch_s
        if self.budget_s:
            self.expected_s = min(self.expected_s, self.budget_s)
        budget = f"; budget {_clock(self.budget_s)}" if self.budget_s else ""
        self._note(f"estimate: about {_clock(usual * launch_s)} ({usual} launches of about "
                   f"{launch_s:.0f} s, the baseline's); at most {_clock(high * launch_s)}{budget}")
        if self._bar is not None:
            self._bar.update(self._task, total=self.expected_s)

    def left_s(self) -> Optional[float]:
        """Seconds left: of the budget where there is one, else of the estimate."""
        end = self.budget_s or self.expected_s
        return end - (time.monotonic() - self.started) if end else None

    def _left_text(self) -> str:
        """What is left: of the budget where there is one, else the launches of the plan."""
        left = self.left_s()
        if self.budget_s and left is not None:
            return f" | {_clock(max(left, 0.0))} left of the budget"
        if self.usual is None:
            return ""
        which = f"launch {self.launches} of about {self.usual}" \
            if self.launches <= self.usual or self.high is None else \
            f"launch {self.launches}, past the usual {self.usual}, of at most {self.high}"
        return f" | {_clock(time.monotonic() - self.started)} in, {which}"

    def _start_bar(self) -> None:
        if not self.tty or self._bar is not None:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        progress = self

        class TimeLeft(TextColumn):  # rich's text column, its text the time left
            def render(self, task: Any) -> Any:
                from rich.text import Text

                left = progress.left_s()
                return Text(f"{_clock(max(left, 0.0))} left" if left is not None else "")

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                             TimeLeft(""), transient=True)
        self._bar.start()
        self._task = self._bar.add_task("launches", total=self.expected_s or self.budget_s,
                                        completed=time.monotonic() - self.started)

    def _describe(self, text: str) -> None:
        if self._bar is not None:
            best = f" | best {_fmt_tp(self.best.throughput)}" if self.best else ""
            self._bar.update(self._task, description=text + best,
                             completed=time.monotonic() - self.started)

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
        total = f"/{max(self.total, self.count)}" if self.total and not self.expected_s else ""
        short = "" if not entry.short else " (ran to the script's end)" \
            if entry.kind in ALTERNATED else \
            f"; short: {entry.steps_measured} of {entry.steps_asked} steps, the script ended first"
        ran = entry.config if entry.config != LoaderSettings() else entry.requested
        line = (f"[{self.count}{total}] {entry.id} {entry.kind} "
                f"{ran.label()}{option_text}: "
                f"{result}"
                f"{wait_text}{' (from the ledger)' if reused else ''}{short}")
        if self._bar is None:
            line += self._left_text()
        self._note(line)
        if self._bar is not None:
            self._bar.update(self._task, completed=time.monotonic() - self.started)

    def _note(self, text: str) -> None:
        """``text`` printed, each of its lines wider than ``WIDTH`` wrapped."""
        text = "\n".join(line if len(line) <= WIDTH else _note_text(line)
                         for line in text.split("\n"))
        if self._bar is not None:
            self._bar.console.print(text, highlight=False, markup=False)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _clock(seconds: float) -> str:
    """``1:05`` for 65 s; ``1:02:05`` past an hour."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _note_text(text: str) -> str:
    """A progress note in lines of at most ``WIDTH`` characters, the later ones indented."""
    return "\n".join(_wrapped(text, indent=""))


def plan_line(plan: list[Any], budget_s: Optional[float]) -> str:
    """The sweep's plan in launches, before the first probe."""
    usual, high = sum(step.usual for step in plan), sum(step.high for step in plan)
    steps = ", ".join(step.words() for step in plan if step.high)
    budget = f"; budget {_clock(budget_s)}" if budget_s else ""
    return _note_text(f"plan: about {usual} launches, at most {high}{budget}: {steps}")


def budget_line(stop: dict[str, Any]) -> str:
    """Where the budget stopped the sweep, and what it did not do."""
    return _note_text(f"budget spent: {stop['launch']} would take about {stop['estimate_s']:.0f} "
                    f"s, {stop['left_s']:.0f} s left; not done: {', '.join(stop['not_done'])}")


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


def _gain(speedup: Optional[float], interval: Optional[tuple[float, float]]) -> str:
    """``: <speedup>x as fast [<low>-<high>]``; "" where nothing was measured."""
    if speedup is None:
        return ""
    return f": {speedup:.2f}x as fast" + (f" [{interval[0]:.2f}-{interval[1]:.2f}]"
                                           if interval else "")


def verdict_lines(summary: dict[str, Any], verdict: Verdict) -> list[str]:
    """The verdict in a few lines: what to change and what it gains, how it was checked,
    the cause, what is not established."""
    lines = []
    threads = verdict.threads
    if not summary.get("recommended"):
        lines.append("No recommendation: no probe finished, nothing was measured.")
    elif verdict.moves:
        lines += _wrapped(f"Change {verdict.change_text('->')}"
                          f"{_gain(verdict.speedup, verdict.interval)}", indent="")
        if verdict.snippet:
            lines += _wrapped(verdict.snippet, indent="  ", max_lines=2)
        lines += _wrapped(f"checked: {verdict.check}", max_lines=1)
    if threads is not None:  # measured beside the loader's settings: after a loader change,
        # with the settings it was measured with; first where the loader's settings stay
        with_ = "" if threads.measured_with == "the script's settings" and not verdict.moves \
            else f" with {threads.measured_with}"
        lines += _wrapped(f"{'And set' if verdict.moves else 'Set'} {threads.text('->')}"
                          f"{_gain(threads.speedup, threads.interval)}{with_}", indent="")
        lines += _wrapped(f"checked: {threads.check}", max_lines=1)
    if summary.get("recommended") and not verdict.moves:
        kept = "the script's loader settings" if threads is not None else "the script's settings"
        lines += _wrapped(f"Keep {kept} ({config_label(summary['recommended'])}):"
                          f" {verdict.check}", indent="", max_lines=2)
    lines += _wrapped(f"Cause: {verdict.cause_title}" + (f" [{verdict.severity}]"
                                                         if verdict.severity else ""),
                      indent="", max_lines=1)
    if verdict.cause_text:
        lines += _wrapped(verdict.cause_text, max_lines=2)
    for index, item in enumerate(verdict.not_established[:2]):  # the first whole: what the
        # search read, then what its check read; the next in a line (the summary's ten seconds)
        lines += _wrapped(f"Not established: {item['text'].replace('×', 'x')}", indent="",
                          max_lines=1 if index else 2)
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
    budget = (summary.get("search") or {}).get("budget") or {}
    if budget.get("stopped"):  # the answer so far: what the budget left out, in one line
        lines += _wrapped(f"Budget {_clock(budget['budget_s'])} spent, --resume goes on; not "
                          f"done: {', '.join(budget['stopped']['not_done'])}", indent="",
                          max_lines=1)
    if not summary.get("gpu_available"):
        lines += _wrapped(f"GPU metrics unavailable: {summary.get('gpu_unavailable_reason')}",
                          indent="", max_lines=1)
    report = os.path.join(out, "report.html")
    written = os.path.isfile(report)  # never a report --no-report (or a failed render) left out
    if written:
        lines += _wrapped(f"Report: {report}", indent="")
    else:
        lines += _wrapped(f"Run directory: {out} (no report.html)", indent="")
    if not verbose:
        lines.append("The method and every probe: --verbose, summary.json")
        return lines
    lines.append("Detail:")
    for line in detail_lines(summary, probes):
        lines += _wrapped(line.strip(), indent="  " + " " * (len(line) - len(line.lstrip())))
    if written:
        lines += _wrapped(f"run directory: {out}", indent="")
    return lines


STOP_WORDS = {"decided": "its interval settled the answer",
              "futile": "no outcome of the launches left could have made B win",
              "unpromising": "the launches left, read as those before them, would not have "
                             "established B",
              "rounds": "every launch allowed ran",
              "failed": "a launch failed"}


def alternation_stop_line(ended: dict[str, Any]) -> str:
    """How an alternation in launches ended (summary.json's ``search.alternations``)."""
    why = STOP_WORDS.get(str(ended.get("stopped")), str(ended.get("stopped")))
    return (f"{ended.get('check', 'the check')} stopped after {ended.get('launches')} "
            f"launches ({ended.get('letters')}): {ended.get('stopped')}, {why}")


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
    search = summary.get("search") or {}
    budget = search.get("budget") or {}
    if budget.get("stopped"):
        lines.append(f"  budget {_clock(budget['budget_s'])} spent: the answer so far; not done: "
                     f"{', '.join(budget['stopped']['not_done'])} (--resume goes on)")
    elif budget.get("budget_s"):
        lines.append(f"  budget {_clock(budget['budget_s'])}: {_clock(budget['spent_s'])} used, "
                     "nothing left out")
    if (search.get("ladder_stop") or {}).get("text"):
        lines.append(f"  {search['ladder_stop']['text']}")
    for ended in search.get("alternations") or []:
        lines.append(f"  {alternation_stop_line(ended)}")
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

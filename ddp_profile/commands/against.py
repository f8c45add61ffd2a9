"""``ddp-profile gate --against REF``: the change and its reference, alternated in one job.

Both sides run the project's pinned configuration, a launch each, ``A B A B A`` (``A`` the
reference, ``B`` the working tree as it is), then one more ``B A`` at a time while the
verdict is open, up to ``max_launches``. Each launch is a probe of the tool's own measurer in
the side's run directory (``OUT/reference``, ``OUT/current``: a launch's steps, split and
telemetry stay there, as for ``ddp-profile run``), warmed up by time as the claim's launches
are. The verdict is ``decide.gate.judge``'s; the outputs are ``reports.gate_paired``'s, and
``OUT/gate.json`` holds the result whatever it is. A job replaces a previous job's output in
``OUT`` (``not_gate_output`` says what else would be lost, and the job refuses it).

A side that fails to start (or crashes, or hangs) ends the job with a one-line error naming it
(``ScriptFailed``), its launches kept; the reference's checkout is removed however it ends.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from ddp_profile.defaults import CONFIDENCE, MAX_REGRESSION
from ddp_profile.errors import ExitCode, ScriptFailed, UsageError
from ddp_profile.profiler.cache import CacheMode
from ddp_profile.profiler.decide import gate
from ddp_profile.profiler.decide.paired import CANDIDATE, REFERENCE, order
from ddp_profile.profiler.settings import (
    MIN_WARMUP_S,
    SETTING_KEYS,
    LoaderSettings,
    timed_warmup,
)
from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.store.results import read_probe_dir
from ddp_profile.profiler.store.rundir import RunDir
from ddp_profile.profiler.sweep.measure import MIN_TIMEOUT_S, TIMEOUT_FACTOR, LedgerMeasurer
from ddp_profile.profiler.sweep.state import Window

GROUP = "gate"
MEASURE_S = 20.0  # seconds each launch measures at least: a neighbour that comes and goes
# every second or two (the head-to-head's on/off load) moves a 4 s window by 8.5 % (SD), a
# 10 s window by 4.7 %, more than half the tolerance; what comes and goes within a window
# averages out as one over its length
MAX_STEPS_FACTOR = 50  # ... but no more than this many times the file's steps


@dataclass(frozen=True)
class PairedRequest:
    """What one paired gate job runs (the project file's settings, the command line's)."""

    against: str
    script: str
    script_args: tuple[str, ...]
    out: str
    config: LoaderSettings = LoaderSettings()  # the pinned configuration
    launcher: str = "torchrun"
    nproc_per_node: Optional[int] = None
    steps: int = 30
    warmup: int = 5
    timeout_s: Optional[float] = None
    cache: str = CacheMode.AS_IS
    max_launches: int = gate.DEFAULT_MAX_LAUNCHES
    measure_s: float = MEASURE_S  # each launch measures at least this long
    max_regression: float = MAX_REGRESSION
    confidence: float = CONFIDENCE


@dataclass(frozen=True)
class PairedResult:
    """Everything the job measured and decided, for the reports (no I/O there)."""

    against: str  # the reference as the reports name it
    current: str  # the current side's script
    config: LoaderSettings
    launches: tuple[gate.Launch, ...]
    environments: tuple[dict[str, Any], ...]  # per launch, in the same order
    verdict: gate.PairedVerdict
    notes: tuple[str, ...] = ()
    out: str = ""
    steps: int = 0
    max_launches: int = 0

    @property
    def status(self) -> str:
        return self.verdict.status


@dataclass
class _Side:
    name: str  # "reference" | "current"
    label: str
    measurer: LedgerMeasurer
    environments: list[dict[str, Any]] = field(default_factory=list)


def paired_request(project: Any, *, against: Optional[str] = None,
                   max_launches: Optional[int] = None, max_regression: Optional[float] = None,
                   out: Optional[str] = None, config: Optional[str] = None,
                   measure_s: Optional[float] = None) -> PairedRequest:
    """The job from the command line's options over the project file (``ProjectConfig``: its
    script, arguments and one configuration; ``--config`` over the file's axes)."""
    from ddp_profile.commands.baseline_gate import parse_config
    from ddp_profile.commands.project_config import (
        RUN_DEFAULTS,
        check_command_line,
        resolve,
        search_space,
    )

    if project is None or not project.get("script"):
        raise UsageError("gate --against needs a project file naming the script "
                         "(ddp-profile.toml or [tool.ddp-profile] in pyproject.toml)")
    given = resolve({"against": against, "max_launches": max_launches, "out": out,
                     "max_regression": max_regression, "measure_s": measure_s}, project,
                    {**RUN_DEFAULTS, "max_launches": gate.DEFAULT_MAX_LAUNCHES,
                     "max_regression": MAX_REGRESSION, "out": "ddp-profile-gate",
                     "measure_s": MEASURE_S})
    check_command_line(given, ("max_launches", "max_regression", "measure_s"))
    space = search_space(given).to_dict()
    if any(values and len(values) > 1 for values in space.values()):
        raise UsageError("gate --against runs one configuration: give one value per axis in "
                         "the project file (num_workers = [4]), or --config")
    pinned = {key: (space.get(key) or [None])[0] for key in SETTING_KEYS}
    pinned.update(parse_config(config) or {})
    return PairedRequest(
        against=given["against"], script=given["script"],
        script_args=tuple(given.get("args") or ()), out=given["out"],
        config=LoaderSettings(**pinned), launcher=given["launcher"],
        nproc_per_node=given.get("nproc_per_node"), steps=given["steps"],
        warmup=given["warmup"], timeout_s=given.get("timeout"), cache=given["cache"],
        max_launches=given["max_launches"], max_regression=given["max_regression"],
        measure_s=given["measure_s"])


def check_request(request: PairedRequest, outputs: tuple[Optional[str], ...] = ()) -> None:
    if request.max_launches < gate.MIN_LAUNCHES:
        raise UsageError(f"--max-launches: {request.max_launches} is below the "
                         f"{gate.MIN_LAUNCHES} of A B A B A")
    if not 0 <= request.max_regression < 1:
        raise UsageError(f"--max-regression must be in [0, 1), got {request.max_regression}")
    foreign = not_gate_output(request.out, outputs)
    if foreign:
        raise UsageError(f"--out {request.out} exists and is not empty, and is not a previous "
                         f"gate's output ({foreign}): remove it, or name another directory")


SIDES = ("reference", "current")
OWN_ENTRIES = (*SIDES, "gate.json")  # everything a paired gate job writes in its OUT


def not_gate_output(out: str, outputs: tuple[Optional[str], ...] = ()) -> Optional[str]:
    """Why ``out`` may not be replaced by this job (``None``: it is missing, empty, or holds
    nothing but a previous paired gate's output, which the job replaces, and the files this
    job's ``--junit``/``--markdown``/``--json`` name, which it overwrites)."""
    if not os.path.lexists(out):
        return None
    if not os.path.isdir(out):
        return "not a directory"
    written = {os.path.realpath(path) for path in outputs if path}
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if os.path.realpath(path) in written and os.path.isfile(path):
            continue
        if name not in OWN_ENTRIES or os.path.islink(path):
            return f"it holds {name}"
        if name == "gate.json":
            try:
                with open(path, encoding="utf-8") as handle:
                    document = json.load(handle)
            except (OSError, ValueError):
                document = None
            if not isinstance(document, dict) or document.get("mode") != "paired":
                return "its gate.json is not a paired gate's result"
            continue
        try:
            with open(os.path.join(path, "run.json"), encoding="utf-8") as handle:
                side = (json.load(handle).get("gate") or {}).get("side")
        except (OSError, ValueError, AttributeError):
            side = None
        if side != name:
            return f"its {name} is not a gate's launches"
    return None


def clear_previous(out: str, outputs: tuple[Optional[str], ...] = ()) -> None:
    """Remove a previous job's output from ``out`` (``check_request`` vouched for it), keeping
    the directory itself: a re-run in the same place needs no clean-up."""
    if not_gate_output(out, outputs) is not None or not os.path.isdir(out):
        return
    for name in OWN_ENTRIES:
        path = os.path.join(out, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)


def _side(name: str, label: str, script: str, request: PairedRequest,
          python_path: Optional[str]) -> _Side:
    from ddp_profile.commands.run import RunRequest, default_nproc, run_meta, spec_from_meta
    from ddp_profile.profiler.sweep.space import SearchSpace
    from ddp_profile.profiler.sweep.state import SweepOptions

    nproc = request.nproc_per_node or default_nproc()
    meta = run_meta(RunRequest(script=script, script_args=request.script_args, out=None,
                               launcher=request.launcher, nproc_per_node=nproc,
                               space=SearchSpace(), options=SweepOptions(
                                   steps=request.steps, warmup=request.warmup,
                                   timeout_s=request.timeout_s, single=True,
                                   cache=request.cache)), nproc)
    meta["gate"] = {"side": name, "against": label}
    run_dir = RunDir(os.path.join(request.out, name))
    run_dir.create(meta)
    spec = spec_from_meta(meta)
    if python_path:
        spec = replace(spec, extra_env=spec.extra_env + (("PYTHONPATH", python_path),))
    measurer = LedgerMeasurer(run_dir, spec, request.steps, request.warmup,
                              timeout_s=request.timeout_s,
                              cache=CacheMode.COLD if request.cache == CacheMode.COLD
                              else CacheMode.AS_IS)
    return _Side(name, label, measurer)


def _environment(side: _Side, entry: ProbeRecord) -> dict[str, Any]:
    """What ``decide.gate.environment_differences`` compares of one launch."""
    context = side.measurer.context(entry)
    found = {key: context.get(key) for key in gate.COMPARED}
    clocks, throttled = [], []
    for data in read_probe_dir(side.measurer.run_dir.probe_dir(entry.id)):
        for sample in data.samples:
            if sample.get("source") != "gpu":
                continue
            clock, reasons = sample.get("gpu_sm_clock_mhz"), sample.get("gpu_throttle_reasons")
            if isinstance(clock, (int, float)) and clock == clock:
                clocks.append(float(clock))
            if isinstance(reasons, (int, float)) and reasons == reasons:
                throttled.append(1.0 if int(reasons) & gate.THROTTLED else 0.0)
    if clocks:
        found["sm_clock_mhz"] = statistics.median(clocks)
    if throttled:
        found["throttled"] = sum(throttled) / len(throttled)
    return found


def _measure(side: _Side, index: int, request: PairedRequest, warmup: int, steps: int,
             progress: Callable[[str], None]) -> ProbeRecord:
    role = REFERENCE if side.name == "reference" else CANDIDATE
    entry = side.measurer.measure(Window(
        request.config, Kind.PAIRED, steps=steps, warmup=warmup,
        pair={"role": role, "index": index, "group": GROUP}))
    if not entry.measured:
        why = entry.reason or ("no measured step" if entry.ok else entry.status)
        raise ScriptFailed(f"the {side.name} side ({side.label}) failed in launch {entry.id}: "
                           f"{why}; its log is in "
                           f"{side.measurer.run_dir.probe_dir(entry.id)} (the launches so "
                           f"far are kept in {request.out})")
    side.environments.append(_environment(side, entry))
    progress(f"{side.name} {entry.id}: {entry.throughput:,.1f} samples/s")
    return entry


def _steps_per_s(entry: ProbeRecord) -> Optional[float]:
    medians = [r.step_time_median_s for r in entry.ranks if r.step_time_median_s]
    return 1.0 / max(medians) if medians else None


def launch_plan(request: PairedRequest, entry: ProbeRecord) -> tuple[int, int]:
    """(warm-up, measured steps) of every launch the verdict counts, sized by the first:
    a warm-up of about ``MIN_WARMUP_S`` (as the claim's launches), and at least
    ``measure_s`` seconds measured (within ``MAX_STEPS_FACTOR`` times the file's steps)."""
    rate = _steps_per_s(entry)
    steps = request.steps
    if rate and request.measure_s:
        steps = max(steps, min(MAX_STEPS_FACTOR * steps, math.ceil(request.measure_s * rate)))
    return timed_warmup(request.warmup, rate), steps


def measure_alternation(request: PairedRequest, reference_script: str, reference_label: str,
                        python_path: Optional[str], progress: Callable[[str], None],
                        fixed: Optional[int] = None) -> PairedResult:
    """Run the alternation (``fixed``: exactly that many launches, for the benchmarks) and
    judge it. The first launch sizes the rest (``launch_plan``); where it ran other steps, it
    is measured again with them and not counted."""
    sides = {REFERENCE: _side("reference", reference_label, reference_script, request,
                              python_path),
             CANDIDATE: _side("current", request.script, request.script, request, None)}
    roles = order(fixed // 2 if fixed else (gate.MIN_LAUNCHES - 1) // 2)
    launches: list[gate.Launch] = []
    environments: list[dict[str, Any]] = []
    plan: Optional[tuple[int, int]] = None
    verdict: Optional[gate.PairedVerdict] = None
    sized: list[str] = []
    notes: list[str] = []
    while len(launches) < len(roles):
        role = roles[len(launches)]
        side = sides[role]
        warmup, steps = plan or (request.warmup, request.steps)
        entry = _measure(side, len(launches), request, warmup, steps, progress)
        if plan is None:
            plan = launch_plan(request, entry)
            if not request.timeout_s:
                for each in sides.values():
                    each.measurer.timeout_s = max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * float(
                        entry.wall_s or 0.0) * plan[1] / request.steps)
            if plan != (warmup, steps):
                side.environments.pop()
                sized.append(f"the first launch ({entry.id}) sized the rest: {plan[0]} steps "
                             f"of warm-up (about {MIN_WARMUP_S:g} s), {plan[1]} measured "
                             f"(at least {request.measure_s:g} s); it is not counted")
                progress(sized[-1])
                continue
        launches.append(gate.Launch(role, len(launches), entry.throughput, entry.id))
        environments.append(side.environments[-1])
        if len(launches) < len(roles):
            continue
        differences, notes = gate.environment_differences(
            sides[REFERENCE].environments, sides[CANDIDATE].environments)
        verdict = gate.judge(launches, max_regression=request.max_regression,
                             confidence=request.confidence, differences=differences)
        if fixed is None and gate.more(verdict, len(launches), request.max_launches):
            roles += [CANDIDATE, REFERENCE]
            progress(f"current / reference {verdict.ratio:.3f} [{verdict.low:.3f}-"
                     f"{verdict.high:.3f}] straddles {1 - request.max_regression:g}: one more "
                     f"pair, B A")
    assert verdict is not None and plan is not None
    return PairedResult(against=reference_label, current=request.script, config=request.config,
                        launches=tuple(launches), environments=tuple(environments),
                        verdict=verdict, notes=tuple(sized + notes), out=request.out,
                        steps=plan[1], max_launches=request.max_launches)


def run_paired_gate(request: PairedRequest, *, junit: Optional[str] = None,
                    markdown: Optional[str] = None, json_out: Optional[str] = None,
                    quiet: bool = False) -> ExitCode:
    """The whole job: check out the reference, alternate, judge, write every output; the
    verdict's exit code."""
    from ddp_profile.commands.baseline_gate import EXIT, write_outputs, write_text
    from ddp_profile.commands.reference import checked_out
    from ddp_profile.commands.run import check_script
    from ddp_profile.reports import gate_paired

    check_request(request, (junit, markdown, json_out))
    check_script(request.script)

    def progress(text: str) -> None:
        if not quiet:
            print(f"ddp-profile gate: {text}", flush=True)

    with checked_out(request.against, request.script) as reference:
        check_script(reference.script)
        clear_previous(request.out, (junit, markdown, json_out))
        progress(f"{reference.label} (A) against the working tree (B), "
                 f"{request.config.label()}, {request.steps} steps a launch")
        result = measure_alternation(request, reference.script, reference.label,
                                     reference.python_path, progress)
    document = gate_paired.to_json(result)
    write_text(os.path.join(request.out, "gate.json"), json.dumps(document, indent=2) + "\n",
               "JSON result")
    gate_paired.render_console(result)
    write_outputs(gate_paired.markdown(result), gate_paired.junit_xml(result), document,
                  junit=junit, markdown=markdown, json_out=json_out)
    return EXIT[result.status]

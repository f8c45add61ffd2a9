"""The ``ddp-profile`` command line (typer). Thin: parse, call a command, map errors to exit codes.

``main`` is the only place where exceptions become exit codes (``errors.ExitCode``); every
error is one line on stderr. Set ``DDP_PROFILE_DEBUG=1`` for tracebacks of internal errors.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

import typer

from ddp_profile.profiler.cache import MODES as CACHE_MODES
from ddp_profile.profiler.store.probes import Status

try:  # typer >= 0.20 vendors its own copy of click
    from typer._click.exceptions import UsageError as ClickUsageError
except ImportError:  # pragma: no cover - older typer on click
    from click.exceptions import UsageError as ClickUsageError

from ddp_profile.defaults import ALPHA, MAX_REGRESSION
from ddp_profile.errors import DdpProfileError, ExitCode, UsageError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find out why the GPUs of a PyTorch DDP job sit idle, and which "
                       "DataLoader settings fix it.")


@app.command()
def run(
    script: Optional[str] = typer.Argument(None, help="The training script, unmodified "
                                           "(default: `script` in ddp-profile.toml or "
                                           "the tool.ddp-profile table of pyproject.toml)."),
    script_args: Optional[List[str]] = typer.Argument(None, help="Arguments for the script "
                                                      "(after --)."),
    nproc_per_node: Optional[int] = typer.Option(None, help="Ranks on this node (default: the "
                                                 "visible GPUs, or 2 without one)."),
    launcher: Optional[str] = typer.Option(None, help="torchrun | none (the script starts its "
                                           "own ranks; default torchrun)."),
    nnodes: Optional[str] = typer.Option(None, help="torchrun --nnodes (multi-node)."),
    node_rank: Optional[int] = typer.Option(None, help="torchrun --node-rank (multi-node)."),
    rdzv_endpoint: Optional[str] = typer.Option(None, help="torchrun --rdzv-endpoint "
                                                "HOST:PORT (multi-node)."),
    rdzv_backend: Optional[str] = typer.Option(None, help="torchrun --rdzv-backend "
                                               "(default c10d with --rdzv-endpoint)."),
    num_workers: Optional[str] = typer.Option(None, help="Comma list, e.g. 0,2,4,8."),
    pin_memory: Optional[str] = typer.Option(None, help="Comma list of true/false."),
    prefetch_factor: Optional[str] = typer.Option(None, help="Comma list, e.g. 2,4."),
    batch_size: Optional[str] = typer.Option(None, help="Comma list, e.g. 32,64,128."),
    steps: Optional[int] = typer.Option(None, help="Measured steps per probe (default 30)."),
    warmup: Optional[int] = typer.Option(None, help="Steps discarded at the start of each "
                                         "probe (default 5)."),
    timeout: Optional[float] = typer.Option(None, help="Seconds per probe (default: derived "
                                            "from the first probe)."),
    out: Optional[str] = typer.Option(None, help="Run directory."),
    resume: bool = typer.Option(False, help="Finish the interrupted run in --out (one a "
                                "budget stopped too: it goes on past it, for --budget again "
                                "where given)."),
    budget: Optional[str] = typer.Option(None, help="Time for the whole run, e.g. 90s, 2m, "
                                         "1h: no launch is started that the estimate says "
                                         "would end past it; the answer so far is reported "
                                         "with what was not done (default: none)."),
    search: Optional[str] = typer.Option(None, help="adaptive | grid (default adaptive)."),
    ceiling: Optional[bool] = typer.Option(None, "--ceiling/--no-ceiling", help="Measure the "
                                           "compute-only ceiling (default: yes)."),
    comm: Optional[bool] = typer.Option(None, "--comm/--no-comm", help="Where DDP's timers "
                                        "show exposed communication, measure the step without "
                                        "gradient synchronisation, larger per-rank batches and "
                                        "other DDP options (default: yes)."),
    repeat: Optional[int] = typer.Option(None, help="Launches of the recommended configuration "
                                         "in all (default 1); the gate uses 3 or more to "
                                         "tell a slow launch from a slowdown."),
    pairs: Optional[int] = typer.Option(None, help="Check the claim: the script's settings "
                                        "and the recommendation alternated, A B A B A B A "
                                        "in one launch; DDP options and persistent_workers "
                                        "too, each beside the settings without them (default "
                                        "3 pairs; 0: not checked, neither measured)."),
    cache: Optional[str] = typer.Option(None, help=f"{' | '.join(CACHE_MODES)}: the page "
                                        "cache's state in every probe (default auto: cold "
                                        "where one epoch's data exceeds half the memory "
                                        "available, warm where it fits)."),
    report: bool = typer.Option(True, help="Write report.html."),
    quiet: bool = typer.Option(False, help="No progress output."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="End with the method's "
                                 "detail (every figure, note and probe) after the verdict."),
) -> int:
    """Sweep DataLoader settings over short probes of SCRIPT and report what helps.

    Settings not given here are read from ddp-profile.toml, or the tool.ddp-profile table of
    pyproject.toml, in the current directory (see docs/ci.md); the command line wins.
    """
    _survive_hangup()
    from ddp_profile.commands.project_config import search_space
    from ddp_profile.commands.run import RunRequest, execute, start_run
    from ddp_profile.profiler.sweep.state import SweepOptions

    given = _merge_run_settings(dict(
        script=script, args=script_args or None, nproc_per_node=nproc_per_node,
        launcher=launcher, num_workers=num_workers, pin_memory=pin_memory,
        prefetch_factor=prefetch_factor, batch_size=batch_size, steps=steps, warmup=warmup,
        timeout=timeout, out=out, search=search, ceiling=ceiling, comm=comm, repeat=repeat,
        pairs=pairs, cache=cache, budget=budget),
        resume=resume,
        quiet=quiet)
    out = given["out"]
    budget_s = run_budget(given["budget"])
    if resume:
        if given["script"] is not None:
            _check_resume_script(out, given["script"])
    else:
        space = search_space(given)
        single = all(v is None or len(v) == 1 for v in (space.num_workers, space.pin_memory,
                                                          space.prefetch_factor, space.batch_size))
        options = SweepOptions(search=given["search"], steps=given["steps"],
                               warmup=given["warmup"], timeout_s=given["timeout"],
                               ceiling=given["ceiling"], comm=given["comm"],
                               repeat=given["repeat"], pairs=given["pairs"],
                               cache=given["cache"], budget_s=budget_s,
                               single=single and any(
                                   v is not None for v in space.to_dict().values()))
        out = start_run(RunRequest(script=given["script"],
                                   script_args=tuple(given["args"] or ()), out=out,
                                   launcher=given["launcher"],
                                   nproc_per_node=given["nproc_per_node"], space=space,
                                   options=options, torchrun_args=_torchrun_args(
                                       nnodes, node_rank, rdzv_endpoint, rdzv_backend)))
    summary = execute(out, report=report, quiet=quiet, verbose=verbose,
                      **({"budget_s": budget_s} if resume else {}))
    return _exit_for(summary)


def run_budget(value: Optional[object]) -> Optional[float]:
    """``--budget`` (or the file's ``budget``) in seconds; None where not given."""
    from ddp_profile.commands.project_config import duration

    if value is None:
        return None
    try:
        return duration("budget", value)
    except ValueError as exc:
        raise UsageError(f"--{exc}") from None


def _merge_run_settings(cli: dict, *, resume: bool, quiet: bool) -> dict:
    """Command line, then the project file, then the defaults; checked, one-line errors."""
    from ddp_profile.commands.project_config import check_command_line, find_project_config, resolve

    project = find_project_config()
    if project is not None and cli["script"] is not None and cli["script"].startswith("-") \
            and project.get("script"):
        # `ddp-profile run -- --epochs 2`: arguments for the file's script, not a script
        cli["args"] = [cli["script"], *(cli["args"] or [])]
        cli["script"] = None
    given = resolve(cli, project)
    if project is not None and not quiet:
        print(f"ddp-profile: settings from {project.path}")
    check_command_line(given, ("launcher", "search", "steps", "warmup", "timeout", "repeat",
                               "pairs", "cache", "nproc_per_node"))
    if resume and not given["out"]:
        raise UsageError("--resume needs --out RUN_DIR")
    if not resume and given["script"] is None:
        raise UsageError("no SCRIPT given, and no ddp-profile.toml or [tool.ddp-profile] in "
                         "pyproject.toml in this directory names one")
    return given


def _torchrun_args(nnodes: Optional[str], node_rank: Optional[int],
                   rdzv_endpoint: Optional[str], rdzv_backend: Optional[str]) -> tuple[str, ...]:
    """Multi-node rendezvous options, passed through to torchrun for every probe."""
    args: list[str] = []
    if nnodes:
        args.append(f"--nnodes={nnodes}")
    if node_rank is not None:
        args.append(f"--node-rank={node_rank}")
    if rdzv_endpoint:
        args += [f"--rdzv-endpoint={rdzv_endpoint}",
                 f"--rdzv-backend={rdzv_backend or 'c10d'}"]
    elif rdzv_backend:
        raise UsageError("--rdzv-backend needs --rdzv-endpoint")
    if args and not rdzv_endpoint:
        raise UsageError("--nnodes/--node-rank need --rdzv-endpoint HOST:PORT")
    return tuple(args)


def _survive_hangup() -> None:
    """A closed terminal (SIGHUP) must not stop a sweep or its report; Ctrl-C still does."""
    from ddp_profile.profiler.launch.ranks import ignore_hangup

    ignore_hangup()


def _check_resume_script(out: str, script: str) -> None:
    from ddp_profile.profiler.store.rundir import RunDir

    meta = RunDir(out).read_meta()
    if os.path.abspath(script) != meta.get("script"):
        raise UsageError(f"--resume: {out} profiles {meta.get('script')}, not {script}")


def _exit_for(summary: dict) -> int:
    if summary.get("follower"):
        return ExitCode.OK
    statuses = [p.get("status") for p in summary.get("probes", [])]
    return ExitCode.OK if Status.OK in statuses else ExitCode.SCRIPT_FAILED


@app.command()
def demo(
    out: Optional[str] = typer.Option(None, help="Run directory."),
    steps: int = typer.Option(20, help="Measured steps per probe."),
    quiet: bool = typer.Option(False, help="No progress output."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="End with the method's "
                                 "detail after the verdict."),
) -> int:
    """Profile the built-in workload (an IO-bound DDP script), end to end; no GPU needed.

    On a machine with GPUs it trains there, one rank per GPU."""
    _survive_hangup()
    from ddp_profile.commands.run import RunRequest, execute, start_run
    from ddp_profile.examples import DEMO_SCRIPT
    from ddp_profile.profiler.sweep.space import SearchSpace
    from ddp_profile.profiler.sweep.state import SweepOptions

    out = start_run(RunRequest(
        script=DEMO_SCRIPT, script_args=("--load-ms", "2", "--batch-size", "16"), out=out,
        launcher="torchrun", nproc_per_node=None, space=SearchSpace(),
        options=SweepOptions(steps=steps, warmup=5)))
    summary = execute(out, quiet=quiet, verbose=verbose)
    return _exit_for(summary)


@app.command("report")
def report_cmd(
    run_dir: str = typer.Argument(..., help="A run directory."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="HTML file (default: "
                                         "RUN_DIR/report.html)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print the run's summary "
                                 "too: the verdict, then the method's detail."),
) -> int:
    """Re-render the HTML report from stored results; runs nothing."""
    from ddp_profile.commands.run import write_report

    path = write_report(run_dir, output or os.path.join(run_dir, "report.html"), verbose)
    print(path)
    return ExitCode.OK



@app.command()
def gate(
    baseline: Optional[str] = typer.Argument(None, help="Baseline: a run directory or a "
                                             "baseline.json (default: `baseline` in the "
                                             "project file)."),
    current: Optional[str] = typer.Argument(None, help="Current: a run directory or a "
                                            "baseline.json (default: `out` in the project "
                                            "file)."),
    config: Optional[str] = typer.Option(None, help="Compare this configuration, e.g. "
                                         "num_workers=4,pin_memory=true (default: recommended)."),
    max_regression: Optional[float] = typer.Option(None, help="Tolerated slowdown (default "
                                                   f"{MAX_REGRESSION:g} = "
                                                   f"{MAX_REGRESSION:.0%})."),
    alpha: float = typer.Option(ALPHA, help="Significance level of the one-sided test."),
    force: bool = typer.Option(False, help="Compare even across hardware, world size or torch "
                               "version."),
    junit: Optional[str] = typer.Option(None, help="Write JUnit XML here."),
    markdown: Optional[str] = typer.Option(None, help="Write Markdown here (also "
                                           "$GITHUB_STEP_SUMMARY when set)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the verdict as JSON."),
    against: Optional[str] = typer.Option(None, help="Paired: run the project file's script "
                                          "and pinned configuration at this git revision "
                                          "(or this script) and in the working tree, "
                                          "alternated in launches (`against` in the project "
                                          "file)."),
    max_launches: Optional[int] = typer.Option(None, help="Paired: launches in all at most "
                                               "(default 19: A B ... A)."),
    measure_s: Optional[float] = typer.Option(None, help="Paired: seconds each launch "
                                              "measures at least (default 20; `steps` at "
                                              "least)."),
    out: Optional[str] = typer.Option(None, help="Paired: the job's directory (default: `out` "
                                      "in the project file, else ddp-profile-gate)."),
    quiet: bool = typer.Option(False, help="Paired: no progress output."),
) -> int:
    """CI regression gate: exit 0 pass, 1 regression, 9 inconclusive, 10 incomparable.

    With --against REF (or `against` in the project file, when no BASELINE is given), the
    change and its reference are measured in one job, alternated (docs/ci.md)."""
    from ddp_profile.commands.baseline_gate import run_gate
    from ddp_profile.commands.project_config import find_project_config, resolve

    project = find_project_config()
    if against is not None or (baseline is None and project is not None
                               and project.get("against")):
        from ddp_profile.commands.against import paired_request, run_paired_gate

        request = paired_request(project, against=against, max_launches=max_launches,
                                 max_regression=max_regression, out=out, config=config,
                                 measure_s=measure_s)
        return run_paired_gate(request, junit=junit, markdown=markdown, json_out=json_out,
                               quiet=quiet)
    given = resolve({"baseline": baseline, "out": current, "max_regression": max_regression},
                    project, {"max_regression": MAX_REGRESSION})
    baseline, current, max_regression = given["baseline"], given["out"], given["max_regression"]
    if baseline is None or current is None:
        raise UsageError("gate needs BASELINE and CURRENT (or `baseline` and `out` in "
                         "ddp-profile.toml or the tool.ddp-profile table of pyproject.toml)")
    return run_gate(baseline, current, config=config, max_regression=max_regression,
                    alpha=alpha, force=force, junit=junit, markdown=markdown, json_out=json_out)


@app.command("baseline")
def baseline_cmd(
    run_dir: str = typer.Argument(..., help="A run directory."),
    output: str = typer.Option("baseline.json", "-o", "--output", help="Baseline file to write."),
    config: Optional[str] = typer.Option(None, help="Configuration to keep (default: "
                                         "recommended)."),
) -> int:
    """Export a small baseline file (JSON, meant to be committed) from a run directory."""
    from ddp_profile.commands.baseline_gate import run_baseline_export

    run_baseline_export(run_dir, output, config=config)
    print(output)
    return 0


def main(argv: Optional[List[str]] = None) -> None:
    """Entry point of the console script; the one place errors become exit codes."""
    code = _dispatch(argv)
    sys.exit(int(code))


def _dispatch(argv: Optional[List[str]]) -> int:
    try:
        result = app(args=argv, prog_name="ddp-profile", standalone_mode=False)
        return int(result) if isinstance(result, int) else ExitCode.OK
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        _error("interrupted; finished probes are kept: continue with --resume --out RUN_DIR")
        return ExitCode.INTERRUPTED
    except ClickUsageError as exc:
        _error(exc.format_message().replace("\n", " "))
        return ExitCode.USAGE
    except DdpProfileError as exc:
        _error(str(exc).replace("\n", " "))
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001
        if os.environ.get("DDP_PROFILE_DEBUG"):
            raise
        _error(f"internal error: {type(exc).__name__}: {exc} (DDP_PROFILE_DEBUG=1 for details)")
        return ExitCode.INTERNAL


def _error(message: str) -> None:
    print(f"ddp-profile: error: {message}", file=sys.stderr)


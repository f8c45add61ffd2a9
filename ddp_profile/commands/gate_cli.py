"""``ddp-profile gate`` and ``ddp-profile baseline``: registered on the main typer app."""

from __future__ import annotations

from typing import Optional

import typer

from ddp_profile.cli import app
from ddp_profile.errors import UsageError


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
    max_regression: Optional[float] = typer.Option(None, help="Tolerated slowdown (0.05 = "
                                                   "5 %, the default)."),
    alpha: float = typer.Option(0.002, help="Significance level of the one-sided test."),
    force: bool = typer.Option(False, help="Compare even across hardware, world size or torch "
                               "version."),
    junit: Optional[str] = typer.Option(None, help="Write JUnit XML here."),
    markdown: Optional[str] = typer.Option(None, help="Write Markdown here (also "
                                           "$GITHUB_STEP_SUMMARY when set)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the verdict as JSON."),
) -> int:
    """CI regression gate: exit 0 pass, 1 regression, 9 inconclusive, 10 incomparable."""
    from ddp_profile.commands.gate import run_gate
    from ddp_profile.profiler.project_config import find_project_config, resolve

    given = resolve({"baseline": baseline, "out": current, "max_regression": max_regression},
                    find_project_config(), {"max_regression": 0.05})
    baseline, current, max_regression = given["baseline"], given["out"], given["max_regression"]
    if baseline is None or current is None:
        raise UsageError("gate needs BASELINE and CURRENT (or `baseline` and `out` in "
                         "ddp-profile.toml or the tool.ddp-profile table of pyproject.toml)")
    if not 0 <= max_regression < 1 or not 0 < alpha < 1:
        raise UsageError("--max-regression must be in [0, 1) and --alpha in (0, 1)")
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
    from ddp_profile.commands.gate import run_baseline_export

    run_baseline_export(run_dir, output, config=config)
    print(output)
    return 0

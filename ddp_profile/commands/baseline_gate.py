"""``ddp-profile gate`` and ``ddp-profile baseline``, free of typer.

Both raise ``DdpProfileError`` subclasses; the CLI turns them into exit codes. ``run_gate``
itself returns the verdict's exit code (OK, REGRESSION or INCONCLUSIVE) after writing every
requested output, so CI gets its JUnit and Markdown even when the gate fails.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from typing import Any, Mapping, Optional, Union

from rich.console import Console

from ddp_profile.defaults import ALPHA, MAX_REGRESSION
from ddp_profile.errors import ExitCode, Incomparable, UsageError
from ddp_profile.profiler.settings import SETTING_KEYS, config_label, parse_bool
from ddp_profile.profiler.store.atomic import write_text_atomic
from ddp_profile.profiler.store.baseline import (
    COMPARED_KEYS,
    GateSide,
    environment_differences,
    export_baseline,
    load_side,
)
from ddp_profile.profiler.store.results import load_run
from ddp_profile.reports import ci
from ddp_profile.rules.gate.verdict import (
    INCONCLUSIVE,
    PASS,
    REGRESSION,
    Comparison,
    GateResult,
    compare,
    compare_launches,
)

ConfigArg = Union[None, str, Mapping[str, Any]]
EXIT = {PASS: ExitCode.OK, REGRESSION: ExitCode.REGRESSION,
         INCONCLUSIVE: ExitCode.INCONCLUSIVE}
_SHORT_KEYS = {"w": "num_workers", "workers": "num_workers", "pin": "pin_memory",
               "pf": "prefetch_factor", "bs": "batch_size"}


def parse_config(config: ConfigArg) -> Optional[dict[str, Any]]:
    """``"num_workers=4,pin_memory=true"`` (or ``"w=4 pin=true pf=2 bs=64"``) -> dict."""
    if config is None or isinstance(config, Mapping):
        return dict(config) if config is not None else None
    parsed: dict[str, Any] = {}
    for item in config.replace(",", " ").split():
        key, sep, value = item.partition("=")
        key = _SHORT_KEYS.get(key.strip(), key.strip())
        if not sep or key not in SETTING_KEYS:
            raise UsageError(f"--config: expected KEY=VALUE with KEY in {', '.join(SETTING_KEYS)}"
                             f", got {item!r}")
        value = value.strip()
        try:
            if value.lower() in ("none", "null"):
                parsed[key] = None
            elif key == "pin_memory":
                parsed[key] = parse_bool(value)
            else:
                parsed[key] = int(value)
        except ValueError:
            raise UsageError(f"--config: bad value for {key}: {value!r}") from None
    if not parsed:
        raise UsageError("--config: no settings given")
    return parsed


def _check_comparable(baseline: GateSide, current: GateSide, force: bool) -> list[str]:
    """Raise ``Incomparable`` on environment differences unless ``force``; return warnings."""
    differences = environment_differences(baseline.environment, current.environment)
    if differences and not force:
        raise Incomparable("baseline and current ran on different environments ("
                           + "; ".join(differences) + "); pass --force to compare anyway")
    warnings = [f"compared despite a different {d} (--force)" for d in differences]
    for key in COMPARED_KEYS:
        known = [side.environment.get(key) is not None for side in (baseline, current)]
        if any(known) and not all(known):
            warnings.append(f"{key} is unknown on one side and was not compared")
    return warnings


def build_result(baseline: GateSide, current: GateSide, *, max_regression: float = MAX_REGRESSION,
                 alpha: float = ALPHA, force: bool = False) -> GateResult:
    """Compare two loaded sides of the same configuration (no output written)."""
    warnings = _check_comparable(baseline, current, force)
    warnings += [f"baseline: {w}" for w in baseline.warnings]
    warnings += [f"current: {w}" for w in current.warnings]
    verdict = compare_launches(baseline.launches or [baseline.samples],
                               current.launches or [current.samples],
                               max_regression=max_regression, alpha=alpha)
    warnings += [w for w in (ci.detectability_warning(verdict), ci.launch_warning(verdict)) if w]
    comparison = Comparison(config=dict(baseline.config), label=config_label(baseline.config),
                            baseline_probe_id=baseline.probe_id,
                            current_probe_id=current.probe_id,
                            baseline_median=_median(baseline.samples),
                            current_median=_median(current.samples), verdict=verdict)
    return GateResult(baseline=baseline.describe(), current=current.describe(),
                      comparison=comparison, max_regression=max_regression, alpha=alpha,
                      warnings=tuple(warnings))


def _median(values: list[float]) -> float:
    """The median of the samples that are numbers (NaN when none is)."""
    finite = [v for v in values if v == v]
    return statistics.median(finite) if finite else math.nan


def write_text(path: str, text: str, what: str) -> None:
    """Write atomically (temporary file + rename); ``-`` means standard output."""
    if path == "-":
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    try:
        write_text_atomic(path, text)
    except OSError as exc:
        raise UsageError(f"cannot write the {what} to {path}: {exc.strerror or exc}") from None


def run_gate(baseline_path: str, current_path: str, *, config: ConfigArg = None,
             max_regression: float = MAX_REGRESSION, alpha: float = ALPHA, force: bool = False,
             junit: Optional[str] = None, markdown: Optional[str] = None,
             json_out: Optional[str] = None, console: Optional[Console] = None) -> ExitCode:
    """Compare CURRENT against BASELINE for one configuration; write outputs; return the code.

    The configuration is ``config`` if given, else the baseline side's (its recommended one),
    looked up on the current side too. Raises ``BadRunDir``, ``Incomparable`` (also when a
    side lacks the configuration) or ``UsageError``.
    """
    if not 0 <= max_regression < 1:
        raise UsageError(f"--max-regression must be in [0, 1), got {max_regression}")
    if not 0 < alpha < 1:
        raise UsageError(f"--alpha must be in (0, 1), got {alpha}")
    wanted = parse_config(config)
    baseline = load_side(baseline_path, wanted)
    current = load_side(current_path, wanted if wanted is not None else baseline.config)
    result = build_result(baseline, current, max_regression=max_regression, alpha=alpha,
                          force=force)
    ci.render_console(result, console)
    write_outputs(ci.markdown(result), ci.junit_xml(result), ci.to_json(result),
                  junit=junit, markdown=markdown, json_out=json_out)
    return EXIT[result.status]


def write_outputs(text: str, junit_text: str, document: Mapping[str, Any], *,
                  junit: Optional[str], markdown: Optional[str], json_out: Optional[str]) -> None:
    """Every gate's files: JUnit, Markdown and JSON where asked, and the Markdown appended to
    ``$GITHUB_STEP_SUMMARY``, whatever the verdict."""
    if junit:
        write_text(junit, junit_text, "JUnit XML")
    if markdown:
        write_text(markdown, text, "Markdown summary")
    if json_out:
        write_text(json_out, json.dumps(document, indent=2) + "\n", "JSON result")
    ci.write_github_summary(text)


def baseline_warnings(samples: list[float], max_regression: float = MAX_REGRESSION) -> list[str]:
    """What a baseline's own samples say about the gate it can support, as warning lines.

    The baseline compared with itself has the interval width a current run with as many steps
    and the same spread would get, so its ``min_detectable`` and ``steps_needed`` are what such
    a gate could see, before any current run exists.
    """
    return ci.baseline_warnings(compare(samples, samples, max_regression=max_regression))


def run_baseline_export(run_dir: str, out_path: str, config: ConfigArg = None,
                        max_regression: float = MAX_REGRESSION) -> list[str]:
    """Write the baseline file for one configuration of ``run_dir`` (``-`` = stdout).

    Warnings about too few or too noisy samples (:func:`baseline_warnings`) go to stderr and
    are returned.
    """
    data = export_baseline(load_run(run_dir), parse_config(config))
    write_text(out_path, json.dumps(data, indent=1) + "\n", "baseline")
    warnings = baseline_warnings(data["samples"], max_regression)
    for warning in warnings:
        sys.stderr.write(f"warning: {warning}\n")
    return warnings

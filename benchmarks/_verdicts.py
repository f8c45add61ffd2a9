"""What each tool's verdicts mean, and the scores of ``benchmarks/peers.py`` (pure functions).

Every tool speaks its own vocabulary: ddp-profile's finding rules (and the recommendation's
"compute-bound" note), traceml-ai's ``*_BOUND`` / ``*_STRAGGLER`` kinds, loadtune's narrative,
fournex's bottleneck labels, datapath-doctor's rule ids and correlated diagnoses.
``VOCABULARY`` maps each verdict to one of the ``CAUSES`` below (or to ``None``: a verdict
that names no cause, e.g. "NORMAL").

A workload has one known cause; what a tool said about it scores

* ``right``: it named the known cause and nothing that contradicts it;
* ``partial``: it named only a true but generic description (``CONSISTENT``): a loading
  problem without telling waiting from CPU work on a loading workload, or "compute-bound" on
  a workload whose loop does not wait for data (threads, a straggler, unsharded data, an
  exposed all-reduce);
* ``wrong``: it named any other cause (with or without the right one);
* ``nothing``: it named no cause;
* ``n/a``: the tool does not apply (e.g. loadtune has one process: no straggler, no sharding).
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Optional

CAUSES = ("loading_wait", "loading_cpu", "loading", "compute", "threads", "straggler",
          "unsharded", "no_ddp", "comm", "other")
# known cause -> the generic descriptions that are true of such a workload without naming it
CONSISTENT = {"loading_wait": ("loading",), "loading_cpu": ("loading",),
              "threads": ("compute",), "straggler": ("compute",), "unsharded": ("compute",),
              "no_ddp": ("compute",), "comm": ("compute",)}

# tool -> verdict -> cause (None: the verdict names no cause)
VOCABULARY: dict[str, dict[str, Optional[str]]] = {
    "ddp_profile": {
        "io-bound-loading": "loading_wait", "cpu-bound-preprocessing": "loading_cpu",
        "data-loader-bound": "loading", "persistent-workers": "loading",
        "worker-oversubscription": "threads", "thread-oversubscription": "threads",
        "straggler": "straggler", "missing-distributed-sampler": "unsharded",
        "no-ddp": "no_ddp", "note:compute-bound": "compute",
        "frequent-io": "other", "pin-memory": "other", "batch-size-headroom": "other",
        "low-gpu-utilization": "other", "missing-set-epoch": "other",
        "data-parallel": "other", "backend-mismatch": "other",
        "find-unused-parameters": None, "exposed-communication": "comm",
        "allreduce-per-micro-batch": "comm", "per-step-collectives": "comm",
        "sync-batchnorm": "comm", "host-sync-per-step": "other",
    },
    "traceml": {  # its diagnosis kinds; the observations (CPU, memory, residual) name none
        "INPUT_BOUND": "loading", "INPUT_STRAGGLER": "straggler",
        "COMPUTE_BOUND": "compute", "COMPUTE_STRAGGLER": "straggler",
        "STRAGGLER": "straggler", "IMBALANCE": "straggler", "NORMAL": None, "NO_GPU": None,
        "BALANCED": None, "WARMUP": None, "NO_DATA": None, "INCOMPLETE_DATA": None,
        "HIGH_CPU": None, "HIGH_PROCESS_CPU": None, "RESIDUAL_HEAVY": None,
        "HIGH_HOST_MEMORY": None, "HIGH_PROCESS_RSS": None, "HIGH_PRESSURE": None,
        "CREEP_EARLY": None, "CREEP_CONFIRMED": None,
    },
    "loadtune": {
        "input-bound, CPU saturated": "loading_cpu", "input-bound": "loading",
        "compute-bound": "compute", "mildly contended": "loading",
    },
    # fournex's labels: launch_bound names kernel-launch overhead (its fixes: torch.compile,
    # CUDA graphs), a cause none of the workloads has; without a GPU its utilisation reads 0 %,
    # so it fires wherever no input, copy or sync stall dominates
    "fournex": {
        "input_bound": "loading", "copy_bound": "other", "sync_bound": "other",
        "underutilized_gpu": "other", "memory_pressure": "other",
        "shape_instability": "other", "launch_bound": "other",
        "insufficient_telemetry": None, "inconclusive": None,
    },
    "datapath_doctor": {  # its rule ids, its correlated diagnoses, its rank-skew check
        "DPD-001": "loading", "DPD-002": "loading_wait", "DPD-003": "loading_wait",
        "DPD-004": "loading", "DPD-005": "loading_cpu", "DPD-006": "loading_wait",
        "DPD-007": "loading_wait", "DPD-008": "loading", "DPD-009": "other",
        "DPD-010": "other",
        "CPU-bound input preprocessing is starving the training loop": "loading_cpu",
        "remote input-storage latency is starving the training loop": "loading_wait",
        "small-file I/O overhead is starving the training loop": "loading_wait",
        "block-storage saturation is starving the training loop": "loading_wait",
        "synchronous checkpoint I/O is blocking training progress": "other",
        "DataLoader worker instability is disrupting batch delivery": "other",
        "input-straggler": "straggler", "healthy": None,
    },
}


def causes(tool: str, verdicts: Iterable[str]) -> list[str]:
    """The causes a tool's verdicts name, in order, once each (unknown verdicts: ``other``)."""
    vocabulary = VOCABULARY.get(tool, {})
    named: list[str] = []
    for verdict in verdicts:
        cause = vocabulary.get(verdict, "other")
        if cause is not None and cause not in named:
            named.append(cause)
    return named


def score(named: list[str], known: str) -> str:
    """right / partial / wrong / nothing for the causes a tool named on a workload."""
    if not named:
        return "nothing"
    wrong = [c for c in named if c != known and c not in CONSISTENT.get(known, ())]
    if wrong:
        return "wrong"
    if known in named:
        return "right"
    return "partial"


_LOADTUNE_PATTERNS = (  # in the order loadtune's own explain() tests them
    (r"input-bound\*\* .*CPU already saturated", "input-bound, CPU saturated"),
    (r"\*\*input-bound\*\*", "input-bound"),
    (r"\*\*compute-bound\*\*", "compute-bound"),
    (r"mildly contended", "mildly contended"),
)


def loadtune_verdicts(narrative: str) -> list[str]:
    """The verdict in loadtune's narrative (``brain.explain``), as one vocabulary word."""
    for pattern, verdict in _LOADTUNE_PATTERNS:
        if re.search(pattern, narrative or ""):
            return [verdict]
    return []


def traceml_verdicts(summary: dict) -> list[str]:
    """Every diagnosis kind in traceml-ai's ``final_summary.json`` (primary first)."""
    kinds = [((summary.get("primary_diagnosis") or {}).get("kind"))]
    for section in ("step_time", "system", "process", "step_memory"):
        part = summary.get(section) or {}
        kinds.append((part.get("diagnosis") or {}).get("kind"))
        kinds += [issue.get("kind") for issue in part.get("issues") or []]
    return _once(kinds)


def fournex_verdicts(analysis: dict) -> list[str]:
    """The bottleneck labels of ``frx analyze --json`` on one run bundle, from the scope its
    own report shows (steady state where it has one), the one it puts to the user first."""
    result = analysis.get("result", analysis)
    scope = result.get("steady_state") or result.get("run") or result
    diagnosis = scope.get("diagnosis") or {}
    labels = [diagnosis.get("user_facing_bottleneck"), diagnosis.get("primary_bottleneck")]
    labels += [b.get("label") for b in scope.get("bottlenecks") or []]
    return _once(labels)


_DPD_HEADINGS = ("LIKELY ROOT CAUSE", "LIKELY CONTRIBUTING FACTOR", "DIAGNOSTIC SIGNAL")


def datapath_doctor_verdicts(text: str) -> Optional[list[str]]:
    """What datapath-doctor's printed reports say (``render_findings`` of every rank, then the
    rank-skew line ``peers_train.py`` prints): correlated diagnoses, rule ids, "healthy",
    "input-straggler". None where no report was printed."""
    lines = (text or "").splitlines()
    if not any(line.startswith("datapath-doctor: ") for line in lines):
        return None
    said: list[Optional[str]] = []
    for before, line in zip(lines, lines[1:]):
        if before.strip() in _DPD_HEADINGS:
            said.append(line.strip())
    said += re.findall(r"^\[(?:CRITICAL|WARNING|INFO)\]\s+(DPD-\d{3})", text, re.MULTILINE)
    if any("no issues found" in line for line in lines):
        said.append("healthy")
    skew = re.search(r"^== datapath-doctor straggler: (.*)$", text, re.MULTILINE)
    if skew and skew.group(1).strip() != "none":
        said.append("input-straggler")
    return _once(said)


def _once(values: Iterable[Optional[str]]) -> list[str]:
    seen: list[str] = []
    for value in values:
        if value and value not in seen:
            seen.append(value)
    return seen


def ddp_profile_verdicts(summary: dict) -> list[str]:
    """The finding rules of a ddp-profile summary, and its compute-bound note if given."""
    rules = [f["rule"] for f in summary.get("findings") or []]
    notes = (summary.get("recommendation") or {}).get("notes") or []
    if any("compute-bound" in note for note in notes):
        rules.append("note:compute-bound")
    return rules


def diagnosis_row(tool: str, verdicts: Optional[list[str]], known: str,
                  status: str = "ok") -> dict:
    """One tool's cell of the diagnosis table: raw verdicts, causes named, score."""
    if status != "ok" or verdicts is None:
        return {"score": "n/a" if status == "n/a" else "nothing", "status": status,
                "verdicts": verdicts or [], "causes": []}
    named = causes(tool, verdicts)
    return {"score": score(named, known), "status": status, "verdicts": verdicts,
            "causes": named}


def tally(rows: list[dict], tools: Iterable[str]) -> dict[str, dict[str, int]]:
    """Per tool, how many workloads scored right / partial / wrong / nothing / n/a."""
    out: dict[str, dict[str, int]] = {}
    for tool in tools:
        counts = {key: 0 for key in ("right", "partial", "wrong", "nothing", "n/a")}
        for row in rows:
            cell = row["tools"].get(tool)
            if cell is not None:
                counts[cell["score"]] += 1
        out[tool] = counts
    return out


def quality(candidates: dict[str, list[float]], grid: Iterable[str],
            tools: dict[str, Optional[str]]) -> dict:
    """Each tool's recommended configuration against the grid's best, from head-to-head medians.

    ``candidates``: configuration label -> throughputs of its fresh launches; ``grid``: the
    labels of the wide grid; ``tools``: tool -> the label of its recommendation (None: none).

    The grid's best is the largest of several noisy medians, so it reads high when launches
    differ a lot. ``launch_sd`` is the relative SD between launches of one configuration,
    pooled over the configurations measured more than once; a tool's ``within_noise`` says
    whether its gap to the grid's best is within two standard errors of the difference of two
    such medians (each of ``n`` launches: ``2 x launch_sd x sqrt(2 / n)``).
    """
    medians = {label: _median(values) for label, values in candidates.items()}
    grid_medians = {label: medians.get(label) for label in grid if medians.get(label)}
    if not grid_medians:
        return {"grid_best": None, "tools": {t: None for t in tools}}
    best = max(grid_medians, key=lambda label: grid_medians[label])
    spread = launch_sd(candidates)
    out = {}
    for tool, label in tools.items():
        value = medians.get(label) if label else None
        ratio = value / grid_medians[best] if value else None
        cell = {"config": label, "throughput": _round(value, 1),
                "vs_grid_best": _round(ratio, 4)}
        if ratio is not None and spread is not None:
            n = min(len(candidates[label]), len(candidates[best]))
            cell["within_noise"] = within_noise(ratio, spread, n)
        out[tool] = cell
    return {"grid_best": {"config": best, "throughput": _round(grid_medians[best], 1)},
            "medians": {k: _round(v, 1) for k, v in medians.items()},
            "launch_sd": _round(spread, 4), "tools": out}


def confirm(fresh: dict[str, list[float]], best: str, tools: dict[str, Optional[str]]
            ) -> dict:
    """Each tool's choice against the grid's best again, from launches made after the grid.

    The grid's best is the largest of several noisy medians, so on the launches that chose it
    it reads high (the winner's curse: of seven configurations equally fast, the highest median
    of three launches is about one standard error above their level). ``fresh``: label ->
    throughputs of new launches of the grid's best (``best``) and of every tool's choice,
    alternating, which did not take part in choosing anything; their ratio is unbiased.
    ``within_noise_fresh`` as ``quality``'s ``within_noise``, from the spread of these
    launches. Returns their medians, ``launch_sd`` and a cell per tool that chose.
    """
    base = _median(fresh.get(best) or [])
    spread = launch_sd(fresh)
    out: dict[str, dict] = {}
    for tool, label in tools.items():
        if label is None:
            continue
        value = _median(fresh.get(label) or []) if label != best else base
        ratio = value / base if value and base else None
        cell = {"vs_best_fresh": _round(ratio, 4), "launches": len(fresh.get(label) or [])}
        if ratio is not None and spread is not None:
            n = min(len(fresh[label]), len(fresh[best]))
            cell["within_noise_fresh"] = within_noise(ratio, spread, n)
        out[tool] = cell
    return {"medians": {k: _round(_median(v), 1) for k, v in fresh.items()},
            "launch_sd": _round(spread, 4), "tools": out}


def within_noise(ratio: float, spread: float, n: int) -> bool:
    """Whether a choice's shortfall ``1 - ratio`` is within two standard errors of the
    difference of two medians of ``n`` launches each, launches ``spread`` apart (relative)."""
    return 1 - ratio <= 2 * spread * math.sqrt(2 / max(n, 1))


def launch_sd(candidates: dict[str, list[float]]) -> Optional[float]:
    """Relative SD between launches of one configuration, pooled (root mean square) over the
    configurations with at least two launches; None when none has."""
    variances = []
    for values in candidates.values():
        values = [v for v in values if v]
        if len(values) >= 2:
            mean = sum(values) / len(values)
            variances.append(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / mean ** 2)
    return math.sqrt(sum(variances) / len(variances)) if variances else None


def _median(values: list[float]) -> Optional[float]:
    values = sorted(v for v in values if v)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _round(value: Optional[float], digits: int) -> Optional[float]:
    return None if value is None else round(value, digits)

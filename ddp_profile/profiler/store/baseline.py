"""Per-step throughput samples of one probe, exported baselines, and the gate's two sides.

``ddp-profile baseline RUN_DIR -o baseline.json`` writes a small JSON file meant to be
committed (``kind: "ddp-profile-baseline"``, ``schema_version`` 2): the environment, the
configuration and its probe, its ``throughput``, ``samples`` (the per-step global samples/s
of every launch, in order) and ``launches`` (the same steps per launch; schema 1 files have
none: their samples are one launch). ``ddp-profile gate BASELINE CURRENT`` reads each side with
:func:`load_side`, from either a run directory or such a file. A side is one configuration of
one run: the recommended one, else the fastest successful probe; ceiling probes are never a
side. Every successful probe of that configuration is one launch of the side (``--repeat K``
makes K). A per-step sample is global samples/s at one measured step index: the samples every
rank processed at that step over the step time of the slowest rank, which bounds the step.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import pandas as pd

from ddp_profile.errors import BadRunDir, Incomparable
from ddp_profile.profiler.settings import config_label
from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.profiler.store.results import STEP_PARTS, Run, load_run, read_json, step_split

BASELINE_KIND = "ddp-profile-baseline"
BASELINE_SCHEMA_VERSION = 2
ENVIRONMENT_KEYS = ("device", "world_size", "torch_version", "cpu_model", "gpu_name", "hostname")
COMPARED_KEYS = ("device", "world_size", "torch_version", "cpu_model", "gpu_name")


class ConfigNotFound(Incomparable):
    """A side has no successful probe with the configuration to compare."""


@dataclass(frozen=True)
class GateSide:
    """One side of the gate: where it came from, its environment and its per-step samples."""

    source: str
    kind: str  # "run" | "baseline"
    environment: dict[str, Any]
    config: dict[str, Any]
    probe_id: Optional[str]
    throughput: Optional[float]
    samples: list[float]  # every launch's steps
    warnings: list[str] = field(default_factory=list)
    launches: list[list[float]] = field(default_factory=list)  # the same steps, per launch
    probe_ids: list[str] = field(default_factory=list)  # one per launch, when known
    split: Optional[dict[str, float]] = None  # mean s per step of each part (STEP_PARTS)

    def describe(self) -> dict[str, Any]:
        """Plain data for reports: everything but the samples."""
        return {"source": self.source, "kind": self.kind, "environment": dict(self.environment),
                "config": dict(self.config), "probe_id": self.probe_id,
                "throughput": self.throughput, "n_samples": len(self.samples),
                "launches": len(self.launches) or 1, "probe_ids": list(self.probe_ids),
                "warnings": list(self.warnings), "split": self.split}


def step_throughput_samples(run: Run, probe_id: str) -> list[float]:
    """Global samples/s per measured step index of the training loader, in step order.

    (sum over ranks of the step's samples) / (max over ranks of the step's ``step_s``). Step
    indices that not every rank of the probe recorded (a rank killed mid-write) are left out.
    """
    steps = run.steps
    if steps.empty:
        return []
    chosen = steps[(steps["probe_id"] == str(probe_id)) & steps["measured"].astype(bool)]
    if chosen.empty:
        return []
    n_ranks = chosen["rank"].nunique()
    per_step = chosen.groupby("step").agg(samples=("samples", "sum"), step_s=("step_s", "max"),
                                          ranks=("rank", "nunique")).sort_index()
    per_step = per_step[(per_step["ranks"] == n_ranks) & (per_step["step_s"] > 0)]
    return [float(s) / float(t) for s, t in zip(per_step["samples"], per_step["step_s"])]


def environment_of(run: Run) -> dict[str, Any]:
    """The run's comparable environment, from summary.json, else the ranks' context records."""
    summary = run.summary
    env = summary.get("environment") or {}
    context = next((c for c in run.contexts.values() if c), {})
    world_size = summary.get("world_size") or context.get("world_size")
    return {"device": summary.get("device") or context.get("device"),
            "world_size": int(world_size) if world_size is not None else None,
            "torch_version": env.get("torch_version") or context.get("torch_version"),
            "cpu_model": env.get("cpu_model") or context.get("cpu_model"),
            "gpu_name": env.get("gpu_name") or context.get("gpu_name"),
            "hostname": env.get("hostname") or context.get("hostname")}


def config_matches(probe_config: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """True when every setting given in ``wanted`` (``None`` = any) equals the probe's."""
    return all(key in probe_config and type(probe_config[key]) is type(value)
               and probe_config[key] == value
               for key, value in wanted.items() if value is not None)


def _throughput(probe: ProbeRecord) -> float:
    value = probe.throughput
    return value if value is not None and math.isfinite(value) else -1.0


def choose_probe(run: Run, config: Optional[Mapping[str, Any]] = None) -> ProbeRecord:
    """The probe to compare (see the module docstring), among those that count for the gate
    (``store.probes.counts_for_gate``: never a ceiling, threads or DDP counterfactual)."""
    candidates = [p for p in run.records if p.counts_for_gate]
    if not candidates:
        raise BadRunDir(f"no successful probe to compare in {run.path}")
    if config is not None:
        matching = [p for p in candidates if config_matches(p.config.to_dict(), config)]
        if not matching:
            raise ConfigNotFound(f"no successful probe with {config_label(config)} in {run.path}")
        return max(matching, key=_throughput)
    recommended = run.summary.get("recommended")
    if isinstance(recommended, dict) and any(v is not None for v in recommended.values()):
        matching = [p for p in candidates
                    if config_matches(p.config.to_dict(), recommended)]
        if matching:
            return max(matching, key=_throughput)
    return max(candidates, key=_throughput)


def same_config_probes(run: Run, probe: ProbeRecord) -> list[ProbeRecord]:
    """Every probe that counts for the gate measuring exactly ``probe``'s configuration, in
    order (``probe`` among them): the launches of one side."""
    return [p for p in run.records
            if p.counts_for_gate and p.config == probe.config] or [probe]


def _side_from_run(run: Run, config: Optional[Mapping[str, Any]]) -> GateSide:
    probe = choose_probe(run, config)
    environment = environment_of(run)
    warnings = list(run.warnings)
    world_size = environment.get("world_size")
    launches, probe_ids = [], []
    measured = same_config_probes(run, probe)
    for launch in measured:
        probe_id = launch.id
        ranks = run.steps.loc[run.steps["probe_id"] == probe_id, "rank"].nunique() \
            if not run.steps.empty else 0
        if world_size and ranks and ranks < world_size:
            raise BadRunDir(f"probe {probe_id} in {run.path} has step records from only {ranks} "
                            f"of {world_size} ranks")
        samples = step_throughput_samples(run, probe_id)
        if not samples:
            warnings.append(f"probe {probe_id} has no measured steps")
            continue
        launches.append(samples)
        probe_ids.append(probe_id)
    throughputs = [t for t in map(_throughput, measured) if t >= 0]
    return GateSide(source=run.path, kind="run", environment=environment,
                    config=probe.config.to_dict(),
                    probe_id=",".join(probe_ids) or probe.id,
                    throughput=statistics.median(throughputs) if throughputs else None,
                    samples=[v for launch in launches for v in launch], warnings=warnings,
                    launches=launches, probe_ids=probe_ids,
                    split=_split(run.steps[run.steps["probe_id"].isin(probe_ids)]))


def _split(steps: pd.DataFrame) -> Optional[dict[str, float]]:
    """The side's step split (``results.step_split``), None without measured steps."""
    table = step_split(steps)
    return None if table.empty else {k: round(float(v), 6) for k, v in table.iloc[0].items()}


def export_baseline(run: Run, config: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """The committed baseline file's content for one configuration of ``run``."""
    side = _side_from_run(run, config)
    if not side.samples:
        raise BadRunDir(f"probe {side.probe_id} in {run.path} has no measured steps to export")
    created = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    return {"kind": BASELINE_KIND, "schema_version": BASELINE_SCHEMA_VERSION,
            "created": created.isoformat().replace("+00:00", "Z"),
            "environment": side.environment, "config": side.config,
            "probe_id": side.probe_id, "throughput": side.throughput,
            "samples": [round(s, 6) for s in side.samples],
            "launches": [{"probe_id": pid, "samples": [round(s, 6) for s in launch]}
                         for pid, launch in zip(side.probe_ids, side.launches)],
            "split": side.split,
            "source": {"run_dir": os.path.abspath(run.path),
                       "script": run.summary.get("script")}}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _side_from_file(path: str, config: Optional[Mapping[str, Any]]) -> GateSide:
    data = read_json(path, "baseline file")
    if data.get("kind") != BASELINE_KIND:
        raise BadRunDir(f"not a ddp-profile baseline file (kind is {data.get('kind')!r}): {path}")
    version = data.get("schema_version")
    if not isinstance(version, int) or version > BASELINE_SCHEMA_VERSION:
        raise BadRunDir(f"baseline file has unsupported schema_version {version!r}: {path}")
    samples = data.get("samples")
    environment = data.get("environment")
    stored_config = data.get("config")
    if not isinstance(samples, list) or not all(_number(s) for s in samples):
        raise BadRunDir(f"baseline file has no numeric 'samples' list: {path}")
    if not isinstance(environment, dict) or not isinstance(stored_config, dict):
        raise BadRunDir(f"baseline file lacks 'environment' or 'config': {path}")
    if config is not None and not config_matches(stored_config, config):
        raise ConfigNotFound(f"baseline file {path} holds {config_label(stored_config)}, "
                             f"not {config_label(config)}")
    throughput = data.get("throughput")
    launches, probe_ids = _launches_from_file(data, samples, path)
    return GateSide(source=path, kind="baseline",
                    environment={k: environment.get(k) for k in ENVIRONMENT_KEYS},
                    config=dict(stored_config), probe_id=data.get("probe_id"),
                    throughput=float(throughput) if _number(throughput) else None,
                    samples=[float(s) for s in samples], launches=launches,
                    probe_ids=probe_ids, split=_split_from_file(data.get("split")))


def _split_from_file(split: Any) -> Optional[dict[str, float]]:
    """A baseline file's step split; None where absent (files written before it) or bad."""
    if not isinstance(split, dict) or not all(_number(split.get(k)) for k in STEP_PARTS):
        return None
    return {k: float(split[k]) for k in STEP_PARTS}


def _launches_from_file(data: Mapping[str, Any], samples: list[Any],
                        path: str) -> tuple[list[list[float]], list[str]]:
    """A baseline file's launches; a schema 1 file (or none listed) is one launch."""
    listed = data.get("launches")
    if listed is None:
        return [[float(s) for s in samples]], [str(data.get("probe_id"))]
    if not isinstance(listed, list) or not all(
            isinstance(item, dict) and isinstance(item.get("samples"), list)
            and all(_number(s) for s in item["samples"]) for item in listed):
        raise BadRunDir(f"baseline file has a malformed 'launches' list: {path}")
    launches = [[float(s) for s in item["samples"]] for item in listed]
    if sum(len(launch) for launch in launches) != len(samples):
        raise BadRunDir(f"baseline file's 'launches' do not add up to its 'samples': {path}")
    return launches, [str(item.get("probe_id")) for item in listed]


def load_side(path: str, config: Optional[Mapping[str, Any]] = None) -> GateSide:
    """Read one side of the gate from a run directory (or its summary.json) or a baseline file.

    Raises ``BadRunDir`` (one line) when unreadable or corrupt, ``ConfigNotFound`` when the
    requested configuration is not there.
    """
    path = os.fspath(path)
    if os.path.isfile(path) and os.path.basename(path) == "summary.json":
        path = os.path.dirname(path) or "."
    if os.path.isdir(path):
        return _side_from_run(load_run(path), config)
    if os.path.isfile(path):
        return _side_from_file(path, config)
    raise BadRunDir(f"neither a run directory nor a baseline file: {path}")


def environment_differences(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``"key: baseline-value != current-value"`` for each compared key known on both sides."""
    differences = []
    for key in COMPARED_KEYS:
        left, right = baseline.get(key), current.get(key)
        if left is None or right is None:
            continue
        if str(left).strip() != str(right).strip():
            differences.append(f"{key}: {left} != {right}")
    return differences

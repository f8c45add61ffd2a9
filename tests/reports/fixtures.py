"""Report scenarios: synthetic sweeps for the report tests and the render benchmark.

``write_run_dir(path, Scenario(...))`` describes a sweep (probes, step times, host and GPU
samples, findings) and has ``tests.synthetic.write_run``, the one synthetic run-directory
writer, lay it out; load the result with ``load_run``. The numbers are deterministic (seeded)
and shaped like a real sweep: more workers shrink the data wait, a straggler rank is slower on
every step, a failed probe has an error record and no steps.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any, Optional

from tests.synthetic import SampleFn, StepTimeFn, SyntheticProbe, write_run


@dataclass(frozen=True)
class Scenario:
    """What to synthesise; every field has a small default."""

    num_workers: tuple[int, ...] = (0, 2, 4)
    batch_sizes: tuple[int, ...] = (32,)
    pin_memory: tuple[bool, ...] = (False,)
    ranks: int = 2
    steps: int = 30
    warmup: int = 3
    data_bound: bool = True          # data wait dominates at low num_workers
    straggler_rank: Optional[int] = None
    gpu: bool = False
    failed_probe: bool = False       # one extra probe that ran out of memory
    host_samples_per_s: float = 10.0
    script: str = "train.py"
    script_args: tuple[str, ...] = ("--epochs", "1")
    hostname: str = "node-a"
    error_message: str = "CUDA out of memory. Tried to allocate 2.00 GiB"
    finding_title: str = "Ranks wait for data"
    extra_summary: dict[str, Any] = field(default_factory=dict)
    seed: int = 0


def data_bound() -> Scenario:
    return Scenario()


def straggler() -> Scenario:
    return Scenario(data_bound=False, straggler_rank=1, ranks=4)


def no_gpu() -> Scenario:
    return Scenario(gpu=False)


def with_gpu() -> Scenario:
    return Scenario(gpu=True)


def failed_probe() -> Scenario:
    return Scenario(failed_probe=True)


def scale(probes: int = 50, ranks: int = 8, steps: int = 200) -> Scenario:
    """``probes`` probes in all (sweep, a ceiling and a failed one) on ``ranks`` ranks."""
    return Scenario(num_workers=(0, 1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32),
                    batch_sizes=(16, 32, 64, 128), pin_memory=(False, True), ranks=ranks,
                    steps=steps, gpu=True, failed_probe=True,
                    extra_summary={"_max_probes": max(1, probes - 2)})


def _step_time_fn(scenario: Scenario, config: dict[str, Any], kind: str) -> StepTimeFn:
    def step_time(probe_id: str, rank: int, step: int) -> tuple[float, float, float]:
        compute = 0.02 * config["batch_size"] / 32
        if kind == "ceiling":
            wait = 0.0005
        elif scenario.data_bound:
            wait = 0.06 * config["batch_size"] / 32 / (1 + config["num_workers"])
        else:
            wait = 0.002
        if scenario.straggler_rank == rank:
            compute *= 1.8
        jitter = 1 + random.Random(f"{scenario.seed}:{probe_id}:{rank}:{step}").uniform(-0.05,
                                                                                         0.05)
        return wait * jitter, compute * jitter, 0.002

    return step_time


def _sample_fn(scenario: Scenario, config: dict[str, Any], kind: str) -> SampleFn:
    """Host samples (and GPU ones) at ``host_samples_per_s`` over the probe's steps."""
    def samples(probe_id: str, rank: int, t0: int, end: int) -> list[dict[str, Any]]:
        rng = random.Random(f"{scenario.seed}:{probe_id}:{rank}:samples")
        busy = 1 - _step_time_fn(scenario, config, kind)(probe_id, rank, 0)[0] / 0.1
        records = []
        count = max(2, int((end - t0) / 1e9 * scenario.host_samples_per_s))
        for i in range(count):
            ts = t0 + int(i * (end - t0) / count)
            records.append({"kind": "sample", "rank": rank, "source": "host", "t_ns": ts,
                            "cpu_percent": 30 + 10 * config["num_workers"] + rng.uniform(0, 5),
                            "worker_cpu_percent": 20.0 * config["num_workers"]})
            if scenario.gpu:
                util = max(0.0, min(100.0, 100 * busy + rng.uniform(-5, 5)))
                records.append({"kind": "sample", "rank": rank, "source": "gpu", "t_ns": ts,
                                "gpu_util_percent": util,
                                "gpu_mem_used_bytes": 8e9 + config["batch_size"] * 2e7})
        return records

    return samples


def _configs(scenario: Scenario) -> list[dict[str, Any]]:
    configs = [{"num_workers": w, "pin_memory": p, "prefetch_factor": 2 if w else None,
                "batch_size": b}
               for b, w, p in itertools.product(scenario.batch_sizes, scenario.num_workers,
                                                scenario.pin_memory)]
    limit = scenario.extra_summary.get("_max_probes")
    return configs[:limit] if limit else configs


def _probe(scenario: Scenario, probe_id: str, kind: str, config: dict[str, Any]
           ) -> SyntheticProbe:
    return SyntheticProbe(id=probe_id, config=config, kind=kind,
                          step_time_fn=_step_time_fn(scenario, config, kind),
                          sample_fn=_sample_fn(scenario, config, kind))


def _probes(scenario: Scenario) -> list[SyntheticProbe]:
    configs = _configs(scenario)
    probes = [_probe(scenario, f"p{i:03d}", "baseline" if i == 0 else "sweep", c)
              for i, c in enumerate(configs)]
    probes.append(_probe(scenario, "ceiling", "ceiling", dict(configs[-1])))
    if scenario.failed_probe:
        big = {**configs[-1], "batch_size": max(scenario.batch_sizes) * 4}
        probes.append(SyntheticProbe(id=f"p{len(configs):03d}", config=big, status="oom",
                                     steps=0, warmup=0, reason="exit_code",
                                     error=scenario.error_message, root_cause_rank=0))
    return probes


def _findings(scenario: Scenario) -> list[dict[str, Any]]:
    findings = []
    if scenario.data_bound:
        findings.append({"rule": "data_wait", "severity": "high", "title": scenario.finding_title,
                         "evidence": "At num_workers=0, 74% of each step is spent waiting for "
                                     "the next batch on every rank.",
                         "recommendation": "Use num_workers=4.", "ranks": []})
    if scenario.straggler_rank is not None:
        findings.append({"rule": "straggler", "severity": "medium",
                         "title": f"Rank {scenario.straggler_rank} is a straggler",
                         "evidence": {"median_step_s": 0.04, "others_median_step_s": 0.022},
                         "recommendation": "Check the host of that rank.",
                         "ranks": [scenario.straggler_rank]})
    findings.append({"rule": "pin_memory", "severity": "low", "title": "pin_memory is off",
                     "evidence": ["device is cuda", "pin_memory=False"],
                     "recommendation": "Set pin_memory=True.", "ranks": []})
    return findings


def _environment(scenario: Scenario) -> dict[str, Any]:
    gpu = scenario.gpu
    return {"torch_version": "2.13.0", "cuda_version": "12.8" if gpu else None,
            "driver_version": "570.86" if gpu else None,
            "gpu_name": "NVIDIA H100 80GB HBM3" if gpu else None, "cpu_count": 32,
            "hostname": scenario.hostname, "python": "3.11.9",
            "command_line": " ".join(["ddp-profile", "run", scenario.script,
                                      *scenario.script_args])}


def write_run_dir(path: str, scenario: Scenario) -> str:
    """Write a complete synthetic run directory for ``scenario`` at ``path``; return ``path``."""
    extra = {k: v for k, v in scenario.extra_summary.items() if not k.startswith("_")}
    reason = None if scenario.gpu else "no NVIDIA driver (libnvidia-ml.so not found)"
    return write_run(
        path, _probes(scenario), world_size=scenario.ranks, steps=scenario.steps,
        warmup=scenario.warmup, device="cuda" if scenario.gpu else "cpu",
        hostname=scenario.hostname, script=scenario.script, script_args=scenario.script_args,
        notes=["Measured on 2 ranks; re-check at full scale."],
        summary_extra={"environment": _environment(scenario), "findings": _findings(scenario),
                       "gpu_unavailable_reason": reason, **extra})

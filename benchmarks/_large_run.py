"""A large run directory for the render benchmark, built by the tool's own code.

Only the rank records are made up (seeded, shaped like a data-bound sweep on GPUs: more workers
shrink the data wait); the ledger entries, ``summary.json`` and the layout come from the same
functions a real run uses (``summarise_probe``, ``build_summary``, ``RunDir``). The tests keep
their own scenario writers; benchmarks import nothing from ``tests/``.
"""

from __future__ import annotations

import itertools
import os
import random
from typing import Any

from ddp_profile.profiler.decide.capacity import run_capacity
from ddp_profile.profiler.launch.ranks import LaunchOutcome
from ddp_profile.profiler.settings import LoaderSettings, ProbePlan
from ddp_profile.profiler.store.record import dumps
from ddp_profile.profiler.store.rundir import RunDir
from ddp_profile.profiler.store.summary import build_summary
from ddp_profile.profiler.sweep.probe import summarise_probe

WARMUP = 3
T0_NS = 1_700_000_000_000_000_000
BATCH_SIZES = (16, 32, 64, 128)
WORKERS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)  # 4 x 14 x 2 = 112 probes at most


def _configs(probes: int) -> list[dict[str, Any]]:
    grid = itertools.product(BATCH_SIZES, WORKERS, (False, True))
    return [{"num_workers": w, "pin_memory": p, "prefetch_factor": 2 if w else None,
             "batch_size": b} for b, w, p in itertools.islice(grid, probes)]


def _rank_records(config: dict[str, Any], rank: int, ranks: int, steps: int,
                  rng: random.Random) -> list[dict[str, Any]]:
    t = T0_NS + rank * 1_000_000
    records = [{"kind": "context", "rank": rank, "local_rank": rank, "node_rank": 0,
                "world_size": ranks, "device": "cuda", "hostname": "node-a", "t_ns": t},
               {"kind": "loader", "rank": rank, "loader_id": 0, "own": {}, "applied": config,
                "skipped_overrides": []}]
    for step in range(WARMUP + steps):
        jitter = 1 + rng.uniform(-0.05, 0.05)
        compute = 0.02 * config["batch_size"] / 32 * jitter
        wait = 0.06 * config["batch_size"] / 32 / (1 + config["num_workers"]) * jitter
        records.append({"kind": "step", "rank": rank, "loader_id": 0, "step": step,
                        "measured": step >= WARMUP, "t_ns": t, "data_wait_s": wait,
                        "compute_s": compute, "other_s": 0.002, "forward_s": compute / 3,
                        "samples": config["batch_size"]})
        if step % 5 == 0:
            records.append({"kind": "sample", "rank": rank, "source": "host", "t_ns": t,
                            "cpu_percent": 30 + 5 * config["num_workers"] + rng.uniform(0, 5)})
            records.append({"kind": "sample", "rank": rank, "source": "gpu", "t_ns": t,
                            "gpu_util_percent": 100 * compute / (compute + wait + 0.002)})
        t += int((wait + compute + 0.002) * 1e9)
    records.append({"kind": "end", "rank": rank, "reason": "steps_done",
                    "training_loader_id": 0, "steps_recorded": steps, "t_ns": t})
    return records


def write_large_run(path: str, probes: int, ranks: int, steps: int, seed: int = 0) -> str:
    """``probes`` probes (the first the baseline) of ``ranks`` ranks and ``steps`` steps."""
    rng = random.Random(seed)
    run_dir = RunDir(path)
    meta = {"script": "train.py", "script_args": [], "launcher": "torchrun",
            "nproc_per_node": ranks}
    run_dir.create(meta)
    entries = []
    for index, config in enumerate(_configs(probes)):
        plan = ProbePlan(probe_id=f"p{index:03d}", out_dir=run_dir.probe_dir(f"p{index:03d}"),
                         overrides=LoaderSettings.from_dict(config), warmup=WARMUP, steps=steps)
        os.makedirs(plan.out_dir)
        for rank in range(ranks):
            with open(os.path.join(plan.out_dir, f"rank-{rank}.jsonl"), "w",
                      encoding="utf-8") as handle:
                records = _rank_records(config, rank, ranks, steps, rng)
                handle.write("\n".join(dumps(r) for r in records) + "\n")
        outcome = LaunchOutcome(returncode=0, timed_out=False, interrupted=False, wall_s=12.5,
                                log_path=os.path.join(plan.out_dir, "launcher.log"))
        entry = summarise_probe(plan, outcome, "baseline" if index == 0 else "sweep", 120.0)
        run_dir.append(entry.to_json())
        entries.append(entry)
    gpu = {"gpu_available": True, "gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}
    run_dir.write_summary(build_summary(meta, entries, {"world_size": ranks, "device": "cuda"},
                                        gpu, "complete", capacity=run_capacity))
    return path

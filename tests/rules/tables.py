"""Build small ``Run`` objects in memory for rule tests: no files, a few dozen rows each.

    run = (RunBuilder(world_size=2)
           .probe("p0", kind="baseline", num_workers=0)
           .steps(n=20, data_wait=0.05, compute=0.05)
           .samples("host", cpu_percent=30.0)
           .build())

A value given to ``steps`` may be a number or a function ``(rank, step) -> number``.
Probe throughput and data-wait fraction are computed from the measured steps unless given.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import numpy as np
import pandas as pd

from ddp_profile.profiler.decide.capacity import loading_cost, loop_demand, run_capacity
from ddp_profile.profiler.settings import SETTING_KEYS
from ddp_profile.profiler.store.probes import records
from ddp_profile.profiler.store.results import STEP_COLUMNS, Run, probes_table

Value = Union[float, None, Callable[[int, int], Optional[float]]]


def _at(value: Value, rank: int, step: int) -> Optional[float]:
    return value(rank, step) if callable(value) else value


class RunBuilder:
    def __init__(self, world_size: int = 1, device: str = "cpu", cpus: int = 8,
                 nproc_per_node: Optional[int] = None, backend: str = "gloo"):
        self.summary: dict[str, Any] = {"world_size": world_size, "device": device,
                                        "nproc_per_node": nproc_per_node or world_size,
                                        "backend": backend, "probes": []}
        self.world_size, self.device, self.cpus, self.backend = world_size, device, cpus, backend
        self.probes: list[dict[str, Any]] = []
        self.tables: dict[str, list[dict[str, Any]]] = {
            "steps": [], "samples": [], "loader_iters": [], "events": []}
        self.contexts: dict[tuple[str, int], dict[str, Any]] = {}
        self.current: Optional[str] = None
        self.memory: Optional[int] = None  # the host's available memory, bytes

    def probe(self, probe_id: str, kind: str = "sweep", status: str = "ok",
              num_workers: Optional[int] = 2, pin_memory: Optional[bool] = False,
              prefetch_factor: Optional[int] = 2, batch_size: Optional[int] = 32,
              throughput: Optional[float] = None, data_wait_fraction: Optional[float] = None,
              loader: Optional[dict[str, Any]] = None, short: bool = False,
              entry: Optional[dict[str, Any]] = None, **context: Any) -> "RunBuilder":
        self.current = probe_id
        self.probes.append({"id": probe_id, "kind": kind, "status": status,
                            "num_workers": num_workers, "pin_memory": pin_memory,
                            "prefetch_factor": prefetch_factor, "batch_size": batch_size,
                            "throughput": throughput, "data_wait_fraction": data_wait_fraction,
                            "short": short, "short_reason": "the script ended" if short
                            else None, "entry": entry or {}})
        loader_dict = {"num_workers": num_workers, "pin_memory": pin_memory,
                       "prefetch_factor": prefetch_factor, "batch_size": batch_size,
                       "persistent_workers": False, "sampler": "DistributedSampler",
                       "sampler_shuffle": True, "distributed_sampler": True,
                       "dataset_len": 1000, **(loader or {})}
        for rank in range(self.world_size):
            self.contexts[(probe_id, rank)] = {
                "rank": rank, "local_rank": rank, "world_size": self.world_size,
                "hostname": "node0", "backend": self.backend, "device": self.device,
                "cpu_count": self.cpus, "cpus_available": self.cpus, "loader": loader_dict,
                **context}
        return self

    def steps(self, n: int = 20, data_wait: Value = 0.01, compute: Value = 0.05,
              other: Value = 0.001, forward: Value = None, samples: Optional[int] = None,
              warmup: int = 0, jitter: float = 0.0, seed: int = 0,
              loader_id: int = 0, gpu_gap: Value = None, runq: Value = None) -> "RunBuilder":
        """Warm-up steps then ``n`` measured steps on every rank; ``jitter`` scales compute;
        ``gpu_gap``: each step's GPU gap (CUDA events), none by default; ``runq``: the time
        each step's loop sat runnable without a CPU, unknown by default."""
        rng = np.random.default_rng(seed)
        batch = samples or self.probes[-1]["batch_size"] or 1
        for rank in range(self.world_size):
            t = 0.0
            for step in range(warmup + n):
                wait, comp = _at(data_wait, rank, step), _at(compute, rank, step)
                comp *= 1 + jitter * rng.standard_normal() if jitter else 1
                oth, fwd = _at(other, rank, step), _at(forward, rank, step)
                self.tables["steps"].append({
                    "probe_id": self.current, "rank": rank, "node": 0, "loader_id": loader_id,
                    "step": step, "measured": step >= warmup, "t_s": t,
                    "data_wait_s": wait, "compute_s": comp, "other_s": oth,
                    "forward_s": float("nan") if fwd is None else fwd,
                    "step_s": wait + comp + oth, "samples": batch,
                    "gpu_gap_s": float("nan") if gpu_gap is None else _at(gpu_gap, rank, step),
                    "runq_s": float("nan") if runq is None else _at(runq, rank, step)})
                t += wait + comp + oth
        return self

    def loading(self, cpu_ms: float, wait_ms: float, rss: Optional[int] = None,
                runq_ms: Optional[float] = None) -> "RunBuilder":
        """The current probe's measured loading: CPU, blocked waiting and (where given)
        time runnable without a CPU, per sample."""
        runq = None if runq_ms is None else runq_ms / 100
        cost = loading_cost([([{"pid": 1, "t_ns": i, "samples": 10, "cpu_s": cpu_ms / 100,
                                "wall_s": (cpu_ms + wait_ms + (runq_ms or 0.0)) / 100,
                                "runq_s": runq} for i in range(11)],
                              None)], [rss] if rss else [])
        self.probes[-1]["loading"] = cost.to_dict()
        return self

    def samples(self, source: str, n: int = 10, rank: int = 0, **metrics: float) -> "RunBuilder":
        for i in range(n):
            self.tables["samples"].append({"probe_id": self.current, "rank": rank,
                                           "source": source, "t_s": 0.1 * i, **metrics})
        return self

    def loader_iter(self, iter_index: int, first_batch_s: float, loader_id: int = 0,
                    ranks: Optional[list[int]] = None) -> "RunBuilder":
        for rank in ranks if ranks is not None else range(self.world_size):
            self.tables["loader_iters"].append({
                "probe_id": self.current, "rank": rank, "loader_id": loader_id,
                "iter_index": iter_index, "first_batch_s": first_batch_s})
        return self

    def event(self, name: str, rank: int = 0, **data: Any) -> "RunBuilder":
        self.tables["events"].append({"probe_id": self.current, "rank": rank, "name": name,
                                      "data": data})
        return self

    def _fill_measures(self, probe: dict[str, Any], steps: pd.DataFrame) -> dict[str, Any]:
        if len(steps):
            steps = steps[(steps["probe_id"] == probe["id"]) & steps["measured"]]
        rows = steps
        if probe["status"] != "ok" or rows.empty:
            return probe
        elapsed = rows.groupby("rank")["step_s"].sum().max()
        if probe["throughput"] is None:
            probe = {**probe, "throughput": rows["samples"].sum() / elapsed}
        if probe["data_wait_fraction"] is None:
            wait = rows["data_wait_s"].sum() / rows["step_s"].sum()
            probe = {**probe, "data_wait_fraction": wait}
        return probe

    def build(self) -> Run:
        steps = pd.DataFrame(self.tables["steps"], columns=STEP_COLUMNS)
        probes = [self._fill_measures(p, steps) for p in self.probes]
        summary = {**self.summary, "probes": [
            {"id": p["id"], "kind": p["kind"], "status": p["status"],
             "config": {k: p[k] for k in SETTING_KEYS},
             "throughput": p["throughput"], "data_wait_fraction": p["data_wait_fraction"],
             "steps_measured": int(((steps["probe_id"] == p["id"]) & steps["measured"]).sum())
             // self.world_size, "short": p["short"], "short_reason": p["short_reason"],
             "loading": p.get("loading"), "loop_demand": _loop_demand(steps, p["id"]),
             **p["entry"]} for p in probes]}
        context = {"world_size": self.world_size, "cpus_available": self.cpus,
                   "memory_available": self.memory}
        summary["capacity"] = run_capacity(records(summary["probes"]), context,
                                           self.summary["nproc_per_node"], None)
        return Run(path="<memory>", meta={}, summary=summary,
                   probes=probes_table(records(summary["probes"])), steps=steps,
                   samples=pd.DataFrame(self.tables["samples"]),
                   loader_iters=pd.DataFrame(self.tables["loader_iters"],
                                             columns=["probe_id", "rank", "loader_id",
                                                      "iter_index", "first_batch_s"]),
                   events=pd.DataFrame(self.tables["events"],
                                       columns=["probe_id", "rank", "name", "data"]),
                   contexts=dict(self.contexts))


def _loop_demand(steps: pd.DataFrame, probe_id: str) -> Optional[float]:
    rows = steps[steps["probe_id"] == probe_id]
    return loop_demand(group.to_dict("records") for _, group in rows.groupby("rank"))


def empty_run() -> Run:
    """A run with no probes and empty tables: every rule must return None."""
    return RunBuilder().build()

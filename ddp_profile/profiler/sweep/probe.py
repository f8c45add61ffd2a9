"""One finished probe: turn its rank records and launch outcome into one ledger entry (how
the launch ended: ``launch.failure.classify``)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ddp_profile.profiler.decide.capacity import loading_cost, loop_demand
from ddp_profile.profiler.launch.failure import classify
from ddp_profile.profiler.launch.ranks import LaunchOutcome
from ddp_profile.profiler.numbers import finite, finite_or_none
from ddp_profile.profiler.settings import BURST_ROUNDS, ProbePlan
from ddp_profile.profiler.store.epochs import rank_step_stats, step_seconds, whole_epochs
from ddp_profile.profiler.store.probe_comm import probe_comm
from ddp_profile.profiler.store.probedir import RankData, read_probe_dir, whole_run
from ddp_profile.profiler.store.probes import Kind, ProbeRecord, Status


@dataclass(frozen=True)
class ScreenLaunch:
    """The launch a screen's window was measured in (``sweep.screen``)."""

    id: str  # the launch's own id (its directory)
    wall_s: float
    ranks: Callable[[], Sequence[RankData]]  # its rank records (read where they are needed)


def summarise_probe(plan: ProbePlan, outcome: LaunchOutcome, kind: Kind, timeout_s: float,
                    *, ranks: Optional[Sequence[RankData]] = None, pair: Any = None,
                    screen: Optional[ScreenLaunch] = None) -> ProbeRecord:
    """The record of a finished probe, whole: made here once, its ledger line (the
    ``probes[]`` item of summary.json) with it. ``ranks``: its rank records where the caller
    read them (else read here); ``pair``: its place in an alternation; ``screen``: the launch
    that measured it, where it was a window of one."""
    ranks = [r for r in (read_probe_dir(plan.out_dir) if ranks is None else ranks)
             if r.rank >= 0 or r.steps or r.error]
    loader = _training_loader(ranks)
    entry: dict[str, Any] = {
        "id": plan.probe_id, "kind": Kind(kind).value, "requested": plan.overrides.to_dict(),
        "config": dict(loader.get("applied") or {}), "status": Status.OK.value, "reason": None,
        "error": None,
        "root_cause_rank": None, "wall_s": round(outcome.wall_s, 3),
        "warmup": plan.warmup, "steps": plan.steps, "threads": plan.threads,
        "ddp_options": plan.ddp,
        **({"persistent_workers": plan.persistent_workers}
           if plan.persistent_workers is not None else {}),
        "skipped_overrides": list(loader.get("skipped_overrides") or []),
        "strays_killed": outcome.strays_killed,
        **({"hung_at_exit": True} if outcome.hung_at_exit else {}),
    }
    workers = (loader.get("applied") or {}).get("num_workers")
    entry.update(_measurements(ranks, workers))
    entry.update(_loading(ranks))
    entry.update(_communication(ranks, entry["per_rank"]))
    entry["worker_cores"] = _worker_cores(ranks, workers, entry)
    entry["cpu_busy"] = _cpu_busy(ranks, entry.get("cpus_available"))
    status, reason, error, root = classify(ranks, outcome, plan, timeout_s)
    entry.update(status=status.value, reason=reason, error=error, root_cause_rank=root)
    if status != Status.OK:
        entry["throughput"] = None
    entry.update(_shortness(entry, plan))
    entry.update(script_run(ranks if status == Status.OK else []))
    if screen is not None:
        entry.update(screened=True, launch=screen.id, launch_wall_s=round(screen.wall_s, 3))
        if entry["script_samples"]:  # the launch's, not the window's alone
            entry.update(script_run(list(screen.ranks())))
    if pair is not None:
        entry["pair"] = pair
    return ProbeRecord.from_json(entry)


def script_run(ranks: list[RankData]) -> dict[str, Any]:
    """``script_samples`` and ``script_run_s``: the script's whole run, where the launch of
    ``ranks`` ran it to its end (``store.probedir.whole_run``), else None; a screen's
    windows carry their launch's."""
    found = whole_run(ranks)
    return {"script_samples": found[0] if found else None,
            "script_run_s": round(found[1], 4) if found else None}


def _shortness(entry: dict[str, Any], plan: ProbePlan) -> dict[str, Any]:
    """``short``: an ok probe that measured fewer steps than asked, and why."""
    measured = entry.get("steps_measured") or 0
    if entry["status"] != Status.OK or measured >= plan.steps:
        return {"short": False, "short_reason": None}
    return {"short": True,
            "short_reason": f"the script ended after {measured} measured step(s) of the "
                            f"{plan.steps} asked: run more epochs (or more data) so that a "
                            f"probe reaches --warmup + --steps"}


def _training_loader_record(data: RankData) -> Optional[dict[str, Any]]:
    loader_id = data.training_loader_id
    return data.loaders.get(loader_id) if loader_id is not None else None


def _training_loader(ranks: list[RankData]) -> dict[str, Any]:
    """The first rank's ``loader`` record of its training loader (empty if none ran)."""
    for data in ranks:
        loader = _training_loader_record(data)
        if loader:
            return loader
    return {}


def _measurements(ranks: list[RankData], workers: Optional[int] = None) -> dict[str, Any]:
    per_rank, samples, elapsed, first_batch = [], 0, 0.0, []
    steady, restarts, epoch = 0.0, [], None
    spans: list[Optional[tuple[int, float]]] = []
    skip: dict[int, frozenset[int]] = {}
    for data in ranks:
        steps, loader = data.training_steps(), _training_loader_record(data)
        stats = rank_step_stats(steps, loader)
        spans.append(whole_epochs(steps, loader))
        skip[data.rank] = stats["segment_steps"]
        per_rank.append({"rank": data.rank, "node": data.context.get("node_rank", 0),
                         "steps": stats["steps"],
                         "data_wait_fraction": finite_or_none(stats["data_wait_fraction"]),
                         "step_time_median_s": finite_or_none(stats["step_time_median_s"]),
                         "throughput": finite_or_none(stats["throughput"])})
        if stats["steps"]:
            samples += stats["samples"]
            elapsed = max(elapsed, stats["elapsed_s"])
        if stats["restart_s"] is not None:
            restarts.append(stats["restart_s"])
            steady = max(steady, stats["steady_s"])
            epoch = stats["epoch_steps"]
        first_batch += [i["first_batch_s"] for i in data.loader_iters
                        if i.get("loader_id") == data.training_loader_id
                        and i.get("iter_index") == 0 and i.get("first_batch_s") is not None]
    fractions = [r["data_wait_fraction"] for r in per_rank if r["data_wait_fraction"] is not None]
    return {
        "throughput": samples / elapsed if elapsed > 0 else None,
        "data_wait_fraction": statistics.fmean(fractions) if fractions else None,
        "steps_measured": min((r["steps"] for r in per_rank), default=0),
        "step_time_cv": _step_time_cv(ranks, skip),
        "throughput_rse": _throughput_rse(ranks, workers, skip),
        "epoch_restart_s": round(statistics.fmean(restarts), 4) if restarts else None,
        "epoch_steps": epoch,
        "steady_throughput": samples / steady if restarts and steady > 0 else None,
        # whole epochs by the wall clock, every rank's (``store.epochs.whole_epochs``)
        "epochs_throughput": sum(s[0] for s in spans) / max(s[1] for s in spans)
        if spans and all(spans) else None,
        **_gpu_idle(ranks),
        "time_to_first_batch_s": max(first_batch) if first_batch else None,
        "ranks_per_host": _ranks_per_host(ranks),
        "cpus_available": min((r.context["cpus_available"] for r in ranks
                               if r.context.get("cpus_available")), default=None),
        "intra_op_threads": max(((r.context.get("threads") or {}).get("intra_op") or 0
                                 for r in ranks), default=0) or None,
        "per_rank": per_rank,
    }


def _communication(ranks: list[RankData], per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """``comm`` (``store.probe_comm.probe_comm``) and ``comm_fraction``: the share of each step
    spent in communication backward did not cover, the step's fourth part; each rank's own
    in ``per_rank``."""
    comm = probe_comm(ranks)
    shares = {r["rank"]: r["exposed_fraction"] for r in (comm or {}).get("per_rank") or []}
    for row in per_rank:
        row["comm_fraction"] = finite_or_none(shares.get(row["rank"]))
    return {"comm": comm, "comm_fraction": finite_or_none((comm or {}).get("exposed_fraction"))}


def _worker_cores(ranks: list[RankData], workers: Optional[int], entry: dict[str, Any]
                  ) -> Optional[float]:
    """The one author of "cores one machine's DataLoader workers were busy on" (read by the
    threads probe of the search and by the host rules).

    0 without workers. Else the CPU their batches cost, measured where they were made: the
    loading's CPU per sample x the probe's samples/s x the machine's share of the ranks. A
    worker that mostly sleeps (storage latency) is busy on almost nothing, however many there
    are. Without batch costs, the host sampler's ``worker_cpu_percent`` (median per rank,
    summed, scaled to one machine); None when neither was recorded.
    """
    if workers == 0:
        return 0.0
    per_host, world = entry.get("ranks_per_host") or 1, max(1, len(ranks))
    share = min(1.0, per_host / world)
    per_sample = (entry.get("loading") or {}).get("cpu_per_sample_s")
    throughput = entry.get("throughput")
    if workers and finite(per_sample) and finite(throughput):
        return round(float(per_sample) * float(throughput) * share, 3)
    medians = []
    for data in ranks:
        values = [s["worker_cpu_percent"] for s in data.samples
                  if s.get("source") == "host" and isinstance(s.get("worker_cpu_percent"), float)
                  and math.isfinite(s["worker_cpu_percent"])]
        if values:
            medians.append(statistics.median(values) / 100.0)
    return round(sum(medians) * share, 3) if medians else None


def _ranks_per_host(ranks: list[RankData]) -> Optional[int]:
    """The most ranks that ran on one host, as observed (contexts' hostnames)."""
    hosts = [r.context.get("hostname") for r in ranks if r.context.get("hostname")]
    return max(hosts.count(h) for h in set(hosts)) if hosts else None


def _loading(ranks: list[RankData]) -> dict[str, Any]:
    """``loading``: what producing the training loader's samples cost (see
    ``decide.capacity``), and ``loop_demand``: the loop's samples/s with free data."""
    groups, rss = [], {}
    for data in ranks:
        loader_id = data.training_loader_id
        span = _measured_span(data)
        groups.append(([b for b in data.batch_costs if b.get("loader_id") == loader_id],
                       span[0] if span else None))
        for record in data.worker_starts + data.batch_costs:
            if record.get("loader_id") == loader_id and record.get("private_rss"):
                key = record.get("pid")
                rss[key] = max(rss.get(key, 0), int(record["private_rss"]))
    cost = loading_cost(groups, rss.values())
    loading = cost.to_dict() if cost else None
    if loading is not None:
        loading.update(_pinning(ranks))
        shares = {str(data.rank): round(one.storage_share, 4)
                  for data, group in zip(ranks, groups)
                  if (one := loading_cost([group])) is not None and one.storage_share is not None}
        if len(shares) >= 2:  # which rank read from storage, which from the page cache
            loading["storage_share_by_rank"] = shares
    return {"loading": loading,
            "loop_demand": loop_demand(d.training_steps() for d in ranks)}


def _measured_span(data: RankData) -> Optional[tuple[int, int]]:
    """Wall-clock starts (ns) of a rank's first and last measured training steps."""
    measured = [s["t_ns"] for s in data.training_steps() if s.get("measured")]
    return (min(measured), max(measured)) if measured else None


def _cpu_busy(ranks: list[RankData], cpus: Optional[float]) -> Optional[float]:
    """Share of the CPUs available to a rank (``cpus_available``: affinity and cgroup quota)
    that were busy while the steps were measured, whoever kept them busy: the median of the
    host samples' busy cores (``cpu_percent`` x the cores sampled). None without samples."""
    if not cpus:
        return None
    busy = []
    for data in ranks:
        span = _measured_span(data)
        if span is None:
            continue
        low, high = span
        for sample in data.samples:
            percent, cores = sample.get("cpu_percent"), sample.get("cpu_per_core")
            if sample.get("source") == "host" and low <= sample.get("t_ns", 0) <= high \
                    and finite(percent) and cores:
                busy.append(percent / 100.0 * len(cores))
    return round(min(1.0, statistics.median(busy) / cpus), 3) if busy else None


def _pinning(ranks: list[RankData]) -> dict[str, Any]:
    """Wall and CPU time per sample of pinning the training loader's measured batches (one
    thread per rank pins them all); empty when nothing was pinned."""
    wall = cpu = 0.0
    samples = 0
    for data in ranks:
        span = _measured_span(data)
        since = span[0] if span else 0
        for record in data.pin_costs:
            if record.get("loader_id") == data.training_loader_id \
                    and record.get("t_ns", 0) >= since and record.get("samples"):
                wall += float(record.get("wall_s") or 0.0)
                cpu += float(record.get("cpu_s") or 0.0)
                samples += int(record["samples"])
    if not samples:
        return {}
    return {"pin_per_sample_s": wall / samples, "pin_cpu_per_sample_s": cpu / samples}


def _global_steps(ranks: list[RankData], skip: Optional[dict[int, frozenset[int]]] = None
                  ) -> list[tuple[float, int]]:
    """Per measured step: (time of the slowest rank, samples of all ranks), in step order;
    without the steps of an epoch restart (``skip``, by rank: ``store.epochs``), whose cost
    the throughput carries once per epoch."""
    by_step: dict[int, list[float]] = {}
    for data in ranks:
        left_out = (skip or {}).get(data.rank, frozenset())
        for step in data.training_steps():
            if step.get("measured") and step["step"] not in left_out:
                total = step_seconds(step)
                slot = by_step.setdefault(step["step"], [0.0, 0])
                slot[0] = max(slot[0], total)
                slot[1] += step.get("samples") or 0
    return [(t, int(n)) for _, (t, n) in sorted(by_step.items())]


BLOCKS = BURST_ROUNDS  # a probe with workers measures this many rounds of them


def _gpu_idle(ranks: list[RankData]) -> dict[str, Optional[float]]:
    """Shares of the measured steps' time the GPUs sat idle between steps (CUDA events):
    ``gpu_idle_fraction`` in all, ``gpu_starved_fraction`` while their host waited for data.

    The host asks for the next batch at the end of its work between two steps, so of a step's
    GPU gap the last ``data_wait_s`` (at most) is the GPU waiting for data; a host wait that the
    GPU spent on queued work (the gap shorter than the wait) cost nothing. A gap is at most the
    host's time between the events that bound it, the previous step's ``other_s`` and this
    step's wait: more (a gap across an epoch's validation and checkpoint, where the rank
    recorded none) is time outside every step, and is left out.
    """
    idle = starved = total = 0.0
    for data in ranks:
        before = math.inf  # the previous step's host time after its optimizer step
        for step in data.training_steps():
            gpu = data.gpu_steps.get((step.get("loader_id"), step.get("step")))
            if step.get("measured") and gpu and gpu.get("gpu_gap_s") is not None:
                gap = min(gpu["gpu_gap_s"], before + step["data_wait_s"])
                idle += gap
                starved += min(gap, step["data_wait_s"])
                total += step["data_wait_s"] + step["compute_s"] + step["other_s"]
            before = step.get("other_s") or 0.0
    if total <= 0:
        return {"gpu_idle_fraction": None, "gpu_starved_fraction": None}
    return {"gpu_idle_fraction": idle / total, "gpu_starved_fraction": starved / total}


def _throughput_rse(ranks: list[RankData], workers: Optional[int] = None,
                    skip: Optional[dict[int, frozenset[int]]] = None) -> Optional[float]:
    """Relative standard error of the probe's throughput, by batch means.

    Step times of a loader with workers are bursty (a step that waits, then several that do
    not), so single steps are poor samples; the throughputs of up to ``BLOCKS`` contiguous
    blocks of steps, each at least one round of the workers (``workers`` steps) long, are
    close to independent, and their spread gives the uncertainty of the mean. Blocks shorter
    than a round would measure where the bursts fall and overstate it several times.
    """
    steps = _global_steps(ranks, skip)
    blocks = min(BLOCKS, len(steps) // max(2, workers or 0))
    if blocks < 2:
        return None
    size = len(steps) // blocks
    rates = []
    for index in range(blocks):
        chunk = steps[index * size:(index + 1) * size]
        elapsed = sum(t for t, _ in chunk)
        if elapsed <= 0:
            return None
        rates.append(sum(n for _, n in chunk) / elapsed)
    mean = statistics.fmean(rates)
    return statistics.stdev(rates) / mean / math.sqrt(blocks) if mean > 0 else None


def _step_time_cv(ranks: list[RankData], skip: Optional[dict[int, frozenset[int]]] = None
                  ) -> Optional[float]:
    """Coefficient of variation of the per-step time of the slowest rank."""
    values = [t for t, _ in _global_steps(ranks, skip)]
    if len(values) < 2 or statistics.fmean(values) <= 0:
        return None
    return statistics.stdev(values) / statistics.fmean(values)



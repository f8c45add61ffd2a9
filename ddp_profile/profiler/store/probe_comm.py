"""Communication of one probe, from the records ``profiler.rank.comm_meter`` wrote.

``step_comm(steps)`` matches each step with DDP's reducer timers of its own backward (the
figures tagged with the step's ``ddp_n``: torch computes them one forward later) and gives
the step's *exposed* communication: the all-reduce time backward did not cover
(``comm - overlap``). It lies inside the step's ``compute_s`` (backward returns once every
bucket is reduced), so a step splits into data wait / compute / exposed comm / other.

``probe_comm(ranks)`` is the ledger entry's ``comm``, the one author of these figures (the
rules and reports read them): per-step figures (at each step timed on every rank, those of
the least exposed rank: a rank that reaches the all-reduce early also waits there for its
peers, which is imbalance, not communication; ``per_rank`` keeps each rank's own), the
gradient bytes and buckets, the achieved all-reduce bandwidth, how often gradients were
synchronised per optimizer step, and the script's own collectives and host-GPU
synchronisations (``host_syncs``) with their call sites.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Optional

NS = 1e9


def _step_time(step: dict[str, Any]) -> float:
    return step["data_wait_s"] + step["compute_s"] + step["other_s"]


def _timer_index(steps: Iterable[dict[str, Any]]) -> dict[tuple[int, int], list[int]]:
    """(module, iteration) -> [forward, backward, comm, overlap] ns, from every step."""
    index: dict[tuple[int, int], list[int]] = {}
    for step in steps:
        for entry in step.get("ddp_t") or ():
            if len(entry) == 6:
                index[(int(entry[0]), int(entry[1]))] = [int(v) for v in entry[2:]]
    return index


def step_comm(steps: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """step -> {comm_s, overlap_s, exposed_s, backward_s} for the steps whose own backward was
    timed (summed over the DDP modules synchronised in it)."""
    index = _timer_index(steps)
    found: dict[int, dict[str, float]] = {}
    if not index:
        return found
    for step in steps:
        counts = step.get("ddp_n")
        if not counts or not step.get("syncs"):
            continue
        total = {"comm_s": 0.0, "overlap_s": 0.0, "exposed_s": 0.0, "backward_s": 0.0}
        matched = False
        for module, count in enumerate(counts):
            timers = index.get((module, int(count)))
            if timers is None:
                continue
            matched = True
            _, backward, comm, overlap = timers
            total["comm_s"] += comm / NS
            total["overlap_s"] += overlap / NS
            total["exposed_s"] += max(0, comm - overlap) / NS
            total["backward_s"] += backward / NS
        if matched:
            total["exposed_s"] = min(total["exposed_s"], step["compute_s"])
            found[int(step["step"])] = total
    return found


def _mean(values: list[float]) -> Optional[float]:
    return statistics.fmean(values) if values else None


def timed_rows(steps: list[dict[str, Any]]) -> dict[int, tuple[dict[str, float], float]]:
    """One rank's measured steps whose backward was timed: step -> (``step_comm`` figures,
    the step's time)."""
    timed = step_comm(steps)
    return {int(s["step"]): (timed[int(s["step"])], _step_time(s)) for s in steps
            if s.get("measured") and int(s["step"]) in timed}


def _means(rows: list[tuple[dict[str, float], float]]) -> Optional[dict[str, Any]]:
    """Mean figures of (step_comm figures, step time) rows; None without rows."""
    if not rows:
        return None
    step_mean = statistics.fmean(t for _, t in rows)
    exposed = statistics.fmean(c["exposed_s"] for c, _ in rows)
    return {"timed_steps": len(rows), "exposed_s": exposed,
            "comm_s": statistics.fmean(c["comm_s"] for c, _ in rows),
            "overlap_s": statistics.fmean(c["overlap_s"] for c, _ in rows),
            "step_s": step_mean,
            "exposed_fraction": exposed / step_mean if step_mean > 0 else None}


def common_comm(per_rank: list[dict[int, tuple[dict[str, float], float]]]
                ) -> Optional[dict[str, Any]]:
    """Per measured step timed on every rank (``timed_rows`` of each), the figures of the rank
    that reached the all-reduce last (the least exposed: the others also waited there for it,
    which is imbalance, not communication), over the step's time on the slowest rank; None
    when no step was timed on every rank."""
    common = sorted(set.intersection(*(set(r) for r in per_rank))) if per_rank else []
    return _means([(min((r[k][0] for r in per_rank), key=lambda c: c["exposed_s"]),
                    max(r[k][1] for r in per_rank)) for k in common])


def _sync_counts(steps: list[dict[str, Any]]) -> dict[str, Optional[float]]:
    """Gradient synchronisations and forwards with grad per optimizer step."""
    measured = [s for s in steps if s.get("measured") and "ddp_n" in s]
    opt = sum(int(s.get("opt_steps") or 0) for s in measured)
    syncs = sum(int(s.get("syncs") or 0) for s in measured)
    unsynced = sum(int(s.get("unsynced") or 0) for s in measured)
    if not measured:
        return {"syncs_per_optimizer_step": None, "forwards_per_optimizer_step": None,
                "optimizer_steps": 0}
    return {"syncs_per_optimizer_step": syncs / opt if opt else None,
            "forwards_per_optimizer_step": (syncs + unsynced) / opt if opt else None,
            "optimizer_steps": opt}


def _collectives(steps: list[dict[str, Any]]) -> Optional[dict[str, float]]:
    measured = [s for s in steps if s.get("measured")]
    if not measured or not any(s.get("coll_n") for s in measured):
        return None
    calls = [int(s.get("coll_n") or 0) for s in measured]
    seconds = [float(s.get("coll_s") or 0.0) for s in measured]
    total = sum(_step_time(s) for s in measured)
    return {"per_step": statistics.fmean(calls), "seconds_per_step": statistics.fmean(seconds),
            "steps_with_calls": sum(1 for c in calls if c) / len(calls),
            "fraction": sum(seconds) / total if total > 0 else None}


def _events(ranks: list[Any], name: str) -> list[tuple[int, dict[str, Any]]]:
    return [(data.rank, event.get("data") or {}) for data in ranks for event in data.events
            if event.get("name") == name]


def _bucket_count(fact: dict[str, Any]) -> Optional[int]:
    sizes = fact.get("rebuilt_bucket_sizes") or fact.get("bucket_sizes")
    if not isinstance(sizes, str) or not sizes.strip():
        return None
    return len([s for s in sizes.split(",") if s.strip()])


def _configuration(ranks: list[Any]) -> dict[str, Any]:
    """What the DDP modules of the lowest rank that reported them say about themselves."""
    facts = sorted(_events(ranks, "ddp_config"), key=lambda item: item[0])
    if not facts:
        return {}
    rank = facts[0][0]
    mine = [f for r, f in facts if r == rank]
    first = mine[0]
    buckets = [_bucket_count(f) for f in mine]
    return {"modules": len(mine),
            "gradient_bytes": sum(int(f.get("total_parameter_size_bytes") or 0) for f in mine)
            or None,
            "buckets": sum(b for b in buckets if b) or None,
            "bucket_cap_bytes": first.get("bucket_cap_bytes"),
            "backend": first.get("backend_name"),
            "world_size": first.get("world_size"),
            "find_unused_parameters": bool(first.get("find_unused_parameters")),
            "unused_parameter_size": first.get("unused_parameter_size"),
            "gradient_as_bucket_view": bool(first.get("gradient_as_bucket_view")),
            "static_graph": bool(first.get("static_graph")),
            "can_set_static_graph": first.get("can_set_static_graph"),
            "has_sync_bn": any(bool(f.get("has_sync_bn")) for f in mine),
            "comm_hook": first.get("comm_hook"),
            "env": first.get("env") or {}}


def _sites(ranks: list[Any], name: str = "collective_site") -> list[dict[str, Any]]:
    """The script's call sites of one kind (``collective_site``, ``host_sync_site``), merged
    over ranks (calls, time and ``outside``, the calls made outside every step, summed), the
    most costly first."""
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for _rank, site in _events(ranks, name):
        key = (str(site.get("file")), int(site.get("line") or 0))
        slot = merged.setdefault(key, {**site, "file": key[0], "line": key[1], "calls": 0,
                                       "outside": 0, "seconds": 0.0, "ranks": 0})
        slot["calls"] += int(site.get("calls") or 0)
        slot["outside"] += int(site.get("outside") or 0)
        slot["seconds"] += float(site.get("seconds") or 0.0)
        slot["ranks"] += 1
    return sorted(merged.values(), key=lambda s: (-s["seconds"], -s["calls"]))[:10]


def _host_syncs(steps: list[dict[str, Any]], ranks: list[Any]) -> Optional[dict[str, Any]]:
    """The script's host-GPU synchronisations per measured step (``rank.comm_meter``), or None
    where none was counted (a CPU run, or a script that never blocks on the GPU)."""
    measured = [s for s in steps if s.get("measured")]
    counts = [int(s.get("hsync_n") or 0) for s in measured]
    if not any(counts):
        return None
    return {"per_step": statistics.fmean(counts),
            "steps_with_syncs": sum(1 for c in counts if c) / len(counts),
            "timed_seconds_per_step": statistics.fmean(
                float(s.get("hsync_s") or 0.0) for s in measured),
            "sites": _sites(ranks, "host_sync_site")}


def bandwidth(gradient_bytes: Optional[float], comm_s: Optional[float],
              world_size: Optional[int]) -> Optional[float]:
    """Achieved all-reduce bus bandwidth (bytes/s): a ring moves 2(n-1)/n of the bytes."""
    if not gradient_bytes or not comm_s or not world_size or world_size < 2 or comm_s <= 0:
        return None
    return gradient_bytes * 2 * (world_size - 1) / world_size / comm_s


def probe_comm(ranks: list[Any]) -> Optional[dict[str, Any]]:
    """The ledger entry's ``comm`` (None when the probe had no DDP and no collectives)."""
    per_rank, rows, every_step = [], [], []
    for data in ranks:
        steps = data.training_steps()
        every_step += steps
        rows.append(timed_rows(steps))
        figures = _means(list(rows[-1].values()))  # the rank's own means
        if figures is not None:
            per_rank.append({"rank": data.rank, **figures})
    config = _configuration(ranks)
    collectives = _collectives(every_step)
    host_syncs = _host_syncs(every_step, ranks)
    if not per_rank and not config and collectives is None and host_syncs is None:
        return None
    # the rank that reaches the all-reduce last waits for the transfer alone; the others also
    # wait for it: per step where every rank was timed, else the least exposed rank's means
    least = common_comm(rows) or min(per_rank, key=lambda r: r["exposed_s"], default=None)
    comm_s = least["comm_s"] if least else None
    return {
        "exposed_fraction": least["exposed_fraction"] if least else None,
        "exposed_s": least["exposed_s"] if least else None,
        "comm_s": comm_s,
        "overlap_s": least["overlap_s"] if least else None,
        "step_s": least["step_s"] if least else None,
        "timed_steps": least["timed_steps"] if least else 0,
        "bandwidth_bytes_per_s": bandwidth(config.get("gradient_bytes"), comm_s,
                                           config.get("world_size")),
        **_sync_counts(every_step),
        **config,
        "collectives": collectives,
        "sites": _sites(ranks),
        "host_syncs": host_syncs,
        "per_rank": [{"rank": r["rank"], "exposed_fraction": r["exposed_fraction"],
                      "exposed_s": r["exposed_s"]} for r in per_rank],
    }

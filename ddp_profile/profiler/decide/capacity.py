"""The input pipeline's capacity, from what producing each batch cost (pure; no I/O).

Per probe, :func:`loading_cost` turns the batch records of the training loader (see
``profiler.rank.loading.loadcost``) into CPU, runnable time (``runq``: waiting for a CPU) and
blocked waiting (storage, network, sleep, a lock) per sample; :func:`loop_demand` gives the
samples/s the loop would consume if data were free. :func:`capacity_model` then predicts, for
``w`` workers on a rank with ``C`` CPUs, ``1 / (1 / demand + cpu + wait)`` per rank at
``w = 0`` and ``min(w / (cpu + wait), C / cpu)`` from ``w = 1``, and the throughput the loop
would reach, ``min(demand, capacity)``, up to the memory bound and the cap. ``bound_of`` is the
one test of CPU-, wait- or mixed-bound loading (the climb, the summary and the rules ask it).

The model in full: docs/internals.md, "The capacity model (decide/capacity)".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Optional, Sequence

from ddp_profile.profiler.cpus import cpus_per_rank
from ddp_profile.profiler.decide.choose import ChoiceThresholds
from ddp_profile.profiler.numbers import finite_or_none
from ddp_profile.profiler.store.probes import ProbeRecord

DEFAULT_THRESHOLDS = ChoiceThresholds()
WORKER_CAP = 64  # per rank, unless the user lists worker counts
STORAGE_READ_BYTES = 4096  # per sample: reads below this say nothing of storage or the cache
RUNQ_NOTABLE_SHARE = 0.2  # producers runnable this share of their wall time: the CPUs were busy
CURVE_WORKERS = (0, 1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class LoadingCost:
    """What producing the training loader's samples cost in one probe."""

    cpu_per_sample_s: float
    wait_per_sample_s: float  # blocked: wall - CPU - runq (wall - CPU where runq is unknown)
    collate_per_sample_s: float  # wall time of collate_fn, part of the three
    samples: int  # of the batches the figures are from: the metered ones (``loadcost``)
    batches: int
    producers: int  # processes that made batches: workers, or ranks with num_workers=0
    worker_private_rss: Optional[int]  # bytes; median over the workers that reported it
    runq_per_sample_s: Optional[float] = None  # runnable, waiting for a CPU; None: unknown
    collate_cpu_per_sample_s: Optional[float] = None  # CPU of collate_fn, part of cpu
    read_per_sample_bytes: Optional[float] = None  # read() by the producers; None: unknown
    storage_per_sample_bytes: Optional[float] = None  # of it (or mmap faults) from storage

    @property
    def storage_share(self) -> Optional[float]:
        """The share of the bytes read that came from storage, not the page cache (None when
        under ``STORAGE_READ_BYTES`` a sample was read, or more came from storage than was
        read: mmap'd files)."""
        read, storage = self.read_per_sample_bytes, self.storage_per_sample_bytes
        if not read or read < STORAGE_READ_BYTES or storage is None or storage > read * 1.05:
            return None
        return min(1.0, storage / read)

    @property
    def per_sample_s(self) -> float:
        """A producer's own time per sample without CPU contention: CPU + blocked waiting."""
        return self.cpu_per_sample_s + self.wait_per_sample_s

    @property
    def cpu_share(self) -> float:
        return self.cpu_per_sample_s / self.per_sample_s if self.per_sample_s > 0 else 1.0

    @property
    def runq_share(self) -> Optional[float]:
        """The share of the producers' wall time spent runnable without a CPU."""
        if self.runq_per_sample_s is None:
            return None
        wall = self.per_sample_s + self.runq_per_sample_s
        return self.runq_per_sample_s / wall if wall > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(cpu_share=self.cpu_share, bound=bound_of(self.cpu_share),
                   runq_share=self.runq_share, storage_share=self.storage_share)
        return out


def bound_of(cpu_share: float, thresholds: ChoiceThresholds = DEFAULT_THRESHOLDS) -> str:
    """"cpu", "wait" or "mixed", from the CPU share of producing a sample."""
    if cpu_share >= thresholds.cpu_bound_share:
        return "cpu"
    return "wait" if cpu_share <= thresholds.wait_bound_share else "mixed"


def _in_window(batches: list[dict[str, Any]], since_ns: Optional[int]) -> list[dict[str, Any]]:
    """The batches made once measuring began; if too few, all but each producer's first."""
    if not batches:
        return []
    if since_ns is not None:
        recent = [b for b in batches if b.get("t_ns", 0) >= since_ns]
        if len(recent) >= 2:
            return recent
    first: dict[Any, int] = {}
    for batch in batches:
        key = batch.get("pid")
        first[key] = min(first.get(key, batch.get("t_ns", 0)), batch.get("t_ns", 0))
    rest = [b for b in batches if b.get("t_ns", 0) > first[b.get("pid")]]
    return rest or batches


def loading_cost(groups: Iterable[tuple[list[dict[str, Any]], Optional[int]]],
                 rss: Iterable[int] = ()) -> Optional[LoadingCost]:
    """CPU, runnable time and blocked waiting per sample of one loader. ``groups``: per rank,
    its ``batch_cost`` records and the wall-clock start of its first measured step (None:
    unknown); ``rss``: the workers' private RSS readings. None without a batch. The runnable
    time is that of the batches that recorded ``runq_s`` (None when none did)."""
    chosen = []
    for batches, since_ns in groups:
        chosen += _in_window([b for b in batches if b.get("samples")], since_ns)
    samples = sum(int(b["samples"]) for b in chosen)
    if not samples:
        return None
    cpu = sum(float(b.get("cpu_s") or 0.0) for b in chosen)
    wall = sum(float(b.get("wall_s") or 0.0) for b in chosen)
    collate = sum(float(b.get("collate_s") or 0.0) for b in chosen)
    cpu_timed = [float(b["collate_cpu_s"]) for b in chosen if b.get("collate_cpu_s") is not None]
    runqs = [float(b["runq_s"]) for b in chosen if b.get("runq_s") is not None]
    runq = min(sum(runqs), max(wall - cpu, 0.0)) if runqs else None
    rss = [int(r) for r in rss if r]
    io = [b for b in chosen if b.get("read_b") is not None and b.get("storage_b") is not None]
    io_samples = sum(int(b["samples"]) for b in io)
    return LoadingCost(cpu_per_sample_s=cpu / samples,
                       wait_per_sample_s=max(wall - cpu - (runq or 0.0), 0.0) / samples,
                       collate_per_sample_s=collate / samples, samples=samples,
                       batches=len(chosen), producers=len({b.get("pid") for b in chosen}),
                       worker_private_rss=int(statistics.median(rss)) if rss else None,
                       runq_per_sample_s=runq / samples if runq is not None else None,
                       collate_cpu_per_sample_s=sum(cpu_timed) / samples
                       if len(cpu_timed) == len(chosen) else None,
                       read_per_sample_bytes=sum(int(b["read_b"]) for b in io) / io_samples
                       if io_samples else None,
                       storage_per_sample_bytes=sum(int(b["storage_b"]) for b in io)
                       / io_samples if io_samples else None)


def loop_demand(steps_by_rank: Iterable[list[dict[str, Any]]]) -> Optional[float]:
    """Global samples/s of the measured steps without their data wait: what the loop
    consumes when data is free (the slowest rank sets the pace)."""
    samples, busiest = 0, 0.0
    for steps in steps_by_rank:
        measured = [s for s in steps if s.get("measured")]
        samples += sum(int(s.get("samples") or 0) for s in measured)
        busiest = max(busiest, sum(s["compute_s"] + s["other_s"] for s in measured))
    return samples / busiest if busiest > 0 and samples else None


@dataclass(frozen=True)
class RunQueue:
    """Time a probe's producers sat runnable without a CPU: direct evidence of busy CPUs."""

    per_sample_s: float
    share: float  # of the producers' wall time
    workers: int  # per rank, in that probe (0: the ranks loaded in their loops)

    @property
    def notable(self) -> bool:
        """Large enough to say the CPUs were busy (``RUNQ_NOTABLE_SHARE``)."""
        return self.share >= RUNQ_NOTABLE_SHARE


@dataclass(frozen=True)
class Capacity:
    """The capacity model of one run (global samples/s: per-rank figures x ranks)."""

    cpu_per_sample_s: float
    wait_per_sample_s: float
    cpus_per_rank: float
    ranks: int
    demand: float  # global samples/s the loop consumes with free data
    memory_workers: Optional[int]  # most workers per rank that fit in memory; None: unknown
    cap: int = WORKER_CAP
    contention: Optional[RunQueue] = None  # the probe whose producers waited most for a CPU
    pin_per_sample_s: Optional[float] = None  # one thread per rank pins every batch

    @property
    def pin_limit(self) -> float:
        """Global samples/s the ranks' pinning threads can keep up with (inf: no pinning)."""
        pin = self.pin_per_sample_s or 0.0
        return self.ranks / pin if pin > 0 else math.inf

    @property
    def cpu_share(self) -> float:
        total = self.cpu_per_sample_s + self.wait_per_sample_s
        return self.cpu_per_sample_s / total if total > 0 else 1.0

    @property
    def bound(self) -> str:
        return bound_of(self.cpu_share)

    @property
    def cpu_limit(self) -> float:
        """Global samples/s the rank's CPUs can make at most (inf when loading takes no CPU)."""
        if self.cpu_per_sample_s <= 0:
            return math.inf
        return self.ranks * self.cpus_per_rank / self.cpu_per_sample_s

    def supply(self, workers: int) -> float:
        """Global samples/s the loaders can deliver with ``workers`` per rank."""
        per_sample = self.cpu_per_sample_s + self.wait_per_sample_s
        if per_sample <= 0:
            return math.inf
        if workers <= 0:
            return self.ranks / self.in_loop_per_sample_s
        return min(self.ranks * workers / per_sample, self.cpu_limit, self.pin_limit)

    @property
    def in_loop_per_sample_s(self) -> float:
        """Time per sample a loop without workers spends loading and pinning its batches."""
        return self.cpu_per_sample_s + self.wait_per_sample_s + (self.pin_per_sample_s or 0.0)

    def throughput(self, workers: int) -> float:
        """Predicted global samples/s of the loop with ``workers`` per rank."""
        if workers <= 0:  # the loop loads (and pins) its batches itself
            return self.ranks / (self.ranks / self.demand + self.in_loop_per_sample_s)
        return min(self.demand, self.supply(workers))

    @property
    def max_workers(self) -> int:
        """The most workers per rank worth considering: memory bound and cap."""
        limit = self.cap
        if self.memory_workers is not None:
            limit = min(limit, max(self.memory_workers, 0))
        return limit

    def workers_for_demand(self) -> int:
        """The fewest workers per rank whose supply meets the demand; where the CPUs cannot,
        the fewest that saturate them. Bounded by :attr:`max_workers` (at least 1)."""
        per_sample = self.cpu_per_sample_s + self.wait_per_sample_s
        target = min(self.demand, self.cpu_limit, self.pin_limit)
        needed = math.ceil(target * per_sample / self.ranks - 1e-9) if target < math.inf else 1
        return max(1, min(needed, max(self.max_workers, 1)))

    def to_dict(self) -> dict[str, Any]:
        workers = sorted({w for w in CURVE_WORKERS if w <= max(self.max_workers, 1)}
                         | {self.workers_for_demand()})
        return {"cpu_per_sample_s": self.cpu_per_sample_s,
                "wait_per_sample_s": self.wait_per_sample_s, "cpu_share": self.cpu_share,
                "bound": self.bound, "cpus_per_rank": self.cpus_per_rank, "ranks": self.ranks,
                "demand": self.demand, "cpu_limit": finite_or_none(self.cpu_limit),
                "memory_workers": self.memory_workers, "max_workers": self.max_workers,
                "workers_for_demand": self.workers_for_demand(),
                "runq": _runq_dict(self.contention),
                "pin_per_sample_s": self.pin_per_sample_s,
                "pin_limit": finite_or_none(self.pin_limit),
                "curve": [{"num_workers": w, "supply": finite_or_none(self.supply(w)),
                           "throughput": finite_or_none(self.throughput(w))} for w in workers]}


def _runq_dict(runq: Optional[RunQueue]) -> Optional[dict[str, Any]]:
    if runq is None:
        return None
    return {**asdict(runq), "notable": runq.notable}


def most_contended(probes: Sequence[ProbeRecord]) -> Optional[RunQueue]:
    """The run-queue time of the probe whose producers were runnable the largest share of
    their wall time (None when no probe recorded it)."""
    known = [(p.loading.runq_share, p.loading.runq_per_sample_s, p) for p in probes
             if p.loading is not None and p.loading.runq_share is not None]
    if not known:
        return None
    share, per_sample, top = max(known, key=lambda found: found[0])
    return RunQueue(per_sample_s=float(per_sample), share=share,
                    workers=top.config.num_workers or 0)


def run_capacity(probes: Sequence[ProbeRecord], context: dict[str, Any],
                 local_ranks: Optional[int], ceiling: Optional[float]
                 ) -> Optional[dict[str, Any]]:
    """The input pipeline's capacity model of a run, as summary.json keeps it, or None
    (``store.summary.CapacityModel``). ``local_ranks``: the ranks that shared one host's CPUs
    (observed, else as launched)."""
    model = run_model(probes, context, local_ranks, ceiling)
    if model is None:
        return None
    return {**model.to_dict(), "demand_source": "ceiling" if ceiling else "loop",
            "measured": [{"probe": p.id, "num_workers": p.config.num_workers,
                          "throughput": p.throughput} for p in probes
                         if p.counts_for_choice and p.throughput]}


def capacity_model(probes: Sequence[ProbeRecord], cpus_per_rank: float, ranks: int,
                   memory_available: Optional[int], cap: int = WORKER_CAP,
                   ceiling: Optional[float] = None) -> Optional[Capacity]:
    """The run's model from its ok probes' ``loading`` (median CPU and least waiting per
    sample) and the
    loop's demand (the compute-only ceiling when measured, else the highest ``loop_demand``
    of a probe). None when no probe measured its loading."""
    measured = [p for p in probes if p.ok and p.loading is not None]
    if not measured or ranks < 1:
        return None
    demands = [p.host.loop_demand for p in measured if p.host.loop_demand]
    demand = ceiling or (max(demands) if demands else None)
    if not demand:
        return None
    cpu = statistics.median(p.loading.cpu_per_sample_s or 0.0 for p in measured)
    # blocked waiting (runnable time apart where recorded; where not, the waiting includes
    # it): the least contended probe shows the loader's own waiting best
    wait = min(p.loading.wait_per_sample_s or 0.0 for p in measured)
    rss = [p.loading.worker_private_rss for p in measured if p.loading.worker_private_rss]
    memory_workers = None
    if rss and memory_available:
        memory_workers = int(memory_available / ranks // max(rss))
    return Capacity(cpu_per_sample_s=cpu, wait_per_sample_s=wait,
                    cpus_per_rank=max(cpus_per_rank, 1e-9), ranks=ranks, demand=float(demand),
                    memory_workers=memory_workers, cap=cap, contention=most_contended(measured),
                    pin_per_sample_s=_median_pinning(measured))


def _median_pinning(probes: Sequence[ProbeRecord]) -> Optional[float]:
    """Median pinning time per sample of the probes that pinned (None: none did)."""
    pins = [p.loading.pin_per_sample_s for p in probes
            if p.loading is not None and p.loading.pin_per_sample_s]
    return statistics.median(pins) if pins else None


def run_model(probes: Sequence[ProbeRecord], context: dict[str, Any],
              local_ranks: Optional[int], ceiling: Optional[float] = None
              ) -> Optional[Capacity]:
    """THE capacity model of a run (the search reads it while it runs, the summary at the
    end): each rank's CPUs are the rank context's ``cpus_available`` (else ``cpu_count``)
    shared by the ``local_ranks`` that ran on one host (as observed, else as launched)."""
    ranks = int(context.get("world_size") or local_ranks or 1)
    cpus = context.get("cpus_available") or context.get("cpu_count") or 1
    return capacity_model(probes, cpus_per_rank(cpus, local_ranks or ranks), ranks,
                          context.get("memory_available"), ceiling=ceiling)

"""The typed parts of a probe record (``store.probes.ProbeRecord``): what one probe measured of
its loading, its communication, its ranks, its machine and its epochs, each parsed from the
ledger line in one place (``of``), the line's keys unchanged.

Numbers that are missing, not numbers, or NaN read as None (``number``), so that a reader
tests ``is None`` rather than the shape of a JSON value.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Optional


def number(value: Any) -> Optional[float]:
    """A finite-or-infinite float of a JSON number; None for anything else (bool, NaN, None)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and value == value else None


def count(value: Any) -> Optional[int]:
    figure = number(value)
    return int(figure) if figure is not None else None


def text(value: Any) -> Optional[str]:
    return str(value) if value is not None else None


def mapping(value: Any, what: str) -> Mapping[str, Any]:
    """A read-only copy of a JSON object (None: empty); anything else is no probe part."""
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} is no JSON object")
    return MappingProxyType(dict(value))


@dataclass(frozen=True)
class Pair:
    """A probe's place in an alternation (the claim's, a DDP option's): its role, its place
    in the order they ran, and the alternation it belongs to."""

    role: str  # "reference" | "candidate"
    index: int
    group: str

    @classmethod
    def of(cls, pair: Any) -> Optional["Pair"]:
        if not isinstance(pair, Mapping):
            return None
        return cls(str(pair.get("role")), int(pair.get("index") or 0), str(pair.get("group")))


@dataclass(frozen=True)
class Gpu:
    """What CUDA events showed of a probe's steps (None: not on CUDA)."""

    idle_fraction: Optional[float]  # the GPU idle between steps, of the step time
    starved_fraction: Optional[float]  # idle while its host waited for data

    @classmethod
    def of(cls, line: Mapping[str, Any]) -> "Gpu":
        return cls(number(line.get("gpu_idle_fraction")), number(line.get("gpu_starved_fraction")))


@dataclass(frozen=True)
class Loading:
    """The producers' measured cost per sample (``decide.capacity.LoadingCost.to_dict``, plus
    the pinning's and, where ranks differ, each rank's storage share)."""

    cpu_per_sample_s: Optional[float]
    wait_per_sample_s: Optional[float]  # blocked: wall - CPU - runq
    collate_per_sample_s: Optional[float]  # wall time of collate_fn, part of the two
    collate_cpu_per_sample_s: Optional[float]  # CPU of collate_fn, part of cpu (None: untimed)
    runq_per_sample_s: Optional[float]  # runnable, waiting for a CPU (None: unknown)
    pin_per_sample_s: Optional[float]  # the pin-memory thread's time per sample
    cpu_share: Optional[float]  # cpu / (cpu + blocked waiting)
    runq_share: Optional[float]  # of the producers' wall time, runnable without a CPU
    storage_share: Optional[float]  # of the bytes read, the share that came from storage
    read_per_sample_bytes: Optional[float]
    storage_per_sample_bytes: Optional[float]
    worker_private_rss: Optional[float]  # bytes, median over the workers that reported it
    storage_share_by_rank: Mapping[str, float]  # rank -> its share, where ranks differ

    @classmethod
    def of(cls, loading: Any) -> Optional["Loading"]:
        if not isinstance(loading, Mapping):
            return None
        by_rank = mapping(loading.get("storage_share_by_rank"), "storage_share_by_rank")
        return cls(*(number(loading.get(key)) for key in (
            "cpu_per_sample_s", "wait_per_sample_s", "collate_per_sample_s",
            "collate_cpu_per_sample_s", "runq_per_sample_s", "pin_per_sample_s", "cpu_share",
            "runq_share", "storage_share", "read_per_sample_bytes", "storage_per_sample_bytes",
            "worker_private_rss")),
            storage_share_by_rank=MappingProxyType({
                str(k): share for k, v in by_rank.items() if (share := number(v)) is not None}))


@dataclass(frozen=True)
class Communication:
    """DDP's reducer timers and the script's collectives (``store.probe_comm.probe_comm``)."""

    exposed_fraction: Optional[float]  # the all-reduce backward did not cover, of the step
    options: Optional[Mapping[str, Any]]  # the probe's DDP options (None: the script's own)
    fields: Mapping[str, Any]  # its ``comm`` summary (``store.probe_comm.probe_comm``), as recorded

    @classmethod
    def of(cls, line: Mapping[str, Any]) -> "Communication":
        options = line.get("ddp_options")
        return cls(number(line.get("comm_fraction")),
                   MappingProxyType(dict(options)) if isinstance(options, Mapping) else None,
                   mapping(line.get("comm"), "comm"))


@dataclass(frozen=True)
class RankFigures:
    """One rank's figures of a probe (a ``per_rank`` item)."""

    rank: int
    data_wait_fraction: Optional[float]
    step_time_median_s: Optional[float]

    @classmethod
    def of(cls, line: Mapping[str, Any]) -> tuple["RankFigures", ...]:
        return tuple(cls(int(r["rank"]), number(r.get("data_wait_fraction")),
                         number(r.get("step_time_median_s")))
                     for r in line.get("per_rank") or ())


@dataclass(frozen=True)
class Host:
    """What a probe's ranks had of their machine, and what its workers used of it."""

    cpus_available: Optional[float]  # the fewest CPUs a rank could use (affinity, cgroup)
    ranks_per_host: Optional[int]
    intra_op_threads: Optional[int]  # the most any rank ran with
    worker_cores: Optional[float]  # the cores its DataLoader workers were measured busy on
    loop_demand: Optional[float]  # samples/s the loop would consume if data were free
    cpu_busy: Optional[float]  # share of the CPUs available to a rank busy while measured

    @classmethod
    def of(cls, line: Mapping[str, Any]) -> "Host":
        return cls(number(line.get("cpus_available")), count(line.get("ranks_per_host")),
                   count(line.get("intra_op_threads")), number(line.get("worker_cores")),
                   number(line.get("loop_demand")), number(line.get("cpu_busy")))


@dataclass(frozen=True)
class Epochs:
    """What a probe's loader paid at its epoch boundaries (``store.epochs``)."""

    restart_s: Optional[float]  # starting its workers again, per epoch (None: no restart)
    steps: Optional[int]  # steps in an epoch, where a restart was measured
    steady_throughput: Optional[float]  # global samples/s between restarts

    @classmethod
    def of(cls, line: Mapping[str, Any]) -> Optional["Epochs"]:
        """None for a line recorded before the restarts were measured (no
        ``epoch_restart_s``)."""
        if "epoch_restart_s" not in line:
            return None
        return cls(number(line.get("epoch_restart_s")), count(line.get("epoch_steps")),
                   number(line.get("steady_throughput")))

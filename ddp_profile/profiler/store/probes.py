"""What a probe is and which probes count for what: ``Status``, ``Kind``, the predicates, and
``ProbeRecord``, the typed record of one probe that the run's readers share (the ledger line
it is made from and written back to keeps its keys).

A ledger entry (``profiler.sweep.probe.summarise_probe``; the ``probes[]`` items of
summary.json) stores ``status`` and ``kind`` as plain strings; the enums here are ``str``
subclasses, so ``entry["kind"] == Kind.THREADS`` and JSON both work unchanged.

Which probes count is decided here alone:

* ``counts_for_choice``: what the recommendation may pick (``decide.choose``): the script's
  own settings (``baseline``) and the searched ones (``sweep``), measured ok.
* ``counts_for_gate``: what the CI gate may compare or pool: those, and the ``repeat``
  launches of the recommended configuration. Never a counterfactual that runs the script
  other than the user does (``threads``: fewer intra-op threads; ``ddp``: other DDP options),
  the compute-only ``ceiling``, nor a baseline read out of the run's cache regime (``cache``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Optional

from ddp_profile.profiler.settings import LoaderSettings

if TYPE_CHECKING:
    import pandas as pd


class Status(str, Enum):
    OK = "ok"
    OOM = "oom"
    CRASH = "crash"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"  # not launched (a smaller batch size already ran out of memory)

    def __str__(self) -> str:
        return self.value


class Kind(str, Enum):
    BASELINE = "baseline"  # the script's own settings
    SWEEP = "sweep"  # a searched DataLoader configuration
    CEILING = "ceiling"  # cached batches replayed: compute-only throughput
    REPEAT = "repeat"  # the recommended configuration again, in a fresh launch (--repeat)
    THREADS = "threads"  # counterfactual: the same settings with the intra-op threads that fit
    DDP = "ddp"  # counterfactual: the same settings with other DDP options (bucket_cap_mb ...)
    PAIRED = "paired"  # the claim checked: the script's settings and the recommendation,
    # alternated in one launch (or launch by launch): read by the expected speedup only
    PERSISTENT = "persistent"  # the recommendation with and without persistent_workers=True
    # (or the script's kept settings, and a restarting configuration with it), alternated
    # launch by launch (``persistent_workers`` set on the ones with): read by the
    # persistent-workers finding, the snippet and the recommendation only
    CACHE = "cache"  # a probe that read in another page-cache state than the run's regime,
    # then measured again in it (``profiler.cache``; ``MEASURED_AS`` its own kind): read by no
    # decision

    def __str__(self) -> str:
        return self.value


Entry = Mapping[str, Any]  # a probe as the sweep holds it: its ledger line, or its ProbeRecord

CEILING_FAILED = "ceiling_failed"  # why a ceiling probe is none (it ran below a loading rate)
MEASURED_AS = "measured_as"  # the kind a probe set aside as ``cache`` was measured as

CHOICE_KINDS = (Kind.BASELINE, Kind.SWEEP)
GATE_KINDS = (Kind.BASELINE, Kind.SWEEP, Kind.REPEAT)


def data_wait_share(entry: Mapping[str, Any]) -> Optional[float]:
    """The share of each step that waiting for data costs the job: on CUDA, where each step's
    GPU gap was timed, the time the GPU sat idle while its host waited for data
    (``gpu_starved_fraction``); else the host's own wait (``data_wait_fraction``).

    A CUDA host that waits for a batch while the GPU still works through queued steps loses
    nothing: the host's wait says the loader is slow, only the GPU's says it bounds the job.
    """
    starved = entry.get("gpu_starved_fraction")
    if isinstance(starved, (int, float)) and starved == starved:
        return float(starved)
    wait = entry.get("data_wait_fraction")
    return float(wait) if isinstance(wait, (int, float)) and wait == wait else None


def is_ok(entry: Mapping[str, Any]) -> bool:
    return entry.get("status") == Status.OK


def is_measured(entry: Optional[Mapping[str, Any]]) -> bool:
    """Measured ok, with a throughput (a probe that ran but measured no step has none)."""
    return entry is not None and is_ok(entry) and bool(entry.get("throughput"))


def counts_for_choice(entry: Mapping[str, Any]) -> bool:
    """A measurement the recommendation may choose (see the module docstring)."""
    return is_ok(entry) and entry.get("kind", Kind.SWEEP) in CHOICE_KINDS


def counts_for_gate(entry: Mapping[str, Any]) -> bool:
    """A measurement the CI gate may compare or pool (see the module docstring)."""
    return is_ok(entry) and entry.get("kind", Kind.SWEEP) in GATE_KINDS


# The same predicates over the probes table (``store.results.Run.probes``: a row a probe)
def ok_mask(probes: "pd.DataFrame", kinds: Optional[Iterable[str]] = None) -> "pd.Series":
    """The rows measured ok (of ``kinds``, where given)."""
    mask = probes["status"] == Status.OK
    return mask & probes["kind"].isin(list(kinds)) if kinds is not None else mask


def choice_mask(probes: "pd.DataFrame") -> "pd.Series":
    """``counts_for_choice`` of every row."""
    return ok_mask(probes, CHOICE_KINDS)


def gate_mask(probes: "pd.DataFrame") -> "pd.Series":
    """``counts_for_gate`` of every row."""
    return ok_mask(probes, GATE_KINDS)


def latest_ceiling(entries: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The last ok compute-only measurement (a screened one may be superseded by a probe at
    the recommended batch size) that is a ceiling (``CEILING_FAILED``: one that ran below a
    rate measured with loading is none)."""
    return next((e for e in reversed(entries) if e.get("kind") == Kind.CEILING
                 and is_ok(e) and not e.get(CEILING_FAILED)), None)


# ---- the record ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Pair:
    """A probe's place in an alternation (the claim's, a DDP option's): its role, its place
    in the order they ran, and the alternation it belongs to."""

    role: str  # "reference" | "candidate"
    index: int
    group: str


@dataclass(frozen=True)
class Gpu:
    """What CUDA events showed of a probe's steps (None: not on CUDA)."""

    idle_fraction: Optional[float]  # the GPU idle between steps, of the step time
    starved_fraction: Optional[float]  # idle while its host waited for data


@dataclass(frozen=True)
class CacheMiss:
    """A probe set aside as kind ``cache``: it read out of the run's page-cache regime, and
    was measured again in it."""

    measured_as: Kind  # the kind it was measured as
    mode: Optional[str]  # the regime it missed
    storage_share: Optional[float]  # the share of its bytes read from storage


@dataclass(frozen=True)
class Loading:
    """The producers' measured cost per sample (``sweep.capacity.loading_cost``)."""

    cpu_per_sample_s: Optional[float]
    wait_per_sample_s: Optional[float]
    storage_share: Optional[float]  # of the bytes read, the share that came from storage
    read_per_sample_bytes: Optional[float]
    fields: Mapping[str, Any]  # every key, as recorded


@dataclass(frozen=True)
class Communication:
    """DDP's reducer timers and the script's collectives (``store.comm.probe_comm``)."""

    exposed_fraction: Optional[float]  # the all-reduce backward did not cover, of the step
    options: Optional[Mapping[str, Any]]  # the probe's DDP options (None: the script's own)
    fields: Mapping[str, Any]  # every key of its ``comm``, as recorded


@dataclass(frozen=True)
class RankFigures:
    """One rank's figures of a probe (a ``per_rank`` item)."""

    rank: int
    data_wait_fraction: Optional[float]
    step_time_median_s: Optional[float]


@dataclass(frozen=True)
class Host:
    """What a probe's ranks had of their machine, and what its workers used of it."""

    cpus_available: Optional[float]  # the fewest CPUs a rank could use (affinity, cgroup)
    ranks_per_host: Optional[int]
    intra_op_threads: Optional[int]  # the most any rank ran with
    worker_cores: Optional[float]  # the cores its DataLoader workers were measured busy on
    loop_demand: Optional[float]  # samples/s the loop would consume if data were free


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and value == value else None


def _count(value: Any) -> Optional[int]:
    number = _number(value)
    return int(number) if number is not None else None


class BadProbeRecord(ValueError):
    """A ledger line or summary item that is no probe (``ProbeRecord.from_json``)."""


@dataclass(frozen=True, eq=False)
class ProbeRecord(Mapping[str, Any]):
    """One probe as the ledger holds it, typed where decisions read it.

    Made from a ledger line (or a summary.json ``probes[]`` item) in one place,
    ``from_json``, and written back with ``to_json``: every key of the line is kept as it was,
    so the ledger and summary.json keep their keys. The record reads as the line (a
    read-only mapping) for the keys that have no typed field yet.
    """

    line: Mapping[str, Any]
    id: str
    kind: Kind
    status: Status
    config: LoaderSettings  # the settings that ran
    throughput: Optional[float]  # global samples/s (None unless ok)
    pair: Optional[Pair]
    gpu: Gpu
    cache: Optional[CacheMiss]
    loading: Optional[Loading]
    comm: Communication
    ranks: tuple[RankFigures, ...]
    host: Host

    @classmethod
    def from_json(cls, line: Mapping[str, Any]) -> "ProbeRecord":
        if not isinstance(line, Mapping) or line.get("id") is None:
            raise BadProbeRecord(f"a probe without an id: {str(line)[:80]}")
        try:
            return cls._typed(line)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:  # a wrong shape
            raise BadProbeRecord(f"probe {line.get('id')}: {exc}") from None

    @classmethod
    def _typed(cls, line: Mapping[str, Any]) -> "ProbeRecord":
        kind = Kind(line.get("kind") or Kind.SWEEP.value)
        status = Status(line.get("status"))
        pair = line.get("pair")
        missed = line.get("regime_miss") or {}
        loading = line.get("loading")
        comm = line.get("comm") or {}
        return cls(
            line=MappingProxyType(dict(line)), id=str(line["id"]), kind=kind, status=status,
            config=LoaderSettings.from_dict(line.get("config")),
            throughput=_number(line.get("throughput")),
            pair=Pair(str(pair.get("role")), int(pair.get("index") or 0), str(pair.get("group")))
            if isinstance(pair, Mapping) else None,
            gpu=Gpu(_number(line.get("gpu_idle_fraction")),
                    _number(line.get("gpu_starved_fraction"))),
            cache=CacheMiss(Kind(line[MEASURED_AS]), missed.get("mode"),
                            _number(missed.get("storage_share")))
            if kind == Kind.CACHE and line.get(MEASURED_AS) in Kind._value2member_map_ else None,
            loading=Loading(_number(loading.get("cpu_per_sample_s")),
                            _number(loading.get("wait_per_sample_s")),
                            _number(loading.get("storage_share")),
                            _number(loading.get("read_per_sample_bytes")),
                            MappingProxyType(dict(loading)))
            if isinstance(loading, Mapping) else None,
            comm=Communication(_number(line.get("comm_fraction")),
                               line.get("ddp_options") if isinstance(line.get("ddp_options"),
                                                                    Mapping) else None,
                               MappingProxyType(dict(comm))),
            ranks=tuple(RankFigures(int(r["rank"]), _number(r.get("data_wait_fraction")),
                                    _number(r.get("step_time_median_s")))
                        for r in line.get("per_rank") or ()),
            host=Host(_number(line.get("cpus_available")), _count(line.get("ranks_per_host")),
                      _count(line.get("intra_op_threads")),
                      _number(line.get("worker_cores")),
                      _number(line.get("loop_demand"))))

    def to_json(self) -> dict[str, Any]:
        """The ledger line, as it was read (plain JSON types)."""
        return dict(self.line)

    # the line's keys, read-only
    def __getitem__(self, key: str) -> Any:
        return self.line[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.line)

    def __len__(self) -> int:
        return len(self.line)

    # what the record counts for (the module's predicates)
    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    @property
    def measured(self) -> bool:
        return is_measured(self)

    @property
    def counts_for_choice(self) -> bool:
        return counts_for_choice(self)

    @property
    def counts_for_gate(self) -> bool:
        return counts_for_gate(self)

    @property
    def launch(self) -> str:
        """The launch that measured it: its screen's, else its own."""
        launch = self.line.get("launch")
        return launch if isinstance(launch, str) and launch else self.id

    @property
    def short(self) -> bool:
        return self.line.get("short") is True

    @property
    def epochs_throughput(self) -> Optional[float]:
        """Global samples/s over the whole epochs its measured steps spanned, by the wall clock
        (``store.epochs.whole_epochs``; None where it spanned none)."""
        return _number(self.line.get("epochs_throughput"))

    @property
    def data_wait_share(self) -> Optional[float]:
        return data_wait_share(self)


def records(lines: Iterable[Mapping[str, Any]]) -> tuple[ProbeRecord, ...]:
    """``ProbeRecord.from_json`` of every line."""
    return tuple(ProbeRecord.from_json(line) for line in lines)

"""What a probe is and which probes count for what: ``Status``, ``Kind``, the predicates, and
``ProbeRecord``, the typed record of one probe that the run's readers share (the ledger line
it is made from and written back to keeps its keys).

A ledger entry (``sweep.probe.summarise_probe``; summary.json's ``probes[]``) stores
``status`` and ``kind`` as plain strings; the enums are ``str`` subclasses, so both work
unchanged. Every reader reads a probe as a ``ProbeRecord``, made from its line in one place
(``ProbeRecord.from_json``; its parts, ``store.probe_parts``). Which probes count is decided
here alone:
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
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Sequence

from ddp_profile.profiler.settings import LoaderSettings
from ddp_profile.profiler.store.probe_parts import (
    Communication,
    Epochs,
    Gpu,
    Host,
    Loading,
    Pair,
    RankFigures,
    count,
    number,
    text,
)

if TYPE_CHECKING:
    import pandas as pd


class Status(str, Enum):
    OK = "ok"
    OOM = "oom"
    CRASH = "crash"
    TIMEOUT = "timeout"

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


CEILING_FAILED = "ceiling_failed"  # why a ceiling probe is none (it ran below a loading rate)
MEASURED_AS = "measured_as"  # the kind a probe set aside as ``cache`` was measured as

CHOICE_KINDS = (Kind.BASELINE, Kind.SWEEP)
GATE_KINDS = (Kind.BASELINE, Kind.SWEEP, Kind.REPEAT)


def data_wait_share(starved: Any, wait: Any) -> Optional[float]:
    """The share of each step that waiting for data costs the job: on CUDA, where each step's
    GPU gap was timed, the time the GPU sat idle while its host waited for data (``starved``,
    a probe's ``gpu_starved_fraction``); else the host's own wait (``wait``, its
    ``data_wait_fraction``). None where neither is a number.

    A CUDA host that waits for a batch while the GPU still works through queued steps loses
    nothing: the host's wait says the loader is slow, only the GPU's says it bounds the job.
    """
    if isinstance(starved, (int, float)) and starved == starved:
        return float(starved)
    return float(wait) if isinstance(wait, (int, float)) and wait == wait else None


def is_ok(record: Optional["ProbeRecord"]) -> bool:
    return record is not None and record.status == Status.OK


def is_measured(record: Optional["ProbeRecord"]) -> bool:
    """Measured ok, with a throughput (a probe that ran but measured no step has none)."""
    return record is not None and is_ok(record) and bool(record.throughput)


def counts_for_choice(record: "ProbeRecord") -> bool:
    """A measurement the recommendation may choose (see the module docstring)."""
    return is_ok(record) and record.kind in CHOICE_KINDS


def counts_for_gate(record: "ProbeRecord") -> bool:
    """A measurement the CI gate may compare or pool (see the module docstring)."""
    return is_ok(record) and record.kind in GATE_KINDS


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


def script_settings_probe(records: Iterable["ProbeRecord"]) -> Optional["ProbeRecord"]:
    """The probe of the script's own settings (the first of kind baseline), ok or not."""
    return next((r for r in records if r.kind == Kind.BASELINE), None)


def baseline_probe(records: Sequence["ProbeRecord"]) -> Optional["ProbeRecord"]:
    """What every gain of the run is measured against: the ok probe of the script's own
    settings, else (it failed) the first ok probe that counts for the choice; None where no
    probe did. The one lookup: the recommendation records its id (``baseline_probe_id``)."""
    own = script_settings_probe(records)
    if own is not None and own.ok:
        return own
    return next((r for r in records if r.counts_for_choice), None)


def latest_ceiling(records: Sequence["ProbeRecord"]) -> Optional["ProbeRecord"]:
    """The last ok compute-only measurement (a screened one may be superseded by a probe at
    the recommended batch size) that is a ceiling (``ceiling_failed``: one that ran below a
    rate measured with loading is none)."""
    return next((r for r in reversed(records) if r.kind == Kind.CEILING
                 and is_ok(r) and not r.ceiling_failed), None)


# ---- the record ---------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheMiss:
    """A probe set aside as kind ``cache``: it read out of the run's page-cache regime, and
    was measured again in it."""

    measured_as: Kind  # the kind it was measured as
    mode: Optional[str]  # the regime it missed
    storage_share: Optional[float]  # the share of its bytes read from storage

    @classmethod
    def of(cls, kind: Kind, line: Mapping[str, Any]) -> Optional["CacheMiss"]:
        if kind != Kind.CACHE or line.get(MEASURED_AS) not in Kind._value2member_map_:
            return None
        missed = line.get("regime_miss") or {}
        return cls(Kind(line[MEASURED_AS]), missed.get("mode"),
                   number(missed.get("storage_share")))


# the corrections of a recorded probe (``ProbeRecord.amended``; the ledger's ``amends`` lines):
# their fields written here, next to where ``from_json`` reads them
def set_aside(record: "ProbeRecord", mode: str, storage_share: Optional[float]
              ) -> dict[str, Any]:
    """``record`` read out of the run's page-cache regime (``mode``): kind ``cache``, measured
    as its own kind (``CacheMiss``)."""
    return {"kind": Kind.CACHE.value, MEASURED_AS: record.kind.value,
            "regime_miss": {"mode": mode, "storage_share": storage_share}}


def not_a_ceiling(why: str) -> dict[str, Any]:
    """A ceiling probe that ran below a rate measured with loading (``ceiling_failed``)."""
    return {CEILING_FAILED: why}


class BadProbeRecord(ValueError):
    """A ledger line or summary item that is no probe (``ProbeRecord.from_json``)."""


@dataclass(frozen=True, eq=False)
class ProbeRecord:
    """One probe as the ledger holds it, typed: every reader reads these fields.

    Made from a ledger line (or a summary.json ``probes[]`` item) in one place,
    ``from_json``, and written back with ``to_json``: ``line`` keeps every key of it as it
    was, so the ledger and summary.json keep their keys; it is there to be written, not read.
    """

    line: Mapping[str, Any]  # the line as read, for ``to_json`` and ``amended`` only
    id: str
    kind: Kind
    status: Status
    config: LoaderSettings  # the settings that ran (all None: no training loader ran)
    requested: LoaderSettings  # the settings the probe asked for
    throughput: Optional[float]  # global samples/s (None unless ok)
    launch: str  # the launch that measured it: its screen's, else its own
    screened: bool  # a window of a screen
    short: bool  # measured fewer steps than asked (the script ended first)
    short_reason: Optional[str]
    reason: Optional[str]  # why it failed (``no_dataloader`` ...)
    error: Optional[str]
    root_cause_rank: Optional[int]
    wall_s: Optional[float]  # its launch's wall time (a window's span)
    steps_asked: Optional[int]  # the measured steps it asked for (``--steps``, or more)
    warmup: Optional[int]  # the warm-up steps it ran before them
    time_to_first_batch_s: Optional[float]
    steps_measured: Optional[int]
    step_time_cv: Optional[float]
    throughput_rse: Optional[float]  # relative standard error by batch means
    data_wait_fraction: Optional[float]  # the host's wait, of the step time
    script_samples: Optional[int]  # every rank's samples over the script's whole run, where
    # its launch ran the script to its end (``store.probedir.whole_run``)
    script_run_s: Optional[float]  # ... and its seconds from the first batch to its end
    epochs_throughput: Optional[float]  # samples/s over whole epochs by the wall clock
    # (``store.epochs.whole_epochs``; None where it spanned none)
    score: Optional[float]  # throughput / the ceiling's (summary.json's items only)
    ceiling_failed: Optional[str]  # why a ceiling probe is none (``CEILING_FAILED``)
    threads: Optional[int]  # the intra-op threads it was told to run with (None: its own)
    persistent_workers: Optional[bool]  # True: run with persistent workers (None: its own)
    pair: Optional[Pair]
    gpu: Gpu
    cache: Optional[CacheMiss]
    loading: Optional[Loading]
    comm: Communication
    ranks: tuple[RankFigures, ...]
    host: Host
    epochs: Optional[Epochs]  # None: recorded before the restarts were measured

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
        launch, persistent = line.get("launch"), line.get("persistent_workers")
        return cls(
            line=MappingProxyType(dict(line)), id=str(line["id"]), kind=kind,
            status=Status(line.get("status")),
            config=LoaderSettings.from_dict(line.get("config")),
            requested=LoaderSettings.from_dict(line.get("requested")),
            throughput=number(line.get("throughput")),
            launch=launch if isinstance(launch, str) and launch else str(line["id"]),
            screened=bool(line.get("screened")), short=line.get("short") is True,
            short_reason=text(line.get("short_reason")), reason=text(line.get("reason")),
            error=text(line.get("error")), root_cause_rank=count(line.get("root_cause_rank")),
            wall_s=number(line.get("wall_s")), steps_asked=count(line.get("steps")),
            warmup=count(line.get("warmup")),
            time_to_first_batch_s=number(line.get("time_to_first_batch_s")),
            steps_measured=count(line.get("steps_measured")),
            step_time_cv=number(line.get("step_time_cv")),
            throughput_rse=number(line.get("throughput_rse")),
            data_wait_fraction=number(line.get("data_wait_fraction")),
            script_samples=count(line.get("script_samples")),
            script_run_s=number(line.get("script_run_s")),
            epochs_throughput=number(line.get("epochs_throughput")),
            score=number(line.get("score")),
            ceiling_failed=text(line.get(CEILING_FAILED) or None),
            threads=count(line.get("threads")),
            persistent_workers=persistent if isinstance(persistent, bool) else None,
            pair=Pair.of(line.get("pair")), gpu=Gpu.of(line), cache=CacheMiss.of(kind, line),
            loading=Loading.of(line.get("loading")), comm=Communication.of(line),
            ranks=RankFigures.of(line), host=Host.of(line), epochs=Epochs.of(line))

    def to_json(self) -> dict[str, Any]:
        """The ledger line, as it was read (plain JSON types)."""
        return dict(self.line)

    def amended(self, fields: Mapping[str, Any]) -> "ProbeRecord":
        """The record with ``fields`` laid over its line (``store.results.AMENDS``)."""
        return ProbeRecord.from_json({**self.line, **fields})

    # what the record counts for (the module's predicates)
    @property
    def ok(self) -> bool:
        return is_ok(self)

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
    def data_wait_share(self) -> Optional[float]:
        """``data_wait_share`` of its GPU's starved share and its host's wait."""
        return data_wait_share(self.gpu.starved_fraction, self.data_wait_fraction)


def records(lines: Iterable[Mapping[str, Any]]) -> tuple[ProbeRecord, ...]:
    """``ProbeRecord.from_json`` of every line."""
    return tuple(ProbeRecord.from_json(line) for line in lines)

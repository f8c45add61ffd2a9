"""What a probe is and which probes count for what: ``Status``, ``Kind`` and the predicates.

A ledger entry (``profiler.sweep.probe.summarise_probe``; the ``probes[]`` items of
summary.json) stores ``status`` and ``kind`` as plain strings; the enums here are ``str``
subclasses, so ``entry["kind"] == Kind.THREADS`` and JSON both work unchanged.

Which probes count is decided here alone:

* ``counts_for_choice``: what the recommendation may pick (``sweep.choose``): the script's
  own settings (``baseline``) and the searched ones (``sweep``), measured ok.
* ``counts_for_gate``: what the CI gate may compare or pool: those, and the ``repeat``
  launches of the recommended configuration. Never a counterfactual that runs the script
  other than the user does (``threads``: fewer intra-op threads; ``ddp``: other DDP options),
  the compute-only ``ceiling``, nor a baseline read out of the run's cache regime (``cache``).
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

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
    CACHE = "cache"  # a probe that read in another page-cache state than the run's regime,
    # then measured again in it (``profiler.cache``; ``MEASURED_AS`` its own kind): read by no
    # decision

    def __str__(self) -> str:
        return self.value


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

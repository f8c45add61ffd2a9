"""The run's page-cache regime: decided once, after the baseline, and applied to every probe.

Repeated probes over files meet the page cache, and a setting can look faster than it is
because its files were cached. So every probe of a run is measured in one state, the job's
own: ``warm`` (an epoch's data fits in half the memory available: before every launch the
harness reads the files the probes opened back into the cache, :func:`warm`), ``cold`` (it
does not: producers drop each file after the batch, ``ProbePlan.cache``, and the harness drops
the files before every launch, :func:`chill`), or ``as-is`` (the producers read no files, or
their reads were not measured). ``--cache auto`` decides from the baseline's bytes per sample
x the dataset's length against ``MemAvailable`` (:func:`decide`). A baseline whose reads were
not in the regime is measured again in it (the first kept as kind ``cache``); where that
misses too, the regime is not held, unless the misses were files no launch had read before
(:func:`misses_are_new_files`). The regimes in full: docs/how-it-works.md, "The page cache".
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Optional

from ddp_profile.profiler.drop_pages import drop
from ddp_profile.profiler.settings import CacheMode
from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.profiler.store.record import WORKER_DIR, read_jsonl

MODES = tuple(mode.value for mode in CacheMode)  # what ``--cache`` accepts
IN_MEMORY_READ_B = 1024  # producers reading less per sample read no files: nothing to regime
FITS_SHARE = 0.5  # of MemAvailable the data one epoch reads may take and still count as cached
CACHE_MARGIN = 0.25  # a storage share this far from the regime's is not in it
# ... but a warm read is slowed far beyond its storage share: a baseline of 64 files of
# 128 KiB a batch that took 10 % of its bytes from storage fetched a batch in 13.4 ms (8.3 ms
# of CPU) where every later launch took 3.5, and the search, measuring against it, never
# tried the batch size that plain launches run 1.5x faster
WARM_STORAGE_SHARE = 0.02
FRONTIER_SLACK = 1.5  # misses up to this times the new files' share of the bytes are theirs


@dataclass(frozen=True)
class Regime:
    requested: CacheMode  # as asked (``--cache``)
    mode: CacheMode  # as decided: COLD, WARM or AS_IS
    reason: str
    epoch_bytes: Optional[float] = None  # bytes one epoch reads, from the baseline
    memory_available: Optional[int] = None

    @property
    def cold(self) -> bool:
        return self.mode == CacheMode.COLD

    @property
    def warm(self) -> bool:
        return self.mode == CacheMode.WARM

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


AS_IS = Regime(CacheMode.AUTO, CacheMode.AS_IS, "not decided yet")


def _gb(value: float) -> str:
    return f"{value / 1e9:.2f} GB"


def decide(requested: str, baseline: ProbeRecord, dataset_len: Optional[int],
           memory: Optional[int]) -> Regime:
    """The run's regime, from the request (one of ``MODES``) and the baseline's measured
    reads."""
    asked = CacheMode(requested)
    read = baseline.loading.read_per_sample_bytes if baseline.loading is not None else None
    epoch = read * dataset_len if read is not None and dataset_len else None
    if asked != CacheMode.AUTO:
        return Regime(asked, asked, f"--cache {asked}", epoch, memory)
    if read is None:
        return Regime(asked, CacheMode.AS_IS, "the producers' reads were not measured", None,
                      memory)
    if read < IN_MEMORY_READ_B:
        return Regime(asked, CacheMode.AS_IS, f"the producers read {read:,.0f} bytes per "
                      "sample: no files to cache", epoch, memory)
    if epoch is None or not memory:
        return Regime(asked, CacheMode.AS_IS, "the dataset's length or the memory available "
                      "is unknown", epoch, memory)
    if epoch <= FITS_SHARE * memory:
        return Regime(asked, CacheMode.WARM, f"one epoch reads {_gb(epoch)}, within half the "
                      f"{_gb(memory)} available: the job reads it from the page cache from "
                      "its second epoch on", epoch, memory)
    return Regime(asked, CacheMode.COLD, f"one epoch reads {_gb(epoch)}, more than half the "
                  f"{_gb(memory)} available: the job reads it from storage every epoch",
                  epoch, memory)


def out_of_regime(regime: Regime, probe: ProbeRecord) -> bool:
    """Whether a probe read in another state than the regime's (see the docstring)."""
    share = probe.loading.storage_share if probe.loading is not None else None
    if share is None:
        return False
    if regime.cold:
        return share < 1 - CACHE_MARGIN
    if regime.warm:
        return share > WARM_STORAGE_SHARE
    return False


def misses_are_new_files(probe: ProbeRecord, probe_dir: str, before: Iterable[str]) -> bool:
    """Whether what a warm probe read from storage is accounted for by files no launch before
    it had read, so that none of them was warmed for it: their share of the bytes its producers
    read, times ``FRONTIER_SLACK``, at least its storage share. A window's workers prefetch a
    few batches further in one launch than in another, so a launch measured again can reach
    past the files warmed; the regime held, and those files are warm for the next launch."""
    share = probe.loading.storage_share if probe.loading is not None else None
    sizes = {path: _size(path) for path in recorded_files(probe_dir)}
    known = set(before)
    new = sum(size for path, size in sizes.items() if path not in known)
    return share is not None and new > 0 and share * sum(sizes.values()) <= FRONTIER_SLACK * new


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def recorded_files(probe_dir: str) -> list[str]:
    """The files a probe's producers recorded (``files`` records of ranks and workers)."""
    paths: list[str] = []
    names = [os.path.join(probe_dir, n) for n in _listdir(probe_dir) if n.endswith(".jsonl")]
    worker_dir = os.path.join(probe_dir, WORKER_DIR)
    names += [os.path.join(worker_dir, n) for n in _listdir(worker_dir) if n.endswith(".jsonl")]
    for name in names:
        records, _torn = read_jsonl(name)
        for record in records:
            if record.get("kind") == "files":
                paths.extend(p for p in record.get("paths") or [] if isinstance(p, str))
    return paths


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def warm(paths: Iterable[str], budget_bytes: Optional[float],
         chunk: int = 1 << 20) -> dict[str, Any]:
    """Read each file once, up to ``budget_bytes`` in all, so that it sits in the page cache;
    what was read, in how long."""
    started, files, read = time.monotonic(), 0, 0
    for path in paths:
        if budget_bytes is not None and read >= budget_bytes:
            break
        try:
            with open(path, "rb", buffering=0) as handle:
                while True:
                    block = handle.read(chunk)
                    if not block:
                        break
                    read += len(block)
        except OSError:
            continue
        files += 1
    return {"files": files, "bytes": read, "seconds": round(time.monotonic() - started, 3)}


def chill(paths: Iterable[str]) -> int:
    """Drop each file from the page cache (the cold regime, before a launch); how many."""
    return sum(drop(path) for path in paths)

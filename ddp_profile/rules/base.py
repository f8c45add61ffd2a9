"""What every rule shares: ``Finding``, ``Advice``, ``Thresholds``, and the words of numbers.

A rule is a pure function ``rule(run, thresholds, known=None) -> Finding | None`` over a
loaded run (``ddp_profile.profiler.store.results.Run``: its probe records and its tables) and
the evidence its alternations give (``known``, built once per evaluation). Rules do no I/O and
never plot. Each one returns ``None`` when what it needs is missing (a CPU-only run has no GPU
samples; an old run may lack ``forward_s``): no evidence, no finding. What they read of the
tables, they read through ``rules.tables``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

from ddp_profile.profiler.cache import CACHE_MARGIN
from ddp_profile.profiler.decide.choose import ChoiceThresholds
from ddp_profile.profiler.numbers import finite
from ddp_profile.profiler.settings import SETTING_KEYS, LoaderSettings
from ddp_profile.profiler.store.results import Run

SEVERITIES = ("high", "medium", "low")


@dataclass(frozen=True)
class Advice:
    """The setting a finding advises. ``rules.voice`` words it in one voice with the
    recommendation: measured (naming the probe that ran it) or a labelled prediction."""

    change: str  # e.g. "num_workers=1"
    wants: Callable[[LoaderSettings], bool]  # a probe's settings are the advised ones
    basis: str  # why it should help: the basis of a prediction
    measure: str  # ddp-profile options that would measure it, e.g. "--num-workers 0,1"
    extra: str = ""  # advice besides the setting (storage, code), kept as is
    see: tuple[str, ...] = ()  # rule ids the advice points to, named only when they fired


@dataclass(frozen=True)
class Finding:
    """One diagnosis: a stable ``rule`` id, how bad, and what to change, with the run's numbers."""

    rule: str
    severity: str  # "high" | "medium" | "low"
    title: str
    evidence: str  # a sentence citing this run's own measurements
    # what to change: DataLoader arguments or code. Empty where ``advice`` names a setting:
    # ``rules.voice`` words it then, from the one recommendation
    recommendation: str = ""
    ranks: tuple[int, ...] = ()
    advice: Optional[Advice] = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")


@dataclass(frozen=True)
class Thresholds(ChoiceThresholds):
    """Every number the rules and the recommendation decide with: ``Thresholds(**overrides)``.

    The recommendation's own (``data_wait_fraction``, ``noise_floor``, ``noise_sigmas``,
    ``clear_gain``) are inherited from ``profiler.decide.choose.ChoiceThresholds``: one set,
    which the sweep uses too.
    """

    data_wait_severe: float = 0.5  # ... and "high" severity at or above this
    cpu_saturated_percent: float = 85.0  # host cpu_percent median: CPUs saturated
    worker_cpu_saturated_share: float = 0.85  # worker CPU / cores available to the rank
    cpu_idle_percent: float = 50.0  # host cpu_percent median below this: CPUs mostly idle
    worker_cpu_idle_share: float = 0.5  # workers using less of the rank's cores: not CPU-busy
    busy_worker_cores: float = 0.5  # workers busy on fewer cores compete for no CPU
    iowait_high_percent: float = 20.0  # iowait median at or above this: waiting on storage
    workers_flat_gain: float = 1.10  # more workers gaining less than this: gain has flattened
    pin_speedup: float = 1.03  # pinned probe this much faster than its unpinned twin
    # two probes whose producers read this much more or less of their bytes from storage (not
    # the page cache) were not measured like for like (the sweep's regime uses the same margin)
    cache_margin: float = CACHE_MARGIN
    gpu_mem_unused_share: float = 0.5  # peak GPU memory below this share of the total
    batch_gain: float = 1.05  # a larger batch this much faster counts as a gain
    gpu_util_low_percent: float = 50.0  # median GPU utilisation below this is low
    straggler_steps_share: float = 0.6  # slowest rank in at least this share of steps
    straggler_excess_share: float = 0.1  # ... by at least this share of the median step
    straggler_min_s: float = 0.001  # ... and at least this many seconds
    straggler_severe_share: float = 0.25  # excess at or above this share of a step: "high"
    spike_ratio: float = 5.0  # other_s above this multiple of the median is a spike
    spike_min_s: float = 0.02  # ... and above this many seconds
    spike_share: float = 0.05  # spikes costing this share of the run trigger frequent-io
    spike_severe_share: float = 0.2
    threads_gain: float = 1.05  # fewer intra-op threads this much faster: oversubscription costs
    threads_severe_gain: float = 1.5  # ... "high" at or above this
    ceiling_share_target: float = 0.8  # below this share of the ceiling, say what would help
    comm_exposed_severe: float = 0.3  # exposed communication share of a step: "high"
    micro_batch_syncs: float = 1.5  # passes and gradient syncs per optimizer step: accumulation
    collective_share: float = 0.02  # the script's own collectives at this share of a step
    collective_severe_share: float = 0.1  # ... "medium" at or above this
    host_sync_idle_share: float = 0.05  # GPU idle between steps, not for data, with host syncs
    host_sync_severe_share: float = 0.15  # ... "medium" at or above this
    bootstrap_resamples: int = 1000
    bootstrap_seed: int = 0


# every rule: ``rule(run, thresholds, known=None) -> Finding | None`` (``known``: the run's
# evidence, ``rules.alternations.Evidence``, built once by ``rules.evaluate``; None: by the rule)
Rule = Callable[[Run, Thresholds, Any], Optional[Finding]]


# ---- numbers and their words -------------------------------------------------------------

def as_int(value: Any, default: Optional[int] = None) -> Optional[int]:
    return int(value) if finite(value) else default


def describe_config(config: Union[Mapping[str, Any], LoaderSettings]) -> str:
    """``num_workers=4, pin_memory=True, prefetch_factor=2, batch_size=64`` for settings (a
    probe's ``config``, or their dict)."""
    values = config.to_dict() if isinstance(config, LoaderSettings) else config
    parts = []
    for key in SETTING_KEYS:
        value = values.get(key)
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            parts.append(f"{key}={int(value) if isinstance(value, float) else value}")
    return ", ".join(parts) or "the script's own settings"


def pct(share: float) -> str:
    return f"{100 * share:.0f} %"


def ms(seconds: float) -> str:
    """A duration in ms, or in us where ms would read under "0.1 ms" (never "0.0 ms"); two
    decimals under 1 ms, so that 0.10 and 0.15 ms read apart."""
    if abs(seconds) < 9.5e-5:
        return f"{1e6 * seconds:.0f} us"
    return f"{1000 * seconds:.2f} ms" if abs(seconds) < 9.95e-4 else f"{1000 * seconds:.1f} ms"

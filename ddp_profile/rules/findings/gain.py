"""A loader change the recommendation measured faster, as the data-loader finding's evidence.

Below the data-wait threshold the baseline is not called data-bound, yet a change of its
loader settings may still measure faster (a wait of 19 % that one worker wins back). The
finding then reads the recommendation's own figure (``rules.recommend``: its speedup, its
interval, how it was measured): one author, so that a loader recommendation never stands
without the finding that explains it.
"""

from __future__ import annotations

from typing import Optional

from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.rules.base import Advice, Finding, Thresholds, pct
from ddp_profile.rules.recommend import Recommendation

LOADER_KEYS = ("num_workers", "pin_memory", "prefetch_factor")  # what a loader change moves


def loader_change(base: ProbeRecord, rec: Optional[Recommendation]) -> Optional[str]:
    """``num_workers=1, prefetch_factor=2``: the loader settings the recommendation changes
    from the script's own (``base``), where it measured them faster (its expected speedup
    above 1, not a comparison across cache states); None where it changes none."""
    if rec is None or rec.probe_id is None or rec.probe_id == base.id \
            or not rec.expected_speedup or rec.expected_speedup <= 1.0 \
            or rec.like_for_like is False:
        return None
    own = base.config.to_dict()
    moved = [f"{key}={rec.config.get(key)}" for key in LOADER_KEYS
             if rec.config.get(key) is not None and rec.config.get(key) != own.get(key)]
    return ", ".join(moved) or None


def measured_gain(rec: Recommendation) -> str:
    """The recommendation's own figure: "Rx [lo-hi] the script's settings, alternated with
    them" (the speedup, its interval and how it was measured)."""
    bounds = rec.expected_speedup_interval
    interval = f" [{bounds[0]:.2f}-{bounds[1]:.2f}]" if bounds else ""
    how = ("alternated with them" if rec.check and rec.check.get("alternated")
           else "in separate probes, not alternated")
    return f"{rec.expected_speedup or 1.0:.2f}x{interval} the script's settings, {how}"


def loader_change_finding(base: ProbeRecord, wait_evidence: str,
                          rec: Optional[Recommendation],
                          thresholds: Thresholds) -> Optional[Finding]:
    """The data-loader finding of a baseline that waits below ``data_wait_fraction``, where
    the recommendation changes a loader setting and measured it faster (``loader_change``);
    else None. ``wait_evidence``: the sentence of the baseline's wait."""
    change = loader_change(base, rec)
    if change is None or rec is None:
        return None
    wanted = dict(rec.config)
    return Finding(
        rule="data-loader-bound", severity="medium",
        title="The DataLoader's settings hold training back",
        evidence=(f"{wait_evidence} That is below the {pct(thresholds.data_wait_fraction)} "
                  "at which waiting alone is called data-bound, yet it costs throughput: "
                  f"{change} ran {measured_gain(rec)}."),
        advice=Advice(change=change, wants=lambda config: config.to_dict() == wanted,
                      basis=f"{change} measured faster", measure=""))

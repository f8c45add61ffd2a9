"""The straggler rule: one rank slower than the others for a reason of its own.

A rule is ``rule(run, thresholds, known) -> Finding | None`` (see ``rules.base``); it is registered
with the distributed rules (``rules.findings.distributed.RULES``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import pandas as pd

from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.alternations import Evidence
from ddp_profile.rules.base import Finding, Thresholds, ms, pct
from ddp_profile.rules.tables import baseline_probe, probe_steps
from ddp_profile.rules.threads import baseline_oversubscribed


def _per_rank_table(steps: pd.DataFrame, column: str) -> pd.DataFrame:
    """step x rank table of one per-step metric over measured steps, complete rows only."""
    table = steps.pivot_table(index="step", columns="rank", values=column, aggfunc="first")
    return table.dropna()


def _presync_steps(run: Run, probe_id: str) -> pd.DataFrame:
    """Measured steps with ``presync_s`` = data wait + forward + the previous step's other
    (less the time spent in the script's own collectives, ``coll_s``)."""
    steps = probe_steps(run, probe_id, measured_only=False).sort_values(["rank", "step"])
    if steps.empty or "forward_s" not in steps:
        return steps.iloc[0:0]
    # a rank's own work after its step, less the time it sat in the script's collectives
    # (waiting there for a slower rank is the other rank's lag, not its own)
    own_other = (steps["other_s"] - steps["coll_s"].fillna(0.0)).clip(lower=0.0) \
        if "coll_s" in steps else steps["other_s"]
    previous_other = own_other.groupby(steps["rank"]).shift(1).fillna(0.0)
    steps = steps.assign(presync_s=steps["data_wait_s"] + steps["forward_s"] + previous_other)
    return steps[steps["measured"].astype(bool)] if "measured" in steps else steps


def _excess(table: pd.DataFrame, rank: Any) -> Optional[float]:
    """The median over steps of ``rank``'s value above the other ranks' median (a step x rank
    table); None without the rank, another rank or 3 steps."""
    if rank not in table or table.shape[1] < 2 or table.shape[0] < 3:
        return None
    return float((table[rank] - table.drop(columns=[rank]).median(axis=1)).median())


def _slowest_rank(table: pd.DataFrame) -> Optional[tuple[int, float, float]]:
    """(rank, share of steps it is the slowest, median excess over the others' median)."""
    if table.shape[1] < 2 or table.shape[0] < 3:
        return None
    counts = table.idxmax(axis=1).value_counts()
    rank = counts.index[0]
    return int(rank), counts.iloc[0] / len(table), _excess(table, rank)


def straggler(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
             ) -> Optional[Finding]:
    """One rank is consistently slower and holds the others at every synchronisation.

    With DDP the fast ranks wait for the slow one inside backward, so their ``compute_s``
    absorbs the wait; the straggler is the rank with the most work before the gradient
    synchronisation: ``presync_s`` = data_wait_s + forward_s + the previous step's other_s.
    Trigger (baseline probe, >= 2 ranks, >= 3 complete measured steps): one rank has the
    largest ``presync_s`` (else, without forward_s, the largest ``compute_s``) in
    >= ``straggler_steps_share`` of the steps, and its median excess over the other ranks'
    median is >= max(``straggler_min_s``, ``straggler_excess_share`` x the median step);
    "high" at or above ``straggler_severe_share`` of a step. A rank whose loop sat runnable
    without a CPU (``runq_s``) at least half its lag longer than the others lags for CPU
    contention, and one that read from storage what the others read from the page cache for
    its cache state: "low", and it says so. Where the baseline's own ranks
    oversubscribe the CPUs (``host.baseline_oversubscribed``: the thread-oversubscription
    finding stands), a rank can lag waiting for a CPU, not for a reason of its own: the
    finding is "low" and says so.
    """
    probe = baseline_probe(run)
    if probe is None:
        return None
    presync = _presync_steps(run, probe.id)
    steps = probe_steps(run, probe.id)
    step_median = float(steps["step_s"].median())
    # with forward_s, the work before the synchronisation decides; compute_s only without it:
    # where gradients are synchronised in backward, the fast ranks' compute_s holds their wait
    # for the slow one, and the longest compute would name a rank that waits
    column, where, source = (("presync_s", "reaches the gradient synchronisation last", presync)
                             if not presync.empty and presync["presync_s"].notna().any() else
                             ("compute_s", "has the longest compute", steps))
    if source.empty or column not in source or not step_median > 0:
        return None
    found = _slowest_rank(_per_rank_table(source, column))
    if found is None:
        return None
    rank, share, excess = found
    floor = max(thresholds.straggler_min_s, thresholds.straggler_excess_share * step_median)
    if share < thresholds.straggler_steps_share or excess < floor:
        return None
    finding = _straggler_finding(rank, share, excess, step_median, where, thresholds)
    return _explained(finding, rank, run, probe, excess, thresholds)


def _explained(finding: Finding, rank: int, run: Run, probe: ProbeRecord, excess: float,
               thresholds: Thresholds) -> Finding:
    """The straggler finding, or, where the lag has an explanation outside the rank (CPU
    contention, its cache state, the job's own oversubscribed CPUs), a "low" one that says
    which and what to do first."""
    contended = _runnable_lag(run, probe, rank, excess)
    cold = None if contended else _colder_rank(run, probe, rank, excess, thresholds)
    if contended or cold:
        what, cause, first = (
            ("waiting for a CPU", f"{contended}: CPU contention explains the lag.",
             "Give each rank CPUs of its own (fewer threads or workers than cores; nothing "
             "else busy on them), then measure again") if contended else
            ("reading from storage", f"{cold}: the cache state explains the lag.",
             "Measure every rank in one cache state (--cache cold or --cache warm)"))
        return replace(finding, severity="low",
                       title=f"Rank {rank} lags {what}, not for a reason of its own",
                       evidence=f"{finding.evidence} {cause}",
                       recommendation=f"{first}; if rank {rank} still lags: "
                                      + finding.recommendation)
    if baseline_oversubscribed(run, thresholds):
        return replace(
            finding, severity="low", title=f"Rank {rank} lags on oversubscribed CPUs",
            evidence=finding.evidence + (
                " The job's own ranks oversubscribe the CPUs (see thread-oversubscription): a "
                "rank can lag waiting for a CPU, which explains this without a cause of its "
                "own."),
            recommendation=("Fit the threads to the CPUs first (see thread-oversubscription), "
                            f"then measure again; if rank {rank} still lags: "
                            f"{finding.recommendation}"))
    return finding


def _runnable_lag(run: Run, probe: ProbeRecord, rank: int, excess: float) -> Optional[str]:
    """Why a lagging rank's lag is CPU contention, or None: its loop's thread sat runnable
    without a CPU (``runq_s``, from the scheduler's own counter) longer than the other ranks'
    by at least half its lag, in the median step of those that read it (a sample of the
    steps, the same on every rank: ``stepclock.runq_sampled``)."""
    steps = probe_steps(run, probe.id)
    if "runq_s" not in steps or steps["runq_s"].isna().all():
        return None
    lag = _excess(_per_rank_table(steps, "runq_s"), rank)
    if lag is None or lag < 0.5 * excess:
        return None
    return (f"Its loop sat runnable, waiting for a CPU, {ms(lag)}/step longer than the other "
            f"ranks' (the scheduler's run-queue time of its thread)")


def _colder_rank(run: Run, probe: ProbeRecord, rank: int, excess: float,
                 thresholds: Thresholds) -> Optional[str]:
    """Why a lagging rank's lag is its cache state, or None: its producers read from storage
    a share of their bytes ``cache_margin`` above the other ranks' median (the rest came from
    the page cache), and it waited for data at least half its lag longer than they did."""
    loading = probe.loading
    shares = loading.storage_share_by_rank if loading is not None else {}
    mine = shares.get(str(rank))
    others = [v for k, v in shares.items() if k != str(rank)]
    if mine is None or not others:
        return None
    rest = float(pd.Series(others).median())
    if float(mine) - rest < thresholds.cache_margin:
        return None
    waited = _excess(_per_rank_table(probe_steps(run, probe.id), "data_wait_s"), rank)
    if waited is None or waited < 0.5 * excess:
        return None
    return (f"Its loading read {pct(float(mine))} of its bytes from storage, the other ranks' "
            f"{pct(rest)} (the rest from the page cache), and it waited {ms(waited)}/step "
            "longer for data")


def _straggler_finding(rank: int, share: float, excess: float, step_median: float,
                       where: str, thresholds: Thresholds) -> Finding:
    severe = excess >= thresholds.straggler_severe_share * step_median
    return Finding(
        rule="straggler", severity="high" if severe else "medium",
        title=f"Rank {rank} is a straggler",
        evidence=(f"Rank {rank} {where} in {pct(share)} of measured steps, {ms(excess)}/step "
                  f"behind the other ranks' median ({pct(excess / step_median)} of a "
                  f"{ms(step_median)} step); every other rank waits for it."),
        recommendation=(f"Find what differs on rank {rank}: its GPU or node (clocks, thermal "
                        "throttling, a shared PCIe link, other jobs), a data shard with larger "
                        "samples, or extra work done only on that rank inside the step."),
        ranks=(rank,))

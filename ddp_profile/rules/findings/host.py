"""Rules about the host: CPU oversubscription and periodic host work between steps.

Each rule is ``rule(run, thresholds, known) -> Finding | None`` (see ``rules.base``). The
thread pools' finding is ``rules.threads``'s (the recommendation's notes cite it), registered
here.
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.alternations import Evidence
from ddp_profile.rules.base import (
    Advice,
    Finding,
    Thresholds,
    ms,
    pct,
)
from ddp_profile.rules.tables import (
    baseline_probe,
    cpus_available,
    local_ranks,
    probe_steps,
)
from ddp_profile.rules.threads import thread_oversubscription


def worker_oversubscription(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                            ) -> Optional[Finding]:
    """More DataLoader workers on a machine than it has CPUs.

    Trigger: the baseline probe's ``num_workers`` x local ranks (``nproc_per_node``, else the
    ranks sharing a hostname) > ``cpus_available`` of the rank's context (else ``cpu_count``),
    and the workers were measured busy: the probe's ``worker_cores`` (``sweep.probe``: the CPU
    their batches cost on this machine) is at least ``busy_worker_cores`` cores. Workers that
    mostly sit idle compete for nothing. "high" when more than twice the CPUs.
    """
    probe = baseline_probe(run)
    if probe is None:
        return None
    workers = probe.config.num_workers
    cpus = cpus_available(run, probe.id)
    if not workers or not cpus:
        return None
    nproc = local_ranks(run, probe.id)
    total = workers * nproc
    if total <= cpus:
        return None
    busy = probe.host.worker_cores
    if busy is not None and busy < thresholds.busy_worker_cores:
        return None
    fitting = max(1, cpus // nproc - 1)
    measured = f" (measured busy on {busy:.1f} cores)" if busy is not None else ""
    return Finding(
        rule="worker-oversubscription",
        severity="high" if total > 2 * cpus else "medium",
        title="More DataLoader workers than CPUs",
        evidence=(f"{nproc} rank(s) per machine x num_workers={workers} = {total} worker "
                  f"processes{measured} compete for {cpus} available CPUs."),
        advice=Advice(
            change=f"num_workers={fitting} (CPUs // ranks per machine - 1 for the main process)",
            wants=lambda config: (config.num_workers or 0) * nproc <= cpus,
            basis=f"{total} worker processes compete for {cpus} CPUs",
            measure=f"--num-workers {fitting},{workers}"))


def _rank_spikes(steps: pd.DataFrame, thresholds: Thresholds) -> Optional[dict]:
    """Spikes of ``other_s`` in one rank's steps and what they cost, or None."""
    run_s = float(steps["step_s"].sum())
    if len(steps) < 3 or run_s <= 0:
        return None
    median = float(steps["other_s"].median())
    limit = max(thresholds.spike_ratio * median, thresholds.spike_min_s)
    spikes = steps[steps["other_s"] > limit].sort_values("step")
    if len(spikes) < 2:
        return None
    cost = float((spikes["other_s"] - median).sum())
    period = float(spikes["step"].diff().dropna().median())
    return {"share": cost / run_s, "count": len(spikes), "period": period,
            "spike_s": float(spikes["other_s"].median()), "median_s": median}


def frequent_io(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                ) -> Optional[Finding]:
    """Periodic spikes of host work between steps (logging, checkpoints, evaluation).

    Trigger: on some rank of the baseline probe, at least two measured steps have ``other_s``
    above ``spike_ratio`` x that rank's median ``other_s`` and above ``spike_min_s``, and the
    excess over the median costs >= ``spike_share`` of the rank's measured step time; "high"
    at or above ``spike_severe_share``. The period is the median gap between spikes in steps.
    """
    probe = baseline_probe(run)
    if probe is None:
        return None
    steps = probe_steps(run, probe.id)
    found = {}
    for rank, rows in steps.groupby("rank"):
        spikes = _rank_spikes(rows, thresholds)
        if spikes and spikes["share"] >= thresholds.spike_share:
            found[int(rank)] = spikes
    if not found:
        return None
    worst_rank = max(found, key=lambda r: found[r]["share"])
    worst = found[worst_rank]
    return Finding(
        rule="frequent-io",
        severity="high" if worst["share"] >= thresholds.spike_severe_share else "medium",
        title="Periodic host work between steps",
        evidence=(f"On rank {worst_rank}, {worst['count']} steps, about every "
                  f"{worst['period']:.0f} steps, spend {ms(worst['spike_s'])} between steps "
                  f"against a median of {ms(worst['median_s'])}: {pct(worst['share'])} of the "
                  "measured time."),
        recommendation=("Make the periodic work cheaper or rarer: log and checkpoint less "
                        "often, only on rank 0, asynchronously (torch.distributed.checkpoint."
                        "async_save, a background writer thread), and avoid .item()/.cpu() "
                        "syncs in the logging path."),
        ranks=tuple(sorted(found)))


RULES = [thread_oversubscription, worker_oversubscription, frequent_io]

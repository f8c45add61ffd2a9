"""Rules about the input pipeline: is the loop waiting on data, and why.

Each rule is ``rule(run, thresholds, known) -> Finding | None`` (see ``rules.base``); the loading
in words (its cost, its bound, the fixes) is ``rules.loading``'s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ddp_profile.profiler.decide.worker_restarts import restart_bound
from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.alternations import Evidence
from ddp_profile.rules.base import (
    Advice,
    Finding,
    Thresholds,
    describe_config,
    finite,
    ms,
    pct,
)
from ddp_profile.rules.cpuload import cpu_load
from ddp_profile.rules.findings.gain import loader_change, loader_change_finding, measured_gain
from ddp_profile.rules.loading import (
    CPU_FIX,
    IO_FIX,
    capacity_of,
    cpu_cost,
    loading_bound,
    loading_evidence,
    predicted_workers,
    storage_evidence,
)
from ddp_profile.rules.recommend import Recommendation
from ddp_profile.rules.tables import (
    baseline_probe,
    data_wait,
    fastest,
    gpu_timed,
    is_data_bound,
    metric,
    ok_probes,
    storage_caveat,
)
from ddp_profile.rules.threads import baseline_oversubscribed


def _measured_workers(run: Run) -> set[int]:
    return {p.config.num_workers for p in ok_probes(run) if p.config.num_workers is not None}


def _with_workers(run: Run) -> list[ProbeRecord]:
    return [p for p in ok_probes(run)
            if p.config.num_workers is not None and finite(p.throughput)]


def most_workers_probe(run: Run) -> Optional[ProbeRecord]:
    """The ok probe with the most DataLoader workers: on a tie, one with host samples, fastest."""
    probes = _with_workers(run)
    if not probes:
        return None
    most = max(p.config.num_workers for p in probes)
    top = [p for p in probes if p.config.num_workers == most]
    sampled = [p for p in top if metric(run, p.id, "host", "cpu_percent") is not None
               or metric(run, p.id, "host", "worker_cpu_percent") is not None]
    return fastest(sampled or top)


def fewer_workers_probe(run: Run, probe: ProbeRecord) -> Optional[ProbeRecord]:
    """The fastest ok probe with the next smaller worker count than ``probe``'s."""
    workers = probe.config.num_workers
    probes = [p for p in _with_workers(run) if workers is not None
              and p.config.num_workers < workers]
    if not probes:
        return None
    below = max(p.config.num_workers for p in probes)
    return fastest(p for p in probes if p.config.num_workers == below)


def data_loader_bound(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                      ) -> Optional[Finding]:
    """The baseline probe waits on the DataLoader for a significant share of each step, or
    a change of its loader settings measured faster.

    Trigger: the share of each step that the baseline's data wait costs (``base.data_wait``:
    the ranks' wait / step time over the measured steps of all ranks; on CUDA the GPU's idle
    time while its host waited) >= ``data_wait_fraction``; "high" at or above
    ``data_wait_severe``. Below it, where the recommendation (``known.recommendation``)
    changes a loader setting and measured it faster (``loader_change``): "medium", its figure
    the evidence, so that a loader recommendation never stands without the finding that
    explains it. Where the loading is neither CPU- nor wait-bound (mixed: no finding of its
    own), the evidence says what the producers read and how much from storage.
    """
    probe = baseline_probe(run)
    measured = data_wait(run, probe) if probe is not None else None
    if measured is None:
        return None
    rec = known.recommendation if known is not None else None
    if measured[0] < thresholds.data_wait_fraction:
        return loader_change_finding(probe, _wait_evidence(run, probe, *measured), rec,
                                     thresholds)
    fraction, per_step = measured
    evidence = _wait_evidence(run, probe, fraction, per_step)
    capacity = capacity_of(run)
    enough = _enough_workers(run, probe)
    if capacity is None or loading_bound(capacity, thresholds) == "mixed":
        # mixed loading: no cpu- or io-bound finding says what the producers read
        evidence += storage_evidence(probe)
    return Finding(
        rule="data-loader-bound",
        severity="high" if fraction >= thresholds.data_wait_severe else "medium",
        title="Training waits on the DataLoader",
        evidence=evidence,
        # more workers advised: worded from the recommendation (rules.voice); else its own
        recommendation=_loading_advice(run, probe, rec) if enough else "",
        advice=None if enough else _more_workers(run, probe, fraction))


def _wait_evidence(run: Run, probe: ProbeRecord, fraction: float, per_step: float) -> str:
    seconds = f" ({ms(per_step)} per step)" if finite(per_step) else ""
    if gpu_timed(run, probe):
        return (f"With {describe_config(probe.config)} the GPU sits idle {pct(fraction)} of "
                f"each measured step while its rank waits for the next batch{seconds}, timed "
                f"on the GPU (CUDA events); the ranks wait {pct(probe.data_wait_fraction)} "
                "of each step in all.")
    return (f"With {describe_config(probe.config)} the ranks spend {pct(fraction)} of each "
            f"measured step waiting for the next batch{seconds}.")


def _enough_workers(run: Run, baseline: ProbeRecord) -> bool:
    """The capacity model predicts no more workers than the baseline already runs (the CPUs
    or the memory are the limit): advising more workers would contradict it."""
    capacity = capacity_of(run)
    return capacity is not None and \
        capacity["workers_for_demand"] <= (baseline.config.num_workers or 0)


def _more_workers(run: Run, baseline: ProbeRecord, fraction: float) -> Advice:
    """More workers, as many as the measured loading capacity predicts when it is known."""
    workers = baseline.config.num_workers or 0
    capacity = capacity_of(run)
    more = capacity["workers_for_demand"] if capacity is not None else max(2, 2 * workers)
    basis = f"the ranks wait {pct(fraction)} of each step for data"
    if capacity is not None:
        basis += f"; {predicted_workers(capacity)}"
    return Advice(
        change=(f"load in parallel and ahead (e.g. num_workers={more}, "
                "persistent_workers=True)"),
        wants=lambda config: (config.num_workers or 0) > workers,
        basis=basis,
        measure=f"--num-workers {workers},{more}",
        see=("cpu-bound-preprocessing", "io-bound-loading"))


def _loading_advice(run: Run, baseline: ProbeRecord, rec: Optional[Recommendation]) -> str:
    """Where the capacity model predicts no more workers than the baseline runs: what the
    sweep measured, when it measured something better (the recommendation's figure, where
    given); else what limits the loading."""
    probes = ok_probes(run)
    change = loader_change(baseline, rec)
    if rec is not None and change is not None:
        return (f"Measured: {change} runs {measured_gain(rec)}; use the recommended "
                "configuration below.")
    if rec is not None and rec.probe_id == baseline.id and len(probes) > 1:
        return "None of the measured settings loaded faster than the script's own."
    best = fastest(probes) if rec is None else None
    if best is not None and finite(baseline.throughput) and baseline.throughput > 0:
        gain = best.throughput / baseline.throughput
        if best.id != baseline.id and gain >= 1.05:
            return (f"Measured: {describe_config(best.config)} runs {gain:.2f}x faster than "
                    f"the script's settings; use the recommended configuration below.")
        if len(probes) > 1:
            return "None of the measured settings loaded faster than the script's own."
    workers = baseline.config.num_workers or 0
    capacity = capacity_of(run)
    assert capacity is not None  # _enough_workers holds
    return (f"More workers are not predicted to help: {predicted_workers(capacity)}, and "
            f"the script runs {workers} already. What limits the loading is the cost of "
            f"each sample: {loading_evidence(capacity)}.")


def _workers_flattened(run: Run, probe: ProbeRecord, thresholds: Thresholds
                       ) -> Optional[str]:
    """Evidence that more workers stopped helping, or None if they still help."""
    fewer = fewer_workers_probe(run, probe)
    if fewer is None or not fewer.throughput > 0:
        return "no probe with fewer workers was measured to compare"
    gain = probe.throughput / fewer.throughput
    still_bound = is_data_bound(run, probe, thresholds)
    if gain >= thresholds.workers_flat_gain and not still_bound:
        return None
    text = (f"going from {fewer.config.num_workers} to {probe.config.num_workers} "
            f"workers changed throughput {gain:.2f}x")
    if still_bound:
        text += f", with the ranks still waiting {pct(data_wait(run, probe)[0])} of each step"
    return text


def cpu_bound_preprocessing(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                            ) -> Optional[Finding]:
    """Data-bound, and producing a sample is mostly CPU work.

    Trigger: the baseline is data-bound and the measured loading (``summary.capacity``: thread
    CPU vs CPU + blocked waiting of producing each batch, where it is made; time runnable
    without a CPU is contention, not waiting) is CPU-bound (CPU share >=
    ``Thresholds.cpu_bound_share``, ``loading_bound``). Runs recorded without batch costs fall
    back to the CPU load of the probe with the most workers (saturated, and more workers
    stopped helping).
    """
    base = baseline_probe(run)
    if base is None or not is_data_bound(run, base, thresholds):
        return None
    capacity = capacity_of(run)
    if capacity is not None:
        caveat = storage_caveat(run, base, thresholds)
        return _cpu_bound_from_capacity(run, base, capacity, caveat, thresholds)
    probe = most_workers_probe(run)
    if probe is None:
        return None
    load = cpu_load(run, probe)
    if not load.saturated(thresholds):
        return None
    flat = _workers_flattened(run, probe, thresholds)
    if flat is None:
        return None
    return Finding(
        rule="cpu-bound-preprocessing", severity="high",
        title="Preprocessing saturates the CPUs",
        evidence=(f"With {probe.config.num_workers} workers the CPUs are saturated "
                  f"({load.describe()}) and {flat}."),
        recommendation=CPU_FIX[0].upper() + CPU_FIX[1:] + ".")


def _cpu_bound_from_capacity(run: Run, base: ProbeRecord, capacity: dict, caveat: str,
                             thresholds: Thresholds) -> Optional[Finding]:
    """``caveat``: the baseline read from storage what the model's probes read warm ("": no)."""
    if loading_bound(capacity, thresholds) != "cpu":
        return None
    limit, demand = capacity.get("cpu_limit"), capacity["demand"]
    saturated = finite(limit) and limit < demand
    what, fix = cpu_cost(base)
    finding = Finding(
        rule="cpu-bound-preprocessing", severity="high" if saturated else "medium",
        title=(f"Loading is CPU-bound: {what} limits it" if caveat else
               f"Loading is CPU-bound: {what}, not storage, limits it"),
        evidence=(f"Measured where the batches are made: {loading_evidence(capacity)}."
                  + storage_evidence(base) + caveat),
        recommendation=f"More workers cannot help once the CPUs are full: {fix}.")
    if saturated:
        return finding
    workers = base.config.num_workers or 0
    more = capacity["workers_for_demand"]
    if more <= workers:
        return finding
    # the CPUs can keep up with more workers: worded from the recommendation (rules.voice)
    return replace(finding, recommendation="", advice=Advice(
        change=f"num_workers={more}",
        wants=lambda config: (config.num_workers or 0) >= more,
        basis=f"{loading_evidence(capacity)}; {predicted_workers(capacity)}",
        measure=f"--num-workers {workers},{more}", extra=f"To need fewer cores: {fix}."))


def io_bound_loading(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                     ) -> Optional[Finding]:
    """Data-bound, and producing a sample is mostly waiting (storage, network, sleep).

    Trigger: the baseline is data-bound and the measured loading (``summary.capacity``) is
    wait-bound (CPU share <= ``Thresholds.wait_bound_share``, ``loading_bound``). Runs
    recorded without batch costs fall back to the CPU load of the probe with the most workers
    (still data-bound while the loading is not CPU-busy or iowait is high). No finding beside
    ``thread-oversubscription`` of the baseline's own ranks (``host.baseline_oversubscribed``):
    on oversubscribed CPUs the waiting can include waiting for a CPU (where the run queue was
    not recorded, and a producer blocked on its own busy intra-op threads).
    """
    base = baseline_probe(run)
    if base is None or not is_data_bound(run, base, thresholds):
        return None
    if baseline_oversubscribed(run, thresholds):
        return None  # waiting for a CPU cannot be told from waiting on storage
    capacity = capacity_of(run)
    if capacity is not None:
        return _wait_bound_from_capacity(run, base, capacity, thresholds)
    probe = most_workers_probe(run)
    if probe is None or not is_data_bound(run, probe, thresholds):
        return None
    load = cpu_load(run, probe)
    waiting = (load.iowait_percent is not None
               and load.iowait_percent >= thresholds.iowait_high_percent)
    idle = (probe.config.num_workers or 0) > 0 and load.idle(thresholds)
    if not (waiting or idle):
        return None
    fraction = data_wait(run, probe)[0]
    workers = probe.config.num_workers or 0
    return Finding(
        rule="io-bound-loading",
        severity="high" if fraction >= thresholds.data_wait_severe else "medium",
        title="Loading waits on storage, not on the CPUs",
        evidence=(f"With {workers} workers the ranks still wait {pct(fraction)} of each step "
                  f"for data while the loading is not CPU-busy ({load.describe()})."),
        advice=Advice(
            change=f"num_workers={max(2, 2 * workers)}, prefetch_factor=4 to overlap more reads",
            wants=lambda config: (config.num_workers or 0) >= max(2, 2 * workers),
            basis=f"with {workers} workers the loading waits without using the CPUs",
            measure=f"--num-workers {workers},{max(2, 2 * workers)}",
            extra=f"Or, {IO_FIX}."))


def held_by_restarts(run: Run, baseline: ProbeRecord) -> Optional[tuple[ProbeRecord, float]]:
    """A worker probe whose restart every epoch holds every worker count below the
    baseline even with data free (``worker_restarts.restart_bound``), the fewest workers first, with
    that bound; None where none does."""
    if not baseline.measured or not baseline.throughput:
        return None
    for record in sorted(run.records, key=lambda r: r.config.num_workers or 0):
        if record.kind != Kind.SWEEP or not record.measured or not record.config.num_workers:
            continue
        bound = restart_bound(record, baseline)
        if bound is not None and bound <= baseline.throughput:
            return record, bound
    return None


def _wait_bound_from_capacity(run: Run, base: ProbeRecord, capacity: dict,
                              thresholds: Thresholds) -> Optional[Finding]:
    if loading_bound(capacity, thresholds) != "wait":
        return None
    fraction = data_wait(run, base)[0]
    workers = capacity["workers_for_demand"]
    most = max(_measured_workers(run), default=0)
    past = ", past the CPU count" if max(most, workers) > capacity["cpus_per_rank"] else ""
    held = held_by_restarts(run, base)
    if held is not None:
        probe, bound = held
        overlap = (f"More workers only pay here kept alive: they start again every epoch, and "
                   f"probe {probe.id} ({describe_config(probe.config.to_dict())}) paid "
                   f"{probe.epochs.restart_s:.2f} s a restart, so that with data free no "
                   f"worker count restarting so runs faster than the script's settings (at "
                   f"most {bound:,.0f} samples/s against {float(base.throughput):,.0f}; "
                   "see persistent-workers)")
    elif most >= workers:
        overlap = (f"Loading overlaps with more workers{past}: up to num_workers={most} was "
                   "measured; the recommendation below chooses among what was measured")
    else:
        overlap = f"Loading overlaps with more workers{past}: {predicted_workers(capacity)}"
    return Finding(
        rule="io-bound-loading",
        severity="high" if fraction >= thresholds.data_wait_severe else "medium",
        title="Loading waits (storage, network, latency), not the CPUs",
        evidence=(f"The baseline waits {pct(fraction)} of each step for data. Measured where "
                  f"the batches are made: {loading_evidence(capacity)}."
                  + storage_evidence(base) + storage_caveat(run, base, thresholds)),
        recommendation=f"{overlap}. Or, {IO_FIX}.")


RULES = [data_loader_bound, cpu_bound_preprocessing, io_bound_loading]

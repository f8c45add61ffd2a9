"""Rules about the input pipeline: is the loop waiting on data, and why.

Each rule is ``rule(run, thresholds) -> Finding | None`` (see ``rules.base``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import pandas as pd

from ddp_profile.profiler.cache import IN_MEMORY_READ_B
from ddp_profile.profiler.decide.capacity import STORAGE_READ_BYTES, bound_of
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.base import (
    Advice,
    Finding,
    Thresholds,
    as_int,
    baseline_probe,
    data_wait,
    describe_config,
    finite,
    gpu_timed,
    is_data_bound,
    loading_of,
    metric,
    ms,
    ok_probes,
    pct,
    storage_caveat,
)
from ddp_profile.rules.cpuload import cpu_load
from ddp_profile.rules.host import baseline_oversubscribed


def capacity_of(run: Run) -> Optional[dict]:
    """The run's measured loading capacity (``summary.capacity``, see ``decide.capacity``)."""
    capacity = run.summary.get("capacity")
    return capacity if isinstance(capacity, dict) and finite(capacity.get("cpu_share")) \
        else None


def loading_bound(capacity: dict, thresholds: Thresholds) -> str:
    """"cpu", "wait" or "mixed": decided here, from the measured CPU share of producing a
    sample and the rules' thresholds (``decide.capacity.bound_of``, the test the climb asks
    with the same thresholds)."""
    return bound_of(float(capacity["cpu_share"]), thresholds)


def _rate(value: Optional[float]) -> str:
    return f"{value:,.0f} samples/s" if finite(value) else "an unbounded rate"


def loading_evidence(capacity: dict) -> str:
    """What producing a sample costs and what that allows, from the capacity model."""
    cpu, wait = capacity["cpu_per_sample_s"], capacity["wait_per_sample_s"]
    cpus, ranks = capacity["cpus_per_rank"], capacity["ranks"]
    text = (f"producing a sample takes {ms(cpu)} of CPU and {ms(wait)} of waiting "
            f"({pct(capacity['cpu_share'])} CPU); the {cpus:g} CPU(s) per rank can produce at "
            f"most {_rate(capacity.get('cpu_limit'))} over {ranks} rank(s); the loop consumes "
            f"{_rate(capacity['demand'])}")
    return text + _runnable_evidence(capacity)


def _runnable_evidence(capacity: dict) -> str:
    """The time producers sat runnable without a CPU, where notable: the CPUs were busy."""
    runq = capacity.get("runq") or {}
    if not runq.get("notable"):
        return ""
    where = (f"with {runq['workers']} worker(s) per rank" if runq.get("workers")
             else "loading in the ranks' loops")
    return (f"; {where}, the producers also sat {ms(runq['per_sample_s'])} per sample "
            f"runnable, waiting for a CPU ({pct(runq['share'])} of their time): the CPUs "
            "were saturated (not counted as waiting)")


def storage_evidence(run: Run, base: pd.Series) -> str:
    """What the baseline's producers read per sample and how much of it came from storage
    (MB/s from disk at the baseline's rate), where they read files ("" otherwise)."""
    loading = loading_of(run, base["id"])
    if loading is None:
        return ""
    read, storage = loading.read_per_sample_bytes, loading.storage_per_sample_bytes
    share = loading.storage_share
    if not (finite(read) and finite(share) and finite(storage)) or read < STORAGE_READ_BYTES:
        return ""
    text = f" The baseline's producers read {read / 1024:,.0f} KiB per sample, {pct(share)} " \
           "of it from storage"
    rate = base.get("throughput")
    if share < 0.05 or not finite(rate):
        return text + " (the rest from the page cache)."
    wait = loading.wait_per_sample_s
    return (text + f": {storage * float(rate) / 1e6:,.1f} MB/s from storage at its "
            f"{float(rate):,.0f} samples/s"
            + (f", {ms(wait)} of blocked waiting per sample" if finite(wait) else "") + ".")


def predicted_workers(capacity: dict) -> str:
    """The worker count the model predicts, labelled as a prediction with its basis."""
    workers = capacity["workers_for_demand"]
    one = 1.0 / (capacity["cpu_per_sample_s"] + capacity["wait_per_sample_s"])
    basis = (f"each worker makes {one:,.0f} samples/s; the loop consumes "
             f"{_rate(capacity['demand'])} over {capacity['ranks']} rank(s)")
    if capacity.get("cpu_limit") and capacity["cpu_limit"] < capacity["demand"]:
        basis += f"; the CPUs saturate at {_rate(capacity['cpu_limit'])}"
    if capacity.get("memory_workers") is not None and \
            capacity["memory_workers"] <= workers:
        basis += f"; memory holds at most {capacity['memory_workers']} workers per rank"
    return f"num_workers={workers} per rank (predicted, not measured: {basis})"


def _measured_workers(run: Run) -> set[int]:
    probes = ok_probes(run)
    return {int(w) for w in probes["num_workers"] if finite(w)}


def most_workers_probe(run: Run) -> Optional[pd.Series]:
    """The ok probe with the most DataLoader workers: on a tie, one with host samples, fastest."""
    probes = ok_probes(run)
    probes = probes[probes["num_workers"].apply(finite) & probes["throughput"].apply(finite)]
    if probes.empty:
        return None
    top = probes[probes["num_workers"] == probes["num_workers"].max()]
    sampled = top[top["id"].apply(lambda pid: metric(run, pid, "host", "cpu_percent") is not None
                                  or metric(run, pid, "host", "worker_cpu_percent") is not None)]
    top = sampled if not sampled.empty else top
    return top.loc[top["throughput"].idxmax()]


def fewer_workers_probe(run: Run, probe: pd.Series) -> Optional[pd.Series]:
    """The fastest ok probe with the next smaller worker count than ``probe``'s."""
    probes = ok_probes(run)
    probes = probes[probes["num_workers"].apply(finite) & probes["throughput"].apply(finite)]
    probes = probes[probes["num_workers"] < probe["num_workers"]]
    if probes.empty:
        return None
    below = probes[probes["num_workers"] == probes["num_workers"].max()]
    return below.loc[below["throughput"].idxmax()]


def data_loader_bound(run: Run, thresholds: Thresholds) -> Optional[Finding]:
    """The baseline probe waits on the DataLoader for a significant share of each step.

    Trigger: the share of each step that the baseline's data wait costs (``base.data_wait``:
    the ranks' wait / step time over the measured steps of all ranks; on CUDA the GPU's idle
    time while its host waited) >= ``data_wait_fraction``; "high" at or above
    ``data_wait_severe``. Where the loading is neither CPU- nor wait-bound (mixed: no finding
    of its own), the evidence says what the producers read and how much from storage.
    """
    probe = baseline_probe(run)
    measured = data_wait(run, probe) if probe is not None else None
    if measured is None or measured[0] < thresholds.data_wait_fraction:
        return None
    fraction, per_step = measured
    seconds = f" ({ms(per_step)} per step)" if finite(per_step) else ""
    evidence = (f"With {describe_config(probe)} the ranks spend {pct(fraction)} of each "
                f"measured step waiting for the next batch{seconds}.")
    if gpu_timed(run, probe):
        evidence = (f"With {describe_config(probe)} the GPU sits idle {pct(fraction)} of each "
                    f"measured step while its rank waits for the next batch{seconds}, timed "
                    f"on the GPU (CUDA events); the ranks wait {pct(probe['data_wait_fraction'])}"
                    " of each step in all.")
    capacity = capacity_of(run)
    enough = _enough_workers(run, probe)
    if capacity is None or loading_bound(capacity, thresholds) == "mixed":
        # mixed loading: no cpu- or io-bound finding says what the producers read
        evidence += storage_evidence(run, probe)
    return Finding(
        rule="data-loader-bound",
        severity="high" if fraction >= thresholds.data_wait_severe else "medium",
        title="Training waits on the DataLoader",
        evidence=evidence,
        # more workers advised: worded from the recommendation (rules.voice); else its own
        recommendation=_loading_advice(run, probe) if enough else "",
        advice=None if enough else _more_workers(run, probe, fraction))


def _enough_workers(run: Run, baseline: pd.Series) -> bool:
    """The capacity model predicts no more workers than the baseline already runs (the CPUs
    or the memory are the limit): advising more workers would contradict it."""
    capacity = capacity_of(run)
    return capacity is not None and \
        capacity["workers_for_demand"] <= (as_int(baseline.get("num_workers"), 0) or 0)


def _more_workers(run: Run, baseline: pd.Series, fraction: float) -> Advice:
    """More workers, as many as the measured loading capacity predicts when it is known."""
    workers = as_int(baseline.get("num_workers"), 0) or 0
    capacity = capacity_of(run)
    more = capacity["workers_for_demand"] if capacity is not None else max(2, 2 * workers)
    basis = f"the ranks wait {pct(fraction)} of each step for data"
    if capacity is not None:
        basis += f"; {predicted_workers(capacity)}"
    return Advice(
        change=(f"load in parallel and ahead (e.g. num_workers={more}, "
                "persistent_workers=True)"),
        wants=lambda p: (as_int(p.get("num_workers"), 0) or 0) > workers,
        basis=basis,
        measure=f"--num-workers {workers},{more}",
        see=("cpu-bound-preprocessing", "io-bound-loading"))


def _loading_advice(run: Run, baseline: pd.Series) -> str:
    """Where the capacity model predicts no more workers than the baseline runs: what the
    sweep measured, when it measured something better; else what limits the loading."""
    probes = ok_probes(run)
    if not probes.empty and baseline.get("throughput", 0) > 0:
        best = probes.loc[probes["throughput"].idxmax()]
        gain = best["throughput"] / baseline["throughput"]
        if best["id"] != baseline["id"] and gain >= 1.05:
            return (f"Measured: {describe_config(best)} runs {gain:.2f}x faster than the "
                    f"script's settings; use the recommended configuration below.")
        if len(probes) > 1:
            return "None of the measured settings loaded faster than the script's own."
    workers = as_int(baseline.get("num_workers")) or 0
    capacity = capacity_of(run)
    assert capacity is not None  # _enough_workers holds
    return (f"More workers are not predicted to help: {predicted_workers(capacity)}, and "
            f"the script runs {workers} already. What limits the loading is the cost of "
            f"each sample: {loading_evidence(capacity)}.")


def _workers_flattened(run: Run, probe: pd.Series, thresholds: Thresholds) -> Optional[str]:
    """Evidence that more workers stopped helping, or None if they still help."""
    fewer = fewer_workers_probe(run, probe)
    if fewer is None or not fewer["throughput"] > 0:
        return "no probe with fewer workers was measured to compare"
    gain = probe["throughput"] / fewer["throughput"]
    still_bound = is_data_bound(run, probe, thresholds)
    if gain >= thresholds.workers_flat_gain and not still_bound:
        return None
    text = (f"going from {as_int(fewer['num_workers'])} to {as_int(probe['num_workers'])} "
            f"workers changed throughput {gain:.2f}x")
    if still_bound:
        text += f", with the ranks still waiting {pct(data_wait(run, probe)[0])} of each step"
    return text


CPU_FIX = ("take work off the CPUs: preprocess offline (store the transformed tensors), cache "
           "transformed samples or make the transforms cheaper; where the samples are encoded "
           "images read from files, decode them on the GPU (torchvision.io.decode_jpeg("
           "device='cuda'), NVIDIA DALI); or run on more CPU cores per GPU")
IN_MEMORY_FIX = ("take work off the CPUs: apply the transforms once and keep their results "
                 "(offline, or cached), make them cheaper, or run on more CPU cores per GPU")


FAST_FETCH_S = 1e-4  # a sample fetched in less: the cost is the DataLoader's per-sample work
COLLATE_SHARE = 0.5  # collate_fn this share of a sample's cost: the collate is what costs


def cpu_cost(run: Run, probe: pd.Series) -> tuple[str, str]:
    """(what costs, the fix for it), from the part of producing a sample that costs in
    ``probe`` (its measured loading: dataset fetch vs ``collate_fn``, in CPU time where
    recorded: wall time on busy CPUs also counts time off them): a collate that takes most of
    it -> a cheaper ``collate_fn``; a fetch under ``FAST_FETCH_S`` a sample -> fewer, larger
    files where it reads one (``IN_MEMORY_READ_B`` or more), else (an in-memory dataset:
    nothing to decode) whole batches fetched at once; else transforms, and decoding where
    the producers read from files -> ``CPU_FIX``; where they read (almost) nothing per sample
    (under ``IN_MEMORY_READ_B``: the samples are made in memory) -> transforms alone."""
    loading = loading_of(run, probe["id"])
    if loading is None:
        return "preprocessing", CPU_FIX
    per = (loading.cpu_per_sample_s or 0.0) + (loading.wait_per_sample_s or 0.0)
    collate = loading.collate_per_sample_s or 0.0
    if loading.collate_cpu_per_sample_s is not None:
        per, collate = loading.cpu_per_sample_s or 0.0, loading.collate_cpu_per_sample_s
    if per <= 0:
        return "preprocessing", CPU_FIX
    if collate >= COLLATE_SHARE * per:
        return "collating", (f"collate_fn takes {ms(collate)} of the {ms(per)} a sample costs: "
                             "a cheaper collate_fn (stack ready tensors, no per-sample Python), "
                             "or batches made by the dataset")
    read = loading.read_per_sample_bytes
    files = read is not None and read >= IN_MEMORY_READ_B
    if per - collate < FAST_FETCH_S and files:
        return "per-sample file reads", (
            f"fetching a sample takes only {ms(per - collate)}, a {read / 1e6:.2f} MB file "
            "opened and read each time: the cost is per-sample file access and the DataLoader's "
            "per-sample work; pack the samples into fewer, larger files (shards read in "
            "sequence, or one array to memory-map) and fetch whole batches from them")
    if per - collate < FAST_FETCH_S:
        return "the DataLoader's per-sample work", (
            f"fetching a sample takes only {ms(per - collate)}: the cost is the DataLoader "
            "indexing and collating sample by sample, not decoding; fetch whole batches (a "
            "dataset __getitems__(indices) that slices its tensors, or a BatchSampler passed "
            "as sampler= with batch_size=None), or keep an in-memory dataset on the device "
            "and index it in the loop")
    if read is not None and not files:
        return "preprocessing", (f"the samples are made in memory ({read:,.0f} bytes read per "
                                 f"sample): there are no files to decode; {IN_MEMORY_FIX}")
    return "preprocessing", CPU_FIX


def cpu_bound_preprocessing(run: Run, thresholds: Thresholds) -> Optional[Finding]:
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
        evidence=(f"With {as_int(probe['num_workers'])} workers the CPUs are saturated "
                  f"({load.describe()}) and {flat}."),
        recommendation=CPU_FIX[0].upper() + CPU_FIX[1:] + ".")


def _cpu_bound_from_capacity(run: Run, base: pd.Series, capacity: dict, caveat: str,
                             thresholds: Thresholds) -> Optional[Finding]:
    """``caveat``: the baseline read from storage what the model's probes read warm ("": no)."""
    if loading_bound(capacity, thresholds) != "cpu":
        return None
    limit, demand = capacity.get("cpu_limit"), capacity["demand"]
    saturated = finite(limit) and limit < demand
    what, fix = cpu_cost(run, base)
    finding = Finding(
        rule="cpu-bound-preprocessing", severity="high" if saturated else "medium",
        title=(f"Loading is CPU-bound: {what} limits it" if caveat else
               f"Loading is CPU-bound: {what}, not storage, limits it"),
        evidence=(f"Measured where the batches are made: {loading_evidence(capacity)}."
                  + storage_evidence(run, base) + caveat),
        recommendation=f"More workers cannot help once the CPUs are full: {fix}.")
    if saturated:
        return finding
    workers = as_int(base.get("num_workers"), 0) or 0
    more = capacity["workers_for_demand"]
    if more <= workers:
        return finding
    # the CPUs can keep up with more workers: worded from the recommendation (rules.voice)
    return replace(finding, recommendation="", advice=Advice(
        change=f"num_workers={more}",
        wants=lambda p: (as_int(p.get("num_workers"), 0) or 0) >= more,
        basis=f"{loading_evidence(capacity)}; {predicted_workers(capacity)}",
        measure=f"--num-workers {workers},{more}", extra=f"To need fewer cores: {fix}."))


def io_bound_loading(run: Run, thresholds: Thresholds) -> Optional[Finding]:
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
    idle = (as_int(probe["num_workers"], 0) or 0) > 0 and load.idle(thresholds)
    if not (waiting or idle):
        return None
    fraction = data_wait(run, probe)[0]
    workers = as_int(probe["num_workers"], 0) or 0
    return Finding(
        rule="io-bound-loading",
        severity="high" if fraction >= thresholds.data_wait_severe else "medium",
        title="Loading waits on storage, not on the CPUs",
        evidence=(f"With {workers} workers the ranks still wait {pct(fraction)} of each step "
                  f"for data while the loading is not CPU-busy ({load.describe()})."),
        advice=Advice(
            change=f"num_workers={max(2, 2 * workers)}, prefetch_factor=4 to overlap more reads",
            wants=lambda p: (as_int(p.get("num_workers"), 0) or 0) >= max(2, 2 * workers),
            basis=f"with {workers} workers the loading waits without using the CPUs",
            measure=f"--num-workers {workers},{max(2, 2 * workers)}",
            extra=f"Or, {IO_FIX}."))


IO_FIX = ("to wait less per sample: copy the data set to local NVMe or RAM, and pack many "
          "small files into fewer larger shards (WebDataset, tar, LMDB)")


def _wait_bound_from_capacity(run: Run, base: pd.Series, capacity: dict,
                              thresholds: Thresholds) -> Optional[Finding]:
    if loading_bound(capacity, thresholds) != "wait":
        return None
    fraction = data_wait(run, base)[0]
    workers = capacity["workers_for_demand"]
    most = max(_measured_workers(run), default=0)
    past = ", past the CPU count" if max(most, workers) > capacity["cpus_per_rank"] else ""
    if most >= workers:
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
                  + storage_evidence(run, base) + storage_caveat(run, base, thresholds)),
        recommendation=f"{overlap}. Or, {IO_FIX}.")


RULES = [data_loader_bound, cpu_bound_preprocessing, io_bound_loading]

"""The loading in words: what producing a sample costs, what bounds it, what would help.

Read from the run's capacity model (``summary.capacity``, ``profiler.decide.capacity``) and
a probe's measured loading (``store.probe_parts.Loading``), by the loading rules
(``rules.findings.data``) and the recommendation's ceiling notes (``rules.notes``) alike.
"""

from __future__ import annotations

from typing import Optional

from ddp_profile.profiler.cache import IN_MEMORY_READ_B
from ddp_profile.profiler.decide.capacity import STORAGE_READ_BYTES, bound_of
from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.base import Thresholds, finite, ms, pct

CPU_FIX = ("take work off the CPUs: preprocess offline (store the transformed tensors), cache "
           "transformed samples or make the transforms cheaper; where the samples are encoded "
           "images read from files, decode them on the GPU (torchvision.io.decode_jpeg("
           "device='cuda'), NVIDIA DALI); or run on more CPU cores per GPU")
IN_MEMORY_FIX = ("take work off the CPUs: apply the transforms once and keep their results "
                 "(offline, or cached), make them cheaper, or run on more CPU cores per GPU")
IO_FIX = ("to wait less per sample: copy the data set to local NVMe or RAM, and pack many "
          "small files into fewer larger shards (WebDataset, tar, LMDB)")
FAST_FETCH_S = 1e-4  # a sample fetched in less: the cost is the DataLoader's per-sample work
COLLATE_SHARE = 0.5  # collate_fn this share of a sample's cost: the collate is what costs


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


def storage_evidence(base: ProbeRecord) -> str:
    """What the baseline's producers read per sample and how much of it came from storage
    (MB/s from disk at the baseline's rate), where they read files ("" otherwise)."""
    loading = base.loading
    if loading is None:
        return ""
    read, storage = loading.read_per_sample_bytes, loading.storage_per_sample_bytes
    share = loading.storage_share
    if not (finite(read) and finite(share) and finite(storage)) or read < STORAGE_READ_BYTES:
        return ""
    text = f" The baseline's producers read {read / 1024:,.0f} KiB per sample, {pct(share)} " \
           "of it from storage"
    rate = base.throughput
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


def cpu_cost(probe: ProbeRecord) -> tuple[str, str]:
    """(what costs, the fix for it), from the part of producing a sample that costs in
    ``probe`` (its measured loading: dataset fetch vs ``collate_fn``, in CPU time where
    recorded: wall time on busy CPUs also counts time off them): a collate that takes most of
    it -> a cheaper ``collate_fn``; a fetch under ``FAST_FETCH_S`` a sample -> fewer, larger
    files where it reads one (``IN_MEMORY_READ_B`` or more), else (an in-memory dataset:
    nothing to decode) whole batches fetched at once; else transforms, and decoding where
    the producers read from files -> ``CPU_FIX``; where they read (almost) nothing per sample
    (under ``IN_MEMORY_READ_B``: the samples are made in memory) -> transforms alone."""
    loading = probe.loading
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

"""Rules about the distributed setup: stragglers (``rules.findings.straggler``), sharding, and DDP
misconfigurations.

Each rule is ``rule(run, thresholds, known) -> Finding | None`` (see ``rules.base``).
"""

from __future__ import annotations

from typing import Any, Optional

import pandas as pd

from ddp_profile.profiler.decide.ddp import options_key
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.alternations import Evidence
from ddp_profile.rules.base import Finding, Thresholds
from ddp_profile.rules.findings.straggler import straggler
from ddp_profile.rules.tables import (
    baseline_probe,
    events_named,
    loader_info,
    ok_probes,
    probe_context,
    probe_steps,
    world_size,
)


def _training_loader_ids(run: Run, probe_id: str) -> set[Any]:
    steps = probe_steps(run, probe_id, measured_only=False)
    return set(steps["loader_id"].dropna()) if "loader_id" in steps else set()


def _fingerprints(run: Run, probe_id: str) -> dict[int, dict[int, str]]:
    """rank -> {batch index: digest} of the training loader's first fingerprinted batches."""
    loaders = _training_loader_ids(run, probe_id)
    found: dict[int, dict[int, str]] = {}
    events = events_named(run, "batch_fingerprint", probe_id)
    for rank, data in zip(events["rank"], events["data"]):
        if rank is None or data.get("loader_id") not in loaders or not data.get("digest"):
            continue
        found.setdefault(int(rank), {})[int(data.get("index", 0))] = str(data["digest"])
    return found


def _same_batches(prints: dict[int, dict[int, str]]) -> Optional[tuple[tuple[int, ...], int]]:
    """(ranks that received identical batches, batches compared), or None.

    Two ranks match when at least 2 of their first batches were fingerprinted at the same
    positions and every one is equal; a rank whose batches are all equal to each other (a
    constant data set) proves nothing and is left out.
    """
    varied = {r: p for r, p in prints.items() if len(set(p.values())) >= 2}
    for rank in sorted(varied):
        twins = [other for other in sorted(varied) if other != rank
                 and len(set(varied[rank]) & set(varied[other])) >= 2
                 and all(varied[rank][i] == varied[other][i]
                         for i in set(varied[rank]) & set(varied[other]))]
        if twins:
            compared = min(len(set(varied[rank]) & set(varied[t])) for t in twins)
            return (rank, *twins), compared
    return None


SHARD_ADVICE = ("sampler = DistributedSampler(dataset, shuffle=True); DataLoader(dataset, "
                "sampler=sampler, ...) (and drop shuffle=True), calling "
                "sampler.set_epoch(epoch) at the start of each epoch.")


def _whole_dataset_everywhere(run: Run, probe_id: str) -> Optional[dict[str, Any]]:
    """The training loader's facts when every rank's epoch covers the whole of one dataset:
    each rank recorded the same dataset (length and ``dataset_fingerprint``, never None), no
    distributed sampler, and an epoch of at least its length less one batch. Else None."""
    size = world_size(run, probe_id)
    loaders = [context.get("loader") or {} for (pid, _), context in run.contexts.items()
               if pid == probe_id]
    if size <= 1 or len(loaders) < size:
        return None
    first = loaders[0]
    length = first.get("dataset_len")
    prints = {loader.get("dataset_fingerprint") for loader in loaders}
    if not length or None in prints or len(prints) != 1:
        return None
    for loader in loaders:
        covered = loader.get("epoch_samples")
        if loader.get("distributed_sampler") or loader.get("dataset_len") != length \
                or covered is None or covered < length - (loader.get("batch_size") or 0):
            return None
    return first


def missing_distributed_sampler(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                               ) -> Optional[Finding]:
    """The ranks read the same samples: their batches are equal, or each rank's epoch covers
    the whole dataset.

    Trigger (baseline probe, world size > 1), decided on the data, either way:

    * each rank fingerprints the first batches of its training loader (``batch_fingerprint``
      events): two ranks whose fingerprinted batches (>= 2, not all alike) are equal at every
      position read the same samples in the same order;
    * coverage: every rank built the same dataset (equal length and ``dataset_fingerprint``,
      a digest of what the dataset object holds) and its loader's epoch covers all of it
      (``epoch_samples``: the batch sampler's batches x batch size, the sampler's length, or
      the whole dataset for the default samplers): each rank reads everything, in whatever
      order (an unseeded shuffle without a sampler).

    The sampler's class (DistributedSampler, accelerate's or Lightning's shards, an
    IterableDataset) only explains it; without fingerprints or coverage there is no finding.
    """
    probe = baseline_probe(run)
    if probe is None or world_size(run, probe.id) <= 1:
        return None
    same = _same_batches(_fingerprints(run, probe.id))
    loader = loader_info(run, probe.id)
    sampler = loader.get("batch_sampler") or loader.get("sampler") or "its sampler"
    if same is None:
        whole = _whole_dataset_everywhere(run, probe.id)
        if whole is None:
            return None
        size = world_size(run, probe.id)
        return Finding(
            rule="missing-distributed-sampler", severity="high",
            title="Every rank reads the whole dataset",
            evidence=(f"Each of the {size} ranks built the same dataset ({whole.get('dataset')}, "
                      f"{whole['dataset_len']} samples, equal fingerprints of its contents) and "
                      f"its loader (sampler: {sampler}) covers {whole['epoch_samples']} samples "
                      f"an epoch: every rank reads all of it in its own order, so an epoch does "
                      f"{size}x the work of a sharded one."),
            recommendation=SHARD_ADVICE, ranks=tuple(range(size)))
    ranks, compared = same
    names = ", ".join(str(r) for r in ranks)
    if loader.get("distributed_sampler"):
        advice = ("The DistributedSampler is built with the same rank on every process: "
                  "DistributedSampler(dataset) after init_process_group (or pass "
                  "num_replicas=world_size, rank=rank).")
    else:
        advice = SHARD_ADVICE
    return Finding(
        rule="missing-distributed-sampler", severity="high",
        title="The ranks read the same samples",
        evidence=(f"Ranks {names} received identical batches: the first {compared} batches "
                  f"of the training loader have equal fingerprints (loader sampler: {sampler}, "
                  f"{loader.get('dataset_len', '?')} samples), so every rank trains on the same "
                  "data and an epoch does no more work than on one rank."),
        recommendation=advice, ranks=ranks)


def no_ddp(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
          ) -> Optional[Finding]:
    """Several ranks in a process group compute gradients that are never synchronised.

    Trigger (baseline probe): world size > 1, a ``process_group`` event, measured steps with
    a backward pass (``forward_s`` recorded), no ``ddp`` or ``fsdp`` event on any rank, and no
    ``collective`` event (all_reduce / reduce_scatter called by the script) unless those calls
    fall in fewer than half the training steps (``comm.collectives.steps_with_calls``): a
    script that averages its own gradients all-reduces every step; one that all-reduces its
    validation metrics (pytorch/examples' imagenet ``main.py`` on CPU) does not, and still
    trains independent models.
    """
    probe = baseline_probe(run)
    if probe is None or world_size(run, probe.id) <= 1:
        return None
    if events_named(run, "process_group", probe.id).empty:
        return None
    steps = probe_steps(run, probe.id)
    if steps.empty or "forward_s" not in steps or not steps["forward_s"].notna().any():
        return None
    if any(not events_named(run, name, probe.id).empty for name in ("ddp", "fsdp")):
        return None
    reduced = "no rank all-reduced anything"
    if not events_named(run, "collective", probe.id).empty:
        comm = probe.comm.fields
        share = (comm.get("collectives") or {}).get("steps_with_calls")
        if share is None or share >= 0.5:
            return None  # the script may average the gradients itself
        reduced = (f"the script's own all-reduce ran in {share:.0%} of the training steps "
                   "(not between each backward and optimizer step)")
    size = world_size(run, probe.id)
    return Finding(
        rule="no-ddp", severity="high",
        title="Distributed ranks train independent models",
        evidence=(f"{size} ranks joined a process group and ran backward passes, but no model "
                  f"was wrapped in DistributedDataParallel (or FSDP) and {reduced}: the "
                  "gradients are never averaged, each rank trains its own copy."),
        recommendation=("model = DistributedDataParallel(model, device_ids=[local_rank]) "
                        "(device_ids=None on CPU) after init_process_group, before building "
                        "the optimizer."))


def _epoch_without_set_epoch(run: Run, probe_id: str) -> Optional[int]:
    """Number of later epochs of the training loader with no set_epoch event, or None."""
    steps = probe_steps(run, probe_id, measured_only=False)
    iters = run.loader_iters
    if steps.empty or iters is None or iters.empty or "loader_id" not in steps:
        return None
    loader_ids = set(steps["loader_id"].dropna())
    rows = iters[(iters["probe_id"] == probe_id) & iters["loader_id"].isin(loader_ids)]
    later = rows[rows["iter_index"] >= 1]
    if later.empty:
        return None
    calls = [d for d in events_named(run, "set_epoch", probe_id)["data"]
             if d.get("loader_id") is None or d.get("loader_id") in loader_ids]
    return None if calls else int(later.groupby("rank")["iter_index"].count().max())


def missing_set_epoch(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                     ) -> Optional[Finding]:
    """A shuffling DistributedSampler replays the same order every epoch.

    Trigger: in an ok probe, the training loader uses a DistributedSampler with
    ``sampler_shuffle`` true, it was iterated again (loader_iters iter_index >= 1 for the
    training loader), and the probe recorded no ``set_epoch`` event for that loader.
    """
    for probe in ok_probes(run):
        loader = loader_info(run, probe.id)
        if not (loader.get("distributed_sampler") and loader.get("sampler_shuffle")):
            continue
        epochs = _epoch_without_set_epoch(run, probe.id)
        if epochs:
            return Finding(
                rule="missing-set-epoch", severity="medium",
                title="DistributedSampler.set_epoch is never called",
                evidence=(f"The training loader started {epochs} more epoch(s) with a "
                          "shuffling DistributedSampler and no set_epoch call, so every epoch "
                          "repeats the same sample order."),
                recommendation=("Call sampler.set_epoch(epoch) before iterating the loader "
                                "in each epoch."))
    return None


def _event_ranks(events: pd.DataFrame) -> tuple[int, ...]:
    return tuple(sorted({int(r) for r in events["rank"] if r is not None and r >= 0}))


def data_parallel(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                 ) -> Optional[Finding]:
    """The script wraps the model in torch.nn.DataParallel.

    Trigger: any ``data_parallel`` event.
    """
    events = events_named(run, "data_parallel")
    if events.empty:
        return None
    return Finding(
        rule="data-parallel", severity="high", title="nn.DataParallel in use",
        evidence=("The script wrapped a model in torch.nn.DataParallel (single-process, "
                  "GIL-bound, scatters every batch from one GPU)."),
        recommendation=("Use DistributedDataParallel: one process per GPU (torchrun), "
                        "model = DDP(model.to(local_rank), device_ids=[local_rank])."),
        ranks=_event_ranks(events))


def _backend(run: Run, probe_id: Any) -> Optional[str]:
    for data in events_named(run, "process_group", probe_id)["data"]:
        if data.get("backend"):
            return str(data["backend"])
    return probe_context(run, probe_id).get("backend") or run.summary.get("backend")


def backend_mismatch(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                    ) -> Optional[Finding]:
    """DDP on CUDA tensors over the gloo backend (NCCL is the GPU backend).

    Trigger: a ``ddp`` event with ``device_type`` "cuda" in a probe whose process group
    backend (``process_group`` event, else context, else summary) is "gloo".
    """
    for _, event in events_named(run, "ddp").iterrows():
        if event["data"].get("device_type") != "cuda":
            continue
        if (_backend(run, event["probe_id"]) or "").lower() == "gloo":
            return Finding(
                rule="backend-mismatch", severity="high", title="CUDA model on the gloo backend",
                evidence=("DDP wraps a CUDA model but the process group uses gloo, which "
                          "copies gradients through host memory for every all-reduce."),
                recommendation='dist.init_process_group(backend="nccl") for CUDA training.',
                ranks=_event_ranks(events_named(run, "ddp")))
    return None


def find_unused_parameters(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                           ) -> Optional[Finding]:
    """find_unused_parameters=True although every parameter gets a gradient.

    Trigger: a ``ddp`` event with ``find_unused_parameters`` true, and every
    ``ddp_unused_parameters`` event reports ``params_without_grad`` == 0. Where a ``ddp``
    probe measured it off (``known``: the evaluation's ``claim.Evidence``; None: read here),
    "medium" when faster beyond noise.
    """
    ddp = events_named(run, "ddp")
    if ddp.empty or not any(d.get("find_unused_parameters") for d in ddp["data"]):
        return None
    checks = list(events_named(run, "ddp_unused_parameters")["data"])
    if not checks or any(d.get("params_without_grad") != 0 for d in checks):
        return None
    total = max((d.get("params_total") or 0 for d in checks), default=0)
    measured, severity = _measured_without_search(known or Evidence(run, thresholds))
    return Finding(
        rule="find-unused-parameters", severity=severity,
        title="find_unused_parameters=True without unused parameters",
        evidence=("DDP searches the autograd graph for unused parameters every step, yet all "
                  f"{total} parameters received gradients in the {len(checks)} checked "
                  "step(s)." + measured),
        recommendation="DDP(model, ..., find_unused_parameters=False) (the default).",
        ranks=_event_ranks(ddp))


def _measured_without_search(known: Evidence) -> tuple[str, str]:
    """" Measured: ..." where a ``ddp`` probe ran the script's settings with
    ``find_unused_parameters=False``, and the severity: "medium" when it was faster than the
    baseline beyond noise, else "low"."""
    effect = known.ddp_effects.get(options_key({"find_unused_parameters": False}))
    if effect is None:
        return "", "low"
    faster = effect.faster and effect.interval is not None
    return (f" Measured: with find_unused_parameters=False the script's settings ran "
            f"{effect.figure()} their own ({effect.reference}; {effect.probes}, "
            f"{'faster beyond noise' if faster else 'not faster beyond noise'}).",
            "medium" if faster else "low")


RULES = [straggler, missing_distributed_sampler, no_ddp, missing_set_epoch, data_parallel,
         backend_mismatch, find_unused_parameters]

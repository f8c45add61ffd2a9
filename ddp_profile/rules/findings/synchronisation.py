"""Rules on communication and synchronisation: the all-reduce backward did not cover,
gradients synchronised per micro-batch, the script's own collectives per step, the host
blocking on the GPU every step, SyncBatchNorm.

Each reads the baseline probe's ``comm`` (``profiler.store.probe_comm.probe_comm``: DDP's own
reducer timers and the script's collectives, measured per step) and decides on it alone.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from ddp_profile.profiler.decide.ddp import one_bucket, options_key
from ddp_profile.profiler.settings import GRADIENT_SYNC
from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.profiler.store.record import TORCH_DIR
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.alternations import DdpEffect, Evidence
from ddp_profile.rules.base import Advice, Finding, Thresholds, finite, ms, pct
from ddp_profile.rules.findings.gpu import is_cuda
from ddp_profile.rules.tables import baseline_probe

# NCCL settings that route an all-reduce the slow way, and what they do
SLOW_ENV = {"NCCL_IB_DISABLE": ("1", "InfiniBand is disabled: the all-reduce goes over TCP "
                                     "sockets"),
            "NCCL_P2P_DISABLE": ("1", "peer-to-peer transfers between GPUs are disabled"),
            "NCCL_SHM_DISABLE": ("1", "shared-memory transfers are disabled"),
            "NCCL_NET": ("Socket", "NCCL is forced onto TCP sockets")}


def baseline_comm(run: Run) -> tuple[Optional[ProbeRecord], dict[str, Any]]:
    """The baseline probe and its ``comm`` record ({} when none was measured)."""
    base = baseline_probe(run)
    if base is None:
        return None, {}
    return base, dict(base.comm.fields)


def _mb(value: Optional[float]) -> str:
    return f"{value / 1e6:,.1f} MB" if value else "? MB"


def _environment(comm: dict[str, Any]) -> list[str]:
    env = comm.get("env") or {}
    return [f"{name}={env[name]}: {why}" for name, (value, why) in SLOW_ENV.items()
            if str(env.get(name, "")).lower() == value.lower()]


def _transfer(comm: dict[str, Any]) -> str:
    """Bytes, buckets, ranks, backend and the bandwidth achieved, as far as recorded."""
    parts = [f"{_mb(comm.get('gradient_bytes'))} of gradients"]
    if comm.get("buckets"):
        cap = comm.get("bucket_cap_bytes")
        parts.append(f"in {comm['buckets']} bucket(s)"
                     + (f" of at most {cap / 2 ** 20:.0f} MiB" if cap else ""))
    where = f"{comm.get('world_size') or '?'} ranks over {comm.get('backend') or '?'}"
    rate = comm.get("bandwidth_bytes_per_s")
    achieved = f", {rate / 1e9:.2f} GB/s achieved (bus bandwidth)" if rate else ""
    return " ".join(parts) + f", {where}{achieved}"


def exposed_communication(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                          ) -> Optional[Finding]:
    """Gradient communication costs a large share of each step.

    Measured where the sweep ran the script's settings without gradient synchronisation (a
    ``ddp`` probe with ``gradient_sync`` false: every forward as under ``no_sync()``): the
    share of the step it saves (``saved_share``: 0 unless faster beyond noise). Else
    DDP's own reducer timers (communication minus its overlap with backward compute, on the
    rank that reached the all-reduce last: the others also wait there for it; >= 3 timed
    steps). Trigger (baseline probe): that share >= ``comm_exposed_share``; "high" at or above
    ``comm_exposed_severe``. The timers explain it (ms exposed and overlapped, bytes, buckets,
    bandwidth). The advice, a larger per-rank batch (the all-reduce costs the same per step
    whatever the batch), is worded from the probes that ran it (``rules.voice``). ``known``:
    the evaluation's reading of the counterfactuals (``claim.Evidence``; None: read here).
    """
    base, comm = baseline_comm(run)
    if base is None:
        return None
    known = known or Evidence(run, thresholds)
    unsynced = known.sync_effect()
    timed = comm.get("exposed_fraction") is not None and (comm.get("timed_steps") or 0) >= 3
    if unsynced is not None:
        share = saved_share(unsynced)
        evidence = (f"Measured: without gradient synchronisation ({unsynced.probes}: the "
                    "script's settings with every backward as under no_sync(), a measurement "
                    f"only) the steps ran {unsynced.figure()} as fast as with it "
                    f"({unsynced.reference}): synchronising the gradients costs {pct(share)} "
                    "of each step. ")
    elif timed:
        share, evidence = comm["exposed_fraction"], ""
    else:
        return None
    if share < thresholds.comm_exposed_share:
        return None
    if timed:
        evidence += (f"DDP's reducer timers: {ms(comm['exposed_s'])} of each "
                     f"{ms(comm['step_s'])} step ({pct(comm['exposed_fraction'])}) is gradient "
                     f"all-reduce that backward did not cover, of {ms(comm['comm_s'])} of "
                     f"communication ({ms(comm['overlap_s'])} overlapping backward); "
                     f"{_transfer(comm)}.")
    batch = base.config.batch_size
    slow = _environment(comm)
    if slow:
        evidence += " The environment explains part of it: " + "; ".join(slow) + "."
    measured, tried = _ddp_counterfactuals(known.ddp_effects)
    untried = [f"DDP(..., bucket_cap_mb=...) larger than "
               f"{(comm.get('bucket_cap_bytes') or 25 * 2 ** 20) / 2 ** 20:.0f}"
               if "bucket_cap_mb" not in tried and not one_bucket(comm) else "",
               "gradient_as_bucket_view=True" if "gradient_as_bucket_view" not in tried
               and not comm.get("gradient_as_bucket_view") else "",
               "a compression hook (fp16_compress_hook: changes numerics)"]
    knobs = (measured + " " if measured else "") + (
        "Not measured in this run (their effect depends on the machine and the network: "
        "measure before adopting): " + ", ".join(u for u in untried if u) + ".")
    advice = None
    if batch:
        advice = Advice(
            change=f"a per-rank batch_size above {batch}",
            wants=lambda config: (config.batch_size or 0) > batch,
            basis=("the all-reduce moves the same gradients per step whatever the batch, so a "
                   "larger batch spreads it over more samples"),
            measure=f"--batch-size {batch},{2 * batch},{4 * batch}",
            extra=("A larger batch changes the optimisation: scale the learning rate with the "
                   "global batch size and check convergence. " + knobs))
    return Finding(
        rule="exposed-communication",
        severity="high" if share >= thresholds.comm_exposed_severe else "medium",
        title="Gradient communication is exposed",
        evidence=evidence,
        recommendation=("A larger per-rank batch (fewer all-reduces per sample). " + knobs)
        if advice is None else "A larger per-rank batch.",
        advice=advice)


def saved_share(unsynced: DdpEffect) -> float:
    """The share of a step that gradient synchronisation costs: 0 unless the step without it
    ran faster beyond noise."""
    return 1.0 - 1.0 / unsynced.ratio if unsynced.faster else 0.0


def _ddp_counterfactuals(effects: Mapping[str, DdpEffect]) -> tuple[str, set[str]]:
    """"Measured: ..." for the DDP-option counterfactuals (``claim.ddp_effects``) and the option
    names they tried. "Use it" only for an option faster beyond noise in an alternation with
    the script's own, and slower than the step without any synchronisation."""
    parts, tried, references = [], set(), {}
    unsynced = effects.get(options_key({GRADIENT_SYNC: False}))
    for effect in effects.values():
        if GRADIENT_SYNC in effect.options:
            continue
        tried.update(effect.options)
        if effect.faster and unsynced is not None and effect.ratio >= unsynced.ratio:
            # an option can only save part of what synchronising costs: faster than the step
            # without any synchronisation is the launches' variance, not the option
            verdict = (f"faster even than without any synchronisation ({unsynced.probes}): "
                       "the launches vary more than the option could change; not established")
        elif effect.faster and effect.interval is None:
            verdict = ("faster in a launch of its own, not alternated with the script's: "
                       "launches differ by more than that; not established")
        elif effect.faster:
            verdict = ("faster beyond noise: use DDP(model, ..., "
                       + options_key(effect.options) + ")")
        else:
            verdict = "slower" if effect.slower else "within noise"
        references.setdefault(effect.reference, None)
        parts.append(f"{options_key(effect.options)} ran {effect.figure()} "
                     f"({effect.probes}, {verdict})")
    if not parts:
        return "", tried
    return (f"Measured against the script's own DDP options ({'; '.join(references)}): "
            + "; ".join(parts) + ".", tried)


def allreduce_per_micro_batch(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                              ) -> Optional[Finding]:
    """Gradient accumulation that all-reduces after every micro-batch.

    Trigger (baseline probe): several forward/backward passes per optimizer step
    (``forwards_per_optimizer_step`` >= ``micro_batch_syncs``) and as many gradient
    synchronisations (``syncs_per_optimizer_step`` >= ``micro_batch_syncs``): none ran under
    ``no_sync()``. The saving is a prediction from the exposed communication measured per
    synchronisation, or from the step measured without it (``known``, as for
    ``exposed_communication``).
    """
    base, comm = baseline_comm(run)
    syncs = comm.get("syncs_per_optimizer_step")
    passes = comm.get("forwards_per_optimizer_step")
    if base is None or syncs is None or passes is None \
            or passes < thresholds.micro_batch_syncs or syncs < thresholds.micro_batch_syncs:
        return None
    evidence = (f"Each optimizer step ran {passes:.1f} forward/backward passes and DDP "
                f"all-reduced the gradients after {syncs:.1f} of them "
                f"({_mb(comm.get('gradient_bytes'))} each time), where one all-reduce per "
                "optimizer step gives the same gradients.")
    saving = ""
    unsynced = (known or Evidence(run, thresholds)).sync_effect()
    exposed, step = comm.get("exposed_s"), comm.get("step_s")
    if unsynced is not None:
        share = saved_share(unsynced)
        saving = (f" Prediction (not measured): about {pct(share * (syncs - 1) / passes)} of "
                  f"each optimizer step saved: without synchronisation ({unsynced.probes}) "
                  f"a micro-batch took {pct(share)} less time, and no_sync() removes "
                  f"{syncs - 1:.0f} of every {passes:.0f} synchronisations.")
    elif exposed is not None and step:
        saved = (syncs - 1) * exposed
        saving = (f" Prediction (not measured): about {ms(saved)} less per optimizer step "
                  f"({pct(saved / (passes * step))} of its time), the exposed all-reduce "
                  f"measured per micro-batch ({ms(exposed)}) times the {syncs - 1:.0f} "
                  "synchronisations no_sync() removes.")
    return Finding(
        rule="allreduce-per-micro-batch", severity="medium" if syncs < 4 else "high",
        title="Gradients are all-reduced after every micro-batch",
        evidence=evidence,
        recommendation=("Run the backward of every micro-batch but the last under "
                        "model.no_sync(): `ctx = model.no_sync() if not last else "
                        "contextlib.nullcontext()`; `with ctx: loss.backward()` (Lightning "
                        "and accelerate's accumulate() do this for you)." + saving))


def _script_sites(comm: dict[str, Any]) -> list[dict[str, Any]]:
    """Call sites in the script (or its libraries), not inside torch itself."""
    return [s for s in comm.get("sites") or [] if TORCH_DIR not in str(s.get("file"))]


def _site_text(site: dict[str, Any]) -> str:
    return (f"{site.get('op')} at {os.path.basename(str(site.get('file')))}:{site.get('line')} "
            f"in {site.get('function')} ({site.get('calls')} calls)")


def per_step_collectives(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                        ) -> Optional[Finding]:
    """The script issues its own collectives (a loss all-reduce, a barrier) in most steps,
    and they cost a measurable share of the step.

    Trigger (baseline probe): collectives in at least half the measured steps, taking
    >= ``collective_share`` of the step time (counting only call sites outside torch); "medium"
    at or above ``collective_severe_share``. Every call site is named with file:line.
    """
    base, comm = baseline_comm(run)
    calls = comm.get("collectives") or {}
    fraction = calls.get("fraction")
    sites = _script_sites(comm)
    if base is None or fraction is None or not sites \
            or (calls.get("steps_with_calls") or 0) < 0.5:
        return None
    total = sum(float(s.get("seconds") or 0.0) for s in comm.get("sites") or [])
    mine = sum(float(s.get("seconds") or 0.0) for s in sites)
    fraction *= mine / total if total > 0 else 1.0
    if fraction < thresholds.collective_share:
        return None
    return Finding(
        rule="per-step-collectives",
        severity="medium" if fraction >= thresholds.collective_severe_share else "low",
        title="The script synchronises the ranks every step",
        evidence=(f"{calls['per_step']:.1f} collective call(s) per step took "
                  f"{ms(calls['seconds_per_step'])} ({pct(fraction)} of the step): "
                  + "; ".join(_site_text(s) for s in sites[:3]) + ". Each waits for the "
                  "slowest rank" + (", and reading its result (.item()) blocks the host until "
                                    "the GPU gets there" if is_cuda(run, base.id) else "")
                  + "."),
        recommendation=("Keep metrics on the device and reduce them every N steps (at log "
                        "time) instead of every step, or issue the call with async_op=True and "
                        "wait on it when the value is needed."))


def _sync_site_text(site: dict[str, Any]) -> str:
    text = f" `{site['text']}`" if site.get("text") else ""
    via = f" (through {site['via']})" if site.get("via") else ""
    return (f"{os.path.basename(str(site.get('file')))}:{site.get('line')}{text}{via}, "
            f"{_in_steps(site)} calls")


def _in_steps(site: dict[str, Any]) -> int:
    """A site's calls made inside steps (not between epochs: validation, a checkpoint)."""
    return int(site.get("calls") or 0) - int(site.get("outside") or 0)


SYNC_FIXES = (  # what a synchronising line's source says -> how to avoid it
    (("synchronize(",), "take torch.cuda.synchronize() out of the loop (it is needed only to "
                        "time it)"),
    ((".to(", ".cuda(", "copy_("), "copy batches with .to(device, non_blocking=True) from "
                                   "pinned memory (DataLoader(..., pin_memory=True))"),
    ((".item()", ".cpu()", ".tolist()", ".numpy()", "float(", "print("),
     "keep per-step values on the GPU and read them every N steps (at log time)"))
OTHER_SYNC_FIX = ("keep operations that wait for the GPU (a value read on the host, a shape "
                  "that depends on the data: nonzero, boolean indexing) off the per-step path")


def _sync_fixes(sites: list[dict[str, Any]]) -> str:
    """How to avoid the synchronisations found, read from each site's source line, in the
    order of the sites; every fix where no source line was read."""
    fixes: list[str] = []
    for site in sites[:5]:
        text = str(site.get("text") or "")
        fix = next((f for keys, f in SYNC_FIXES if any(k in text for k in keys)), None) \
            if text else None
        fix = fix or (OTHER_SYNC_FIX if text else None)
        if fix and fix not in fixes:
            fixes.append(fix)
    fixes = fixes or [fix for _, fix in SYNC_FIXES]
    sentence = "; ".join(fixes)
    return sentence[0].upper() + sentence[1:] + "."


def host_sync_per_step(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                      ) -> Optional[Finding]:
    """The loop blocks the host on the GPU in most steps (``.item()``, ``.cpu()``, a copy
    without ``non_blocking``, ``torch.cuda.synchronize()``), and the GPU sits idle between
    steps while the host is not waiting for data: after each such wait the GPU's queue is
    empty until the host issues the next work.

    Trigger (CUDA baseline): host syncs counted in at least half its measured steps
    (``comm.host_syncs``), and its GPU idle time between steps, less the part while the host
    waited for data (``gpu_idle_fraction - gpu_starved_fraction``), >= ``host_sync_idle_share``
    of the step; "medium" at >= ``host_sync_severe_share``. Every site is named with
    file:line and its source line; the saving is a labelled prediction (removing the syncs is
    a change to the script, which no probe makes).
    """
    base, comm = baseline_comm(run)
    syncs = comm.get("host_syncs") or {}
    if base is None or (syncs.get("steps_with_syncs") or 0) < 0.5:
        return None
    idle, starved = base.gpu.idle_fraction, base.gpu.starved_fraction
    if idle is None or not finite(idle):
        return None
    unexplained = idle - (starved if finite(starved) else 0.0)
    if unexplained < thresholds.host_sync_idle_share:
        return None
    sites = [s for s in syncs.get("sites") or [] if _in_steps(s) > 0]
    timed = syncs.get("timed_seconds_per_step") or 0.0
    waited = f"; torch.cuda.synchronize() waited {ms(timed)} a step" if timed > 0 else ""
    return Finding(
        rule="host-sync-per-step",
        severity="medium" if unexplained >= thresholds.host_sync_severe_share else "low",
        title="The host waits for the GPU every step",
        evidence=(f"{syncs['per_step']:.1f} host-GPU synchronisation(s) per step, in "
                  f"{pct(syncs['steps_with_syncs'])} of the steps: "
                  + "; ".join(_sync_site_text(s) for s in sites[:3]) + waited
                  + f". The GPU sat idle between steps {pct(idle)} of the time, "
                  f"{pct(unexplained)} of it while the host was not waiting for data: after "
                  "each synchronisation the GPU has no queued work until the host issues it."),
        recommendation=(
            _sync_fixes(sites) + " "
            f"Predicted, not measured: up to {pct(unexplained)} of the step (the GPU's idle "
            "time that waiting for data does not explain), less where the host's own work "
            "per step takes longer than the GPU's."))


def sync_batchnorm(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                  ) -> Optional[Finding]:
    """A DDP module holds SyncBatchNorm layers: every forward gathers their statistics across
    ranks. Trigger: ``has_sync_bn`` in the baseline's DDP configuration; the cost is quoted
    where its collectives were timed (call sites inside torch's batch-norm function), else the
    finding is informational ("low")."""
    base, comm = baseline_comm(run)
    if base is None or not comm.get("has_sync_bn"):
        return None
    bn = [s for s in comm.get("sites") or [] if "_functions" in str(s.get("file"))
          and TORCH_DIR in str(s.get("file"))]
    seconds = sum(float(s.get("seconds") or 0.0) for s in bn)
    calls = sum(int(s.get("calls") or 0) for s in bn)
    cost = (f" Its collectives were timed at {seconds:.2f} s over {calls} calls in this probe."
            if calls else " Its collectives were not timed separately in this run.")
    return Finding(
        rule="sync-batchnorm", severity="low", title="SyncBatchNorm synchronises every forward",
        evidence="The DDP model contains SyncBatchNorm layers: each of their forwards "
                 "all-gathers batch statistics from every rank." + cost,
        recommendation=("Keep SyncBatchNorm only where the per-rank batch is too small for "
                        "stable statistics; plain BatchNorm needs no communication."))


RULES = [exposed_communication, allreduce_per_micro_batch, per_step_collectives,
         host_sync_per_step, sync_batchnorm]

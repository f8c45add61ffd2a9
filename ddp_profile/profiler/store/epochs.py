"""A rank's measured steps as the script runs them: steady steps, and the epoch restarts.

A DataLoader whose workers are not persistent starts them again at every epoch; a probe's
measured steps hold a restart or not depending on where the epoch happens to end, and one
restart among a few dozen measured steps weighs more than the script ever pays for it. So
each configuration is measured the same way, whatever its window holds: the **steady** steps
(outside every iterator's start segment), the **restart cost** (the data wait a start
segment, the step that waited for a fresh iterator's first batch and the ``num_workers x
prefetch_factor`` steps after it, costs above that many steady steps), and the **throughput as
run**, the steady steps with one restart added per epoch: ``E x b / (E x s + c)``. Only for
loaders that restart (workers, not persistent) whose epoch length is known; others keep every
measured step as it came. ``steady_throughput`` is what ``persistent_workers=True`` leaves,
reported as a prediction with that basis (docs/how-it-works.md, "Epochs and worker
restarts").
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from ddp_profile.profiler.store.probes import ProbeRecord


def step_seconds(step: dict[str, Any]) -> float:
    return step["data_wait_s"] + step["compute_s"] + step["other_s"]


def epoch_steps(loader: Optional[dict[str, Any]]) -> Optional[int]:
    """Steps in one epoch of a rank's training loader as this probe ran it; None if unknown."""
    own, applied = (loader or {}).get("own") or {}, (loader or {}).get("applied") or {}
    samples, batch = own.get("epoch_samples"), applied.get("batch_size") or own.get("batch_size")
    if not isinstance(samples, int) or not isinstance(batch, int) or samples <= 0 or batch <= 0:
        return None
    steps = samples // batch if own.get("drop_last") else math.ceil(samples / batch)
    return steps or None


def restarts_per_epoch(loader: Optional[dict[str, Any]]) -> bool:
    """True when the loader starts its workers again at every epoch: it has workers, they are
    not persistent, and no iterator of it was seen to outlive an epoch (``keeps_iterator``: a
    loader that keeps one iterator over a repeated sampler starts its workers once)."""
    own, applied = (loader or {}).get("own") or {}, (loader or {}).get("applied") or {}
    return bool(applied.get("num_workers")) and own.get("persistent_workers") is False \
        and (loader or {}).get("persistent_workers") is not True \
        and not (loader or {}).get("keeps_iterator")


@dataclass(frozen=True)
class Restart:
    """The restart a rank's loader pays once per epoch."""

    seconds: float  # data wait above the steady steps', per epoch
    epoch_steps: int
    segment_steps: frozenset[int]  # step numbers inside start segments


def _segments(steps: list[dict[str, Any]], length: int) -> list[list[dict[str, Any]]]:
    """Each iterator start and the ``length - 1`` steps after it (cut at the next start)."""
    segments: list[list[dict[str, Any]]] = []
    for step in sorted(steps, key=lambda s: s["step"]):
        if step.get("loader_start"):
            segments.append([step])
        elif segments and len(segments[-1]) < length \
                and step["step"] == segments[-1][-1]["step"] + 1:
            segments[-1].append(step)
    return segments


def _waited(step: dict[str, Any]) -> float:
    """A step's data wait; for a fresh iterator's first step, from the iterator's creation
    (``iter_start_s``: starting the workers happens before the loop asks for a batch)."""
    return max(step["data_wait_s"], step.get("iter_start_s") or 0.0)


def restart(steps: list[dict[str, Any]], loader: Optional[dict[str, Any]]) -> Optional[Restart]:
    """The per-epoch restart of a rank's training steps (all of them, warm-up included);
    None where the loader does not restart, the epoch length is unknown, or no start segment
    and steady step were recorded."""
    epoch = epoch_steps(loader)
    if epoch is None or not restarts_per_epoch(loader):
        return None
    applied = (loader or {}).get("applied") or {}
    length = int(applied["num_workers"]) * int(applied.get("prefetch_factor") or 2) + 1
    segments = _segments(steps, length)
    inside = frozenset(s["step"] for segment in segments for s in segment)
    steady = [s for s in steps if s.get("measured") and s["step"] not in inside]
    whole = [seg for seg in segments if len(seg) == length]
    if not steady or not whole:
        return None
    wait = statistics.fmean(s["data_wait_s"] for s in steady)
    excess = statistics.fmean(sum(_waited(s) for s in seg) - length * wait for seg in whole)
    return Restart(max(0.0, excess), epoch, inside)


def rank_step_stats(steps: list[dict[str, Any]], loader: Optional[dict[str, Any]] = None
                    ) -> dict[str, Any]:
    """Measured-step statistics of one rank: samples/s as run (see the module docstring),
    data-wait share, median step time, and the restart behind them (``restart_s`` per epoch,
    ``epoch_steps``, ``steady_throughput``; None where the loader does not restart)."""
    measured = [s for s in steps if s.get("measured")]
    if not measured:
        return {"steps": 0, "samples": 0, "elapsed_s": math.nan, "data_wait_s": math.nan,
                "data_wait_fraction": math.nan, "step_time_median_s": math.nan,
                "throughput": math.nan, "restart_s": None, "epoch_steps": None,
                "steady_throughput": None, "steady_s": None, "segment_steps": frozenset()}
    cost = restart(steps, loader)
    base = [s for s in measured if s["step"] not in cost.segment_steps] if cost else measured
    step_s = [step_seconds(s) for s in base]
    steady = sum(step_s)
    extra = cost.seconds * len(base) / cost.epoch_steps if cost else 0.0
    elapsed = steady + extra
    wait = sum(s["data_wait_s"] for s in base) + extra
    samples = sum(s.get("samples") or 0 for s in base)
    return {"steps": len(measured), "samples": samples, "elapsed_s": elapsed,
            "data_wait_s": wait, "data_wait_fraction": wait / elapsed if elapsed > 0 else math.nan,
            "step_time_median_s": statistics.median(step_s),
            "throughput": samples / elapsed if elapsed > 0 else math.nan,
            "restart_s": cost.seconds if cost else None,
            "epoch_steps": cost.epoch_steps if cost else None,
            "steady_throughput": samples / steady if cost and steady > 0 else None,
            "steady_s": steady if cost else None,
            "segment_steps": cost.segment_steps if cost else frozenset()}


def restart_share(record: "ProbeRecord") -> Optional[float]:
    """The share of an epoch a probe's loader spent starting its workers again, from its
    summary (``1 - throughput / steady_throughput``: the rate as run against the rate between
    restarts); None where no restart was measured."""
    epochs, rate = record.epochs, record.throughput
    if epochs is None or not epochs.restart_s or not epochs.steady_throughput or not rate:
        return None
    return max(0.0, 1.0 - rate / epochs.steady_throughput)


def whole_epochs(steps: list[dict[str, Any]], loader: Optional[dict[str, Any]]
                 ) -> Optional[tuple[int, float]]:
    """(samples, seconds) of the most whole epochs the measured steps span, by the wall clock
    from the first measured step's start to the start of the step one or more epochs later:
    whatever an epoch boundary costs (workers shut down and started again, or a persistent
    pool refilled) is inside, as often as the script pays it. None where the epoch's length
    is unknown or the measured steps hold less than one epoch and the step after it."""
    length = epoch_steps(loader)
    measured = sorted((s for s in steps if s.get("measured") and s.get("t_ns") is not None),
                      key=lambda s: s["step"])
    if not length or len(measured) <= length:
        return None
    span = (len(measured) - 1) // length * length
    first, last = measured[0], measured[span]
    if last["step"] - first["step"] != span:
        return None  # a gap in the measured steps
    seconds = (last["t_ns"] - first["t_ns"]) / 1e9
    samples = sum(s.get("samples") or 0 for s in measured[:span])
    return (samples, seconds) if seconds > 0 and samples > 0 else None

"""The search space: which DataLoader settings a sweep may try, with defaults and pruning."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any, Optional

from ddp_profile.profiler.cpus import cpus_per_rank
from ddp_profile.profiler.settings import LoaderSettings


@dataclass(frozen=True)
class SearchSpace:
    """Values given on the command line; ``None`` means "choose the default"."""

    num_workers: Optional[tuple[int, ...]] = None
    pin_memory: Optional[tuple[bool, ...]] = None
    prefetch_factor: Optional[tuple[int, ...]] = None
    batch_size: Optional[tuple[int, ...]] = None

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if v is not None else None for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SearchSpace":
        return cls(**{k: tuple(v) if v is not None else None for k, v in data.items()})


def worker_ladder(cpus_per_rank: int) -> list[int]:
    """0, 1, 2, 4, ... up to the CPUs available per local rank (always including it)."""
    top = max(1, cpus_per_rank)
    ladder, value = [0, 1], 2
    while value < top:
        ladder.append(value)
        value *= 2
    ladder.append(top)
    return sorted(set(ladder))


@dataclass(frozen=True)
class Axes:
    """The concrete values of each axis for one run, after defaults were filled in."""

    num_workers: tuple[int, ...]
    pin_memory: tuple[bool, ...]
    prefetch_factor: tuple[int, ...]
    batch_size: tuple[Optional[int], ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) for k, v in asdict(self).items()}


def resolve_axes(space: SearchSpace, baseline: LoaderSettings, device: str,
                 cpus_available: int, local_ranks: int) -> Axes:
    """Fill the defaults: worker ladder, pinning only on CUDA, prefetch 2 and 4, own batch."""
    notes = []
    workers = space.num_workers or tuple(worker_ladder(int(cpus_per_rank(cpus_available,
                                                                         local_ranks))))
    if space.pin_memory is not None:
        pins = space.pin_memory
        if device != "cuda":
            notes.append("pin_memory has no effect without CUDA; it was swept as asked")
    elif device == "cuda":
        pins = (False, True)
    else:
        pins = (bool(baseline.pin_memory),)
        notes.append("pin_memory is kept as the script set it: without CUDA it has no effect")
    prefetch = space.prefetch_factor or (2, 4)
    batches = space.batch_size or (baseline.batch_size,)
    return Axes(tuple(sorted(set(workers))), tuple(pins), tuple(sorted(set(prefetch))),
                tuple(batches), tuple(notes))


def normalise(config: LoaderSettings) -> LoaderSettings:
    """Prune what PyTorch forbids: no prefetch_factor without workers."""
    if (config.num_workers or 0) == 0 and config.prefetch_factor is not None:
        return LoaderSettings(config.num_workers, config.pin_memory, None, config.batch_size)
    return config


def grid(axes: Axes) -> list[LoaderSettings]:
    """Every valid combination, cheapest first, without duplicates."""
    seen, configs = set(), []
    for bs, workers, pin, prefetch in itertools.product(axes.batch_size, axes.num_workers,
                                                        axes.pin_memory, axes.prefetch_factor):
        config = normalise(LoaderSettings(workers, pin, prefetch, bs))
        if config not in seen:
            seen.add(config)
            configs.append(config)
    return configs


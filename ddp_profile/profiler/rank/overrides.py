"""DataLoader arguments: the script's own settings, and the probe's overrides applied to them.

Works on the bound arguments of ``DataLoader.__init__`` (``inspect.BoundArguments.arguments``),
before the real constructor runs, so PyTorch validates what is finally built.
"""

from __future__ import annotations

from typing import Any, Optional

from ddp_profile.profiler.rank.facts import dataset_fingerprint
from ddp_profile.profiler.settings import SETTING_KEYS, LoaderSettings


def own_settings(arguments: dict[str, Any]) -> dict[str, Any]:
    batch_sampler = arguments.get("batch_sampler")
    sampler = arguments.get("sampler")
    if batch_sampler is not None:
        sampler = getattr(batch_sampler, "sampler", sampler)
    batch_size = arguments.get("batch_size")
    if batch_sampler is not None:
        batch_size = getattr(batch_sampler, "batch_size", None)
    dataset = arguments.get("dataset")
    try:
        dataset_len = len(dataset)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001
        dataset_len = None
    num_workers = arguments.get("num_workers") or 0
    prefetch = arguments.get("prefetch_factor")
    try:
        fingerprint = dataset_fingerprint(dataset) if dataset_len else None
    except Exception:  # noqa: BLE001 - evidence, never a failure
        fingerprint = None
    return {
        "num_workers": num_workers, "pin_memory": bool(arguments.get("pin_memory")),
        "prefetch_factor": (prefetch if prefetch is not None else 2) if num_workers > 0 else None,
        "batch_size": batch_size, "persistent_workers": bool(arguments.get("persistent_workers")),
        "drop_last": bool(getattr(batch_sampler, "drop_last", arguments.get("drop_last"))),
        "sampler": type(sampler).__name__ if sampler is not None else
        ("RandomSampler" if arguments.get("shuffle") else "SequentialSampler"),
        "sampler_shuffle": bool(getattr(sampler, "shuffle", arguments.get("shuffle"))),
        "distributed_sampler": _is_distributed_sampler(sampler),
        "batch_sampler": type(batch_sampler).__name__ if batch_sampler is not None else None,
        "dataset": type(dataset).__name__, "dataset_len": dataset_len,
        "iterable": _is_iterable(dataset),
        "epoch_samples": epoch_samples(arguments, dataset_len, batch_size),
        "dataset_fingerprint": fingerprint,
    }


def epoch_samples(arguments: dict[str, Any], dataset_len: Optional[int],
                  batch_size: Optional[int]) -> Optional[int]:
    """The samples one epoch of this rank's loader covers: its batch sampler's batches x the
    batch size, else its sampler's length, else (the default samplers) the whole dataset."""
    batch_sampler, sampler = arguments.get("batch_sampler"), arguments.get("sampler")
    try:
        if batch_sampler is not None:
            return len(batch_sampler) * batch_size if batch_size else None
        return len(sampler) if sampler is not None else dataset_len
    except Exception:  # noqa: BLE001 - a sampler without a length
        return None


def _is_iterable(dataset: Any) -> bool:
    from torch.utils.data import IterableDataset

    return isinstance(dataset, IterableDataset)


def _is_distributed_sampler(sampler: Any) -> bool:
    from torch.utils.data.distributed import DistributedSampler

    if isinstance(sampler, DistributedSampler):
        return True
    # duck typing for samplers that shard by rank without subclassing
    return hasattr(sampler, "num_replicas") and hasattr(sampler, "rank")


def apply_overrides(arguments: dict[str, Any], overrides: LoaderSettings,
                    persistent_workers: Optional[bool] = None
                    ) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Apply the probe's settings to DataLoader arguments in place (``persistent_workers``
    True: a loader with workers keeps them across epochs; None: as the script has it).

    Returns the settings that will run and the overrides that were not applied, with why.
    """
    skipped: list[dict[str, str]] = []
    if overrides.num_workers is not None:
        arguments["num_workers"] = overrides.num_workers
        if overrides.num_workers == 0:
            if arguments.get("persistent_workers"):
                arguments["persistent_workers"] = False
            arguments["prefetch_factor"] = None
    if overrides.pin_memory is not None:
        arguments["pin_memory"] = overrides.pin_memory
    if overrides.prefetch_factor is not None:
        if (arguments.get("num_workers") or 0) > 0:
            arguments["prefetch_factor"] = overrides.prefetch_factor
        else:
            skipped.append({"setting": "prefetch_factor",
                            "reason": "PyTorch allows prefetch_factor only with num_workers > 0"})
    if overrides.batch_size is not None:
        reason = _apply_batch_size(arguments, overrides.batch_size)
        if reason:
            skipped.append({"setting": "batch_size", "reason": reason})
    if persistent_workers and (arguments.get("num_workers") or 0) > 0:
        arguments["persistent_workers"] = True
    own = own_settings(arguments)
    applied = {k: own[k] for k in SETTING_KEYS}
    return applied, skipped


def _apply_batch_size(arguments: dict[str, Any], batch_size: int) -> Optional[str]:
    from torch.utils.data import BatchSampler

    batch_sampler = arguments.get("batch_sampler")
    if batch_sampler is not None:
        if type(batch_sampler) is not BatchSampler:
            return (f"the script's batch sampler {type(batch_sampler).__name__} cannot be rebuilt "
                    f"with another batch size")
        arguments["batch_sampler"] = BatchSampler(batch_sampler.sampler, batch_size,
                                                  batch_sampler.drop_last)
        return None
    if arguments.get("batch_size") is None:
        return "the script disables automatic batching (batch_size=None)"
    arguments["batch_size"] = batch_size
    return None

"""Facts a rank records about itself besides its steps: threads, batch fingerprints, workers.

* ``thread_facts()``: torch's intra-op and inter-op thread counts and the environment
  variables that size them (recorded in the context as ``threads``).
* ``batch_fingerprint(batch)``: a short digest of a batch's contents, cheap on large tensors
  (a strided sample of at most ``FINGERPRINT_VALUES`` values per tensor, plus shapes and
  dtypes). Ranks that receive equal fingerprints read the same samples.
* ``dataset_fingerprint(dataset)``: a digest of what a dataset object holds (its attributes:
  tensors and arrays sampled like batches, plain values, the ends and middle of lists, nested
  datasets), never fetching an item. Ranks with equal digests built the same dataset; a
  dataset that holds nothing readable (or its rank) gets None or a digest of its own.
* ``worker_pids(iterator)``: the pids of a DataLoader iterator's own worker processes.
* ``memory_available()``: the host's available memory.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Optional

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
FINGERPRINT_VALUES = 4096
FINGERPRINT_BATCHES = 3  # the first batches of the first epoch of each loader


def thread_facts() -> dict[str, Any]:
    """``{intra_op, interop, env: {OMP_NUM_THREADS: "1" | None, ...}}`` of this process."""
    import torch

    facts: dict[str, Any] = {"intra_op": None, "interop": None,
                             "env": {name: os.environ.get(name) for name in THREAD_ENV}}
    try:
        facts["intra_op"] = int(torch.get_num_threads())
        facts["interop"] = int(torch.get_num_interop_threads())
    except Exception:  # noqa: BLE001 - facts are best effort
        pass
    return facts


def _tensor_bytes(tensor: Any) -> bytes:
    import torch

    flat = tensor.detach().reshape(-1)
    stride = max(1, flat.numel() // FINGERPRINT_VALUES)
    sample = flat[::stride][:FINGERPRINT_VALUES]
    if sample.is_floating_point() or sample.is_complex():
        sample = sample.to(torch.float64) if not sample.is_complex() else sample
    header = f"{tuple(tensor.shape)}|{tensor.dtype}|".encode()
    return header + sample.cpu().contiguous().numpy().tobytes()


def batch_fingerprint(batch: Any, limit: int = 64) -> Optional[str]:
    """A hex digest of a batch's tensors and plain values; None if it holds none."""
    import torch

    digest = hashlib.blake2b(digest_size=12)
    stack, seen = [batch], 0
    while stack and seen < limit:
        item = stack.pop(0)
        if isinstance(item, torch.Tensor):
            digest.update(_tensor_bytes(item))
            seen += 1
        elif isinstance(item, dict):
            stack.extend(item[k] for k in sorted(item, key=str))
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, (str, bytes, int, float, bool)):
            digest.update(repr(item).encode()[:256])
            seen += 1
        else:
            data = getattr(item, "data", None)  # e.g. a BatchEncoding or a custom batch type
            if isinstance(data, dict):
                stack.append(data)
    return digest.hexdigest() if seen else None


DATASET_ATTRIBUTES = 32  # attributes of one dataset object read, at most
DATASET_ROWS = 16  # rows of a dataset's tensor or array read (evenly spaced), at most


def dataset_fingerprint(dataset: Any) -> Optional[str]:
    """A hex digest of what ``dataset`` holds, or None when nothing in it says which data it
    is (no tensor, array, path-like string or list among its attributes)."""
    digest = hashlib.blake2b(digest_size=12)
    found = _digest_object(dataset, digest, depth=0)
    return digest.hexdigest() if found else None


def _digest_object(obj: Any, digest: Any, depth: int) -> bool:
    digest.update(type(obj).__name__.encode())
    try:
        attributes = vars(obj)
    except TypeError:
        return False
    found = False
    for name in sorted(attributes)[:DATASET_ATTRIBUTES]:
        digest.update(name.encode())
        try:
            found |= _digest_value(attributes[name], digest, depth)
        except Exception:  # noqa: BLE001 - an unreadable attribute: its kind only
            digest.update(type(attributes[name]).__name__.encode())
    return found


def _rows(array: Any) -> Any:
    """A few evenly spaced rows of a tensor or array as a small tensor, plus its full shape:
    never the whole (a dataset may hold gigabytes, or a memory-mapped file)."""
    import torch

    shape = tuple(array.shape)
    if not shape or shape[0] <= DATASET_ROWS:
        rows = array
    else:
        step = shape[0] / DATASET_ROWS
        rows = array[[int(i * step) for i in range(DATASET_ROWS)]]
    if not isinstance(rows, torch.Tensor):
        import numpy as np

        rows = torch.as_tensor(np.ascontiguousarray(rows))
    return shape, rows


def _digest_value(value: Any, digest: Any, depth: int) -> bool:
    """Add ``value`` to ``digest``; whether it says something about the data."""
    import torch

    if isinstance(value, torch.Tensor) or (type(value).__module__ == "numpy"
                                           and hasattr(value, "shape")):
        shape, rows = _rows(value)
        digest.update(f"{shape}|".encode() + _tensor_bytes(rows))
        return True
    if isinstance(value, (str, bytes)):
        digest.update(repr(value).encode()[:256])
        return isinstance(value, str) and (os.sep in value or "." in value)
    if isinstance(value, (int, float, bool)) or value is None:
        digest.update(repr(value).encode())
        return False
    if isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__}:{len(value)}".encode())
        found = len(value) >= 2
        for item in (value[:1] + value[len(value) // 2:len(value) // 2 + 1] + value[-1:]
                     if value else ()):
            if isinstance(item, (str, bytes, int, float, bool)):
                digest.update(repr(item).encode()[:256])
            elif depth < 2:
                found |= _digest_value(item, digest, depth + 1)
        return found
    if depth < 2 and hasattr(value, "__getitem__") and hasattr(value, "__len__") \
            and hasattr(value, "__dict__"):  # a nested dataset (Subset, ConcatDataset)
        return _digest_object(value, digest, depth + 1)
    digest.update(type(value).__name__.encode())  # a transform, a handle: its kind only
    return False


def worker_pids(iterator: Any) -> list[int]:
    """The pids of a DataLoader iterator's worker processes (none with ``num_workers=0``)."""
    pids = []
    for worker in getattr(iterator, "_workers", None) or ():
        pid = getattr(worker, "pid", None)
        if isinstance(pid, int):
            pids.append(pid)
    return pids


def memory_available() -> Optional[int]:
    """The host's available memory (bytes, ``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None

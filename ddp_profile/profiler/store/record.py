"""Per-rank records as JSON lines; never pickle.

Each rank of a probe writes ``<probe_dir>/rank-<rank>.jsonl``. Every line is one JSON object
with a ``kind``: ``context`` (the rank's environment and the training loader's own and applied
settings), ``loader_iter`` (one per ``iter(loader)``), ``step`` (one per training step),
``sample`` (telemetry), ``event`` (a fact for the rules), ``error`` (the exception that ended
the rank), ``end`` (written when the rank stops), ``batch_cost`` and ``pin_cost`` (what making
and pinning a batch cost: ``rank.loading.loadcost``; DataLoader workers write theirs to
``<probe_dir>/workers/*.jsonl``). Every field: docs/internals.md, "Per-rank records".

The rank is often unknown when the first records are made (a DataLoader is commonly built
before ``init_process_group``), so records are buffered until the first flush, which names
the file after the rank known by then.
"""

from __future__ import annotations

import json
import math
import os
import threading
from typing import Any, Callable, Optional

SCHEMA_VERSION = 2  # 2: steps carry communication (ddp_n, ddp_t, coll_*); 1 reads as none
SCRIPT_EXIT = "script_exit"  # the end record's reason where the rank's script ended by itself
ITERATOR_OUTLIVES_EPOCH = "iterator_outlives_epoch"  # event: one iterator of the loader served
# more than len(loader) batches, so the loader keeps it across epochs (no restart per epoch)
WORKER_DIR = "workers"  # <probe_dir>/workers/: one JSON-lines file per DataLoader worker
TORCH_DIR = os.sep + "torch" + os.sep  # in a call site's ``file``: a frame inside torch (the
# ranks pass over such frames to find the script's; the rules tell torch's sites from the script's)


def clean_json(value: Any) -> Any:
    """JSON has no NaN: write it as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value


_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str, allow_nan=False)


def dumps(record: dict[str, Any]) -> str:
    """One compact JSON line; NaN and infinities become null.

    The common case (every number finite) takes one encoder call; only a record the encoder
    refuses is walked by :func:`clean_json`: this runs once per training step.
    """
    try:
        return _ENCODER.encode(record)
    except ValueError:
        return json.dumps(clean_json(record), separators=(",", ":"), default=str)


class RankRecorder:
    """Buffers records and appends them to the rank's JSON-lines file; thread-safe.

    A hot path queues a row instead of a line (``defer``): a tuple whose first item makes its
    JSON line, ``row[0](row, rank)``, called at the flush with the rank known by then. The
    rows are encoded in the order they came, with the lines among them.

    Queuing takes no lock: ``list.append`` is atomic (under the GIL, and under the list's own
    lock where there is none), and the queue is one list, never replaced. A flush (one at a
    time, under the lock) encodes the first ``n`` items it found and deletes those alone, so
    whatever another thread queues meanwhile waits, in order, for the next flush."""

    def __init__(self, out_dir: str, rank_of: Callable[[], Optional[int]]):
        self._out_dir = out_dir
        self._rank_of = rank_of
        self._lock = threading.Lock()
        self._pending: list[Any] = []
        self.queue = self._pending  # read-only to others: its length is ``pending``
        # ``defer(row)``: queue one record as a row, encoded at the flush (see the class); the
        # list's own append, one C call on the hot path
        self.defer: Callable[[Any], None] = self._pending.append
        self._file = None
        self.path: Optional[str] = None

    def write(self, record: dict[str, Any]) -> None:
        self._pending.append(dumps(record))

    def write_line(self, line: str) -> None:
        """Queue one record already formatted as a JSON object (a hot path's own format)."""
        self._pending.append(line)

    @property
    def pending(self) -> int:
        """Records queued since the last flush."""
        return len(self._pending)

    def flush(self) -> None:
        with self._lock:
            pending = self._pending
            count = len(pending)
            if not count:
                return
            if self._file is None:
                self._open()
            rank = self._rank_of()
            items = pending[:count]
            try:  # every row at once; where one fails, each on its own (``_encoded``)
                lines = [item if item.__class__ is str else item[0](item, rank)
                         for item in items]
            except Exception:  # noqa: BLE001
                lines = [item if item.__class__ is str else _encoded(item, rank)
                         for item in items]
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
            del pending[:count]

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._file is not None:
                try:
                    os.fsync(self._file.fileno())
                except OSError:
                    pass
                self._file.close()
                self._file = None

    def _open(self) -> None:
        rank = self._rank_of()
        name = f"rank-{rank}.jsonl" if rank is not None else f"pid-{os.getpid()}.jsonl"
        os.makedirs(self._out_dir, exist_ok=True)
        self.path = os.path.join(self._out_dir, name)
        self._file = open(self.path, "a", encoding="utf-8")


def _encoded(row: tuple, rank: Optional[int]) -> str:
    """A row's line; one its encoder cannot make is kept as what it says of itself (never a
    flush lost to one row)."""
    try:
        return row[0](row, rank)
    except Exception as exc:  # noqa: BLE001
        return dumps({"kind": "unencoded", "row": repr(row)[:500],
                      "error": f"{type(exc).__name__}: {exc}"})


def rank_files(out_dir: str) -> list[str]:
    """The paths of the ranks' record files in ``out_dir`` (``RankRecorder``'s
    ``rank-N.jsonl``), sorted; [] where there is no such folder."""
    try:
        names = sorted(os.listdir(out_dir))
    except OSError:
        return []
    return [os.path.join(out_dir, n) for n in names
            if n.startswith("rank-") and n.endswith(".jsonl")]


def read_jsonl(path: str) -> tuple[list[dict[str, Any]], int]:
    """Read a JSON-lines file; return the records and the number of unreadable lines.

    A rank killed mid-write leaves a torn last line: it is skipped and counted, never fatal.
    """
    records: list[dict[str, Any]] = []
    bad = 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(value, dict):
                records.append(value)
            else:
                bad += 1
    return records, bad

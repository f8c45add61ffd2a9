"""The run directory on disk: metadata, the append-only ledger, the summary, the in-flight mark.

Writes that matter are durable: ledger lines are appended and fsynced one probe at a time, and
``summary.json`` / ``run.json`` are replaced atomically (write, fsync, rename), so a SIGKILL at any
moment leaves a directory that ``load_run`` reads and ``--resume`` completes.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Optional

from ddp_profile.errors import BadRunDir
from ddp_profile.profiler.store.atomic import write_text_atomic
from ddp_profile.profiler.store.record import dumps
from ddp_profile.profiler.store.results import AMENDS, read_json, read_ledger


def write_json_atomic(path: str, value: Any) -> None:
    """Replace ``path`` with ``value`` as indented JSON (NaN as null), atomically and durably."""
    write_text_atomic(path, json.dumps(json.loads(dumps(value)), indent=2))


class RunDir:
    def __init__(self, path: str):
        self.path = path

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def probe_dir(self, probe_id: str) -> str:
        return os.path.join(self.path, "probes", probe_id)

    # ---- metadata -------------------------------------------------------------------------
    def create(self, meta: dict[str, Any]) -> None:
        if os.path.exists(self.file("run.json")) or os.path.exists(self.file("ledger.jsonl")):
            raise BadRunDir(f"{self.path} already holds a run: use --resume to finish it, or "
                            f"choose another --out")
        os.makedirs(self.path, exist_ok=True)
        write_json_atomic(self.file("run.json"), meta)

    def read_meta(self) -> dict[str, Any]:
        if not os.path.isdir(self.path):
            raise BadRunDir(f"run directory not found: {self.path}")
        return read_json(self.file("run.json"), "run metadata")

    # ---- ledger ---------------------------------------------------------------------------
    def ledger(self) -> list[dict[str, Any]]:
        entries, _torn = read_ledger(self.path)
        return [e for e in entries if e.get("id")]

    def append(self, entry: dict[str, Any]) -> None:
        path = self.file("ledger.jsonl")
        self._repair_torn_tail(path)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(dumps(entry) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def amend(self, probe_id: str, fields: dict[str, Any]) -> None:
        """Correct a probe already in the ledger by appending a line (``results.AMENDS``):
        every reader folds it in, so the ledger alone and summary.json agree."""
        self.append({AMENDS: probe_id, "fields": fields})

    @staticmethod
    def _repair_torn_tail(path: str) -> None:
        """A line torn by a kill mid-append would glue onto the next: end it first."""
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            return
        with open(path, "rb+") as handle:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                handle.write(b"\n")

    # ---- in-flight probe --------------------------------------------------------------------
    def mark_inflight(self, probe_id: str, tag: str) -> None:
        write_json_atomic(self.file("inflight.json"), {"probe_id": probe_id, "tag": tag})

    def clear_inflight(self) -> None:
        try:
            os.remove(self.file("inflight.json"))
        except FileNotFoundError:
            pass

    def inflight(self) -> Optional[dict[str, Any]]:
        path = self.file("inflight.json")
        if not os.path.exists(path):
            return None
        try:
            return read_json(path, "in-flight marker")
        except BadRunDir:
            return None

    def discard_partial_probe(self, probe_id: str) -> None:
        """Move a probe directory without a ledger entry aside (its launch never finished)."""
        source = self.probe_dir(probe_id)
        if not os.path.exists(source):
            return
        index = 0
        while os.path.exists(f"{source}.aborted-{index}"):
            index += 1
        shutil.move(source, f"{source}.aborted-{index}")

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.file("summary.json"), summary)

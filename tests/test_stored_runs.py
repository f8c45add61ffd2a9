"""Stored scenario runs re-read give the summary.json they gave when stored.

Each directory under ``tests/data/runs/`` is a small run directory (``run.json``, the ledger
and each probe's rank files; see its README); ``tests/data/expected/<name>.json`` is the
summary.json its re-reading wrote when it was stored. The re-reading goes through the path
that writes summary.json at the end of a sweep (``commands.run.finalize``): the ledger's
records, every probe's rank files read once, ``build_summary`` with the capacity model, then
``rules.evaluate`` over the assembled run. The comparison is exact but for what legitimately
varies between machines (``VARIES``). ``python -m tests.test_stored_runs`` rewrites the
expected files: only when a change of the summary is meant, and said so in its commit.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from ddp_profile.profiler.decide.capacity import run_capacity
from ddp_profile.profiler.store.probes import records
from ddp_profile.profiler.store.record import clean_json
from ddp_profile.profiler.store.results import assemble, read_json, read_ledger, read_probes
from ddp_profile.profiler.store.summary import build_summary
from ddp_profile.rules import evaluate

DATA = Path(__file__).parent / "data"
RUNS, EXPECTED = DATA / "runs", DATA / "expected"
NAMES = sorted(p.name for p in RUNS.iterdir() if (p / "run.json").exists()) \
    if RUNS.is_dir() else []
VARIES = (("environment", "python"),)  # the interpreter that re-read it


def _gpu(stored: dict[str, Any]) -> dict[str, Any]:
    """The GPU status the sweep saw, as it stored it (re-reading samples no hardware)."""
    env = stored.get("environment") or {}
    names = (env.get("gpu_name") or "").split(", ") if env.get("gpu_name") else []
    return {"gpu_available": stored.get("gpu_available"),
            "gpu_unavailable_reason": stored.get("gpu_unavailable_reason"),
            "driver_version": env.get("driver_version"), "gpus": [{"name": n} for n in names]}


def reanalyse(run_dir: str) -> dict[str, Any]:
    """The summary.json of a stored run, written again as ``commands.run.finalize`` writes it
    (its sweep's own decisions, ``search``, and the GPU status read from the stored one)."""
    meta = read_json(os.path.join(run_dir, "run.json"), "run metadata")
    stored = read_json(os.path.join(run_dir, "summary.json"), "summary")
    entries = records(e for e in read_ledger(run_dir)[0] if e.get("id"))
    tables = read_probes(run_dir, [e.id for e in entries])
    state = stored.get("state") or "complete"
    summary = build_summary(meta, entries, tables.first_context(), _gpu(stored), state,
                            search=stored.get("search"), capacity=run_capacity)
    if state == "complete" and any(e.ok for e in entries):
        run = assemble(run_dir, meta, summary, tables)
        summary = {**summary, **evaluate(run).summary_fields()}
    return json.loads(json.dumps(clean_json(summary)))


def _without_varying(summary: dict[str, Any]) -> dict[str, Any]:
    summary = json.loads(json.dumps(summary))
    for path in VARIES:
        node = summary
        for key in path[:-1]:
            node = node.get(key) or {}
        node.pop(path[-1], None)
    return summary


@pytest.mark.parametrize("name", NAMES)
def test_stored_run_gives_its_stored_summary(name: str) -> None:
    expected = json.loads((EXPECTED / f"{name}.json").read_text(encoding="utf-8"))
    summary = _without_varying(reanalyse(str(RUNS / name)))
    expected = _without_varying(expected)
    for key in sorted(set(summary) | set(expected)):  # the first key that differs, named
        assert summary.get(key) == expected.get(key), f"{name}: summary[{key!r}] differs"
    assert summary == expected


def test_the_scenarios_are_stored() -> None:
    assert len(NAMES) >= 4, NAMES
    for name in NAMES:
        assert (EXPECTED / f"{name}.json").exists(), f"no expected summary for {name}"


def main() -> None:
    """Rewrite the expected summaries from the stored runs (see the module docstring)."""
    EXPECTED.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        path = EXPECTED / f"{name}.json"
        path.write_text(json.dumps(reanalyse(str(RUNS / name)), indent=1, sort_keys=True)
                        + "\n", encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Probes read out of the run's page-cache regime are measured again, once (twice where the
second missed only files no launch had read before); where the machine does not hold the
regime, the run stops paying two launches per probe and says why."""

from __future__ import annotations

import json
import os
from typing import Optional

from ddp_profile.profiler.cache import decide
from ddp_profile.profiler.launch.ranks import LaunchSpec
from ddp_profile.profiler.settings import LoaderSettings
from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.store.rundir import RunDir
from ddp_profile.profiler.sweep.measure import LedgerMeasurer
from ddp_profile.profiler.sweep.state import Window

GB = 10 ** 9


def measurer(tmp_path, shares: list[float], reads: Optional[list[list[str]]] = None
             ) -> tuple[LedgerMeasurer, list[str]]:
    """A real measurer over a real run directory whose launches read ``shares`` of their
    bytes from storage, in turn (and, where given, the files ``reads``, recorded as a rank
    records them); and the notes it printed."""
    run_dir = RunDir(str(tmp_path / "run"))
    run_dir.create({"script": "train.py"})
    notes: list[str] = []
    found = LedgerMeasurer(run_dir, LaunchSpec(script="train.py"), steps=10, warmup=2,
                           progress=lambda kind, data: notes.append(data.get("text", "")))
    found.regime = decide("warm", ProbeRecord.from_json({
        "id": "p000", "status": "ok", "loading": {"read_per_sample_bytes": 4096}}), 1000, GB)
    pending = list(shares)

    def launch(window: Window):
        entry = {"id": f"p{len(found.entries):03d}", "kind": window.kind.value, "status": "ok",
                 "config": window.config.to_dict(), "throughput": 100.0,
                 "loading": {"storage_share": pending.pop(0),
                             "read_per_sample_bytes": 4096}}
        if reads:
            paths = reads.pop(0)
            probe_dir = found.run_dir.probe_dir(entry["id"])
            os.makedirs(probe_dir, exist_ok=True)
            with open(os.path.join(probe_dir, "rank-0.jsonl"), "w") as handle:
                handle.write(json.dumps({"kind": "files", "paths": paths}) + "\n")
            found.files.update(dict.fromkeys(paths))  # as a launch adds what it read
        return found._record(ProbeRecord.from_json(entry))

    found._probe = launch  # type: ignore[method-assign]
    return found, notes


def window() -> Window:
    return Window(LoaderSettings(num_workers=2), Kind.SWEEP)


def test_a_probe_read_from_storage_under_the_warm_regime_is_measured_again(tmp_path):
    found, notes = measurer(tmp_path, [0.10, 0.0, 0.01])
    assert found.measure(window()).id == "p001"  # 10 % from storage: not warm
    missed = found.entries[0].cache
    assert found.entries[0].kind == "cache" and missed and missed.measured_as == "sweep"
    assert found.measure(window()).id == "p002"  # 1 %: warm
    assert found.regime_unheld is None and len(found.entries) == 3


def test_a_regime_the_machine_does_not_hold_stops_the_measuring_again(tmp_path):
    found, notes = measurer(tmp_path, [0.30, 0.25, 0.40, 0.35])
    assert found.measure(window()).id == "p001"  # measured again, out again
    assert found.regime_unheld is not None and "25%" in found.regime_unheld
    assert sum("does not hold the warm regime" in note for note in notes) == 1
    assert found.measure(window()).id == "p002"  # kept as it is: one launch, not two
    assert len(found.entries) == 3 and found.entries[2].kind == "sweep"


def data_files(tmp_path, count: int = 40) -> list[str]:
    """``count`` files of 1,000 bytes under ``tmp_path/data``, their paths in order."""
    data = tmp_path / "data"
    data.mkdir()
    for index in range(count):
        (data / f"{index:02d}.bin").write_bytes(b"x" * 1000)
    return [str(data / f"{index:02d}.bin") for index in range(count)]


def test_a_measure_again_that_missed_only_files_never_read_before_is_measured_once_more(
        tmp_path):
    """The re-measure reached one file past those the first launch read (and the harness
    warmed): its 2.4 % from storage is that file's, not a machine that drops the cache."""
    paths = data_files(tmp_path)
    found, notes = measurer(tmp_path, [0.18, 0.024, 0.0], [paths[:39], paths, paths])
    assert found.measure(window()).id == "p002"
    assert [e.kind for e in found.entries] == ["cache", "cache", "sweep"]
    assert found.regime_unheld is None
    assert not any("does not hold" in note for note in notes)


def test_a_measure_again_that_missed_files_read_before_says_the_regime_is_not_held(tmp_path):
    paths = data_files(tmp_path)
    found, _notes = measurer(tmp_path, [0.18, 0.024], [paths, paths])
    assert found.measure(window()).id == "p001"  # every file warmed before it: no third
    assert found.regime_unheld is not None and len(found.entries) == 2

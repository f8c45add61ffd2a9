"""Probes read out of the run's page-cache regime are measured again, once; where the machine
does not hold the regime, the run stops paying two launches per probe and says why."""

from __future__ import annotations

from ddp_profile.profiler.cache import decide
from ddp_profile.profiler.launch.ranks import LaunchSpec
from ddp_profile.profiler.settings import LoaderSettings
from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.store.rundir import RunDir
from ddp_profile.profiler.sweep.measure import LedgerMeasurer
from ddp_profile.profiler.sweep.state import Window

GB = 10 ** 9


def measurer(tmp_path, shares: list[float]) -> tuple[LedgerMeasurer, list[str]]:
    """A real measurer over a real run directory whose launches read ``shares`` of their
    bytes from storage, in turn; and the notes it printed."""
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

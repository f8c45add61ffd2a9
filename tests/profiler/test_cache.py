"""The run's page-cache regime: decided once from the baseline's measured reads."""

from __future__ import annotations

import json
import os

import pytest

from ddp_profile.profiler.cache import (
    MODES,
    CacheMode,
    decide,
    misses_are_new_files,
    out_of_regime,
    recorded_files,
    warm,
)
from ddp_profile.profiler.store.probes import ProbeRecord

GB = 1_000_000_000


def baseline(read_b=None, storage_share=None) -> ProbeRecord:
    return ProbeRecord.from_json({"id": "p000", "status": "ok", "loading": {
        "read_per_sample_bytes": read_b, "storage_share": storage_share}})


def test_auto_reads_warm_what_fits_in_half_the_memory_and_cold_what_does_not():
    fits = decide("auto", baseline(128_000), dataset_len=4000, memory=2 * GB)
    assert fits.mode == "warm" and fits.epoch_bytes == pytest.approx(0.512 * GB)
    assert "0.51 GB" in fits.reason and "second epoch" in fits.reason
    big = decide("auto", baseline(128_000), dataset_len=40_000, memory=2 * GB)
    assert big.mode == "cold" and "every epoch" in big.reason


@pytest.mark.parametrize("read_b,length,memory", [(None, 4000, GB), (200.0, 4000, GB),
                                                  (128_000, None, GB), (128_000, 4000, None)])
def test_auto_leaves_the_cache_as_it_is_without_files_or_figures(read_b, length, memory):
    assert decide("auto", baseline(read_b), length, memory).mode == "as-is"


def test_a_regime_asked_for_is_kept():
    assert decide("cold", baseline(200.0), 10, GB).mode == "cold"
    assert decide("as-is", baseline(128_000), 40_000, GB).mode == "as-is"


def test_a_baseline_read_in_the_other_state_is_out_of_the_regime():
    warm_regime = decide("warm", baseline(), 1, GB)
    cold_regime = decide("cold", baseline(), 1, GB)
    assert out_of_regime(warm_regime, baseline(128_000, storage_share=0.9))
    # a tenth from storage is not warm: it can halve the rate of cached reads
    assert out_of_regime(warm_regime, baseline(128_000, storage_share=0.1))
    assert not out_of_regime(warm_regime, baseline(128_000, storage_share=0.01))
    assert out_of_regime(cold_regime, baseline(128_000, storage_share=0.1))
    assert not out_of_regime(cold_regime, baseline(128_000, storage_share=0.95))
    assert not out_of_regime(cold_regime, baseline(128_000, storage_share=None))


def test_warming_reads_the_recorded_files_within_the_budget(tmp_path):
    paths = []
    for index in range(4):
        path = tmp_path / f"{index}.bin"
        path.write_bytes(b"x" * 1000)
        paths.append(str(path))
    done = warm(paths + [str(tmp_path / "gone.bin")], budget_bytes=None)
    assert done["files"] == 4 and done["bytes"] == 4000
    assert warm(paths, budget_bytes=1500)["files"] == 2


def test_the_files_a_probe_recorded_are_read_back_from_ranks_and_workers(tmp_path):
    (tmp_path / "workers").mkdir()
    (tmp_path / "rank-0.jsonl").write_text('{"kind":"files","paths":["/d/a"]}\n'
                                           '{"kind":"step"}\n')
    (tmp_path / "workers" / "r0-l0-w0-p1.jsonl").write_text(
        '{"kind":"files","paths":["/d/b","/d/c"]}\n{"kind":"files","paths":"torn')
    assert sorted(recorded_files(str(tmp_path))) == ["/d/a", "/d/b", "/d/c"]
    assert recorded_files(os.path.join(str(tmp_path), "missing")) == []


def test_misses_are_the_new_files_only_where_those_hold_the_bytes_read_from_storage(tmp_path):
    """A warm probe measured again read 2.4 % of its bytes from storage: files past those the
    launches before it read (and warmed) account for it, or they do not."""
    data = tmp_path / "data"
    data.mkdir()
    paths = []
    for index in range(40):
        path = data / f"{index:02d}.bin"
        path.write_bytes(b"x" * 1000)
        paths.append(str(path))
    probe_dir = tmp_path / "p003"
    probe_dir.mkdir()
    (probe_dir / "rank-0.jsonl").write_text(json.dumps({"kind": "files", "paths": paths}) + "\n")
    read_again = baseline(1000, storage_share=0.024)
    # one of its 40 files was new: 2.5 % of its bytes, the 2.4 % it read from storage
    assert misses_are_new_files(read_again, str(probe_dir), paths[:39])
    # every file had been read and warmed before: the misses are the machine's, not new files
    assert not misses_are_new_files(read_again, str(probe_dir), paths)
    # a new file's worth, where a tenth came from storage: more than the new files explain
    assert not misses_are_new_files(baseline(1000, storage_share=0.1), str(probe_dir),
                                    paths[:39])
    assert not misses_are_new_files(baseline(1000), str(probe_dir), paths[:39])  # unmeasured


def test_a_regime_is_written_with_the_modes_as_given_on_the_command_line():
    regime = decide("as-is", baseline(128_000), 40_000, GB)
    assert regime.mode is CacheMode.AS_IS and regime.requested is CacheMode.AS_IS
    assert json.loads(json.dumps(regime.to_dict()))["mode"] == "as-is"
    assert MODES == ("auto", "cold", "warm", "as-is")  # what --cache and the project file take

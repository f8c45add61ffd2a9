"""The typed probe record: made from a ledger line in one place, written back unchanged."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from ddp_profile.profiler.settings import LoaderSettings
from ddp_profile.profiler.store.probes import (
    BadProbeRecord,
    Kind,
    ProbeRecord,
    Status,
    choice_mask,
    gate_mask,
)

LINE = {"id": "p004", "kind": "ddp", "status": "ok", "requested": {"num_workers": None},
        "config": {"num_workers": 2, "pin_memory": False, "prefetch_factor": 2,
                   "batch_size": 32},
        "throughput": 812.5, "throughput_rse": 0.02, "data_wait_fraction": 0.1,
        "gpu_idle_fraction": None, "gpu_starved_fraction": 0.05, "comm_fraction": 0.3,
        "comm": {"exposed_fraction": 0.3, "timed_steps": 10}, "ddp_options": {"bucket_cap_mb": 100},
        "loading": {"cpu_per_sample_s": 0.002, "wait_per_sample_s": 0.001,
                    "storage_share": 0.5, "read_per_sample_bytes": 4096},
        "screened": True, "launch": "p003-screen",
        "pair": {"role": "candidate", "index": 1, "group": "ddp-003"}, "short": False,
        "some_future_key": [1, 2]}


def test_a_record_types_what_decisions_read_and_writes_back_every_key():
    record = ProbeRecord.from_json(json.loads(json.dumps(LINE)))
    assert record.kind is Kind.DDP and record.status is Status.OK and record.ok
    assert record.config == LoaderSettings(2, False, 2, 32) and record.throughput == 812.5
    assert record.pair is not None and (record.pair.role, record.pair.index) == ("candidate", 1)
    assert record.gpu.starved_fraction == 0.05 and record.gpu.idle_fraction is None
    assert record.comm.exposed_fraction == 0.3 and record.comm.options == {"bucket_cap_mb": 100}
    assert record.loading is not None and record.loading.storage_share == 0.5
    assert record.launch == "p003-screen" and record.cache is None
    assert record.to_json() == LINE  # ledger and summary.json keep their keys
    assert record.screened and record.throughput_rse == 0.02 and record.data_wait_share == 0.05
    assert record.requested == LoaderSettings() and record.epochs is None
    assert not record.counts_for_choice and not record.counts_for_gate  # a counterfactual
    with pytest.raises(TypeError):  # read by its fields only, never as the raw line
        record["throughput"]  # type: ignore[index]
    assert not hasattr(record, "get") and not hasattr(record, "keys")


def test_a_record_amended_is_a_new_record_of_the_amended_line():
    record = ProbeRecord.from_json({**LINE, "kind": "ceiling"})
    amended = record.amended({"ceiling_failed": "below p002"})
    assert record.ceiling_failed is None and amended.ceiling_failed == "below p002"
    assert amended.to_json() == {**LINE, "kind": "ceiling", "ceiling_failed": "below p002"}


def test_the_epoch_restarts_are_typed_where_the_line_measured_them():
    record = ProbeRecord.from_json({**LINE, "epoch_restart_s": 0.4, "epoch_steps": 62,
                                    "steady_throughput": 900.0})
    assert record.epochs is not None and record.epochs.steps == 62
    assert (record.epochs.restart_s, record.epochs.steady_throughput) == (0.4, 900.0)


def test_a_probe_set_aside_out_of_the_cache_regime_says_what_it_was_measured_as():
    record = ProbeRecord.from_json({**LINE, "kind": "cache", "measured_as": "baseline",
                                    "regime_miss": {"mode": "warm", "storage_share": 0.67}})
    assert record.cache is not None and record.cache.measured_as is Kind.BASELINE
    assert record.cache.storage_share == 0.67 and not record.counts_for_choice


def test_a_line_that_is_no_probe_is_refused_in_one_line():
    for line in ({"kind": "sweep", "status": "ok"}, {**LINE, "status": "fine"},
                 {**LINE, "kind": "guess"}):
        with pytest.raises(BadProbeRecord) as caught:
            ProbeRecord.from_json(line)
        assert "\n" not in str(caught.value)


def test_the_table_masks_agree_with_the_record_predicates():
    lines = [{**LINE, "id": f"p{i}", "kind": kind, "status": status}
             for i, (kind, status) in enumerate([("baseline", "ok"), ("sweep", "crash"),
                                                 ("repeat", "ok"), ("ceiling", "ok"),
                                                 ("sweep", "ok"), ("paired", "ok")])]
    table = pd.DataFrame([{"kind": line["kind"], "status": line["status"]} for line in lines])
    records = [ProbeRecord.from_json(line) for line in lines]
    assert choice_mask(table).tolist() == [r.counts_for_choice for r in records] \
        == [True, False, False, False, True, False]
    assert gate_mask(table).tolist() == [r.counts_for_gate for r in records] \
        == [True, False, True, False, True, False]


def test_a_run_directory_with_a_probe_of_no_known_kind_is_a_bad_run_directory(tmp_path):
    from ddp_profile.errors import BadRunDir
    from ddp_profile.profiler.store.results import load_run

    (tmp_path / "summary.json").write_text(json.dumps({"probes": [{**LINE, "kind": "guess"}]}))
    with pytest.raises(BadRunDir) as caught:
        load_run(str(tmp_path))
    assert "p004" in str(caught.value) and "\n" not in str(caught.value)


def test_a_part_of_the_wrong_shape_is_refused_in_one_line_too():
    for line in ({**LINE, "pair": {"role": "candidate", "index": "first", "group": "g"}},
                 {**LINE, "comm": [1, 2]}, {**LINE, "kind": "cache", "measured_as": "sweep",
                                            "regime_miss": "warm"}):
        with pytest.raises(BadProbeRecord):
            ProbeRecord.from_json(line)


def test_a_line_recorded_before_its_figures_were_kept_is_completed_from_its_steps():
    """A run's readers see one record per probe: where an old line lacks its standard error or
    its data wait, the record has them from its measured steps; what is written stays the
    line as it was."""
    from tests.rules.tables import RunBuilder

    run = (RunBuilder(world_size=2, device="cuda").probe("old", kind="baseline")
           .steps(n=20, data_wait=0.03, compute=0.06, other=0.01, gpu_gap=0.02, jitter=0.1)
           .probe("host", num_workers=4).steps(n=20, data_wait=0.01, compute=0.09, other=0.0)
           .build())
    old, host = run.probe("old"), run.probe("host")
    assert "throughput_rse" not in old.to_json() and "gpu_starved_fraction" not in old.to_json()
    times = run.steps[run.steps["probe_id"] == "old"].groupby("step")["step_s"].max()
    assert old.throughput_rse == pytest.approx(times.std() / times.mean() / len(times) ** 0.5)
    assert old.gpu.starved_fraction == pytest.approx(0.02 / times.mean(), rel=0.05)
    assert old.data_wait_share == old.gpu.starved_fraction  # the GPU's idle time, on CUDA
    assert host.gpu.starved_fraction is None  # no gap timed: the host's own wait
    assert host.data_wait_share == pytest.approx(0.1)

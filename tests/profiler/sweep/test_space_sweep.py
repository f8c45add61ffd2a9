"""Search space defaults, pruning, tie resolution and the ledger's durability."""

from __future__ import annotations

import json
import os

import pytest

from ddp_profile.profiler.decide.choose import candidate_of, choose, noise
from ddp_profile.profiler.launch.coordinate import merge_outcomes
from ddp_profile.profiler.launch.ranks import LaunchOutcome
from ddp_profile.profiler.settings import LoaderSettings
from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.profiler.store.rundir import RunDir
from ddp_profile.profiler.sweep.space import SearchSpace, grid, resolve_axes, worker_ladder


def test_worker_ladder_reaches_the_cpus_per_rank():
    assert worker_ladder(1) == [0, 1]
    assert worker_ladder(6) == [0, 1, 2, 4, 6]
    assert worker_ladder(16) == [0, 1, 2, 4, 8, 16]


def test_defaults_pin_only_on_cuda_and_keep_the_batch_size():
    own = LoaderSettings(0, False, None, 48)
    cpu = resolve_axes(SearchSpace(), own, "cpu", cpus_available=8, local_ranks=2)
    assert cpu.num_workers == (0, 1, 2, 4) and cpu.pin_memory == (False,)
    assert cpu.batch_size == (48,) and cpu.prefetch_factor == (2, 4)
    assert any("no effect" in note for note in cpu.notes)
    cuda = resolve_axes(SearchSpace(), own, "cuda", cpus_available=8, local_ranks=2)
    assert cuda.pin_memory == (False, True)


def test_grid_prunes_prefetch_without_workers():
    axes = resolve_axes(SearchSpace(num_workers=(0, 2), prefetch_factor=(2, 4)),
                        LoaderSettings(0, False, None, 8), "cpu", 4, 1)
    configs = grid(axes)
    assert LoaderSettings(0, False, None, 8) in configs
    assert len(configs) == 3  # w=0 once (no prefetch), w=2 with prefetch 2 and 4
    assert all(c.prefetch_factor is None for c in configs if c.num_workers == 0)


def entry(workers, throughput, cv=0.0, steps=30, pin=False, prefetch=2) -> ProbeRecord:
    return ProbeRecord.from_json({
        "id": f"w{workers}-{throughput}", "status": "ok",
        "config": {"num_workers": workers, "pin_memory": pin,
                   "prefetch_factor": prefetch if workers else None, "batch_size": 8},
        "throughput": throughput, "step_time_cv": cv, "steps_measured": steps})


def test_ties_within_noise_go_to_the_cheaper_configuration():
    cheap, costly = entry(2, 1000.0, cv=0.05), entry(8, 1010.0, cv=0.05)
    assert choose([candidate_of(costly), candidate_of(cheap)]).id == cheap.id
    clearly_faster = entry(8, 1500.0, cv=0.05)
    assert choose([candidate_of(cheap), candidate_of(clearly_faster)]).id == clearly_faster.id


def tie_tolerance(a, b):
    return noise(candidate_of(a), candidate_of(b))


def test_tie_tolerance_grows_with_noise_and_shrinks_with_steps():
    assert tie_tolerance(entry(0, 1), entry(0, 1)) == 0.02
    noisy = tie_tolerance(entry(0, 1, cv=0.3, steps=10), entry(0, 1, cv=0.3, steps=10))
    longer = tie_tolerance(entry(0, 1, cv=0.3, steps=100), entry(0, 1, cv=0.3, steps=100))
    assert noisy > longer > 0.02


def test_merged_outcome_of_several_nodes():
    leader = LaunchOutcome(returncode=0, timed_out=False, interrupted=False, wall_s=1.0,
                           log_path="x")
    assert merge_outcomes(leader, [{"returncode": 0, "timed_out": False}]).returncode == 0
    assert merge_outcomes(leader, [{"returncode": 1, "timed_out": False}]).returncode == 1
    assert merge_outcomes(leader, [{"returncode": 0, "timed_out": True}]).timed_out
    assert merge_outcomes(leader, [{"member": 1, "missing": True}]).returncode == 1


def test_ledger_survives_a_torn_last_line(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    run_dir.create({"script": "x.py"})
    run_dir.append({"id": "p000", "status": "ok"})
    with open(run_dir.file("ledger.jsonl"), "a") as handle:
        handle.write('{"id": "p001", "sta')  # killed mid-append
    assert [e["id"] for e in run_dir.ledger()] == ["p000"]
    run_dir.append({"id": "p001", "status": "ok"})
    assert [e["id"] for e in run_dir.ledger()] == ["p000", "p001"]
    lines = open(run_dir.file("ledger.jsonl")).read().splitlines()
    assert json.loads(lines[-1])["id"] == "p001"


def test_a_relabelled_run_loads_from_its_ledger_alone_with_one_baseline(tmp_path):
    """A probe set aside after it was appended (read out of the page-cache regime, or a
    ceiling below a loading rate) is corrected by an appended line, never rewritten: the
    ledger alone, as ``load_run`` reads a run without summary.json, says what the summary
    says."""
    from ddp_profile.profiler.store.results import load_run
    from tests.synthetic import probe, write_run

    path = write_run(tmp_path / "run", [probe("p000", kind="baseline"),
                                        probe("p001", kind="baseline"),
                                        probe("p002", kind="ceiling", num_workers=2)],
                     write_summary=False)
    run_dir = RunDir(path)
    run_dir.amend("p000", {"kind": "cache", "measured_as": "baseline"})
    run_dir.amend("p002", {"ceiling_failed": "below p001"})
    lines = open(run_dir.file("ledger.jsonl")).read().splitlines()
    assert len(lines) == 5 and json.loads(lines[0])["kind"] == "baseline"  # appended only
    ledger = run_dir.ledger()
    assert [(e["id"], e["kind"]) for e in ledger] == [("p000", "cache"), ("p001", "baseline"),
                                                      ("p002", "ceiling")]
    assert ledger[2]["ceiling_failed"] == "below p001"
    run = load_run(path)
    assert list(run.probes["kind"]) == ["cache", "baseline", "ceiling"]
    assert [p["kind"] for p in run.summary["probes"]].count("baseline") == 1


def test_existing_run_directory_is_not_overwritten(tmp_path):
    import pytest

    from ddp_profile.errors import BadRunDir

    run_dir = RunDir(str(tmp_path / "run"))
    run_dir.create({"script": "x.py"})
    with pytest.raises(BadRunDir, match="--resume"):
        run_dir.create({"script": "x.py"})
    assert os.path.exists(run_dir.file("run.json"))


def test_predicted_rung_from_the_baseline_data_wait():
    from ddp_profile.profiler.sweep.climb import predicted_rung

    ladder = [0, 1, 2, 4, 8]
    def base(workers, wait):
        return ProbeRecord.from_json({"id": "p000", "status": "ok",
                                      "config": {"num_workers": workers},
                                      "data_wait_fraction": wait})
    assert predicted_rung(base(0, 0.75), ladder) == 3  # 1 / 0.25 = 4 workers keep up
    assert predicted_rung(base(2, 0.5), ladder) == 3  # 2 / 0.5 = 4
    assert predicted_rung(base(2, 0.01), ladder) == 2  # not data-bound: stay at its own 2
    assert predicted_rung(base(0, 0.99), ladder) == 4  # beyond the ladder: its top
    assert predicted_rung(ProbeRecord.from_json({"id": "p000", "status": "crash"}), ladder) == 0


def test_a_short_probe_counts_with_a_wider_error():
    """A probe the script ended early is evidence, not nothing: it wins beyond its widened
    error (``SHORT_RSE``), and within it the full measurement does."""
    from ddp_profile.profiler.decide.choose import Candidate, choose

    base = Candidate("p0", LoaderSettings(num_workers=0), 100.0, kind="baseline",
                     data_wait_fraction=0.5)
    full = Candidate("p2", LoaderSettings(num_workers=2), 200.0, rse=0.01)
    clear = Candidate("p1", LoaderSettings(num_workers=4), 300.0, short=True)
    close = Candidate("p1", LoaderSettings(num_workers=4), 215.0, short=True)
    assert choose([base, clear, full], base).id == "p1"
    assert choose([base, close, full], base).id == "p2"
    assert choose([clear], clear).id == "p1"


def test_the_measurer_amends_by_a_new_record_in_the_old_ones_place(tmp_path):
    """The sweep holds frozen records: a correction is a new record among the entries (and an
    appended ledger line), and a run read back from the ledger sees the same."""
    from ddp_profile.profiler.launch.ranks import LaunchSpec
    from ddp_profile.profiler.store.results import load_run
    from ddp_profile.profiler.sweep.measure import LedgerMeasurer

    def probe(probe_id: str, kind: str) -> dict:
        return {"id": probe_id, "kind": kind, "status": "ok", "throughput": 100.0,
                "config": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                           "batch_size": 8}}

    run_dir = RunDir(str(tmp_path / "run"))
    run_dir.create({"script": "train.py"})
    measurer = LedgerMeasurer(run_dir, LaunchSpec(script="train.py"), steps=10, warmup=2,
                              timeout_s=60)
    first = measurer._record(ProbeRecord.from_json(probe("p000", kind="baseline")))
    ceiling = measurer._record(ProbeRecord.from_json(probe("p001", kind="ceiling")))
    assert isinstance(first, ProbeRecord) and measurer.entries == [first, ceiling]
    amended = measurer.amend(ceiling, {"ceiling_failed": "below p000"})
    assert measurer.entries[0] is first and measurer.entries[1] is amended
    assert amended.ceiling_failed == "below p000" and ceiling.ceiling_failed is None
    assert [line.get("ceiling_failed") for line in load_run(run_dir.path).summary["probes"]] \
        == [None, "below p000"]


def test_a_resumed_run_whose_search_asks_for_another_probe_under_a_held_id_is_refused(tmp_path):
    """A resume replays the search and takes each probe its ledger holds under the same id.
    Where the search now asks for something else there (a run made by another version of the
    tool: timm's run, resumed after a change to the choice, measured two probes again under
    their ids and paired old launches with new ones), it is refused in one line, nothing
    launched and the ledger unchanged; what the ledger holds is still taken as it was."""
    from ddp_profile.errors import BadRunDir
    from ddp_profile.profiler.launch.ranks import LaunchSpec
    from ddp_profile.profiler.sweep.measure import LedgerMeasurer
    from ddp_profile.profiler.sweep.state import Window

    held = {"id": "p000", "kind": "sweep", "status": "ok", "throughput": 100.0,
            "steps": 10, "screened": False,
            "config": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                       "batch_size": 32},
            "requested": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                          "batch_size": 32}}
    run_dir = RunDir(str(tmp_path / "run"))
    run_dir.create({"script": "train.py"})
    run_dir.append(held)
    ledger = (tmp_path / "run" / "ledger.jsonl").read_text()

    def measurer() -> LedgerMeasurer:
        found = LedgerMeasurer(run_dir, LaunchSpec(script="train.py"), steps=10, warmup=2,
                               timeout_s=60)
        found._launch = lambda *_: pytest.fail("nothing is launched")  # type: ignore
        return found

    same = measurer()._probe(Window(LoaderSettings(0, False, None, 32)))
    assert same.id == "p000" and same.throughput == 100.0  # taken as it was
    with pytest.raises(BadRunDir, match=r"probe p000 measured sweep w=0 pin=false bs=32, and "
                                        r"the search now asks for sweep w=2 .*bs=32 there"):
        measurer()._probe(Window(LoaderSettings(2, False, 2, 32)))
    assert (tmp_path / "run" / "ledger.jsonl").read_text() == ledger
    assert not (tmp_path / "run" / "probes").exists() or not os.listdir(tmp_path / "run" /
                                                                        "probes")

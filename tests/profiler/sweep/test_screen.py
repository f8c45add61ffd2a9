"""Screens: one launch measuring several loader configurations, and the split into probes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ddp_profile.profiler.launch.ranks import LaunchOutcome
from ddp_profile.profiler.rank.hook import HOOK_DIR
from ddp_profile.profiler.settings import (
    LoaderSettings,
    ProbePlan,
    backlog_warmup,
    burst_steps,
    mode_warmup,
    timed_warmup,
)
from ddp_profile.profiler.store.probedir import read_probe_dir
from ddp_profile.profiler.store.record import read_jsonl
from ddp_profile.profiler.sweep.probe import summarise_probe
from ddp_profile.profiler.sweep.screen import split_screen

# An ordinary training loop whose samples say which worker pool produced them; it writes, per
# step, the pool size it saw, so the test can check each window really ran its own settings.
SCRIPT = """
import json, os, sys, time
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

class Pools(Dataset):
    def __len__(self):
        return 400
    def __getitem__(self, index):
        info = get_worker_info()
        return torch.tensor([float(info.num_workers if info else 0)])

loader = DataLoader(Pools(), batch_size=4, num_workers=0)
model = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
seen = []
for epoch in range(100):
    for batch in loader:
        seen.append(int(batch[0, 0]))
        with open(sys.argv[1], "w") as handle:
            json.dump(seen, handle)
        model(batch).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.002)
"""


def run_screen(tmp_path, windows, steps=6, warmup=2, source=SCRIPT):
    script = tmp_path / "train.py"
    script.write_text(source)
    out = tmp_path / "launch"
    plan = ProbePlan(probe_id="p001-screen", out_dir=str(out), warmup=warmup, steps=steps,
                     mode="screen", overrides=LoaderSettings.from_dict(windows[0]["overrides"]),
                     windows=tuple(windows))
    path = os.pathsep.join(p for p in (HOOK_DIR, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, DDP_PROFILE="1", DDP_PROFILE_PLAN=plan.to_json(),
               DDP_PROFILE_SCRIPT=str(script), RANK="0", WORLD_SIZE="1")
    seen_path = tmp_path / "seen.json"
    proc = subprocess.run([sys.executable, str(script), str(seen_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return plan, json.loads(seen_path.read_text())


def window(workers, mode="normal", prefetch=None, warmup=None):
    data = {"overrides": LoaderSettings(workers, None, prefetch, None).to_dict(), "mode": mode}
    if warmup is not None:
        data["warmup"] = warmup
    return data


def test_each_window_runs_its_own_worker_pool_and_is_split_into_a_probe(tmp_path):
    windows = [window(0), window(2, prefetch=2, warmup=4), window(1),
               window(1, "ceiling", warmup=mode_warmup(2, "ceiling"))]
    plan, seen = run_screen(tmp_path, windows)
    starts, lengths = plan.window_starts(), plan.window_lengths()
    assert starts == [0, 8, 18, 26] and lengths == [8, 10, 8, 11]
    # the script saw each window's worker pool from that window's first step on
    for index, (start, length) in enumerate(zip(starts, lengths)):
        expected = windows[index]["overrides"]["num_workers"]
        assert set(seen[start:start + length]) == {expected}, (index, seen)
    records, _ = read_jsonl(os.path.join(plan.out_dir, "rank-0.jsonl"))
    steps = [r for r in records if r["kind"] == "step"]
    assert [s["window"] for s in steps][:plan.total_steps] == sum(
        ([i] * n for i, n in enumerate(lengths)), [])

    out_dirs = [str(tmp_path / f"p{i:03d}") for i in range(1, 5)]
    splits = split_screen(plan.out_dir, out_dirs, starts, lengths)
    assert all(s.complete for s in splits)
    for index, split in enumerate(splits):
        window_plan = ProbePlan(probe_id=f"p{index:03d}", out_dir=split.out_dir,
                                overrides=LoaderSettings.from_dict(windows[index]["overrides"]),
                                warmup=plan.window_warmup(index), steps=plan.steps,
                                mode=windows[index]["mode"])
        outcome = LaunchOutcome(0, False, False, split.span_s, str(tmp_path / "none.log"))
        entry = summarise_probe(window_plan, outcome, "sweep", 60.0).to_json()
        assert entry["status"] == "ok", entry
        assert entry["config"]["num_workers"] == windows[index]["overrides"]["num_workers"]
        assert entry["steps_measured"] == plan.steps
        (rank,) = read_probe_dir(split.out_dir)
        assert [s["step"] for s in rank.training_steps()] == list(range(lengths[index]))
        assert rank.end["reason"] == "steps_done"
        assert rank.context and rank.loaders
        # each window's batches were timed where they were made: its own workers, or the rank
        makers = {b["worker"] for b in rank.batch_costs}
        workers = windows[index]["overrides"]["num_workers"]
        assert makers == ({None} if workers == 0 else set(range(workers))), (index, makers)
        assert entry["loading"]["samples"] > 0 and entry["loading"]["bound"] in (
            "cpu", "wait", "mixed")
    # the ceiling window replays cached batches: it hardly waits for data
    ceiling = read_probe_dir(splits[3].out_dir)[0].training_steps()
    measured = [s for s in ceiling if s["measured"]]
    assert sum(s["data_wait_s"] for s in measured) < 0.5 * sum(
        s["compute_s"] + s["other_s"] for s in measured)


# A loop that sets its own intra-op threads, then writes, per step, the threads it ran with.
THREADS_SCRIPT = SCRIPT.replace("seen.append(int(batch[0, 0]))",
                                "seen.append(torch.get_num_threads())").replace(
    "loader = DataLoader", "torch.set_num_threads(3)\nloader = DataLoader")


def test_windows_switch_the_ranks_threads_and_restore_the_scripts_own(tmp_path):
    """A screen whose windows alternate the threads that fit (B: 1) with the script's own (A:
    the 3 it set itself), B first (a check's windows that a spilled screen starts with): each
    window's steps ran with its threads, and each window's probe records them."""
    windows = [{**window(0), "threads": 1}, window(0), {**window(0), "threads": 1}, window(0)]
    plan, seen = run_screen(tmp_path, windows, source=THREADS_SCRIPT)
    starts, lengths = plan.window_starts(), plan.window_lengths()
    for index, (start, length) in enumerate(zip(starts, lengths)):
        assert set(seen[start:start + length]) == {windows[index].get("threads") or 3}, seen
    splits = split_screen(plan.out_dir, [str(tmp_path / f"p{i:03d}") for i in range(4)],
                          starts, lengths)
    for index, split in enumerate(splits):
        window_plan = ProbePlan(probe_id=f"p{index:03d}", out_dir=split.out_dir,
                                warmup=plan.window_warmup(index), steps=plan.steps,
                                threads=windows[index].get("threads"))
        outcome = LaunchOutcome(0, False, False, split.span_s, str(tmp_path / "none.log"))
        entry = summarise_probe(window_plan, outcome, "threads", 60.0).to_json()
        assert entry["status"] == "ok", entry
        assert (entry["threads"], entry["intra_op_threads"]) == (
            (1, 1) if index % 2 == 0 else (None, 3))


def _rank_file(directory, rank, records):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"rank-{rank}.jsonl"), "w") as handle:
        handle.write("".join(json.dumps({"rank": rank, **r}) + "\n" for r in records))


def _step(step, t, window):
    return {"kind": "step", "loader_id": 0, "step": step, "window": window, "t_ns": t,
            "measured": True, "data_wait_s": 0.001, "compute_s": 0.002, "other_s": 0.0,
            "samples": 4}


def test_split_routes_records_by_window_and_stops_at_the_failed_window(tmp_path):
    launch = str(tmp_path / "launch")
    ms = 1_000_000
    for rank in (0, 1):
        records = [{"kind": "context", "world_size": 2},
                   {"kind": "loader", "loader_id": 0, "applied": {"num_workers": 0,
                                                                  "batch_size": 4}},
                   {"kind": "event", "name": "ddp", "t_ns": 0, "data": {}}]
        records += [_step(s, 10 * ms * (s + 1), 0) for s in range(3)]
        records.append({"kind": "event", "name": "window", "t_ns": 40 * ms,
                        "data": {"window": 1, "applied": {"num_workers": 2, "batch_size": None}}})
        records += [_step(s, 10 * ms * (s + 1), 1) for s in range(3, 6)]
        records += [{"kind": "sample", "source": "host", "t_ns": 15 * ms},
                    {"kind": "sample", "source": "host", "t_ns": 45 * ms}]
        if rank == 1:  # rank 1 dies two steps into window 2
            records += [_step(s, 10 * ms * (s + 1), 2) for s in range(6, 8)]
            records.append({"kind": "error", "t_ns": 85 * ms, "last_line": "boom"})
        else:
            records += [_step(6, 70 * ms, 2)]
        _rank_file(launch, rank, records)
    out_dirs = [str(tmp_path / f"w{i}") for i in range(4)]
    splits = split_screen(launch, out_dirs, [0, 3, 6, 9], [3, 3, 3, 3])
    assert [s.complete for s in splits] == [True, True, False, False]
    assert [s.started for s in splits] == [True, True, True, False]
    assert not os.path.exists(out_dirs[3])
    second = {r.rank: r for r in read_probe_dir(out_dirs[1])}
    assert [s["step"] for s in second[1].training_steps()] == [0, 1, 2]
    assert [s["t_ns"] for s in second[1].samples] == [45 * ms]  # by time, per rank
    assert second[1].context["applied"]["num_workers"] == 2  # the window's own settings
    assert second[1].context["applied"]["batch_size"] == 4  # what the window left unchanged
    assert any(e["name"] == "ddp" for e in second[1].events)  # set-up facts in every window
    assert second[1].error is None and second[1].end["reason"] == "steps_done"
    failed = {r.rank: r for r in read_probe_dir(out_dirs[2])}
    assert failed[1].error["last_line"] == "boom" and failed[1].end is None
    first = {r.rank: r for r in read_probe_dir(out_dirs[0])}
    assert [s["t_ns"] for s in first[0].samples] == [15 * ms]


def test_backlog_warmup_covers_the_startup_prefetch():
    assert backlog_warmup(5, 0, None) == 5
    assert backlog_warmup(5, 2, None) == 5
    assert backlog_warmup(5, 4, 2) == 8
    assert backlog_warmup(5, 8, 4) == 32


def test_a_claims_launches_warm_up_for_about_a_second_each():
    # the side with the shorter steps warms up for more of them: both about as long
    assert timed_warmup(5, 41.0) == 41 and timed_warmup(5, 22.0) == 22
    assert timed_warmup(5, 2.0) == 5  # slow steps: the run's warm-up is longer already
    assert timed_warmup(5, 400.0) == 50  # within 10 times the run's warm-up
    assert timed_warmup(5, None) == 5 and timed_warmup(5, 0.0) == 5  # no prediction


def test_a_probe_with_workers_measures_several_rounds_of_them():
    assert burst_steps(15, 0) == 15 and burst_steps(15, None) == 15
    assert burst_steps(15, 2) == 15  # 7 rounds already
    assert burst_steps(15, 12) == 60  # 5 rounds of 12 batches
    assert burst_steps(15, 12, "ceiling") == 15  # replayed batches come at once
    # a fast loop measures about a second, within 10 rounds; a slow one is long already
    assert burst_steps(15, 16, steps_per_s=350.0) == 160  # 10 rounds: 0.46 s at 350 steps/s
    assert burst_steps(15, 16, steps_per_s=120.0) == 120  # 1 s at 120 steps/s
    assert burst_steps(15, 16, steps_per_s=10.0) == 80  # 5 rounds take 8 s already
    assert burst_steps(15, 0, steps_per_s=350.0) == 15  # no workers, no bursts
    assert burst_steps(15, 12, "ceiling", 2_000.0) == 150  # replayed: at most 10 x steps
    assert burst_steps(15, 12, "ceiling", 100.0) == 100
    plan = ProbePlan(probe_id="s", out_dir="x", warmup=2, steps=15, windows=(
        {"overrides": {"num_workers": 1}, "warmup": 2},
        {"overrides": {"num_workers": 12}, "warmup": 24, "steps": 60},
        {"overrides": {"num_workers": 12}, "mode": "ceiling", "warmup": 4}))
    assert plan.window_starts() == [0, 17, 101]
    assert plan.window_lengths() == [17, 84, 19]
    assert plan.total_steps == 120


def test_an_error_before_a_windows_first_step_is_not_the_previous_windows(tmp_path):
    # window 1's workers fail on their first batch: its switch is recorded, no step of it is
    launch = str(tmp_path / "launch")
    ms = 1_000_000
    for rank in (0, 1):
        records = [{"kind": "context", "world_size": 2},
                   {"kind": "loader", "loader_id": 0, "applied": {"num_workers": 1}}]
        records += [_step(s, 10 * ms * (s + 1), 0) for s in range(3)]
        records.append({"kind": "event", "name": "window", "t_ns": 42 * ms,
                        "data": {"window": 1, "applied": {"num_workers": 2},
                                 "switched_ns": 40 * ms}})
        records.append({"kind": "error", "t_ns": 45 * ms, "last_line": "ValueError: corrupt"})
        _rank_file(launch, rank, records)
        _worker_file(launch, rank, [{"kind": "batch_cost", "rank": rank, "loader_id": 0,
                                     "t_ns": t * ms, "samples": 4} for t in (15, 41)])
    out_dirs = [str(tmp_path / f"w{i}") for i in range(2)]
    splits = split_screen(launch, out_dirs, [0, 3], [3, 3])
    assert [s.complete for s in splits] == [True, False]
    assert [s.started for s in splits] == [True, False]
    first = {r.rank: r for r in read_probe_dir(out_dirs[0])}
    assert first[0].error is None and first[1].error is None
    assert [b["t_ns"] for b in first[0].batch_costs] == [15 * ms]  # the new workers' not


def _worker_file(directory, rank, records):
    os.makedirs(os.path.join(directory, "workers"), exist_ok=True)
    with open(os.path.join(directory, "workers", f"r{rank}-l0-w0-p1.jsonl"), "w") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in records))


def test_a_spilled_screen_launches_no_rung_its_lower_rungs_condemned(tmp_path):
    """The script ended after two windows of a screen of four rungs and a ceiling: 1 and 13
    workers both ran slower than the script's own settings beyond noise, so 26 and 52 workers
    and the ceiling at 52 are not launched (they were: 52 killed, the ceiling timed out);
    where the lower rungs won, the rest gets its launch."""
    from ddp_profile.profiler.launch.ranks import LaunchSpec
    from ddp_profile.profiler.store.probes import Kind, ProbeRecord
    from ddp_profile.profiler.store.rundir import RunDir
    from ddp_profile.profiler.sweep.climb import Ladder as condemned
    from ddp_profile.profiler.sweep.measure import LedgerMeasurer
    from ddp_profile.profiler.sweep.state import Window

    def line(probe_id: str, kind: str, workers: int, throughput: float) -> ProbeRecord:
        return ProbeRecord.from_json({
            "id": probe_id, "kind": kind, "status": "ok", "throughput": throughput,
            "throughput_rse": 0.01,
            "config": {"num_workers": workers, "pin_memory": False,
                       "prefetch_factor": 2 if workers else None, "batch_size": 16}})

    class EndingScript(LedgerMeasurer):
        """Each launch measures two windows, then the script ends."""

        def __init__(self, rates: dict[int, float], *args):
            super().__init__(*args)
            self.rates, self.launched = rates, []

        def _screen_launch(self, pending, ids, done, condemned=None):
            self.launched.append([w.config.num_workers for w in pending])
            for window, probe_id in list(zip(pending, ids))[:2]:
                workers = window.config.num_workers or 0
                done.append(self._record(line(probe_id, window.kind.value, workers,
                                              self.rates[workers])))
            return min(2, len(pending))

    def screen(rates: dict[int, float]) -> EndingScript:
        run_dir = RunDir(str(tmp_path / f"run-{len(list(tmp_path.iterdir()))}"))
        run_dir.create({"script": "train.py"})
        found = EndingScript(rates, run_dir, LaunchSpec(script="train.py"), 10, 2, 60.0)
        base = found._record(line("p000", "baseline", 0, 896.0))
        rungs = [Window(LoaderSettings(w, False, 2, 16)) for w in (1, 13, 26, 52)]
        rungs.append(Window(LoaderSettings(52, False, 2, 16), Kind.CEILING, "ceiling"))
        measured = found.measure_screen(rungs, condemned(base))
        assert [e.id for e in measured] == [f"p{i:03d}" for i in range(1, len(measured) + 1)]
        return found

    losing = screen({1: 593.0, 13: 98.0, 26: 52.0, 52: 30.0})
    assert losing.launched == [[1, 13, 26, 52, 52]]
    winning = screen({1: 1400.0, 13: 2600.0, 26: 2500.0, 52: 2000.0})
    assert winning.launched == [[1, 13, 26, 52, 52], [26, 52, 52], [52]]


def _rung(probe_id: str, workers: int, rate: float, steady, epoch_steps: int, batch_size: int):
    """A screen's rung as its ledger line reads: the baseline without workers (the loop's
    demand measured), a rung with them; ``steady``: its rate between epoch restarts."""
    from ddp_profile.profiler.store.probes import ProbeRecord

    restarts = {"epoch_restart_s": 0.5, "epoch_steps": epoch_steps,
                "steady_throughput": steady} if steady else {}
    return ProbeRecord.from_json({
        "id": probe_id, "kind": "baseline" if not workers else "sweep", "status": "ok",
        "throughput": rate, "throughput_rse": 0.02, **restarts,
        "loop_demand": None if workers else 10000.0,
        "config": {"num_workers": workers, "pin_memory": False,
                   "prefetch_factor": 2 if workers else None, "batch_size": batch_size}})


def test_a_rung_that_loses_only_to_its_restarts_condemns_no_rung_above_it():
    """1 worker ran slower than the script's own settings beyond noise as run, its start paid
    every epoch, yet with data free (the loop's demand, 10,000 samples/s) and that start it
    could run 1,650 samples/s: more workers may still win, so 2 are not condemned. Where its
    start alone holds any worker count below the script's rate, they are."""
    from ddp_profile.profiler.store.probes import ProbeRecord
    from ddp_profile.profiler.sweep.climb import condemned_by, slower_than_baseline

    def line(probe_id: str, workers: int, rate: float, steady=None) -> ProbeRecord:
        return _rung(probe_id, workers, rate, steady, epoch_steps=23, batch_size=8)

    base, two = line("p000", 0, 520.0), LoaderSettings(2, False, 2, 8)
    restarts_only = line("p001", 1, 460.0, steady=600.0)  # 1/(1/10,000 + 1/460 - 1/600)
    assert not slower_than_baseline(restarts_only, base)
    assert not condemned_by([base, restarts_only], two, base)
    held = line("p001", 1, 300.0, steady=900.0)  # its start alone: at most 430 samples/s
    assert slower_than_baseline(held, base) and condemned_by([base, held], two, base)
    unknown = line("p001", 1, 460.0)  # no restart measured: the rate as run decides
    assert slower_than_baseline(unknown, base) and condemned_by([base, unknown], two, base)
    faster = line("p001", 1, 600.0, steady=900.0)
    assert not slower_than_baseline(faster, base)


def test_rungs_that_lose_more_as_they_add_workers_end_the_ladder_whatever_their_restarts():
    """1 worker lost beyond noise, yet only to its restarts (with data free it could run
    1,180 samples/s): alone it condemns nothing. 11 workers then lost more (300 against
    the script's 899), their restarts again leaving room: the ladder ends there all the
    same, 23 and a ceiling at 23 are condemned, and the stop keeps both rungs as its
    evidence, said in one line."""
    from ddp_profile.profiler.store.probes import Kind, ProbeRecord
    from ddp_profile.profiler.sweep.climb import Ladder, ladder_evidence
    from ddp_profile.profiler.sweep.state import Window

    def line(probe_id: str, workers: int, rate: float, steady=None) -> ProbeRecord:
        return _rung(probe_id, workers, rate, steady, epoch_steps=62, batch_size=16)

    base = line("p000", 0, 899.0)
    one = line("p001", 1, 572.0, steady=1000.0)  # lost to its restarts alone
    eleven = line("p002", 11, 300.0, steady=400.0)
    above = LoaderSettings(23, False, 2, 16)
    assert ladder_evidence([base, one], above, base) is None
    assert ladder_evidence([base, one, eleven], above, base) == [one, eleven]
    rising = line("p002", 11, 700.0, steady=800.0)  # lost less than the rung below: goes on
    assert ladder_evidence([base, one, rising], above, base) is None
    judge = Ladder(base)
    done = [base, one, eleven]
    windows = [Window(above), Window(above, Kind.CEILING, "ceiling")]
    assert all(judge(done, w) for w in windows)
    judge.skip(windows, "p001-screen")
    words = judge.stop.words()
    assert "1 worker(s) 572 (p001), 11 worker(s) 300 (p002)" in words
    assert "against the script's 899" in words and "not measured: 23 worker(s)" in words
    assert judge.stop.to_dict()["stopped_launch"] == "p001-screen"


def test_a_rung_with_fewer_workers_than_the_script_condemns_nothing():
    """The script keeps 1 worker alive (1,181 samples/s); no workers ran 925 beyond noise:
    that says workers help, and 2 workers are measured. 2 slower too would condemn 4."""
    from ddp_profile.profiler.store.probes import ProbeRecord
    from ddp_profile.profiler.sweep.climb import condemned_by

    def line(probe_id: str, kind: str, workers: int, rate: float) -> ProbeRecord:
        return ProbeRecord.from_json({
            "id": probe_id, "kind": kind, "status": "ok", "throughput": rate,
            "throughput_rse": 0.02, "config": {"num_workers": workers, "pin_memory": False,
                                               "prefetch_factor": 2 if workers else None,
                                               "batch_size": 8}})

    base, none = line("p000", "baseline", 1, 1181.0), line("p001", "sweep", 0, 925.0)
    assert not condemned_by([base, none], LoaderSettings(2, False, 2, 8), base)
    two = line("p002", "sweep", 2, 700.0)
    assert condemned_by([base, none, two], LoaderSettings(4, False, 2, 8), base)


def test_a_running_screens_window_rates_cover_the_windows_every_rank_left(tmp_path):
    """Read while the launch runs: windows 0 and 1 are left by both ranks (rank 1 is slower
    in window 1: the slowest rank's rate, times the ranks), window 2 is still running; a torn
    last line is skipped."""
    from ddp_profile.profiler.sweep.screen import window_rates

    def step(rank: int, index: int, window: int, seconds: float) -> str:
        return json.dumps({"kind": "step", "rank": rank, "loader_id": 0, "step": index,
                           "window": window, "measured": index % 10 >= 2, "samples": 16,
                           "data_wait_s": seconds, "compute_s": 0.0, "other_s": 0.0})

    assert window_rates(str(tmp_path), [{}] * 3) == {}
    for rank in (0, 1):
        lines = [json.dumps({"kind": "context", "rank": rank, "world_size": 2})]
        lines += [step(rank, i, i // 10, 0.1 if rank == 0 or i < 10 else 0.4)
                  for i in range(25 if rank == 0 else 21)]
        (tmp_path / f"rank-{rank}.jsonl").write_text("\n".join(lines) + '\n{"kind": "st')
    rates = window_rates(str(tmp_path), [{}] * 3)
    assert set(rates) == {0, 1}
    assert rates[0][0] == pytest.approx(32 / 0.1) and rates[1][0] == pytest.approx(32 / 0.4)
    assert rates[0][1] is None  # no loader that restarts: no rate between restarts


def test_a_running_windows_rate_between_restarts_is_read_beside_its_rate_as_run(tmp_path):
    """A window whose 1 worker starts again every 10-step epoch: its start segment (the
    iterator's first step, 0.5 s, and the 2 steps of stock after it) is charged once per
    epoch as run, and left out of the rate between restarts."""
    from ddp_profile.profiler.sweep.screen import window_rates

    loader = {"kind": "loader", "loader_id": 0, "persistent_workers": False,
              "own": {"epoch_samples": 160, "batch_size": 16, "persistent_workers": False,
                      "drop_last": False},
              "applied": {"num_workers": 1, "prefetch_factor": 2, "batch_size": 16}}
    for rank in (0, 1):
        lines = [json.dumps({"kind": "context", "rank": rank, "world_size": 2}),
                 json.dumps({**loader, "rank": rank})]
        for i in range(22):  # window 0: steps 0-10, an epoch's start at step 3; window 1 after
            lines.append(json.dumps({
                "kind": "step", "rank": rank, "loader_id": 0, "step": i, "window": i // 11,
                "measured": i % 11 >= 2, "samples": 16, "loader_start": i == 3,
                "data_wait_s": 0.5 if i == 3 else 0.05, "compute_s": 0.05, "other_s": 0.0}))
        (tmp_path / f"rank-{rank}.jsonl").write_text("\n".join(lines) + "\n")
    as_run, steady = window_rates(str(tmp_path), [{"num_workers": 1}] * 2)[0]
    assert steady == pytest.approx(2 * 16 / 0.1)  # each steady step: 16 samples in 0.1 s
    assert as_run < steady


def test_a_watched_launch_stops_when_its_watch_says_so():
    """``launch``'s wait asks its watch every second and stops the process group at its
    word; unwatched, it waits to the deadline."""
    import time

    from ddp_profile.profiler.launch.ranks import _wait

    asked = []
    process = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        started = time.monotonic()
        assert _wait(process, started + 25, lambda: asked.append(1) or len(asked) >= 2)
        assert len(asked) == 2 and time.monotonic() - started < 10 and process.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            _wait(process, time.monotonic() + 0.5, None)
    finally:
        process.kill()
        process.wait()


def test_a_screen_is_said_in_the_launches_the_scripts_run_takes(tmp_path):
    """A check's seven windows of 5 + 30 steps: where no launch ran the script to its end, one
    launch unless it ends first; where a launch ran it to its end in 80 steps a rank, three
    windows a launch (the third cut short by the end, the fourth's warm-up past it), three
    launches, said so; where its run holds them all, one launch."""
    from ddp_profile.profiler.launch.ranks import LaunchSpec
    from ddp_profile.profiler.store.probes import Kind, ProbeRecord
    from ddp_profile.profiler.store.rundir import RunDir
    from ddp_profile.profiler.sweep.measure import LedgerMeasurer
    from ddp_profile.profiler.sweep.state import Window, where_windows

    run_dir = RunDir(str(tmp_path / "run"))
    run_dir.create({"script": "train.py"})
    found = LedgerMeasurer(run_dir, LaunchSpec(script="train.py"), 30, 5, 60.0)
    windows = [Window(LoaderSettings(w, False, 2 if w else None, 16), Kind.PAIRED)
               for w in (0, 1, 0, 1, 0, 1, 0)]
    assert found.screen_launches(windows) is None
    assert "one launch (more if the script ends first)" in where_windows(found, windows)

    def ran_to_its_end(steps: int) -> None:
        found.entries[:] = [ProbeRecord.from_json({
            "id": "p000", "kind": "baseline", "status": "ok", "throughput": 500.0,
            "config": {"num_workers": 0, "batch_size": 16}, "script_samples": steps * 16 * 2,
            "per_rank": [{"rank": 0}, {"rank": 1}]})]

    ran_to_its_end(80)
    assert found.screen_launches(windows) == [3, 3, 1]
    assert where_windows(found, windows).startswith("in windows over about 3 launches")
    ran_to_its_end(1000)
    assert found.screen_launches(windows) == [7]
    assert where_windows(found, windows) == "in one launch"

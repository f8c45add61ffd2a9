"""The rank's communication meter: DDP's reducer timers per step and the script's collectives,
with a twin of DDP's logging interface and with a real one-rank DDP."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddp_profile.profiler.rank.comm_meter import SYNC_PATTERN, CommMeter
from ddp_profile.profiler.store.probe_comm import step_comm


class TwinDDP:
    """DDP's logging interface as torch implements it: the figures of iteration N are set at
    the start of forward N+1, tagged with the synchronised forwards before it."""

    def __init__(self) -> None:
        self.require_backward_grad_sync = True
        self.rate = None
        self.forwards = 0
        self.data = {"iteration": 0}

    def _set_ddp_runtime_logging_sample_rate(self, rate: int) -> None:
        self.rate = rate

    def forward(self) -> None:
        if self.require_backward_grad_sync:
            if self.forwards:
                n = self.forwards  # the backward of forward n-1 (0-based) took n ms of comm
                self.data = {"iteration": n, "forward_compute_time": 1, "backward_compute_time": 2,
                             "backward_comm_time": n * 1_000_000,
                             "backward_compute_comm_overlap_time": 0}
            self.forwards += 1

    def _get_ddp_logging_data(self) -> dict:
        return dict(self.data)


def run_steps(meter: CommMeter, ddp: TwinDDP, steps: int, sync_every: int = 1) -> list[dict]:
    records = []
    for step in range(steps):
        ddp.require_backward_grad_sync = (step + 1) % sync_every == 0
        with torch.enable_grad():
            meter.forward(ddp)
        ddp.forward()
        if (step + 1) % sync_every == 0:
            meter.optimizer_stepped()
        record = {"step": step, "measured": True, "data_wait_s": 0.0, "compute_s": 0.05,
                  "other_s": 0.0}
        meter.close_step(record, 0.05)
        records.append(record)
    return records


def test_each_step_is_matched_with_the_timers_of_its_own_backward():
    meter, ddp = CommMeter(), TwinDDP()
    meter.track(ddp)
    assert ddp.rate == 1
    records = run_steps(meter, ddp, 6)
    assert [r["ddp_n"] for r in records] == [[1], [2], [3], [4], [5], [6]]
    timed = step_comm(records)
    # step k's backward is iteration k (0-based), whose figures arrive with forward k+1
    assert sorted(timed) == [0, 1, 2, 3, 4]
    assert [round(timed[k]["exposed_s"] * 1000) for k in range(5)] == [1, 2, 3, 4, 5]


def test_no_sync_micro_batches_are_counted_apart():
    meter, ddp = CommMeter(), TwinDDP()
    meter.track(ddp)
    records = run_steps(meter, ddp, 8, sync_every=4)
    assert sum(r["syncs"] for r in records) == 2
    assert sum(r["unsynced"] for r in records) == 6
    assert sum(r["opt_steps"] for r in records) == 2


def test_reads_are_spaced_to_stay_within_budget():
    ticks = iter(range(0, 10**12, 1_000_000))  # every clock read advances 1 ms
    meter, ddp = CommMeter(clock=lambda: next(ticks)), TwinDDP()
    meter.track(ddp)
    records = run_steps(meter, ddp, 30)
    read = [r for r in records if "ddp_t" in r]
    assert meter.every > 1 and 1 <= len(read) < 30
    # a power of two, read at step counts it divides: ranks that size it apart share steps
    assert meter.every & (meter.every - 1) == 0
    assert all((r["step"] + 1) % 2 == 0 for r in read[1:])


def test_a_read_that_waited_for_a_cpu_does_not_space_the_reads_out():
    """One read took 60 ms (the rank was preempted on a busy machine), the others 0.1 ms: the
    reads stay at every step of 50 ms, as the cheapest read allows (sized by the spike, one
    read in 64 steps would have left a 12-step probe with one timed step)."""
    costs = iter([60_000_000] + [100_000] * 100)
    now = [0]

    def clock() -> int:  # each read's start and end: the end advances by its cost
        now[0] += next(costs) if clock.reading else 0
        clock.reading = not clock.reading
        return now[0]
    clock.reading = False
    meter, ddp = CommMeter(clock=clock), TwinDDP()
    meter.track(ddp)
    records = run_steps(meter, ddp, 12)
    assert meter.every == 1 and len([r for r in records if "ddp_t" in r]) >= 10


def test_collectives_are_timed_per_step_with_their_call_site():
    meter = CommMeter()
    calls = []
    wrapped = meter.wrap_collective("all_reduce", lambda *a, **k: calls.append(a))
    for _ in range(3):
        wrapped("tensor")  # this line is the call site
    record = {}
    meter.close_step(record, 0.01)
    assert record["coll_n"] == 3 and record["coll_s"] >= 0 and len(calls) == 3
    [(name, site)] = meter.site_events()
    assert name == "collective_site"
    assert site["op"] == "all_reduce" and site["file"] == __file__ and site["calls"] == 3
    assert site["function"] == "test_collectives_are_timed_per_step_with_their_call_site"
    after = {}
    meter.close_step(after, 0.01)
    assert "coll_n" not in after  # counters reset at each step


def test_nested_collective_is_counted_once():
    meter = CommMeter()
    inner = meter.wrap_collective("all_gather", lambda: None)
    outer = meter.wrap_collective("all_gather_object", lambda: inner())
    outer()
    record = {}
    meter.close_step(record, 0.01)
    assert record["coll_n"] == 1


def _real_ddp(store_path: str) -> None:
    """One rank's DDP over gloo, metered (run in a fresh process: see the test)."""
    store = dist.FileStore(store_path, 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        meter = CommMeter()
        model = nn.parallel.DistributedDataParallel(nn.Linear(64, 64))
        meter.track(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        records = []
        for step in range(6):
            meter.forward(model)
            model(torch.randn(4, 64)).sum().backward()
            optimizer.step()
            meter.optimizer_stepped()
            record = {"step": step, "measured": True, "data_wait_s": 0.0, "compute_s": 0.05,
                      "other_s": 0.0}
            meter.close_step(record, 0.05)
            records.append(record)
        timed = step_comm(records)
        assert timed and all(v["comm_s"] >= v["exposed_s"] >= 0 for v in timed.values())
        [facts] = meter.module_facts()
        assert facts["total_parameter_size_bytes"] == (64 * 64 + 64) * 4
        assert facts["backend_name"] == "gloo" and facts["comm_hook"] is None
    finally:
        dist.destroy_process_group()


def test_real_ddp_timers_reach_the_steps(tmp_path):
    # in a fresh process, with a deadline: a process group in the test runner's own process
    # once hung there after a few hundred other tests, holding the whole suite. A plain
    # subprocess, not multiprocessing: its spawn context leaves a resource tracker running
    # beside the runner, which the sampler tests rightly count as a leaked child
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    code = ("import sys; from tests.profiler.rank.test_comm_meter import _real_ddp; "
            "_real_ddp(sys.argv[1])")
    try:
        result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "store")], cwd=root,
                                capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("a one-rank DDP did not finish within 120 s")
    assert result.returncode == 0, result.stderr[-2000:]  # an assertion that failed in it


def test_a_gpu_ddp_is_timed_every_16th_iteration_so_the_host_can_run_ahead():
    """On CUDA the reducer waits for the timed iteration's events at the next forward: timing
    every iteration would hold the host to the GPU each step (the A/B on an H100 read 1.02
    with sample rate 1). A CPU DDP's host timers cost no wait: every iteration."""
    from ddp_profile.profiler.rank.comm_meter import CUDA_SAMPLE_RATE

    meter, cpu, gpu = CommMeter(), TwinDDP(), TwinDDP()
    gpu.device_type = "cuda"
    meter.track(cpu)
    meter.track(gpu)
    assert (cpu.rate, gpu.rate) == (1, CUDA_SAMPLE_RATE) and CUDA_SAMPLE_RATE == 16


SYNC_TEXT = "called a synchronizing CUDA operation"  # torch's warning as such an op returns
TORCH_LIKE = compile("import warnings\n"
                     "def _maybe_opt_step():\n"
                     f"    warnings.warn({SYNC_TEXT!r}, UserWarning)\n",
                     os.path.join(os.sep, "site", "torch", "amp", "grad_scaler.py"), "exec")


def test_host_syncs_are_counted_per_step_with_the_script_line_and_never_shown():
    meter = CommMeter()
    shown = []
    namespace: dict = {}
    exec(TORCH_LIKE, namespace)
    with warnings.catch_warnings():
        warnings.filterwarnings("always", message=SYNC_PATTERN, category=UserWarning)
        warnings.showwarning = meter.wrap_showwarning(lambda *a: shown.append(a[0]))
        for _ in range(2):
            warnings.warn(SYNC_TEXT, UserWarning, stacklevel=1)  # as .item() called here
        namespace["_maybe_opt_step"]()  # one inside a torch function the script calls
        warnings.warn("something else", UserWarning, stacklevel=1)
    record: dict = {}
    meter.close_step(record, 0.01)
    assert record["hsync_n"] == 3 and record["hsync_s"] == 0
    assert [str(m) for m in shown] == ["something else"]  # the user's warnings still shown
    sites = [site for name, site in meter.site_events() if name == "host_sync_site"]
    [direct] = [site for site in sites if site["via"] is None]
    assert direct["file"] == __file__ and direct["calls"] == 2
    assert direct["text"] == "warnings.warn(SYNC_TEXT, UserWarning, stacklevel=1)  # as " \
                             ".item() called here"
    [through] = [site for site in sites if site["via"]]
    assert through["via"] == "grad_scaler.py:3 _maybe_opt_step" and through["calls"] == 1
    assert through["text"].startswith('namespace["_maybe_opt_step"]()')
    after: dict = {}
    meter.close_step(after, 0.01)
    assert "hsync_n" not in after


def _torch_synchronize() -> None:
    warnings.warn(SYNC_TEXT, UserWarning, stacklevel=1)  # torch's own may warn too


def test_synchronize_is_timed_once_and_idle_meters_count_nothing():
    ticks = iter(range(0, 10 ** 9, 2_000_000))
    meter = CommMeter(clock=lambda: next(ticks))
    with warnings.catch_warnings():
        warnings.filterwarnings("always", message=SYNC_PATTERN, category=UserWarning)
        warnings.showwarning = meter.wrap_showwarning(lambda *a: None)
        synchronize = meter.wrap_synchronize(_torch_synchronize)
        synchronize()
        record: dict = {}
        meter.close_step(record, 0.01)
        assert record["hsync_n"] == 1 and record["hsync_s"] == pytest.approx(0.002)
        [(_, site)] = [e for e in meter.site_events() if e[0] == "host_sync_site"]
        assert site["text"] == "synchronize()" and site["seconds"] == pytest.approx(0.002)
        meter.active = lambda: False  # stopping, or a DataLoader worker
        synchronize()
        warnings.warn(SYNC_TEXT, UserWarning, stacklevel=1)
        idle: dict = {}
        meter.close_step(idle, 0.01)
        assert "hsync_n" not in idle


def test_watching_host_syncs_installs_and_removes_torch_sync_debug_mode(monkeypatch):
    from types import SimpleNamespace

    from ddp_profile.profiler.rank import patches

    mode = [0]
    monkeypatch.setattr(torch._C, "_cuda_get_sync_debug_mode", lambda: mode[0], raising=False)
    monkeypatch.setattr(torch._C, "_cuda_set_sync_debug_mode",
                        lambda value: mode.__setitem__(0, value), raising=False)
    instr = SimpleNamespace(comm=CommMeter())
    filters_before = list(warnings.filters)
    show_before, sync_before = warnings.showwarning, torch.cuda.synchronize
    try:
        assert patches.watch_host_syncs(instr) is True
        assert mode == [1] and warnings.filters[0][0] == "always"
        assert warnings.showwarning is not show_before and torch.cuda.synchronize is not sync_before
    finally:
        patches.remove()
    assert mode == [0] and warnings.filters == filters_before
    assert warnings.showwarning is show_before and torch.cuda.synchronize is sync_before
    mode[0] = 2  # the script's own debug mode: left alone, nothing watched
    assert patches.watch_host_syncs(instr) is False and not patches.is_applied()

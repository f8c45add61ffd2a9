"""The overhead benchmark's workload: its in-process A/B removes and re-applies the patches in
blocks of steps, and clocks the hooks while they are on."""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

from ddp_profile.profiler.rank import instrument, patches
from ddp_profile.profiler.rank.instrument import Instrumentation
from ddp_profile.profiler.settings import ProbePlan

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks",
                                "workloads"))

import bench_train  # noqa: E402


def test_the_toggled_patches_keep_the_loop_running_and_clock_the_optimizer_hook(
        tmp_path, monkeypatch):
    """A block re-applied registers the clocked optimizer hook, which torch calls with
    (optimizer, args, kwargs): the loop's step must still run, in every block."""
    instr = Instrumentation(ProbePlan(probe_id="t", out_dir=str(tmp_path), warmup=0,
                                      steps=10 ** 9))
    patches.apply(instr)
    monkeypatch.setattr(instrument, "_INSTALLED", instr)
    try:
        toggle = bench_train.Toggle(every=2, warmup=1)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=4)
        steps = []
        for index, batch in enumerate(loader):
            toggle.before_step(index)
            model(batch).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            steps.append(0.001)
        toggle.before_step(len(steps))
    finally:
        if instr.samplers is not None:
            instr.samplers.stop()
        patches.remove()
        instr.recorder.close()
    assert toggle.states[1:9] == [True, True, False, False, False, False, True, True]  # ABBA
    summary = toggle.summary(steps[1:])
    assert summary["pairs"] >= 3
    assert set(summary["hook_cpu_us_by_hook"]) == {"on_next", "on_optimizer_step"}

"""What a script does between epochs (validation, a checkpoint) belongs to no step: a real
DataLoader, the real patches and a real one-rank gloo group, in this process."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from ddp_profile.profiler.rank import patches, process
from ddp_profile.profiler.rank.instrument import Instrumentation
from ddp_profile.profiler.settings import ProbePlan
from ddp_profile.profiler.store.probedir import RankData, read_probe_dir


def _train(tmp_path, monkeypatch, between: int) -> RankData:
    monkeypatch.setattr(process, "_known_rank", process._known_rank)  # the group's rank: this
    # test's alone
    instr = Instrumentation(ProbePlan(probe_id="t", out_dir=str(tmp_path / "probe"), warmup=0,
                                      steps=10 ** 9))
    patches.apply(instr)
    try:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                                world_size=1)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=4)
        for _epoch in range(2):
            for (x,) in loader:
                loss = model(x).sum()
                loss.backward()
                opt.step()
                dist.all_reduce(loss.detach())  # the script's per-step metric
            for _ in range(between):  # the epoch's end: a validation's reductions
                dist.all_reduce(torch.ones(1))
        instr.end_of_script()
    finally:
        patches.remove()
        if dist.is_initialized():
            dist.destroy_process_group()
    (data,) = read_probe_dir(str(tmp_path / "probe"))
    return data


def test_collectives_between_epochs_count_in_no_step_and_their_site_says_so(tmp_path,
                                                                            monkeypatch):
    data = _train(tmp_path, monkeypatch, between=7)
    steps = data.training_steps()
    assert len(steps) >= 11  # two epochs of 6 (the script's last batch closes no step)
    assert [s.get("coll_n") for s in steps] == [1] * len(steps)  # not 8 after the boundary
    sites = {site["line"]: site for _rank, site in
             ((0, e["data"]) for e in data.events if e.get("name") == "collective_site")}
    [per_step] = [s for s in sites.values() if s["outside"] == 0]
    [outside] = [s for s in sites.values() if s["outside"]]
    assert per_step["calls"] == 12
    assert outside["calls"] == outside["outside"] == 14

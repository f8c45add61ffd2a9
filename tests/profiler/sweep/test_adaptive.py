"""Adaptive search on modelled workloads: close to the grid's best, with fewer probes."""

from __future__ import annotations

from typing import Callable, Optional

import pytest

from ddp_profile.profiler.settings import LoaderSettings
from ddp_profile.profiler.store.rundir import RunDir
from ddp_profile.profiler.sweep.launch import LaunchSpec
from ddp_profile.profiler.sweep.search import Sweep, SweepOptions, Window
from ddp_profile.profiler.sweep.space import SearchSpace, grid

Model = Callable[[LoaderSettings], tuple[float, float]]  # -> (samples/s, data-wait share)


class ModelSweep(Sweep):
    """A sweep whose probes are answered by a throughput model instead of a launch."""

    def __init__(self, tmp_path, model: Model, space: SearchSpace, screens: bool = True,
                 repeat: int = 1, fail_after: Optional[int] = None):
        run_dir = RunDir(str(tmp_path / "run"))
        run_dir.create({"script": "model.py"})
        super().__init__(run_dir, LaunchSpec(script="model.py"), space,
                         SweepOptions(search="adaptive", ceiling=False, repeat=repeat))
        self.fail_after = fail_after  # launches after which every probe crashes
        self.model = model
        self.screens = screens
        self.launches_made = 0
        self.measured: list[LoaderSettings] = []

    def _entry(self, requested: LoaderSettings, kind: str, **extra) -> dict:
        config = requested.merged_over(LoaderSettings(0, False, None, 32))
        if not config.num_workers:
            config = LoaderSettings(0, config.pin_memory, None, config.batch_size)
        self.measured.append(config)
        throughput, wait = self.model(config)
        status = "ok" if self.fail_after is None or self.launches_made <= self.fail_after \
            else "crash"
        entry = {"id": f"p{len(self.entries):03d}", "kind": kind, "status": status,
                 "config": config.to_dict(), "requested": requested.to_dict(),
                 "throughput": throughput, "data_wait_fraction": wait, "throughput_rse": 0.01,
                 "steps_measured": 30, "wall_s": 5.0, **extra}
        self.entries.append(entry)
        return entry

    def measure(self, requested: LoaderSettings, kind: str = "sweep",
                steps: Optional[int] = None, mode: str = "normal") -> dict:
        self.launches_made += 1
        return self._entry(requested, kind)

    def measure_screen(self, windows: list[Window]) -> list[dict]:
        if not windows:
            return []
        if not self.screens:
            self.screen_unsupported = "modelled: no screens"
            return []
        self.launches_made += 1
        return [self._entry(w.config, w.kind, screened=True) for w in windows]

    def _baseline_context(self) -> dict:
        return {"device": "cuda", "cpus_available": 32}


def io_bound(config: LoaderSettings) -> tuple[float, float]:
    """Loading at 400 samples/s per worker, compute at 3000 samples/s; prefetch adds 3 %."""
    workers = config.num_workers or 0
    loading = 250.0 if workers == 0 else 400.0 * workers * (1.03 if config.prefetch_factor == 4
                                                            else 1.0)
    throughput = min(loading, 3000.0)
    return throughput, (1 - throughput / 3000.0) if loading < 3000.0 else 0.01


def cpu_bound(config: LoaderSettings) -> tuple[float, float]:
    """Preprocessing saturates 3 workers' worth of CPUs; more workers only add contention."""
    workers = config.num_workers or 0
    loading = 200.0 * min(workers, 3) - 10.0 * max(0, workers - 3) if workers else 150.0
    return min(loading, 2000.0), 0.6


def compute_bound(config: LoaderSettings) -> tuple[float, float]:
    """The loop hardly waits: workers only add a little contention."""
    workers = config.num_workers or 0
    return 1000.0 - 5.0 * workers, 0.01


SPACE = SearchSpace(num_workers=(0, 1, 2, 4, 8, 16), prefetch_factor=(2, 4),
                    pin_memory=(False, True))


@pytest.mark.parametrize("model", [io_bound, cpu_bound])
def test_adaptive_screens_reach_the_grid_best_in_three_launches(tmp_path, model):
    sweep = ModelSweep(tmp_path, model, SPACE)
    sweep.run()
    configs = grid(sweep.axes)
    grid_best = max(model(c)[0] for c in configs)
    chosen = sweep.best()
    assert chosen["throughput"] >= 0.95 * grid_best
    # the baseline, the worker-ladder screen, the confirming screen; the grid launches each
    assert sweep.launches_made == 3, sweep.launches_made
    assert len(sweep.measured) < len(configs) + 1
    # the choice was measured again in a fresh launch: not only inside the ladder's screen
    confirmations = [e for e in sweep.entries if e["config"] == chosen["config"]]
    assert len(confirmations) >= 2 or not chosen.get("screened")


@pytest.mark.parametrize("model", [io_bound, cpu_bound])
def test_adaptive_without_screens_climbs_with_fewer_probes(tmp_path, model):
    sweep = ModelSweep(tmp_path, model, SPACE, screens=False)
    sweep.run()
    configs = grid(sweep.axes)
    grid_best = max(model(c)[0] for c in configs)
    assert sweep.best()["throughput"] >= 0.95 * grid_best
    assert sweep.launches_made <= 0.5 * (len(configs) + 1), (sweep.launches_made, len(configs))


def test_a_compute_bound_baseline_gets_no_worker_ladder(tmp_path):
    sweep = ModelSweep(tmp_path, compute_bound, SPACE)
    sweep.run()
    assert sweep.best()["kind"] == "baseline"
    assert {c.num_workers for c in sweep.measured} == {0}  # pinning variants only
    assert sweep.launches_made == 2


def test_repeat_measures_the_recommended_configuration_in_fresh_launches(tmp_path):
    sweep = ModelSweep(tmp_path, io_bound, SPACE, repeat=3)
    sweep.run()
    best = sweep.best()
    repeats = [e for e in sweep.entries if e["kind"] == "repeat"]
    # the adaptive run measured the choice twice (screen, then a fresh re-measure): one more
    assert len(sweep.launches_of(LoaderSettings.from_dict(best["config"]))) == 3
    assert len(repeats) == 1 and repeats[0]["config"] == best["config"]
    assert sweep.best() is best  # repeats never take part in the choice


def test_repeat_stops_at_a_failed_launch(tmp_path):
    sweep = ModelSweep(tmp_path, io_bound, SPACE, repeat=6, fail_after=4)
    sweep.run()
    repeats = [e for e in sweep.entries if e["kind"] == "repeat"]
    assert [e["status"] for e in repeats] == ["ok", "crash"]

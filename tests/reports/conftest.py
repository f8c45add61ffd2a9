"""Loaded synthetic runs for the report tests (see ``fixtures.py``)."""

from __future__ import annotations

import pytest

from ddp_profile.profiler.store.results import Run, load_run
from tests.reports import fixtures


def make_run(tmp_path_factory: pytest.TempPathFactory, scenario: fixtures.Scenario,
             name: str) -> Run:
    path = tmp_path_factory.mktemp(name)
    return load_run(fixtures.write_run_dir(str(path), scenario))


@pytest.fixture(scope="session")
def data_bound_run(tmp_path_factory) -> Run:
    return make_run(tmp_path_factory, fixtures.data_bound(), "data_bound")


@pytest.fixture(scope="session")
def straggler_run(tmp_path_factory) -> Run:
    return make_run(tmp_path_factory, fixtures.straggler(), "straggler")


@pytest.fixture(scope="session")
def gpu_run(tmp_path_factory) -> Run:
    return make_run(tmp_path_factory, fixtures.with_gpu(), "gpu")


@pytest.fixture(scope="session")
def failed_run(tmp_path_factory) -> Run:
    return make_run(tmp_path_factory, fixtures.failed_probe(), "failed")


@pytest.fixture(scope="session")
def sweep_run(tmp_path_factory) -> Run:
    """num_workers x batch size both swept, GPU samples, a failed probe, a straggler."""
    scenario = fixtures.Scenario(num_workers=(0, 2, 4), batch_sizes=(32, 64), ranks=4,
                                 gpu=True, failed_probe=True, straggler_rank=2, steps=60)
    return make_run(tmp_path_factory, scenario, "sweep")

"""Probes keep the contract of the frameworks' own loops: Lightning's fit loop with validation
and accelerate's gradient accumulation, sized from their loaders, under the default search on
2 real ranks (see ``test_contract``), its ladder's screen switching windows mid-epoch.
``--pairs 0``: the launches after the search (the claim's windows, persistent workers) are the
plain shape's of ``test_contract`` to check; ``--prefetch-factor 2``: so is the prefetch
screen's, as for the other shapes there."""

from __future__ import annotations

import os

import pytest

from tests.conftest import SCRIPTS
from tests.e2e.test_contract import SEARCH, TWO_RANKS, assert_contract_kept

pytestmark = pytest.mark.e2e


# 4 ms a sample: workers win, so the screen runs its windows across epochs (where 1 worker
# loses beyond noise, the rungs above it are condemned and the screen stops after it)
LOAD_MS = "4"
ONE_SCREEN = ["--pairs", "0", "--prefetch-factor", "2"]  # the ladder's screen, then no launch


def test_lightnings_fit_loop_with_validation_keeps_its_counts(cli, run_dir):
    pytest.importorskip("pytorch_lightning", reason="the test extra installs pytorch-lightning")
    result = cli(["run", os.path.join(SCRIPTS, "lightning_contract_train.py"), "--launcher",
                  "none", "--out", run_dir, *SEARCH, *ONE_SCREEN, "--", "0", LOAD_MS],
                 out=run_dir,
                 timeout=300)
    assert_contract_kept(result, screens=True)


def test_accelerates_gradient_accumulation_keeps_its_counts(cli, run_dir):
    pytest.importorskip("accelerate", reason="the test extra installs accelerate")
    result = cli(["run", os.path.join(SCRIPTS, "accelerate_contract_train.py"), "--out", run_dir,
                  *SEARCH, *TWO_RANKS, *ONE_SCREEN, "--", LOAD_MS], out=run_dir, timeout=300)
    assert_contract_kept(result, screens=True)

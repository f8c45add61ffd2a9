"""Fixtures of the rank-side tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def noted(monkeypatch):
    """``_next_index`` notes what it dispatches, as in the ranks of a screen or a ceiling."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    from ddp_profile.profiler.rank.windows import noting_dispatch

    monkeypatch.setattr(_BaseDataLoaderIter, "_next_index",
                        noting_dispatch(_BaseDataLoaderIter._next_index))

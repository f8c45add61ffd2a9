"""ddp-profile: measure why the GPUs of a PyTorch DDP job sit idle, and which settings fix it.

Importing this package changes nothing; the rank-side instrumentation is installed only by the
start-up hook, and only when the ``DDP_PROFILE`` environment variable is set by the harness.

Reading a run directory from Python::

    import ddp_profile

    run = ddp_profile.load_run("ddp-profile-runs/20261125-101500")
    run.summary["recommended"], run.probes, run.steps      # dict, DataFrame, DataFrame

``load_run`` returns a ``Run`` (the summary plus its probes, steps, samples, loader and event
tables); a probe's ``status`` and ``kind`` compare equal to ``Status`` and ``Kind``. Imported
on first use: the start-up hook in every rank and DataLoader worker does not load pandas.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Kind", "Run", "Status", "__version__", "load_run"]

_EXPORTS = {"load_run": "ddp_profile.profiler.store.results",
            "Run": "ddp_profile.profiler.store.results",
            "Status": "ddp_profile.profiler.store.probes",
            "Kind": "ddp_profile.profiler.store.probes"}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ddp_profile' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)

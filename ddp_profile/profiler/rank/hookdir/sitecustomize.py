"""ddp-profile start-up hook: active only when the harness sets DDP_PROFILE=1.

This directory is put first on PYTHONPATH for a probe's processes only. After activating the
hook, the ``sitecustomize`` that this file shadows (if any) still runs.
"""

import os
import sys


def _activate():
    if os.environ.get("DDP_PROFILE") != "1":
        return
    try:
        from ddp_profile.profiler.rank.hook import activate
        activate()
    except Exception as exc:  # never break the user's script
        sys.stderr.write("ddp-profile: start-up hook failed: %s: %s\n" % (type(exc).__name__, exc))


def _run_shadowed_sitecustomize():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.stderr.write("ddp-profile: the shadowed sitecustomize failed: %s\n" % (exc,))


_activate()
_run_shadowed_sitecustomize()

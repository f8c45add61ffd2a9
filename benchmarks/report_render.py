"""Render time and file size of the HTML report for a synthetic 100-probe x 8-rank run.

    python benchmarks/report_render.py [--quick] [--probes N] [--ranks N] [--steps N]

Builds the run directory with ``benchmarks/_large_run.py`` (made-up rank records, everything
else by the tool's own code), loads it, then times ``build_report_data`` and ``write_report``
(best of ``--repeat``).
The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import _bench

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from _large_run import write_large_run  # noqa: E402
from ddp_profile.profiler.store.results import load_run  # noqa: E402
from ddp_profile.reports.html import build_report_data, plotly_js, write_report  # noqa: E402


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 probes x 4 ranks, one repeat")
    parser.add_argument("--probes", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.probes, args.ranks, args.repeat = 20, 4, 1
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        start = time.perf_counter()
        write_large_run(run_dir, args.probes, args.ranks, args.steps)
        run = load_run(run_dir)
        load_s = time.perf_counter() - start
        out = os.path.join(tmp, "report.html")
        build_s = best_of(args.repeat, lambda: build_report_data(run))
        render_s = best_of(args.repeat, lambda: write_report(run, out))
        size = os.path.getsize(out)
    plotly_size = len(plotly_js().encode())
    result = {"benchmark": "report_render", "probes": len(run.probes), "ranks": args.ranks,
              "steps_per_rank": args.steps, "step_rows": len(run.steps),
              "sample_rows": len(run.samples), "synthesise_and_load_s": round(load_s, 3),
              "build_report_data_s": round(build_s, 3), "write_report_s": round(render_s, 3),
              "file_bytes": size, "plotly_js_bytes": plotly_size,
              "beyond_plotly_mb": round((size - plotly_size) / 2**20, 3),
              "cpu_count": os.cpu_count()}
    _bench.finish("report_render", result, argv)
    return result


if __name__ == "__main__":
    main()

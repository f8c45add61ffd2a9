"""CPU cost of the per-rank telemetry samplers at their default rate.

Measures this process's CPU time over the same wall time with the samplers running and idle;
the difference, as a percentage of one core, is the samplers' cost (budget: 0.5 %). The host
sampler runs for real (psutil); the GPU sampler runs against the benchmark's own stand-in for
NVML (``benchmarks/_nvml_device.py``: one live device whose driver produces a utilisation
sample every 1/6 s), so its figure includes the stand-in's Python work in place of NVML's C
calls. To look like a rank, the process holds ``--threads``
idle threads and ``--workers`` child processes (stand-ins for DataLoader workers).

    python benchmarks/sampler_cost.py [--quick] [--duration S] [--interval S]

The last line printed is a JSON object; ``cpu_percent_of_one_core`` is the headline figure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import threading
import time

import _bench
import _nvml_device
from ddp_profile.profiler.telemetry.sampler import GpuSampler, HostSampler, start_samplers

BUDGET_PERCENT = 0.5


def _cpu_s() -> float:
    return time.process_time()  # all threads of this process, ns resolution


def _measure(seconds: float, run=None) -> tuple[float, dict[str, float]]:
    """Process CPU seconds used over ``seconds`` of wall time (start and stop included), and
    CPU seconds of each sampler thread."""
    start = _cpu_s()
    group = run() if run else None
    time.sleep(seconds)
    if group is not None:
        group.stop()
    used = _cpu_s() - start
    return used, {s.source: s.cpu_time_s for s in group.samplers} if group is not None else {}


def _per_tick_us(sampler, ticks: int = 200) -> float:
    """Mean CPU microseconds of one ``sample_once`` (tight loop, after ``prime``)."""
    sampler.prime()
    start = time.thread_time()
    for _ in range(ticks):
        sampler.sample_once()
    cost = (time.thread_time() - start) / ticks * 1e6
    sampler.close()
    return cost


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 s per phase instead of 20 s")
    parser.add_argument("--duration", type=float, default=None, help="seconds per phase")
    parser.add_argument("--interval", type=float, default=0.5,
                        help="sampling interval (default 0.5 s)")
    parser.add_argument("--threads", type=int, default=32, help="idle threads in this process")
    parser.add_argument("--workers", type=int, default=4,
                        help="child processes standing in for workers")
    return parser.parse_args(argv)


@contextlib.contextmanager
def _rank_like_process(threads: int, workers: int):
    """Idle threads and sleeping child processes, as a training rank has."""
    stop = threading.Event()
    for _ in range(threads):
        threading.Thread(target=stop.wait, daemon=True).start()
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
                for _ in range(workers)]
    try:
        time.sleep(0.5)  # let the children start
        yield
    finally:
        stop.set()
        for child in children:
            child.kill()
            child.wait()


def main(argv: list[str] | None = None) -> dict:
    args = _parse(argv)
    duration = args.duration or (5.0 if args.quick else 20.0)
    device = _nvml_device
    bus_id = _nvml_device.PCI_BUS_ID
    records: list[dict] = []

    def run():
        return start_samplers(records.append, pid=os.getpid(), pci_bus_id=bus_id,
                              interval_s=args.interval, nvml_lib=device)

    with _rank_like_process(args.threads, args.workers):
        idle_s, _ = _measure(duration)
        busy_s, per_thread = _measure(duration, run)
        host_tick = _per_tick_us(HostSampler(lambda r: None, pid=os.getpid()))
        gpu_tick = _per_tick_us(GpuSampler(lambda r: None, pci_bus_id=bus_id, nvml_lib=device))

    cost = 100.0 * max(busy_s - idle_s, 0.0) / duration
    result = {
        "benchmark": "sampler_cost",
        "interval_s": args.interval,
        "duration_s": duration,
        "cpu_percent_of_one_core": round(cost, 4),
        "idle_cpu_percent": round(100.0 * idle_s / duration, 4),
        "thread_cpu_percent": {k: round(100.0 * v / duration, 4) for k, v in per_thread.items()},
        "per_tick_cpu_us": {"host": round(host_tick, 1), "gpu_stand_in": round(gpu_tick, 1)},
        "samples": {s: sum(r.get("source") == s for r in records if r["kind"] == "sample")
                    for s in ("host", "gpu")},
        "cpus": len(os.sched_getaffinity(0)),
        "threads": args.threads + 1,
        "workers": args.workers,
        "budget_percent": BUDGET_PERCENT,
        "within_budget": cost <= BUDGET_PERCENT,
    }
    _bench.finish("sampler_cost", result, argv)
    return result


if __name__ == "__main__":
    main()

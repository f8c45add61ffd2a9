"""Where a launch's seconds go: a rank's start-up against its steps, plainly and as a probe.

A probe is one launch of the script, and the test suite makes a few hundred of them. This
prints, as medians over ``--rounds`` (the variants alternate within a round):

* ``import_torch_s``: ``python -c "import torch"``, whole process;
* ``rank``: inside a 1-rank torchrun launch of a script that only starts up, seconds to import
  torch, to join a gloo process group, and to build ``DistributedDataParallel`` around a
  ``Linear(4, 4)`` (the first DDP of a process imports what torch needs for it, the compiler's
  modules among them);
* ``plain_s`` / ``probe_s``: the built-in workload on ``--nproc`` rank(s), 23 steps, launched
  plainly by torchrun (one epoch of 23 batches, whole process) and as a one-probe
  ``ddp-profile run`` (3 + 20 steps, whole CLI process: the fork server's import of torch's
  launcher, the probe, the analysis); ``probe_over_plain`` is their ratio round by round.

    python benchmarks/launch_cost.py --rounds 3            # about 1 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _bench

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "ddp_profile", "examples", "demo_train.py")
WORKLOAD = ["--hidden", "32", "--layers", "1", "--batch-size", "8"]
START_UP = """import json, os, time
t0 = time.perf_counter()
import torch
import torch.distributed as dist
t1 = time.perf_counter()
dist.init_process_group("gloo")
t2 = time.perf_counter()
torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
t3 = time.perf_counter()
print("PHASES " + json.dumps({"import_torch": t1 - t0, "process_group": t2 - t1,
                              "first_ddp": t3 - t2}), flush=True)
dist.destroy_process_group()
"""


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed: {done.stderr.strip().splitlines()[-1:]}")
    return time.monotonic() - started, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=1)
    options = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--monitor-interval=0.2"]
    figures: dict[str, list] = {"import_torch_s": [], "rank": [], "plain_s": [], "probe_s": []}
    with tempfile.TemporaryDirectory(prefix="launch-cost-") as root:
        start_up = os.path.join(root, "start_up.py")
        with open(start_up, "w", encoding="utf-8") as handle:
            handle.write(START_UP)
        for index in range(options.rounds):
            figures["import_torch_s"].append(timed([sys.executable, "-c", "import torch"],
                                                   env)[0])
            _, out = timed([*torchrun, "--nproc-per-node", "1", start_up], env)
            figures["rank"].append(json.loads(out.split("PHASES ", 1)[1].splitlines()[0]))
            steps = 23 * 8 * options.nproc  # one epoch of 23 batches on each rank
            figures["plain_s"].append(timed([*torchrun, "--nproc-per-node", str(options.nproc),
                                             DEMO, *WORKLOAD, "--samples", str(steps),
                                             "--epochs", "1"], env)[0])
            out_dir = os.path.join(root, f"run-{index}")
            figures["probe_s"].append(timed([
                sys.executable, "-m", "ddp_profile", "run", DEMO, "--out", out_dir,
                "--search", "grid", "--num-workers", "0", "--pin-memory", "false",
                "--steps", "20", "--warmup", "3", "--no-ceiling", "--no-comm", "--pairs", "0",
                "--no-report", "--quiet", "--nproc-per-node", str(options.nproc), "--",
                *WORKLOAD], env)[0])
    rank = {phase: round(statistics.median(r[phase] for r in figures["rank"]), 3)
            for phase in figures["rank"][0]}
    ratios = [p / q for p, q in zip(figures["probe_s"], figures["plain_s"])]
    _bench.finish("launch_cost", {
        "rounds": options.rounds, "nproc": options.nproc,
        "import_torch_s": round(statistics.median(figures["import_torch_s"]), 3),
        "rank": rank,
        "plain_s": round(statistics.median(figures["plain_s"]), 3),
        "probe_s": round(statistics.median(figures["probe_s"]), 3),
        "probe_over_plain": [round(r, 3) for r in ratios]}, indent=1)


if __name__ == "__main__":
    main()

"""A script in a real job's regime: about 20 s of start-up before its first batch (imports, a
model built, a dataset's index read), then long epochs of samples that each wait on storage.

The built-in workload (``ddp_profile/examples/demo_train.py``) after ``--start-up-s`` seconds
asleep; by default 48,000 samples, batch 16 on 2 ranks: 1,500 steps an epoch, 4 ms of latency
per sample. Every other argument goes to the built-in workload.

    ddp-profile run benchmarks/workloads/slow_start.py
    torchrun --nproc-per-node 2 benchmarks/workloads/slow_start.py --num-workers 8   # plainly
"""

import argparse
import sys
import time

from ddp_profile.examples import demo_train

DEFAULTS = ["--samples", "48000", "--batch-size", "16", "--load-ms", "4", "--epochs", "1"]

if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--start-up-s", type=float, default=20.0)
    known, rest = parser.parse_known_args()
    time.sleep(known.start_up_s)
    sys.argv = [sys.argv[0], *DEFAULTS, *rest]  # later flags win in argparse
    demo_train.main()

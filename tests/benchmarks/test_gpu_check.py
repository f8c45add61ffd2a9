"""benchmarks/gpu_check.py on a machine without CUDA: one line and its own exit status, at once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_gpu_check_without_cuda_says_so_in_one_line_and_exits_3():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: gpu_check would run its checks")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "gpu_check.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0]

"""Python bytecodes and calls the rank's instrumentation adds a step: a noise-free proxy.

``overhead_micro.py`` times the added work on the wall clock, which this shared VM's speed moves
between sittings. This counts it instead: the tiny loop of ``overhead_micro`` runs one block
plain and one instrumented (its records flushed inside it, as there), each traced with
``sys.settrace`` and opcode events; the difference per step is, within an opcode or two, the
same in every run of the same code, so two commits compare closely. It counts the
interpreter's work alone: the C functions called (clocks, system calls, formatting) each count
as the one call that reaches them.

    python benchmarks/step_bytecodes.py [--steps 200] [--top 25]

Prints the functions that add the most, then one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from typing import Any

import torch

import _bench
from ddp_profile.profiler.rank import patches
from ddp_profile.profiler.rank.instrument import Instrumentation
from ddp_profile.profiler.settings import ProbePlan
from overhead_micro import BLOCK_WARMUP, TinyLoop


class Counts:
    """Opcodes and calls by function (``file:name``), while tracing."""

    def __init__(self) -> None:
        self.opcodes: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()

    def trace(self, frame: Any, event: str, _arg: Any) -> Any:
        code = frame.f_code
        key = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}"
        if event == "opcode":
            self.opcodes[key] += 1
        elif event == "call":
            frame.f_trace_opcodes = True
            self.calls[key] += 1
        return self.trace


def counted_block(loop: TinyLoop, loader: Any, steps: int, instr: Any) -> Counts:
    """One block as ``overhead_micro.block`` runs it, its timed part traced instead."""
    counts = Counts()
    if instr is not None:
        patches.apply(instr)
    try:
        batches = iter(loader)
        loop.run(batches, BLOCK_WARMUP)
        if instr is not None:
            if instr.samplers is not None:
                instr.samplers.stop()
                instr.samplers = None
            instr.recorder.flush()
        sys.settrace(counts.trace)
        try:
            loop.run(batches, steps)
            if instr is not None:
                instr.recorder.flush()
        finally:
            sys.settrace(None)
    finally:
        if instr is not None:
            patches.remove()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loop = TinyLoop(4 * (args.steps + BLOCK_WARMUP))
    with tempfile.TemporaryDirectory() as tmp:
        instr = Instrumentation(ProbePlan(probe_id="bench", out_dir=tmp, warmup=0,
                                          steps=10 ** 9))
        plain_loader = loop.loader()
        patches.apply(instr)
        hooked_loader = loop.loader()
        patches.remove()
        try:
            for _ in range(2):  # the second pair is counted: every path warm
                plain = counted_block(loop, plain_loader, args.steps, None)
                hooked = counted_block(loop, hooked_loader, args.steps, instr)
        finally:
            instr.recorder.close()
    added = collections.Counter(hooked.opcodes)
    added.subtract(plain.opcodes)
    calls = collections.Counter(hooked.calls)
    calls.subtract(plain.calls)
    for key, count in sorted(added.items(), key=lambda item: -abs(item[1]))[:args.top]:
        if count:
            print(f"{count / args.steps:9.1f} opcodes {calls[key] / args.steps:6.2f} calls  {key}")
    _bench.finish("step_bytecodes", {
        "benchmark": "step_bytecodes", "steps": args.steps,
        "added_opcodes_per_step": round(sum(added.values()) / args.steps, 1),
        "added_calls_per_step": round(sum(calls.values()) / args.steps, 2),
        "plain_opcodes_per_step": round(sum(plain.opcodes.values()) / args.steps, 1)})


if __name__ == "__main__":
    main()

"""Benchmark workload: an ordinary 2-rank DDP loop that times its own steps.

Like ``ddp_profile/examples/demo_train.py`` its costs are parameters (``--load-ms`` per sample
asleep, ``--cpu-ms`` per sample busy, ``--step-sleep-ms`` per step, ``--hidden``/``--layers``
for the model), but it also measures itself with ``time.perf_counter`` so the benchmarks have a
reference that does not depend on any profiler:

* step time: the period between the starts of consecutive loop iterations (data wait, compute
  and everything else);
* data wait: time blocked in ``next(iterator)``;
* CPU time per step: ``time.process_time`` (every thread of the rank, so profiler threads
  count), far less sensitive than wall time to other processes on a shared machine.

After ``--steps`` iterations (the first ``--warmup`` discarded) each rank writes
``{"median_step_s", "data_wait_share", ...}`` to ``--out`` (``{rank}`` in the path is replaced)
and the script ends normally. ``--profiler`` wraps the loop in a peer profiler:

* ``torch``: ``torch.profiler.profile`` with ``schedule(wait=1, warmup=1, active=3, repeat=0)``
  (a cycle of 5 steps, 3 of them recorded, over the whole loop), ``prof.step()`` per step;
* ``gpuprof``: the package's two-line integration, ``with gpuprof.profile(name):`` around the
  loop (its database goes to ``--gpuprof-db``, ``{rank}`` replaced).

Run plainly with ``torchrun --nproc-per-node 2 bench_train.py --out res-{rank}.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from ddp_profile.examples.demo_train import SyntheticDataset

DDP_DEFAULT_SAMPLE_RATE = 100  # torch's kDDPRuntimeLoggingSampleRate


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--steps", type=int, default=60, help="loop iterations in all (warm-up included)")
    add("--warmup", type=int, default=5)
    add("--samples", type=int, default=1 << 16)
    add("--features", type=int, default=64)
    add("--batch-size", type=int, default=16)
    add("--num-workers", type=int, default=0)
    add("--prefetch-factor", type=int, default=None, help="with workers (default: torch's 2)")
    add("--pin-memory", action="store_true")
    add("--persistent-workers", action="store_true", help="with workers: keep them across epochs")
    add("--files", default="", help="a folder of one file per sample, read whole per fetch "
        "(the workload of benchmarks/peers.py); the dataset's length is the number of files")
    add("--drop-after-read", action="store_true", help="with --files: drop each file from the "
        "page cache once read, so that every epoch reads from storage")
    add("--bucket-cap-mb", type=float, default=None, help="DDP's bucket_cap_mb (default: its own)")
    add("--gradient-as-bucket-view", action="store_true", help="DDP's gradient_as_bucket_view")
    add("--load-ms", type=float, default=0.0)
    add("--cpu-ms", type=float, default=0.0)
    add("--step-sleep-ms", type=float, default=0.0, help="sleep inside each step (compute)")
    add("--hidden", type=int, default=256)
    add("--layers", type=int, default=2)
    add("--no-ddp", action="store_true",
        help="never wrap the model: the same step without DDP's gradient all-reduce")
    add("--profiler", choices=("none", "torch", "gpuprof"), default="none")
    add("--gpuprof-db", default="gpuprof-{rank}.db")
    add("--out", default="", help="JSON result path; {rank} is replaced")
    add("--toggle-instrumentation", type=int, default=0, metavar="K",
        help="under ddp-profile: remove and re-apply its patches every K steps (in-process A/B)")
    add("--device", choices=("cpu", "cuda"), default="cpu",
        help="cuda: the model and batches on this rank's GPU, DDP over nccl (one rank too)")
    add("--pin-core", action="store_true",
        help="pin each rank to the core of its local rank (less scheduling noise)")
    return parser.parse_args()


def profiler_context(args: argparse.Namespace, rank: int):
    if args.profiler == "torch":
        from torch.profiler import ProfilerActivity, profile, schedule

        return profile(activities=[ProfilerActivity.CPU],
                       schedule=schedule(wait=1, warmup=1, active=3, repeat=0))
    if args.profiler == "gpuprof":
        import gpuprof

        return gpuprof.profile("bench", db_path=args.gpuprof_db.format(rank=rank),
                               summary=False)
    return contextlib.nullcontext()


class Toggle:
    """In-process A/B of ddp-profile's instrumentation, in blocks of ``every`` steps.

    Blocks come in pairs, one patched (``on``) and one unpatched (``off``), in the order
    on-off, off-on, on-off ... (ABBA): a slow drift of the machine, or anything that favours the
    first or second block of a pair, reaches both kinds alike. The samplers and the rest of the
    probe keep running through both kinds of block. DDP's reducer timers run at ddp-profile's
    sample rate (every iteration) in the patched blocks only.

    While patched, the time spent inside ddp-profile's step hooks (``on_next`` without the
    DataLoader's own ``__next__``, and ``on_optimizer_step``) is also clocked: the direct cost
    per step, next to the A/B's total. The backward mark is made inside the ``Tensor.backward``
    patch (one clock read), which calls no hook that could be clocked apart from backward. The
    clocks themselves add a few us to a patched step (``thread_time_ns`` calls, ~0.7 us each on
    the development VM).
    """

    def __init__(self, every: int, warmup: int):
        # a negative ``every`` starts the first pair with the unpatched block
        self.every, self.warmup, self.on_first = abs(every), warmup, every > 0
        self.instr = None
        if every:
            from ddp_profile.profiler.rank import instrument

            self.instr = instrument.installed()
        self.active = self.instr is not None
        self.on = True
        self.states: list[bool] = []  # per step: was it instrumented?
        self.hook_ns = 0  # wall time inside the hooks, this step
        self.hook_cpu_ns = 0  # this thread's CPU time inside them (no preemption counted)
        self.hook_parts: dict[str, int] = {}  # CPU by hook, measured steps
        self.step_hooks: list[tuple[int, int]] = []  # per step: (wall, CPU) ns in the hooks
        if self.active:
            self._clock_hooks()

    def _clock_hooks(self) -> None:
        """Shadow the hooks on the instance (the patches look them up at every call)."""
        instr = self.instr
        on_next, on_step = instr.on_next, instr.on_optimizer_step
        clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns

        def add(name: str, wall: int, cpu: int) -> None:
            self.hook_ns += wall
            self.hook_cpu_ns += cpu
            if len(self.states) > self.warmup:
                self.hook_parts[name] = self.hook_parts.get(name, 0) + cpu

        def timed_on_next(iterator, original):
            inner = inner_cpu = 0

            def timed_original(it):
                nonlocal inner, inner_cpu
                started, started_cpu = clock(), cpu_clock()
                try:
                    return original(it)
                finally:
                    inner += clock() - started
                    inner_cpu += cpu_clock() - started_cpu
            started, started_cpu = clock(), cpu_clock()
            try:
                return on_next(iterator, timed_original)
            finally:
                add("on_next", clock() - started - inner, cpu_clock() - started_cpu - inner_cpu)

        def timed(name, hook):
            def call(*args):  # the optimizer's post hook: (optimizer, args, kwargs)
                started, started_cpu = clock(), cpu_clock()
                try:
                    return hook(*args)
                finally:
                    add(name, clock() - started, cpu_clock() - started_cpu)
            return call

        instr.on_next = timed_on_next
        instr.on_optimizer_step = timed("on_optimizer_step", on_step)

    def instrumented(self, index: int) -> bool:
        if index < self.warmup:
            return True
        block = (index - self.warmup) // self.every
        first_of_pair = block % 2 == 0
        pair_starts_on = ((block // 2) % 2 == 0) == self.on_first
        return first_of_pair == pair_starts_on

    def before_step(self, index: int) -> None:
        if not self.active:
            return
        from ddp_profile.profiler.rank import patches

        self.step_hooks.append((self.hook_ns, self.hook_cpu_ns))  # the step that just ended
        self.hook_ns = self.hook_cpu_ns = 0
        want = self.instrumented(index)
        if want != self.on:
            if want:
                patches.apply(self.instr)
            else:
                patches.remove()
            self._ddp_timers(want)
            self.on = want
        self.states.append(want)

    def _ddp_timers(self, on: bool) -> None:
        """DDP's reducer times iterations at ddp-profile's sample rate
        (``rank.comm_meter.sample_rate``) and one in ``DDP_DEFAULT_SAMPLE_RATE`` plainly: the
        unpatched blocks go back to the default."""
        from ddp_profile.profiler.rank.comm_meter import sample_rate

        for ref in self.instr.comm.modules:
            module = ref()
            if module is not None:
                module._set_ddp_runtime_logging_sample_rate(
                    sample_rate(module) if on else DDP_DEFAULT_SAMPLE_RATE)

    def summary(self, steps: list[float]) -> dict:
        """Per pair of neighbouring on/off blocks, the ratio of their median step times."""
        states = self.states[self.warmup:self.warmup + len(steps)]
        ratios, on_first, pair = [], [], 2 * self.every
        for start in range(0, len(steps) - pair + 1, pair):
            block = list(zip(steps[start:start + pair], states[start:start + pair]))
            on = [t for t, instrumented in block if instrumented]
            off = [t for t, instrumented in block if not instrumented]
            if on and off:
                ratios.append(statistics.median(on) / statistics.median(off))
                on_first.append(block[0][1])
        on_steps = [t for t, instrumented in zip(steps, states) if instrumented]
        # the hooks of a step run from its ``__next__`` to its optimizer step: step i's are
        # clocked by the time step i + 1 begins; warm-up (start-up work: the context record,
        # the samplers' start) is left out
        hooks = [self.step_hooks[i + 1] for i in range(self.warmup, self.warmup + len(steps))
                 if i + 1 < len(self.step_hooks) and self.states[i]]
        patched = max(1, len(hooks))
        hook_us = sum(wall for wall, _ in hooks) / 1e3 / patched
        hook_cpu_us = sum(cpu for _, cpu in hooks) / 1e3 / patched

        def median_of(first: bool):
            chosen = [r for r, f in zip(ratios, on_first) if f == first]
            return statistics.median(chosen) if chosen else None

        return {"every": self.every, "on_first": self.on_first, "pairs": len(ratios),
                "ratio": statistics.median(ratios) if ratios else None,
                "ratio_on_first": median_of(True), "ratio_off_first": median_of(False),
                "pair_ratios": [round(r, 4) for r in ratios],
                "pair_on_first": on_first,
                "hook_us_per_step": round(hook_us, 2),
                "hook_cpu_us_per_step": round(hook_cpu_us, 2),
                "hook_cpu_us_median": round(statistics.median(cpu for _, cpu in hooks) / 1e3, 2)
                if hooks else None,
                "hook_cpu_us_by_hook": {k: round(v / 1e3 / sum(self.states[self.warmup:]), 2)
                                        for k, v in self.hook_parts.items()},
                "hook_share": hook_us / 1e6 / statistics.median(on_steps) if on_steps else None,
                "hook_cpu_share": hook_cpu_us / 1e6 / statistics.median(on_steps)
                if on_steps else None}


def main() -> None:
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = args.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda \
        else torch.device("cpu")
    distributed = world > 1 or cuda  # on a GPU, DDP over nccl with one rank too
    if cuda:
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if distributed else 0
    if args.pin_core and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        os.sched_setaffinity(0, {cores[local % len(cores)]})
    torch.manual_seed(0)
    if args.files:
        from peers_train import FileDataset  # beside this script

        dataset = FileDataset(args.files, args.features, drop=args.drop_after_read)
    else:
        dataset = SyntheticDataset(args.samples, args.features, args.load_ms, args.cpu_ms)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True) \
        if world > 1 else None
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                        shuffle=sampler is None, drop_last=True, num_workers=args.num_workers,
                        pin_memory=args.pin_memory,
                        prefetch_factor=args.prefetch_factor if args.num_workers else None,
                        persistent_workers=args.persistent_workers and args.num_workers > 0)
    layers: list[nn.Module] = [nn.Linear(args.features, args.hidden), nn.ReLU()]
    for _ in range(args.layers - 1):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    model: nn.Module = nn.Sequential(*layers, nn.Linear(args.hidden, 2)).to(device)
    if distributed and not args.no_ddp:
        options = {"bucket_cap_mb": args.bucket_cap_mb} if args.bucket_cap_mb else {}
        model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None,
                                        gradient_as_bucket_view=args.gradient_as_bucket_view,
                                        **options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    sleep_s = args.step_sleep_ms / 1000.0

    starts: list[float] = []  # perf_counter at each iteration's start
    cpu: list[float] = []  # process CPU time (all threads) at each iteration's start
    waits: list[float] = []
    wall_ns: list[int] = []  # time.time_ns at each iteration's start
    epoch = 0
    toggle = Toggle(args.toggle_instrumentation, args.warmup)
    with profiler_context(args, rank) as prof:
        iterator = iter(loader)
        while len(starts) < args.steps + 1:  # one more start closes the last step
            toggle.before_step(len(starts))
            starts.append(time.perf_counter())
            cpu.append(time.process_time())
            wall_ns.append(time.time_ns())
            if len(starts) > args.steps:
                break
            try:
                x, y = next(iterator)
            except StopIteration:
                epoch += 1
                if sampler is not None:
                    sampler.set_epoch(epoch)
                iterator = iter(loader)
                x, y = next(iterator)
            waits.append(time.perf_counter() - starts[-1])
            if cuda:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = loss_fn(model(x), y)
            if sleep_s:
                time.sleep(sleep_s)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if args.profiler == "torch":
                prof.step()
        loop_end_ns = time.time_ns()
    if cuda:
        torch.cuda.synchronize(device)
    steps = [b - a for a, b in zip(starts, starts[1:])][args.warmup:]
    measured_waits = waits[args.warmup:]
    cpu_steps = [b - a for a, b in zip(cpu, cpu[1:])][args.warmup:]
    result = {
        "rank": rank, "profiler": args.profiler, "steps": len(steps),
        "median_step_s": statistics.median(steps),
        "mean_step_s": statistics.fmean(steps),
        "median_step_cpu_s": statistics.median(cpu_steps),
        "data_wait_share": sum(measured_waits) / sum(steps),
        "first_measured_step_ns": wall_ns[args.warmup],
        "loop_end_ns": loop_end_ns,
    }
    if toggle.active:
        result["toggle"] = toggle.summary(steps)
    if args.out:
        with open(args.out.format(rank=rank), "w") as handle:
            json.dump(result, handle)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

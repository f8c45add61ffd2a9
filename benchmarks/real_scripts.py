"""Head to head on real scripts: the default search's recommendation against the best of a plain
grid over the same axes, in fresh plain launches, alternating, whole process less start-up.

For each workload: ``--runs`` runs of ``ddp-profile run`` under the default search, each its
recommendation and interval; then the plain grid, every configuration launched ``--rounds``
times round robin (c1 c2 ... c1 c2 ...: drift spreads over all), each launch's wall time less
the median of launches that do no epoch (start-up: imports, the model, the data's index); a
configuration's speed is the script's own settings' median time over its own. The grid also
launches what the runs recommended and what they named as measured faster but not established
(``unsettled``), so that a run is scored against every configuration it saw win. A run scores its
recommendation's speed over the grid's best (>= 0.95 wanted) and whether its interval holds
the recommendation's plain speed. A workload that times its own training loop and prints it
(``loop``: ours) is also scored by that time (``loop_grid``, ``of_best_loop``, ``inside_loop``):
whole process less a launch that trains nothing still charges the teardown after training,
which such a launch does not pay (0.3-0.6 s of the short MLP's 1.4-3.6 s loop). A run below
0.95 of the grid's best is then checked against that best head to head, the two alternated in
``--check-pairs`` pairs of plain launches (``of_best_paired``): a round robin of many
configurations in few rounds ranks close ones by the machine's moment.
``--keep DIR`` keeps each workload's run directories there; ``--reuse`` with it scores those
runs against a fresh grid, launching no run of the tool.

Scripts we did not write are never copied into this repository: fetch them and point at them
(``--timm-script`` and the like; docs/benchmarks.md names the commits). ``short_mlp`` is our own
(``workloads/short_mlp.py``, 2 gloo ranks). Where a script's command line cannot set an axis
(Lightning's and kubeflow's loaders have no ``num_workers``) the grid keeps the script's value,
and a recommendation that changes it is reported, not launched; where the source holds them
(accelerate's ``cv_example.py``: ``num_workers=4`` and a batch of 64 in its config) each plain
launch runs a copy with the configuration's written in, in the workload's scratch directory,
as a user edits the script to try a setting. Prints one JSON object.

    python benchmarks/real_scripts.py --workloads short_mlp --runs 3
    python benchmarks/real_scripts.py --workloads timm --runs 1 --rounds 2 \\
        --timm-script ~/pytorch-image-models/train.py --images ~/imgs
    python benchmarks/real_scripts.py --workloads imagenet,lightning,kubeflow_mnist --epochs 2 \\
        --imagenet-script ~/examples/imagenet/main.py --images ~/imgs \\
        --lightning-script ~/lightning/examples/pytorch/basics/backbone_image_classifier.py \\
        --kubeflow-script ~/mnist/src/mnist.py --fashion-mnist ~/mnist/data
    python benchmarks/real_scripts.py --workloads accelerate --runs 1 --rounds 1 \
        --accelerate-script ~/accelerate/examples/cv_example.py --pets ~/pets --hf-cache ~/hub
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import _bench

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = [sys.executable, "-m", "ddp_profile"]


@dataclass(frozen=True)
class Script:
    """A real script: how to start it, its own settings, and the grid's axes."""

    path: str
    nproc: int
    args: Callable[[dict[str, Any]], list[str]]  # a configuration -> the script's arguments
    own: dict[str, Any]  # the script's own settings (as the user runs it)
    grid: list[dict[str, Any]]  # the plain grid, the script's own settings among them
    idle: Optional[list[str]]  # arguments of a launch that trains no epoch (None: it has none)
    env: tuple[tuple[str, str], ...] = (("OMP_NUM_THREADS", "1"),)
    cwd: Optional[str] = None  # where it starts (default: the workload's temporary directory)
    fixed: tuple[tuple[str, Any], ...] = ()  # settings its command line cannot change
    loop: Optional[str] = None  # a pattern of its output: the seconds its training loop took
    # where settings live in the script's source: the path of a copy with a configuration's
    # written in, as a user edits the script to try it (None: its command line sets them)
    edited: Optional[Callable[[dict[str, Any]], str]] = None
    launch_timeout_s: float = 1800.0  # a plain launch that runs past this hung: killed


def short_mlp(_: argparse.Namespace) -> Script:
    def args(config: dict[str, Any]) -> list[str]:
        return ["--num-workers", str(config["num_workers"]), "--batch-size",
                str(config["batch_size"])]
    grid = [{"num_workers": w, "batch_size": b} for b in (64, 128, 256) for w in (0, 2)]
    return Script(os.path.join(HERE, "workloads", "short_mlp.py"), 2, args,
                  {"num_workers": 2, "batch_size": 64}, grid, ["--epochs", "0"],
                  loop=r"training loop: ([0-9.]+) s")


def need(name: str, options: argparse.Namespace, *dests: str) -> list[str]:
    """Those options' paths, absolute; exits naming the ones not given."""
    missing = ["--" + dest.replace("_", "-") for dest in dests if not getattr(options, dest)]
    if missing:
        raise SystemExit(f"{name}: give {' and '.join(missing)}")
    return [os.path.abspath(os.path.expanduser(getattr(options, dest))) for dest in dests]


def timm(options: argparse.Namespace) -> Script:
    """timm's train.py: 1 process on the CPU, --images has train/ and validation/."""
    path, images = need("timm", options, "timm_script", "images")
    out = tempfile.mkdtemp(prefix="timm-out-")

    def args(config: dict[str, Any], epochs: int = options.epochs) -> list[str]:
        return [images, "--model", "resnet18", "--img-size", "64", "-b",
                str(config["batch_size"]), "-j", str(config["num_workers"]), "--epochs",
                str(epochs), "--device", "cpu", "--no-prefetcher", "--train-split", "train",
                "--val-split", "validation", "--output", out]
    # the batch axis too: the tool's search moves it, and 1 worker at batch 64 led the plain
    # grids of five sessions (a grid of batch 32 alone scored a run against a lesser best)
    grid = [{"num_workers": w, "batch_size": b} for b in (32, 64) for w in (0, 1, 2)]
    own = {"num_workers": 0, "batch_size": 32}
    return Script(path, 1, args, own, grid, args(own, epochs=0))


def imagenet(options: argparse.Namespace) -> Script:
    """pytorch/examples imagenet/main.py: 1 process, on the CPU by itself, --images has val/."""
    path, images = need("imagenet", options, "imagenet_script", "images")

    def args(config: dict[str, Any], epochs: int = options.epochs) -> list[str]:
        return [images, "-a", "mobilenet_v3_small", "-b", str(config["batch_size"]), "-j",
                str(config["num_workers"]), "--epochs", str(epochs)]
    grid = [{"num_workers": w, "batch_size": 32} for w in (0, 2, 4)]
    own = {"num_workers": 0, "batch_size": 32}
    return Script(path, 1, args, own, grid, args(own, epochs=0))


def lightning(options: argparse.Namespace) -> Script:
    """Lightning's examples/pytorch/basics/backbone_image_classifier.py (LightningCLI, 2 DDP
    ranks on the CPU). It reads MNIST from ../../Datasets beside itself, after checking
    torchvision's copy under ./data: the launches start where ./data is that folder."""
    (path,) = need("lightning", options, "lightning_script")
    datasets = os.path.join(os.path.dirname(path), "..", "..", "Datasets")
    if not os.path.isdir(os.path.join(datasets, "MNIST", "raw")):
        raise SystemExit(f"lightning: no MNIST/raw under {os.path.normpath(datasets)}")
    cwd = tempfile.mkdtemp(prefix="lightning-")
    os.symlink(os.path.abspath(datasets), os.path.join(cwd, "data"))

    def args(config: dict[str, Any], epochs: int = options.epochs,
             batches: Optional[int] = None) -> list[str]:
        limit = ["--trainer.limit_train_batches", str(batches), "--trainer.limit_val_batches",
                 str(batches)] if batches else []
        return ["--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy",
                "ddp", "--trainer.max_epochs", str(epochs), "--trainer.default_root_dir", cwd,
                "--data.batch_size", str(config["batch_size"]), *limit]
    grid = [{"num_workers": 0, "batch_size": b} for b in (32, 64, 128)]
    own = {"num_workers": 0, "batch_size": 32}
    # no epoch at all fails (its test step loads the best checkpoint): one batch instead
    return Script(path, 2, args, own, grid, args(own, epochs=1, batches=1), cwd=cwd,
                  fixed=(("num_workers", 0),))


def kubeflow_mnist(options: argparse.Namespace) -> Script:
    """kubeflow's examples/pytorch/mnist/mnist.py (2 gloo ranks): FashionMNIST from ../data,
    here --fashion-mnist (a folder holding FashionMNIST/raw)."""
    path, data = need("kubeflow_mnist", options, "kubeflow_script", "fashion_mnist")
    root = tempfile.mkdtemp(prefix="kubeflow-")
    os.symlink(data, os.path.join(root, "data"))
    os.makedirs(os.path.join(root, "src"))
    # both ranks open a SummaryWriter on --dir, and the one that finds it made by the other
    # between its check and its mkdir fails (FileExistsError): made here, as any run but a
    # machine's first finds it
    os.makedirs(os.path.join(root, "logs"))

    def args(config: dict[str, Any], epochs: int = options.epochs) -> list[str]:
        return ["--backend", "gloo", "--epochs", str(epochs), "--batch-size",
                str(config["batch_size"]), "--dir", os.path.join(root, "logs")]
    grid = [{"num_workers": 0, "batch_size": b} for b in (32, 64, 128)]
    own = {"num_workers": 0, "batch_size": 64}
    return Script(path, 2, args, own, grid, args(own, epochs=0), cwd=os.path.join(root, "src"),
                  fixed=(("num_workers", 0),))


def accelerate(options: argparse.Namespace) -> Script:
    """accelerate's examples/cv_example.py (2 gloo ranks, bf16 on the CPU): 3 epochs, batch 64
    and 4 workers, both written in the script; --pets holds <label>_<n>.jpg, --hf-cache a hub
    cache with timm/resnet50d.ra2_in1k (it loads pretrained weights, offline here). No launch
    trains no epoch: each rank gets whole batches of 64, however few the files."""
    path, pets, cache = need("accelerate", options, "accelerate_script", "pets",
                             "hf_cache")
    own = {"num_workers": 4, "batch_size": 64}
    env = (("OMP_NUM_THREADS", "1"), ("HF_HUB_OFFLINE", "1"), ("HF_HUB_CACHE", cache))
    grid = [{"num_workers": w, "batch_size": b} for w in (0, 2, 4) for b in (64, 128)]
    return Script(path, 2, lambda _: ["--data_dir", pets, "--cpu", "--mixed_precision", "bf16"],
                  own, grid, None, env=env, launch_timeout_s=600.0,  # a launch: 107-130 s
                  edited=edit_copies(path, tempfile.mkdtemp(prefix="accelerate-"), {
                      "num_workers": ("num_workers=4", "num_workers={}"),
                      "batch_size": ('"batch_size": 64', '"batch_size": {}')}))


def edit_copies(path: str, folder: str, edits: dict[str, tuple[str, str]]
                ) -> Callable[[dict[str, Any]], str]:
    """A configuration's copy of the script at ``path``, written once into ``folder``: each
    setting's text (``edits``: setting -> (as written, a format for the new value)) replaced
    wherever it stands. A text the source no longer holds stops the benchmark."""
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    missing = [old for old, _new in edits.values() if old not in source]
    if missing:
        raise SystemExit(f"{path}: no {missing[0]!r} to edit (the script changed)")

    def copy(config: dict[str, Any]) -> str:
        text = source
        for name, (old, new) in edits.items():
            text = text.replace(old, new.format(config[name]))
        label = "-".join(f"{name}{config[name]}" for name in edits)
        target = os.path.join(folder, f"{label}-{os.path.basename(path)}")
        if not os.path.exists(target):
            with open(target, "w", encoding="utf-8") as handle:
                handle.write(text)
        return target
    return copy


WORKLOADS: dict[str, Callable[[argparse.Namespace], Script]] = {
    "short_mlp": short_mlp, "timm": timm, "imagenet": imagenet, "lightning": lightning,
    "kubeflow_mnist": kubeflow_mnist, "accelerate": accelerate}


def command(script: Script, extra: list[str], config: Optional[dict[str, Any]] = None
            ) -> list[str]:
    """A plain launch: ``extra`` its arguments; ``config`` written into a copy of the script
    where its source holds the settings (``Script.edited``)."""
    path = script.edited(config) if script.edited and config else script.path
    if script.nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                str(script.nproc), path, *extra]
    return [sys.executable, path, *extra]


def launch_env(script: Script, cwd: str) -> tuple[dict[str, str], str]:
    """The environment a launch of ``script`` runs in, and where it starts."""
    return {**os.environ, **dict(script.env)}, script.cwd or cwd


def wall(argv: list[str], env: dict[str, str], cwd: str, loop: Optional[str] = None,
         timeout_s: float = 1800.0) -> tuple[Optional[float], Optional[float]]:
    """Seconds a plain launch took, whole process, and its training loop where it prints that
    (``loop``); (None, None) where it failed, or ran past ``timeout_s``: then its whole
    process group (the launcher, its ranks, their DataLoader workers) is killed and the grid
    goes on without it (accelerate's ``cv_example.py`` once hung, a worker of each rank
    blocked on a lock it inherited at fork)."""
    started = time.monotonic()
    child = subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True,
                             stdout=subprocess.PIPE if loop else subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        out, _ = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        print(f"a plain launch ran past {timeout_s:.0f} s and was killed: {' '.join(argv)}",
              file=sys.stderr, flush=True)
        return None, None
    if child.returncode != 0:
        return None, None
    found = re.search(loop, out) if loop else None
    return time.monotonic() - started, float(found.group(1)) if found else None


def plain(script: Script, extra: list[str], config: Optional[dict[str, Any]],
          env: dict[str, str], cwd: str, loop: Optional[str] = None
          ) -> tuple[Optional[float], Optional[float]]:
    """``wall`` of a plain launch of ``script`` with ``extra`` (``config``'s copy where its
    settings live in the source), under the script's bound for a launch that hung."""
    return wall(command(script, extra, config), env, cwd, loop, script.launch_timeout_s)


def key(config: dict[str, Any]) -> tuple:
    return (config.get("num_workers") or 0, config.get("batch_size"))


def settable(script: Script, config: dict[str, Any]) -> bool:
    """Whether a plain launch can run a configuration: what its command line cannot change left
    as the script has it."""
    return all(config.get(name) in (None, value) for name, value in script.fixed)


def plain_grid(script: Script, rounds: int, extra: list[dict[str, Any]], cwd: str
               ) -> tuple[dict[tuple, float], dict[tuple, float]]:
    """Each configuration's speed against the script's own settings, plain launches round
    robin: whole process less the median start-up, and by its training loop's own time
    where it prints it (else empty)."""
    env, cwd = launch_env(script, cwd)
    configs = {key(c): c for c in [*script.grid, *extra] if settable(script, c)}
    times: dict[tuple, list[float]] = {k: [] for k in configs}
    loops: dict[tuple, list[float]] = {k: [] for k in configs}
    idle: list[float] = []
    for _ in range(rounds):
        idle_wall = plain(script, script.idle, None, env, cwd)[0] if script.idle else None
        if idle_wall is not None:
            idle.append(idle_wall)
        for k, config in configs.items():
            seconds, loop = plain(script, script.args(config), config, env, cwd, script.loop)
            if seconds is not None:
                times[k].append(seconds)
            if loop is not None:
                loops[k].append(loop)
    start_up = statistics.median(idle) if idle else 0.0
    return (speeds({k: [t - start_up for t in v] for k, v in times.items()}, script),
            speeds(loops, script))


def speeds(seconds: dict[tuple, list[float]], script: Script) -> dict[tuple, float]:
    """Each configuration's speed: the script's own settings' median time over its own."""
    medians = {k: statistics.median(v) for k, v in seconds.items() if v}
    own = medians.get(key(script.own))
    return {k: own / v for k, v in medians.items() if own and v > 0}


def tool_run(script: Script, index: int, cwd: str, reuse: bool = False) -> dict[str, Any]:
    """One ``ddp-profile run`` under the default search: what it recommends and how sure.
    ``reuse``: read the run already in ``cwd`` (``--reuse``), launch nothing."""
    out = os.path.join(cwd, f"run-{index}")
    if reuse:
        return read_run(out, {"exit": 0, "reused": out})
    started = time.monotonic()
    argv = [*TOOL, "run", script.path, "--out", out, "--quiet", "--no-report",
            "--nproc-per-node", str(script.nproc), "--", *script.args(script.own)]
    env, where = launch_env(script, cwd)
    done = subprocess.run(argv, env=env, cwd=where,
                          capture_output=True, text=True, timeout=3600)
    result: dict[str, Any] = {"exit": done.returncode, "wall_s": round(time.monotonic()
                                                                       - started, 1)}
    if done.returncode != 0:
        return {**result, "error": done.stderr.strip().splitlines()[-1:]}
    return read_run(out, result)


def read_run(out: str, result: dict[str, Any]) -> dict[str, Any]:
    """A run directory's recommendation, its interval and its probes' statuses."""
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    probes = summary["probes"]
    return {**result, "recommended": summary["recommended"],
            "speedup": summary["expected_speedup"],
            "interval": summary.get("expected_speedup_interval"),
            "probes_ok": sum(p["status"] == "ok" for p in probes), "probes": len(probes),
            "unsettled": [(u["config"], u["ratio"]) for u in
                          (summary.get("recommendation") or {}).get("unsettled") or []]}


def score(run: dict[str, Any], grid: dict[tuple, float], script: Script, suffix: str = ""
          ) -> dict[str, Any]:
    """A run's recommendation against the grid's best, in the plain launches (``suffix``
    names the keys of a second grid)."""
    if not run.get("recommended") or not grid:
        return run
    if not settable(script, run["recommended"]):
        return {**run, f"plain_speed{suffix}": None,
                "note": "not settable on the script's command line"}
    mine = grid.get(key(run["recommended"]))
    best = max(grid.values())
    interval = run.get("interval")
    return {**run, f"plain_speed{suffix}": round(mine, 3) if mine else None,
            f"of_best{suffix}": round(mine / best, 3) if mine else None,
            f"inside{suffix}": bool(interval and mine and interval[0] <= mine <= interval[1])}


def paired_share(script: Script, mine: dict[str, Any], best: dict[str, Any], pairs: int,
                 cwd: str) -> Optional[float]:
    """The recommendation's speed as a share of the grid's best, by plain launches of the two
    alternated (the best, then the recommendation, ``pairs`` times), whole process less a
    launch that trains no epoch; the median of the pairs' ratios. A round robin over many
    configurations in few rounds ranks close ones by the machine's moment (timm's
    ``train.py``: a grid put batch 64 at 1 worker 11 % ahead of batch 32; 5 such pairs, 3 %)."""
    env, cwd = launch_env(script, cwd)
    start_up = (plain(script, script.idle, None, env, cwd)[0] or 0.0) if script.idle else 0.0
    ratios = []
    for _ in range(pairs):
        theirs = plain(script, script.args(best), best, env, cwd)[0]
        ours = plain(script, script.args(mine), mine, env, cwd)[0]
        if theirs and ours and ours > start_up and theirs > start_up:
            ratios.append((theirs - start_up) / (ours - start_up))
    return round(statistics.median(ratios), 3) if ratios else None


def checked(runs: list[dict[str, Any]], script: Script, pairs: int, cwd: str,
            grid: dict[tuple, float], configs: list[dict[str, Any]], below: float = 0.95
            ) -> list[dict[str, Any]]:
    """Each run scored below ``below`` of the grid's best, checked against that best head to
    head (``paired_share``, once per recommendation): ``of_best_paired``."""
    best = {key(c): c for c in configs}.get(max(grid, key=grid.get)) if grid else None
    shares: dict[tuple, Optional[float]] = {}
    out = []
    for run in runs:
        if pairs and best and (run.get("of_best") or 1.0) < below:
            mine = key(run["recommended"])
            if mine not in shares:
                shares[mine] = paired_share(script, run["recommended"], best, pairs, cwd)
            run = {**run, "of_best_paired": shares[mine]}
        out.append(run)
    return out


def seen(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the runs recommended, then what they named as faster but not established: the
    configurations the plain grid launches beside its own."""
    return [*(r["recommended"] for r in runs if r.get("recommended")),
            *(config for r in runs for config, _ratio in r.get("unsettled") or [])]


def labelled(grid: dict[tuple, float]) -> dict[str, float]:
    """A grid's speeds by configuration label, for the printed report."""
    return {f"w={k[0]} bs={k[1]}": round(v, 3) for k, v in sorted(grid.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="short_mlp")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timm-script")
    parser.add_argument("--images", help="ImageFolder: train/, validation/ (timm), val/ (imagenet)")
    parser.add_argument("--imagenet-script", help="pytorch/examples imagenet/main.py")
    parser.add_argument("--lightning-script", help="backbone_image_classifier.py, in Lightning's "
                        "examples tree (MNIST/raw under examples/Datasets)")
    parser.add_argument("--kubeflow-script", help="kubeflow's examples/pytorch/mnist/mnist.py")
    parser.add_argument("--fashion-mnist", help="a folder holding FashionMNIST/raw (kubeflow)")
    parser.add_argument("--accelerate-script", help="accelerate's examples/cv_example.py")
    parser.add_argument("--pets", help="JPEGs named <label>_<n>.jpg (accelerate)")
    parser.add_argument("--hf-cache", help="hub cache with timm/resnet50d.ra2_in1k (accelerate)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--keep", help="keep each workload's run directories in DIR/<workload>")
    parser.add_argument("--reuse", action="store_true",
                        help="score the runs kept in --keep DIR again (a new grid), run none")
    parser.add_argument("--check-pairs", type=int, default=3,
                        help="a run below 0.95 of the grid's best: its recommendation and that "
                             "best alternated in this many pairs of plain launches (0: none)")
    options = parser.parse_args()
    if options.reuse and not options.keep:
        parser.error("--reuse reads the runs kept in --keep DIR: give --keep")
    report: dict[str, Any] = {}
    for name in options.workloads.split(","):
        script = WORKLOADS[name](options)
        with tempfile.TemporaryDirectory(prefix=f"real-{name}-") as scratch:
            cwd = os.path.join(os.path.abspath(options.keep), name) if options.keep else scratch
            os.makedirs(cwd, exist_ok=True)
            runs = [tool_run(script, index, cwd, options.reuse) for index in range(options.runs)]
            named = seen(runs)
            grid, loop_grid = plain_grid(script, options.rounds, named, cwd)
            scored = [score(score(run, grid, script), loop_grid, script, "_loop")
                      for run in runs]
            scored = checked(scored, script, options.check_pairs, cwd, grid,
                             [*script.grid, *named])
        report[name] = {"grid": labelled(grid), "runs": scored}
        if loop_grid:
            report[name]["loop_grid"] = labelled(loop_grid)
        _bench.finish("real_scripts", {name: report[name]})


if __name__ == "__main__":
    main()

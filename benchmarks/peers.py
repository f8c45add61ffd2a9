"""ddp-profile side by side with its peers: recommendation quality, diagnosis, overhead.

The same workloads for every tool (``benchmarks/workloads/peers_train.py``; each has one known
cause), each handed over as the tool needs it:

* **ddp-profile**: the unmodified script through its CLI (``python -m ddp_profile run``, with
  ``PYTHONPATH`` as the caller set it, so the checkout under test is measured);
* **loadtune**: ``benchmarks/workloads/peers_loadtune.py`` (``get_workload()`` over the same
  dataset, model and step; it builds its own DataLoader; one process), ``loadtune tune``;
* **traceml-ai**: the script with its two lines (``--traceml``) through ``traceml run``;
* **fournex**: the script with its SDK lines (``--fournex``: ``frx.init``, the DataLoader
  wrapped in ``frx.instrument_dataloader``, each step in ``frx.step_context``) under torchrun,
  every rank inside its own ``frx collect`` (fournex knows one process: under one ``frx
  collect`` the ranks would share one trace file); then ``frx analyze --json`` on each rank's
  bundle, the labels of both read;
* **datapath-doctor**: the script with its SDK lines (``--datapath-doctor``: the DataLoader
  wrapped in its ``DataLoaderProfiler``, ``record_compute_done()`` after each step; at the end
  the ranks' samples gathered and ``analyze_distributed`` run, as its README shows) under
  torchrun; the report rank 0 prints (``render_findings`` per rank, the rank-skew check) read.

The file-backed workloads read one file per sample (4,096 files of 128 KiB, written once
under the temporary directory and synced to disk): ``files_cold`` as a job whose data does not
fit in the page cache reads them (every file dropped from the page cache,
``posix_fadvise(DONTNEED)``, before every launch of every tool and of the head to head;
ddp-profile is told ``--cache cold``, as such a job's run decides by itself), ``files_warm``
as a job that reads them from the page cache (every file read once before every launch).

The SDK peers run 2 ranks under torchrun; the in-place workload (``threads``) keeps torch's
default thread count there (``OMP_NUM_THREADS`` = all CPUs), as its ranks have it in place.

Rows:

* ``recommendation``: on the loading and compute workloads, every tool's recommended
  configuration and a wide grid (``num_workers`` 0,1,2,4,8,16,32) measured **head to head**:
  fresh launches of the plain script, alternating order, each timing its own steps; the
  figure is a configuration's median throughput over the grid's best median. Then the
  grid's best and every choice again in new launches (``--final-reps``, alternating):
  ``vs_best_fresh`` is their ratio there, free of the winner's curse that lifts the grid's
  best on the launches that chose it. ddp-profile and loadtune at one rank (loadtune has no
  DDP), ddp-profile also at 2 ranks. Plus each tool's wall time to its answer.
* ``diagnosis``: the causes each tool names per workload, raw and scored
  (``benchmarks/_verdicts.py``: right / partial / wrong / nothing / n/a).
* ``overhead``: ddp-profile's in-process A/B and between-launch ratio, gpuprof's
  between-launch ratio (``benchmarks/overhead.py``'s functions), traceml-ai's between-launch
  ratio (its two lines and ``traceml run`` against plain torchrun, same workload).

A peer that is not installed is reported ``"not installed"``, never a failure; ``--tools``
runs only some tools' rows (the others are left out of the rows, the JSON keeps its shape).

    python benchmarks/peers.py --quick   # ~17 min on 2 cores
    python benchmarks/peers.py
    python benchmarks/peers.py --quick --tools fournex,datapath_doctor --skip-overhead  # ~2 min

The last line printed is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _bench  # noqa: E402
import _peer_tools as tools  # noqa: E402
import _verdicts  # noqa: E402

WIDE_GRID = (0, 1, 2, 4, 8, 16, 32)
PEERS = {"loadtune": "loadtune", "traceml": "traceml-ai", "fournex": "fournex",
         "datapath_doctor": "datapath-doctor", "gpuprof": "gpuprof"}
PINS = {"loadtune": "0.3.0", "traceml-ai": "0.5.0", "fournex": "0.3.1",
        "datapath-doctor": "0.2.1", "gpuprof": "0.7.1"}
TOOLS = ("ddp_profile", *PEERS)
WORKLOADS = {  # name -> script arguments, the known cause, whether its loading is tuned
    "latency_bound": {"args": ["--load-ms", "2"], "cause": "loading_wait", "tune": True},
    "cpu_bound": {"args": ["--cpu-ms", "1"], "cause": "loading_cpu", "tune": True},
    "compute_bound": {"args": ["--hidden", "1024", "--layers", "3", "--batch-size", "64"],
                      "cause": "compute", "tune": True},
    "threads": {"args": ["--hidden", "1024", "--layers", "3", "--batch-size", "128"],
                "cause": "threads", "tune": False, "in_place": True},
    "straggler": {"args": ["--hidden", "256", "--straggle-ms", "30"], "cause": "straggler",
                  "tune": False},
    "unsharded": {"args": ["--unsharded", "--hidden", "256"], "cause": "unsharded",
                  "tune": False},
    # a wide model on small batches: 4 x 2048 x 2048 weights, 67 MB of gradients all-reduced
    # every step, 8 samples per rank: the all-reduce backward cannot cover bounds the step
    "comm_bound": {"args": ["--features", "2048", "--hidden", "2048", "--layers", "4",
                            "--batch-size", "8", "--samples", "4096"], "cause": "comm",
                   "tune": False},
}
FILES_DIR = _bench.FILES_DIR
WORKLOADS.update({  # one file per sample, read in one page-cache state (see the docstring)
    "files_cold": {"args": ["--files", FILES_DIR, "--batch-size", "64"],
                   "cause": "loading_wait", "tune": True,
                   "cache": "cold", "ddp_profile_args": ["--cache", "cold"]},
    "files_warm": {"args": ["--files", FILES_DIR, "--batch-size", "64"],
                   "cause": "loading_cpu", "tune": True,
                   "cache": "warm"},
})


def set_cache(workload: dict) -> None:
    """Put a file-backed workload's files in its page-cache state before a launch."""
    _bench.set_cache(workload.get("cache"))


def versions() -> dict:
    """Installed version of every peer (``"not installed"`` where absent)."""
    out = {"ddp-profile": _bench.package_version("ddp-profile")}
    for dist in PEERS.values():
        out[dist] = _bench.package_version(dist) or "not installed"
    return out


def head_to_head(workload: dict, configs: dict[str, dict], nproc: int, reps: int,
                 steps: int) -> dict[str, list[float]]:
    """Throughputs of fresh plain launches of every configuration, alternating, ``reps`` each."""
    labels = list(configs)
    results: dict[str, list[float]] = {label: [] for label in labels}
    for rep in range(reps):
        for label in (labels if rep % 2 == 0 else labels[::-1]):
            set_cache(workload)
            value = tools.measure_config(workload["args"], configs[label], nproc, steps)
            if value:
                results[label].append(value)
    return results


def recommendation_row(name: str, workload: dict, nproc: int, opts: argparse.Namespace,
                       have: dict) -> dict:
    """Each tool's answer on one workload, then every answer and the grid head to head."""
    answers = {}
    if have["ddp_profile"]:
        set_cache(workload)
        answers["ddp_profile"] = tools.ddp_profile(workload, nproc, opts.steps, opts.warmup)
    if nproc == 1 and have["loadtune"]:
        set_cache(workload)
        answers["loadtune"] = tools.loadtune(workload, opts.steps, opts.warmup)
    configs = {f"workers={w}": {"num_workers": w} for w in WIDE_GRID}
    chosen = {}
    for tool, answer in answers.items():
        config = answer.get("recommended")
        if config is None:
            chosen[tool] = None
            continue
        label = tools.config_label(config, tools.default_batch(workload["args"]))
        configs.setdefault(label, config)
        chosen[tool] = label
    measured = head_to_head(workload, configs, nproc, opts.reps, opts.h2h_steps)
    row = {"workload": name, "ranks": nproc,
           **_verdicts.quality(measured, [f"workers={w}" for w in WIDE_GRID], chosen)}
    best = (row.get("grid_best") or {}).get("config")
    finalists = sorted({best, *(label for label in chosen.values() if label)} - {None})
    if best is not None and len(finalists) > 1 and opts.final_reps > 0:
        # the grid chose its best on the launches above; new launches judge the choices
        fresh = head_to_head(workload, {label: configs[label] for label in finalists}, nproc,
                             opts.final_reps, opts.h2h_steps)
        row["fresh"] = _verdicts.confirm(fresh, best, chosen)
        confirmed = row["fresh"].pop("tools")
    else:  # every tool chose the grid's best, or no tool chose: nothing to judge again
        confirmed = {tool: {"vs_best_fresh": 1.0 if label == best else None}
                     for tool, label in chosen.items() if label}
    for tool, cell in confirmed.items():
        row["tools"][tool].update(cell)
    for tool, answer in answers.items():
        cell = row["tools"].get(tool) or {}
        cell.update({"wall_s": answer.get("wall_s"), "status": answer.get("status"),
                     "expected_speedup": answer.get("expected_speedup")})
        row["tools"][tool] = cell
    row["answers"] = answers
    return row


SDK_RUNNERS = {"traceml": tools.traceml, "fournex": tools.fournex,
               "datapath_doctor": tools.datapath_doctor}


def diagnosis_row(name: str, workload: dict, opts: argparse.Namespace, have: dict,
                  known: dict) -> dict:
    """What every tool says about one workload (``known``: answers already in hand)."""
    cause = workload["cause"]
    cells = {}
    if have["ddp_profile"]:
        if not known.get("ddp_profile"):
            set_cache(workload)
        dp = known.get("ddp_profile") or tools.ddp_profile(workload, 2, opts.steps, opts.warmup)
        cells["ddp_profile"] = _verdicts.diagnosis_row("ddp_profile", dp.get("verdicts"), cause,
                                                       dp["status"])
    if have["loadtune"]:
        lt = known.get("loadtune")
        cells["loadtune"] = _verdicts.diagnosis_row(
            "loadtune", lt.get("verdicts") if lt else None, cause,
            lt["status"] if lt else "n/a")
    for tool, runner in SDK_RUNNERS.items():
        if have[tool]:
            set_cache(workload)
            answer = runner(workload, opts.diag_steps)
            cells[tool] = _verdicts.diagnosis_row(tool, answer.get("verdicts"), cause,
                                                  answer["status"])
            cells[tool]["wall_s"] = answer.get("wall_s")
            if answer.get("per_run"):
                cells[tool]["per_run"] = answer["per_run"]
    if have["gpuprof"]:
        cells["gpuprof"] = {"score": "n/a", "status": "n/a", "verdicts": [], "causes": [],
                            "why": tools.NOT_APPLICABLE["gpuprof"]}
    return {"workload": name, "cause": cause, "tools": cells}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workloads", default=None, help="comma list of " + ",".join(WORKLOADS))
    parser.add_argument("--steps", type=int, default=None, help="ddp-profile/loadtune steps")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--reps", type=int, default=None, help="head-to-head launches each")
    parser.add_argument("--h2h-steps", type=int, default=None)
    parser.add_argument("--final-reps", type=int, default=None,
                        help="new launches each of the grid's best and every tool's choice, "
                             "after the grid (0: none)")
    parser.add_argument("--diag-steps", type=int, default=None, help="steps of a peer's run")
    parser.add_argument("--two-rank-workloads", default=None,
                        help="workloads whose 2-rank recommendation is measured head to head")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--tools", default=None, help="comma list of the tools whose rows run: "
                        + ",".join(TOOLS) + " (default: all)")
    opts = parser.parse_args(argv)
    quick = opts.quick
    opts.workloads = (opts.workloads or ",".join(WORKLOADS)).split(",")
    opts.tools = (opts.tools or ",".join(TOOLS)).split(",")
    unknown = [name for name in [*opts.workloads, *opts.tools]
               if name not in WORKLOADS and name not in TOOLS]
    if unknown:
        parser.error(f"unknown workload or tool: {', '.join(unknown)}")
    opts.steps = opts.steps or (15 if quick else 30)
    opts.warmup = opts.warmup or (3 if quick else 5)
    opts.reps = opts.reps or (2 if quick else 4)
    opts.h2h_steps = opts.h2h_steps or (40 if quick else 100)
    opts.final_reps = opts.final_reps if opts.final_reps is not None else (3 if quick else 5)
    opts.diag_steps = opts.diag_steps or (60 if quick else 150)
    opts.two_rank = (opts.two_rank_workloads or ("latency_bound" if quick else
                                                 "latency_bound,cpu_bound,compute_bound")
                     ).split(",")
    return opts


def main(argv: list[str] | None = None) -> dict:
    opts = parse(argv)
    started = time.monotonic()
    have = {tool: tool in opts.tools and _bench.package_version(dist) is not None
            for tool, dist in PEERS.items()}
    have["ddp_profile"] = "ddp_profile" in opts.tools
    info = _bench.machine()
    if any(WORKLOADS[name].get("cache") for name in opts.workloads):
        _bench.ensure_files()
    recommendation, diagnosis = [], []
    for name in opts.workloads:
        workload = WORKLOADS[name]
        known = {}
        if workload["tune"] and (have["ddp_profile"] or have["loadtune"]):
            row = recommendation_row(name, workload, 1, opts, have)
            recommendation.append(row)
            known["loadtune"] = row["answers"].get("loadtune")
            _log(row)
            if name in opts.two_rank and have["ddp_profile"]:
                row2 = recommendation_row(name, workload, 2, opts, have)
                recommendation.append(row2)
                known["ddp_profile"] = row2["answers"]["ddp_profile"]
                _log(row2)
        diagnosis.append(diagnosis_row(name, workload, opts, have, known))
        _log(diagnosis[-1])
    overhead = None
    if not opts.skip_overhead and (have["ddp_profile"] or have["traceml"] or have["gpuprof"]):
        try:
            overhead = tools.overhead(opts.quick, have)
        except Exception as exc:  # noqa: BLE001 -- a failed row never takes the others down
            overhead = {"error": f"{type(exc).__name__}: {exc}"}
    result = {
        "benchmark": "peers", "mode": "quick" if opts.quick else "full",
        "versions": versions(), "pinned": PINS, "wide_grid": list(WIDE_GRID),
        "recommendation": [_short(r) for r in recommendation],
        "diagnosis": diagnosis,
        "diagnosis_tally": _verdicts.tally(diagnosis, sorted({t for r in diagnosis
                                                              for t in r["tools"]})),
        "overhead": overhead, "machine": info,
        "wall_s": round(time.monotonic() - started, 1),
        "settings": {k: getattr(opts, k) for k in (
            "steps", "warmup", "reps", "h2h_steps", "final_reps", "diag_steps", "two_rank",
            "tools")},
    }
    _bench.finish("peers", result, argv)
    return result


def _short(row: dict) -> dict:
    """A recommendation row without the tools' raw answers' bulk (their verdicts stay)."""
    answers = {tool: {k: v for k, v in answer.items() if k not in ("raw",)}
               for tool, answer in row.get("answers", {}).items()}
    return {**row, "answers": answers}


def _log(row: dict) -> None:
    print(json.dumps(_short(row) if "answers" in row else row), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

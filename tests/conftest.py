"""Shared fixtures: the real CLI in a subprocess, and checks that nothing leaks from a test."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Optional

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "ddp_profile", "examples", "demo_train.py")
SCRIPTS = os.path.join(REPO, "tests", "scripts")
# Where a test is about the tool's mechanics rather than ranks, one rank: a rank's start-up
# (importing torch and what DDP imports, about 3 CPU-s) is most of a short launch's CPU, and
# the suite is CPU-bound. With one intra-op thread: ranks that do not share the CPUs by
# torchrun's OMP_NUM_THREADS=1 (one rank a node, ranks started in place) keep torch's default
# threads, and the tool measures a threads counterfactual in a launch of its own (tested in
# test_diagnosis).
ONE_RANK = ["--nproc-per-node", "1"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


# The tests that assert no measured rate (pure functions over tables, records and launch
# mechanics, failures, resuming, rendering, every probe of a run ok), and the few whose rates
# hold with room to spare beside another test (the last entries): `make test` runs these two at
# a time (marker ``concurrent``), then every other test alone, so that no other measurement a
# test asserts on shares the CPUs with another test. Decided here alone.
CONCURRENT = (
    "tests/test_layout.py", "tests/test_docs.py", "tests/benchmarks/", "tests/commands/",
    "tests/rules/",
    "tests/reports/", "tests/profiler/test_cache.py", "tests/profiler/store/",
    "tests/profiler/sweep/", "tests/profiler/decide/", "tests/profiler/test_settings.py",
    "tests/profiler/telemetry/test_nvml.py", "tests/test_suite_checks.py",
    "tests/e2e/test_launchers.py", "tests/e2e/test_contract", "tests/e2e/test_report_real.py",
    "tests/e2e/test_cache.py",
    *(f"tests/e2e/test_probe.py::test_{name}" for name in (
        "batch_sampler_script_honours_batch_size", "prefetch_without_workers_is_not_applied",
        "script_without_optimizer", "validation_loader_is_not", "script_arguments",
        "missing_script", "syntax_error", "script_that_raises", "script_that_never_builds",
        "invalid_cli_values", "corrupt_run_directory", "importing_the_package")),
    *(f"tests/e2e/test_sweep.py::test_{name}" for name in (
        "a_hang_and_a_killed_worker", "oom_at_a_batch_size", "a_hangup_is_ignored",
        "ctrl_c_stops_cleanly", "repeat_launches_exactly",
        "a_screen_records_a_crashed_window")),
    # (not the short script's windows: its ladder must not end at 1 worker, a rate; beside
    # another test 1 worker read 234 samples/s against the script's 372, and the ladder
    # rightly ended there, before the windows the test reads)
    *(f"tests/e2e/test_loading.py::test_{name}" for name in (
        "bad_loading_is_recorded", "a_transform_that_raises")),
    *(f"tests/e2e/test_diagnosis.py::test_{name}" for name in (
        "process_group_without_ddp", "ddp_script_gets_neither", "batch_sampler_that",
        "script_that_ends_early",
        # its finding's figure is read against its own alternation's windows
        "in_place_ranks_with_default_threads")),
    "tests/e2e/test_findings.py::test_ranks_that_each_read_the_whole_dataset",
    # counts of forwards and synchronisations per optimizer step, no rate
    "tests/e2e/test_comm.py::test_accumulation_without_no_sync_is_found",
    # the paired gate alternates its sides launch by launch: a neighbour moves both alike
    "tests/e2e/test_gate_paired.py",
    # rates asserted with room to spare beside the busiest neighbour (the threads test): the
    # stored-baseline gate's step is one known sleep (the same workload read 1.001 [1.000-
    # 1.002], the slowed one 0.870). (Not the io-bound sweep: beside another test its gloo
    # all-reduce cost 10 % of a step, and its no-communication-finding assertion failed.)
    "tests/e2e/test_gate.py",
)
# ... except these, under a prefix above, which assert measured rates: the plain contract
# shape asserts that workers win and that persistent_workers=True is faster beyond noise; the
# screen's split, that the ceiling's replayed batches hardly wait (beside another test, its
# steps once waited 0.52x their compute)
ALONE = ("tests/e2e/test_contract.py::test_a_switch_mid_epoch_keeps_each_epoch_at_its_length"
         "[plain]",
         "tests/profiler/sweep/test_screen.py::test_each_window_runs_its_own_worker_pool")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list) -> None:
    for item in items:
        if item.nodeid.startswith(CONCURRENT) and not item.nodeid.startswith(ALONE):
            item.add_marker(pytest.mark.concurrent)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the order the controller hands units out in
        items.sort(key=lambda item: _order(item.nodeid))  # stable within each class


# The concurrent pass's schedule (``make test``: ``-n 2``): a unit of work is a test file, or
# a single test where the file launches the script and shares no fixture beyond a test; units
# are handed to the two workers one at a time, the longest first: the files whose tests share
# a module's fixture (a gate, a cached run, a report), then every other launching test, then
# the tests that launch nothing. The last units are then short, and neither worker waits long
# for the other at the end (by file, in the plugin's order: one worker ran 377 s of tests, the
# other 328 s, and the pass took 387 s).
LAUNCHING = "tests/e2e/"


@functools.lru_cache(maxsize=None)
def _shares_fixtures(path: str) -> bool:
    """Whether the test file defines a fixture its tests share (module or session scope)."""
    with open(os.path.join(REPO, path), encoding="utf-8") as handle:
        text = handle.read()
    return 'scope="module"' in text or 'scope="session"' in text


def _unit(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return nodeid if path.startswith(LAUNCHING) and not _shares_fixtures(path) else path


def _order(nodeid: str) -> int:
    if not nodeid.startswith(LAUNCHING):
        return 2
    return 1 if _unit(nodeid) == nodeid else 0


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # the suite runs without pytest-xdist too, one test at a time
    LoadScopeScheduling = None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if LoadScopeScheduling is None:
        return None

    class LongestFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False  # the workers' order (``_order``), not by size
    return LongestFirst(config, log)


TEST_ID_VAR = "DDP_PROFILE_TEST_ID"
_current_test_id: list[str] = [""]


def probe_processes(test_id: Optional[str] = None) -> list[int]:
    """Live probe processes (they carry DDP_PROFILE_PROBE_TAG) started by the given test."""
    needle = f"{TEST_ID_VAR}={test_id or _current_test_id[0]}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
            if needle in environ and any(v.startswith(b"DDP_PROFILE_PROBE_TAG=") for v in environ):
                found.append(int(name))
        except OSError:
            continue
    return found


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Each test's id (``nothing_leaks``), set before any of its fixtures: a module's fixture
    that launches runs (set up within its first test's setup) runs them under that test's id,
    and that test's check covers them (set by the function's own fixture, they ran under the
    previous test's id, which no later check reads)."""
    _current_test_id[0] = uuid.uuid4().hex


@pytest.fixture(autouse=True)
def nothing_leaks():
    """No probe process, sampler thread or torch patch survives a test.

    Processes are told apart by a per-test id in the environment of the ``ddp-profile``
    subprocesses a test starts (``pytest_runtest_setup``), so other jobs on the machine do not
    count.
    """
    yield
    from ddp_profile.profiler.rank import patches

    assert not patches.is_applied(), "torch is still patched after the test"
    threads = [t.name for t in threading.enumerate() if t.name.startswith("ddp-profile")]
    assert not threads, f"threads left running: {threads}"
    leftover = probe_processes()
    assert not leftover, f"probe processes left running: {leftover}"


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    out: Optional[str]

    @property
    def progress(self) -> str:
        """The progress output (stderr) as one line: its wrapping at the console's width
        undone."""
        return " ".join(self.stderr.split())

    def summary(self) -> dict:
        with open(os.path.join(self.out, "summary.json"), encoding="utf-8") as handle:
            summary = json.load(handle)
        assert_no_ceiling_below_a_loading_rate(summary)
        assert_findings_agree_with_probes(summary)
        return summary

    def ledger(self) -> list[dict]:
        """The ledger's probes, corrections folded in, as every reader sees them."""
        from ddp_profile.profiler.store.results import read_ledger

        return read_ledger(self.out)[0]


PROBE_ID = re.compile(r"\bp\d{3}\b")


SHARES = ("data_wait_fraction", "gpu_idle_fraction", "gpu_starved_fraction", "comm_fraction")


def claim_groups(summary: dict) -> tuple[list, list, list]:
    """A run's paired alternations, in order: the claim's check; the same two again a launch
    each, where the check's windows left its gain open (none or one); every other (the
    contender's)."""
    groups: dict[str, list] = {}
    for probe in summary["probes"]:
        if probe["kind"] == "paired":
            groups.setdefault(probe["pair"]["group"], []).append(probe)
    first, *rest = groups.values()

    def sides(group: list) -> list:
        return [next(p["config"] for p in group if p["pair"]["role"] == role)
                for role in ("reference", "candidate")]
    again = [g for g in rest if sides(g) == sides(first)]
    return first, again, [g for g in rest if g not in again]


def assert_findings_agree_with_probes(summary: dict) -> None:
    """Every run of the suite: what its findings and its recommendation say agrees with the
    probes they stand on. Every probe they cite exists; the recommended probe ran ok with the
    recommended settings, the baseline's too; the expected speedup lies in its interval; each
    configuration named as measured faster but not established did measure faster, ran ok, and
    is not the recommendation; every share of a step a probe reports lies in [0, 1]."""
    probes = {p["id"]: p for p in summary.get("probes") or []}
    for probe in probes.values():
        for key in SHARES:
            value = probe.get(key)
            assert value is None or value != value or 0.0 <= value <= 1.0 + 1e-9, \
                (probe["id"], key, value)  # None or NaN: not measured
    rec = summary.get("recommendation") or {}
    texts = [text for f in summary.get("findings") or []
             for text in (f.get("evidence"), f.get("recommendation")) if text]
    texts += [*(rec.get("notes") or []), rec.get("speedup_basis") or ""]
    texts += [item.get("why") or "" for item in rec.get("unsettled") or []]
    cited = {found for text in texts
             for found in PROBE_ID.findall(text if isinstance(text, str) else json.dumps(text))}
    assert cited <= set(probes), (sorted(cited - set(probes)), texts)
    chosen = summary.get("recommended_probe")
    if chosen is not None:
        probe = probes[chosen]
        assert probe["status"] == "ok", probe
        recommended = summary.get("recommended") or {}
        ran = probe.get("config") or {}
        assert all(ran.get(k) == v for k, v in recommended.items()
                   if v is not None and ran.get(k) is not None), (recommended, ran)
        speedup = summary.get("expected_speedup")
        interval = summary.get("expected_speedup_interval")
        if speedup is not None and interval:
            assert interval[0] <= speedup <= interval[1], (speedup, interval)
    base = rec.get("baseline_probe_id")
    if base is not None:
        assert probes[base]["status"] == "ok", probes[base]
    for item in rec.get("unsettled") or []:
        assert probes[item["probe"]]["status"] == "ok" and item["ratio"] > 1.0, item
        assert item["probe"] != chosen, item
    for finding in summary.get("findings") or []:
        if finding.get("rule") == "thread-oversubscription":
            _threads_figure_agrees(finding.get("evidence") or "", probes)


ALTERNATED_THREADS = re.compile(r"ran (\d+\.\d+)x \[(\d+\.\d+)-(\d+\.\d+)\] .*\(probes "
                                r"(p\d{3})-(p\d{3})\)")
SINGLE_THREADS = re.compile(r"ran ([\d,.]+) samples/s \(probe (p\d{3})\) against ([\d,.]+) "
                            r"\(\w+ (p\d{3})\), (\d+\.\d+)x")


def _threads_figure_agrees(evidence: str, probes: dict) -> None:
    """A measured thread-oversubscription figure is its probes': from an alternation, inside
    its interval and between its slowest B over its fastest A and the reverse; from one
    counterfactual, the two cited rates and their ratio."""
    alternated, single = ALTERNATED_THREADS.search(evidence), SINGLE_THREADS.search(evidence)
    if alternated is not None:
        ratio, low, high = (float(x) for x in alternated.groups()[:3])
        assert low <= ratio <= high, evidence
        ids = sorted(probes)
        group = [probes[i] for i in ids[ids.index(alternated[4]):ids.index(alternated[5]) + 1]]
        sides = [[p["throughput"] for p in group if p["kind"] == "threads"
                  and (p.get("pair") or {}).get("role") == role]
                 for role in ("reference", "candidate")]
        assert all(sides), (evidence, group)
        assert min(sides[1]) / max(sides[0]) * 0.99 <= ratio \
            <= max(sides[1]) / min(sides[0]) * 1.01, (evidence, sides)
    elif single is not None:
        fast, fast_id, slow, slow_id, ratio = single.groups()
        rates = [float(x.replace(",", "")) for x in (fast, slow)]
        assert [round(probes[i]["throughput"], 1) for i in (fast_id, slow_id)] == rates, evidence
        assert abs(rates[0] / rates[1] - float(ratio)) < 0.006, evidence


def assert_no_ceiling_below_a_loading_rate(summary: dict) -> None:
    """Every run of the suite: a compute-only ceiling replays batches without loading, so it
    is never below a rate measured with loading at its batch size."""
    ceiling = summary.get("ceiling_throughput")
    probe = next((p for p in summary.get("probes") or []
                  if p.get("id") == summary.get("ceiling_probe")), None)
    if not ceiling or probe is None:
        return
    batch = (probe.get("config") or {}).get("batch_size")
    rates = [p["throughput"] for p in summary["probes"] if p.get("status") == "ok"
             and p.get("kind") in ("baseline", "sweep", "repeat") and p.get("throughput")
             and (p.get("config") or {}).get("batch_size") == batch]
    assert not rates or ceiling >= max(rates), (ceiling, rates)


def run_cli(args: list[str], out: Optional[str] = None, timeout: float = 240,
            env: Optional[dict] = None) -> CliResult:
    """Run the real ``ddp-profile`` command in a subprocess."""
    full = [sys.executable, "-m", "ddp_profile", *args]
    merged = dict(os.environ, **(env or {}))
    merged[TEST_ID_VAR] = _current_test_id[0]
    proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout, env=merged,
                          cwd=out and os.path.dirname(out) or None)
    return CliResult(proc.returncode, proc.stdout, proc.stderr, out)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def run_dir(tmp_path):
    return str(tmp_path / "run")

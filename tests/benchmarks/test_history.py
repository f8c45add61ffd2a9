"""The benchmarks' record of each run and the history rendered from it: ``_bench.finish``
appends a line a run, and ``benchmarks/history.py`` (the real script, in a subprocess) turns
the lines into one Markdown table per benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
sys.path.insert(0, BENCHMARKS)

import _bench  # noqa: E402
import history  # noqa: E402


def test_finish_prints_the_json_and_appends_one_record_a_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DDP_PROFILE_BENCH_RESULTS", str(tmp_path))
    for ratio in (1.004, 1.008):
        _bench.finish("overhead", {"ratio": ratio, "per_rep": [1.0, 1.01]}, ["--reps", "2"])
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1]) == {"ratio": 1.008, "per_rep": [1.0, 1.01]}
    lines = (tmp_path / "overhead.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["figures"]["ratio"] for r in records] == [1.004, 1.008]
    first = records[0]
    assert set(first) == {"date", "commit", "machine", "benchmark", "args", "figures"}
    assert first["benchmark"] == "overhead" and first["args"] == ["--reps", "2"]
    assert first["machine"]["nproc"] == len(os.sched_getaffinity(0))
    assert first["date"].endswith("Z") and first["commit"]  # this checkout's commit

    monkeypatch.setenv("DDP_PROFILE_BENCH_RESULTS", "off")
    _bench.finish("overhead", {"ratio": 1.0})
    assert len((tmp_path / "overhead.jsonl").read_text().splitlines()) == 2


def test_history_renders_a_table_per_benchmark_from_the_jsonl(tmp_path, monkeypatch):
    monkeypatch.setenv("DDP_PROFILE_BENCH_RESULTS", str(tmp_path))
    _bench.finish("accuracy", {"max_abs_error_pp": {"ddp_profile": 0.58, "gpuprof": 0.74}})
    with open(tmp_path / "accuracy.jsonl", "a", encoding="utf-8") as handle:  # one from prose
        handle.write(json.dumps({"date": None, "benchmark": "accuracy", "figures": "within "
                                 "0.6 pp | gpuprof 0.7 pp " + "x" * 500, "note": "old"}) + "\n")
    _bench.finish("gate_power", {"false_alarm": 0.002})
    out = tmp_path / "history.md"
    done = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "history.py"),
                           "--results", str(tmp_path), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "## accuracy" in text and "## gate_power" in text
    accuracy = text.split("## accuracy", 1)[1].split("## gate_power", 1)[0]
    rows = [line for line in accuracy.splitlines() if line.startswith("| ")]
    assert rows[0] == "| " + " | ".join(history.COLUMNS) + " |"
    assert len(rows) == 3  # the head and two runs, the undated one first
    assert "within 0.6 pp \\| gpuprof" in rows[1]  # a | in the text does not split the cell
    assert "(the rest: accuracy.jsonl line 2)" in rows[1] and len(rows[1]) < 700
    assert "max_abs_error_pp.ddp_profile=0.58" in rows[2]
    assert "false_alarm=0.002" in text

    only = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "history.py"),
                           "--results", str(tmp_path), "gate_power"],
                          capture_output=True, text=True, timeout=60)
    assert only.returncode == 0 and "## gate_power" in only.stdout
    assert "## accuracy" not in only.stdout
    missing = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "history.py"),
                              "--results", str(tmp_path), "nothing"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "no results for nothing" in missing.stderr


@pytest.mark.parametrize("name", sorted(
    f[:-len(".jsonl")] for f in os.listdir(os.path.join(BENCHMARKS, "results"))
    if f.endswith(".jsonl")))
def test_every_stored_record_reads_back(name):
    records = history.read_records(os.path.join(BENCHMARKS, "results"), [name])[name]
    assert records and all(r["benchmark"] == name and "figures" in r for r in records)

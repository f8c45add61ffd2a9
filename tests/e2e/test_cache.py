"""The page cache, made like for like on real files: CPU ranks read one file per sample,
written by the test and dropped from the page cache before each run, as after a reboot. The
cold regime runs 2 ranks (each rank's producers are read cold); the warm one, whose subject is
the regime and not the ranks, one (a rank's start-up is most of a short launch's CPU). Both
search nothing: ``--num-workers 1`` is the script's own setting, so every launch is of one
configuration and reads the same first files of the epoch (a sweep's probe read out of the
warm regime and measured again: tests/profiler/sweep/test_regime.py)."""

from __future__ import annotations

import os

import pytest

from ddp_profile.profiler.cache import WARM_STORAGE_SHARE
from ddp_profile.profiler.drop_pages import drop
from tests.conftest import ONE_RANK, ONE_THREAD, SCRIPTS

pytestmark = pytest.mark.e2e
SCRIPT = os.path.join(SCRIPTS, "files_train.py")
LEAN = ["--num-workers", "1", "--steps", "20", "--warmup", "2", "--no-ceiling", "--no-comm",
        "--pairs", "0", "--no-report", "--quiet"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> str:
    """1,200 files of 48 KB (58 MB), on disk, none of them in the page cache."""
    root = tmp_path_factory.mktemp("files")
    for index in range(1200):
        path = root / f"{index:05d}.bin"
        with open(path, "wb") as handle:
            handle.write(os.urandom(48 * 1024))
            handle.flush()
            os.fsync(handle.fileno())
    return str(root)


def _cold(root: str) -> None:
    for name in os.listdir(root):
        drop(os.path.join(root, name))


def _shares(summary: dict) -> dict[str, float]:
    return {p["id"]: (p.get("loading") or {}).get("storage_share") for p in summary["probes"]
            if p["status"] == "ok"}


def test_data_that_fits_in_memory_is_measured_warm_the_cold_baseline_again(cli, run_dir, files):
    _cold(files)
    result = cli(["run", SCRIPT, "--out", run_dir, *LEAN, *ONE_RANK], out=run_dir,
                 env={"DATA": files, **ONE_THREAD})  # the regime is the subject, not the ranks
    assert result.returncode == 0, result.stderr
    summary = result.summary()
    cache = summary["search"]["cache"]
    assert cache["requested"] == "auto" and cache["mode"] == "warm", cache
    assert 50e6 < cache["epoch_bytes"] < 65e6  # 1,200 x 48 KB, from the bytes read per sample
    first, *rest = summary["probes"]
    shares = _shares(summary)
    # the first launch read from storage: kept apart (kind "cache"), measured again warm
    assert first["kind"] == "cache" and shares[first["id"]] > 0.9, shares
    warm = next(p for p in rest if p["kind"] != "cache")
    assert warm["kind"] == "baseline" and summary["baseline"]["num_workers"] == 1, shares
    # every probe compared is in the regime (one that read out of it, as a launch that read a
    # few files further than the first can, is kept apart as kind "cache" and measured again)
    compared = [p for p in rest if p["status"] == "ok" and p["kind"] != "cache"]
    assert compared and all(shares[p["id"]] <= WARM_STORAGE_SHARE for p in compared), shares
    assert all(shares[p["id"]] > WARM_STORAGE_SHARE for p in rest if p["kind"] == "cache"), \
        shares
    assert cache["warmed"] and cache["warmed"][0]["files"] > 100
    assert summary["recommended_probe"] != first["id"]


def test_cold_reads_every_file_from_storage_in_every_probe(cli, run_dir, files):
    # the script's settings launched twice (--repeat 2): both read the same first files of the
    # epoch, and without the regime the second would read them from the page cache
    _cold(files)
    result = cli(["run", SCRIPT, "--out", run_dir, "--cache", "cold", "--repeat", "2", *LEAN],
                 out=run_dir, env={"DATA": files})
    assert result.returncode == 0, result.stderr
    summary = result.summary()
    assert summary["search"]["cache"]["mode"] == "cold"
    shares = _shares(summary)
    assert summary["probes"][0]["kind"] == "baseline" and len(shares) >= 2, summary["probes"]
    assert summary["probes"][1]["kind"] == "repeat", summary["probes"]
    assert all(share > 0.9 for share in shares.values()), shares
    by_rank = [p["loading"]["storage_share_by_rank"] for p in summary["probes"]
               if p["status"] == "ok"]  # each rank's producers, alike: no rank read warm
    assert all(set(b) == {"0", "1"} and min(b.values()) > 0.9 for b in by_rank), by_rank


def test_an_invalid_cache_mode_is_a_usage_error(cli, run_dir):
    result = cli(["run", SCRIPT, "--out", run_dir, "--cache", "tepid"], out=run_dir)
    assert result.returncode == 2
    assert "--cache" in result.stderr and "tepid" in result.stderr

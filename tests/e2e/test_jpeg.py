"""Real JPEG files decoded with Pillow in the script's own loader, 2 CPU ranks: the loading's
CPU goes to decoding images read from files, and the advice says so (decode on the GPU,
preprocess offline), with what the producers read per sample."""

from __future__ import annotations

import os
import random

import pytest
from PIL import Image, ImageDraw  # a test dependency (pyproject's test extra)

from tests.conftest import SCRIPTS

pytestmark = pytest.mark.e2e
SCRIPT = os.path.join(SCRIPTS, "jpeg_train.py")


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> str:
    """300 JPEG photos-alike of 384 x 384 (noise and shapes, ~80 KB each)."""
    root = tmp_path_factory.mktemp("jpegs")
    rng = random.Random(0)
    for index in range(300):
        image = Image.effect_noise((384, 384), 40).convert("RGB")
        draw = ImageDraw.Draw(image)
        for _ in range(8):
            x, y = rng.randrange(384), rng.randrange(384)
            draw.ellipse((x, y, x + 80, y + 60), fill=tuple(rng.randrange(256) for _ in "rgb"))
        image.save(root / f"{index:04d}.jpg", quality=90)
    return str(root)


def test_decoding_jpegs_is_cpu_bound_loading_and_the_advice_is_about_decoding(cli, run_dir,
                                                                             jpegs):
    result = cli(["run", SCRIPT, "--out", run_dir, "--num-workers", "0,1", "--steps", "16",
                  "--warmup", "2", "--no-ceiling", "--no-comm", "--pairs", "0", "--no-report",
                  "--quiet"],
                 out=run_dir, env={"DATA": jpegs})
    assert result.returncode == 0, result.stderr
    summary = result.summary()
    base = next(p for p in summary["probes"] if p["kind"] == "baseline")
    files = [os.path.join(jpegs, name) for name in os.listdir(jpegs)]
    mean_size = sum(os.path.getsize(f) for f in files) / len(files)
    read = base["loading"]["read_per_sample_bytes"]  # each sample opens and reads its file
    assert 0.9 * mean_size <= read <= 1.6 * mean_size, (read, mean_size)
    findings = {f["rule"]: f for f in summary["findings"]}
    assert "data-loader-bound" in findings, list(findings)
    cpu = findings.get("cpu-bound-preprocessing")
    assert cpu is not None, list(findings)
    assert "decode_jpeg" in cpu["recommendation"] and "offline" in cpu["recommendation"]
    assert f"read {read / 1024:,.0f} KiB per sample" in cpu["evidence"], cpu["evidence"]
    assert "io-bound-loading" not in findings

"""Sweeps on Hydra's launcher plugins: a local Ray cluster (hydra-ray-launcher) and joblib
processes run etbuild's jobs on one shared cache; the sweep results and the exit status do
not depend on which launcher ran the jobs."""

from __future__ import annotations

import csv
import io
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from etbuild_test_support import run_cli

pytestmark = pytest.mark.e2e

# The cacheable prefix only: the launchers are under test, not the C++ build.
FOUR_JOBS = ["model=mlp", "+quant=none,ptq", "memory.alignment=16,64", "pipeline.stop_after=reference"]


def _sweep(args: list[str], sweep: Path, cache: Path) -> tuple[int, str, list[dict]]:
    proc = run_cli(
        ["-m", *args, f"hydra.sweep.dir={sweep}", f"build.cache_dir={cache}"],
        sweep.parent,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    rows = []
    if (sweep / "sweep.csv").exists():
        rows = list(csv.DictReader(io.StringIO((sweep / "sweep.csv").read_text())))
    return proc.returncode, out, rows


def _cache_hit(run_dir: str) -> bool:
    return json.loads((Path(run_dir) / "manifest.json").read_text())["stage_cache"]["hit"]


@pytest.fixture(autouse=True)
def _ray_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Ray's session files (sockets, logs) in a folder of their own, not /tmp/ray; a short
    # path, since a socket's path may not exceed 107 bytes.
    folder = tempfile.mkdtemp(prefix="etb-ray-", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", folder)
    yield
    shutil.rmtree(folder, ignore_errors=True)


def test_ray_sweep_shares_the_cache_and_reports_failures(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    code, out, rows = _sweep(["hydra/launcher=ray", *FOUR_JOBS], tmp_path / "first", cache)
    assert code == 0, out
    assert [r["status"] for r in rows] == ["ok"] * 4, out
    assert not any(_cache_hit(r["run_dir"]) for r in rows)
    # again, on the same cache: every job restores its stages
    code, out, rows = _sweep(["hydra/launcher=ray", *FOUR_JOBS], tmp_path / "again", cache)
    assert code == 0, out
    assert all(_cache_hit(r["run_dir"]) for r in rows), out
    # a job that fails (its banks are too small) fails the multirun and is listed with its error
    code, out, rows = _sweep(
        ["hydra/launcher=ray", "model=mlp", "memory.banks.0.size_bytes=1024,null",
         "pipeline.stop_after=plan"],
        tmp_path / "failing",
        cache,
    )  # fmt: skip
    assert code == 1, out
    assert [r["status"] for r in rows] == ["failed", "ok"]
    sweep_md = (tmp_path / "failing" / "sweep.md").read_text()
    assert "the memory plan does not fit the banks (sram=1024 bytes)" in sweep_md


def test_joblib_sweep(tmp_path: Path) -> None:
    code, out, rows = _sweep(
        ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "model=mlp", "+quant=none,ptq",
         "pipeline.stop_after=plan"],
        tmp_path / "sweep",
        tmp_path / "cache",
    )  # fmt: skip
    assert code == 0, out
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert "Joblib.Parallel(n_jobs=2" in out  # the plugin ran the jobs, not the basic launcher

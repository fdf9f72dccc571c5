"""A multirun's results (pipeline/sweep.py, the hydra.callbacks entry of conf/config.yaml):
sweep.md, sweep.csv and pareto.png in the sweep directory, failed jobs listed with their
errors, and the command's exit status."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from etbuild_test_support import run_cli

pytestmark = pytest.mark.e2e


def test_sweep_writes_results_and_fails_on_a_failed_job(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    # memory.alignment=24 passes composition but fails etbuild's checks before any stage
    args = ["-m", "model=mlp", "+quant=none,ptq", "memory.alignment=16,24", "build.wheel=false"]
    proc = run_cli([*args, f"hydra.sweep.dir={sweep}"], tmp_path, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out, out
    assert f"etbuild: sweep: 4 jobs, 2 ok, 2 failed -> {sweep / 'sweep.md'}" in proc.stdout
    assert "etbuild: 2 sweep job(s) failed:" in proc.stderr

    rows = list(csv.DictReader(io.StringIO((sweep / "sweep.csv").read_text())))
    assert [r["job"] for r in rows] == ["0", "1", "2", "3"]
    # (Hydra's basic sweeper writes each job's overrides back from their parsed values)
    by_overrides = {r["overrides"]: r for r in rows}
    fp32 = by_overrides["model=mlp +quant=none memory.alignment=16 build.wheel=False"]
    int8 = by_overrides["model=mlp +quant=ptq memory.alignment=16 build.wheel=False"]
    for row in (fp32, int8):
        assert row["status"] == "ok"
        assert float(row["latency_ms"]) > 0
        assert int(row["runtime_bytes"]) > 10_000
        assert int(row["planned_sram_bytes"]) > 0
        manifest = json.loads((Path(row["run_dir"]) / "manifest.json").read_text())
        assert int(row["program_bytes"]) == (Path(row["run_dir"]) / "model.pte").stat().st_size
        assert int(row["runtime_bytes"]) == manifest["metrics"]["runtime_bytes"]
        assert float(row["latency_ms"]) == manifest["metrics"]["latency_ms"]["median"]
    assert fp32["sqnr_db"] == "" and float(int8["sqnr_db"]) > 10
    assert int(int8["program_bytes"]) < int(fp32["program_bytes"]) / 2  # int8 weights
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == 2
    for row in failed:
        assert "memory.alignment=24" in row["overrides"]
        assert "memory.alignment=24 is not valid" in row["error"]
        assert f"  {row['run_dir']}: " in proc.stderr
        # the job failed before any stage, and still left a manifest saying so
        manifest = json.loads((Path(row["run_dir"]) / "manifest.json").read_text())
        assert manifest["status"] == "failed" and manifest["stages"] == []
    # The int8 program is smaller; it is on the front unless the fp32 one is also faster.
    assert int8["pareto"] == "yes" or float(fp32["latency_ms"]) <= float(int8["latency_ms"])
    assert "yes" in (fp32["pareto"], int8["pareto"])

    md = (sweep / "sweep.md").read_text()
    assert "4 jobs: 2 ok, 2 failed." in md
    assert "Every job: `model=mlp` `build.wheel=False`." in md
    assert "## Pareto front: latency vs size (program + runtime) vs SQNR" in md
    assert "## Failed jobs" in md and md.count("memory.alignment=24 is not valid") == 2
    assert (sweep / "pareto.png").read_bytes().startswith(b"\x89PNG")

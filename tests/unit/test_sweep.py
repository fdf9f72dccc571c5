"""Sweep results (pipeline/sweep.py): read from the job directories a multirun leaves, whatever
launcher ran it; the Pareto front; sweep.md, sweep.csv, pareto.png; the callback's exit code."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from etbuild.pipeline.sweep import SweepCallback, summarize, write_results


def make_job(
    sweep: Path,
    num: int,
    overrides: list[str],
    status: str | None = "ok",
    error: str | None = None,
    latency: float | None = None,
    runtime: int | None = 60_000,
    program: int | None = 300_000,
    sqnr: float | None = None,
    scheme: str = "none",
    emulated: bool = False,
    banks: dict[str, int] | None = None,
) -> Path:
    """A job directory as Hydra and etbuild leave it (``status`` None: no manifest)."""
    job = sweep / f"{num}_mlp"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (job / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": num}}}))
    if status is None:
        return job
    metrics: dict = {}
    if program is not None:
        metrics["program_bytes"] = program
    if banks is not None:
        metrics["planned_bytes"] = banks
        metrics["planned_total_bytes"] = sum(banks.values())
    if runtime is not None:
        metrics["runtime_bytes"] = runtime
    if latency is not None:
        metrics["latency_ms"] = {
            "median": latency,
            "p10": latency * 0.9,
            "p90": latency * 1.1,
            "runs": 10,
            "emulated": emulated,
        }
    if sqnr is not None:
        metrics["sqnr_db"] = sqnr
    manifest = {
        "status": status,
        "error": error,
        "config": {"quant": {"scheme": scheme}},
        "metrics": metrics,
        "stages": [],
    }
    (job / "manifest.json").write_text(json.dumps(manifest))
    return job


def test_jobs_statuses_and_errors_come_from_their_files(tmp_path: Path) -> None:
    make_job(tmp_path, 0, ["model=mlp", "memory.alignment=16"], latency=0.02)
    make_job(tmp_path, 1, ["model=mlp", "memory.alignment=64"], "failed", "the model stage failed")
    make_job(tmp_path, 2, ["model=mlp", "memory.alignment=128"], "running")
    make_job(tmp_path, 3, ["model=mlp", "memory.alignment=256"], None)
    # a job subdir with a slash in it (a path-valued override) sits deeper
    make_job(tmp_path / "10_x", 10, ["model=mlp", "model.checkpoint=/a/b.pt"], latency=0.03)
    summary = summarize(tmp_path)
    assert [j.num for j in summary.jobs] == [0, 1, 2, 3, 10]
    assert [j.status for j in summary.jobs] == [
        "ok",
        "failed",
        "unfinished",
        "no manifest",
        "ok",
    ]
    assert [j.num for j in summary.failed] == [1, 2, 3]
    assert summary.jobs[1].error == "the model stage failed"
    assert "never finished" in summary.jobs[2].error
    assert "no manifest.json" in summary.jobs[3].error
    assert summary.jobs[0].overrides == ["model=mlp", "memory.alignment=16"]


def test_pareto_front_of_latency_and_size(tmp_path: Path) -> None:
    make_job(tmp_path, 0, ["a=0"], latency=1.0, runtime=100, program=100)  # fast, big
    make_job(tmp_path, 1, ["a=1"], latency=2.0, runtime=50, program=50)  # slow, small
    make_job(tmp_path, 2, ["a=2"], latency=2.5, runtime=60, program=60)  # dominated by 1
    make_job(tmp_path, 3, ["a=3"], latency=0.5, runtime=10, program=10, emulated=True)
    make_job(tmp_path, 4, ["a=4"], latency=None)  # not run here (android, cortex_m)
    summary = summarize(tmp_path)
    assert not summary.uses_accuracy
    assert [j.num for j in summary.front] == [0, 1]
    assert summary.jobs[0].size_bytes == 200


def test_pareto_front_counts_sqnr_when_a_job_is_quantized(tmp_path: Path) -> None:
    make_job(tmp_path, 0, ["+quant=none"], latency=2.0, runtime=100, program=400)
    int8 = {"runtime": 80, "program": 100}
    make_job(tmp_path, 1, ["+quant=ptq"], latency=1.0, sqnr=35.0, scheme="ptq", **int8)
    # slower than job 1, but more accurate: still on the front
    make_job(tmp_path, 2, ["+quant=qat"], latency=1.1, sqnr=40.0, scheme="qat", **int8)
    # worse than job 1 on every axis
    make_job(tmp_path, 3, ["+quant=dynamic"], latency=1.5, sqnr=20.0, scheme="dynamic", **int8)
    summary = summarize(tmp_path)
    assert summary.uses_accuracy
    # the fp32 build is the slowest and largest, and the most accurate
    assert [j.num for j in summary.front] == [0, 1, 2]


def test_results_files(tmp_path: Path) -> None:
    banks = {"sram": 32768, "dram": 1024}
    make_job(tmp_path, 0, ["model=mlp", "+quant=none"], latency=0.021, banks=banks)
    make_job(
        tmp_path,
        1,
        ["model=mlp", "+quant=ptq"],
        latency=0.015,
        runtime=50_000,
        program=100_000,
        sqnr=31.5,
        scheme="ptq",
        banks={"sram": 8192},
    )
    make_job(tmp_path, 2, ["model=mlp", "+quant=qat"], "failed", "SQNR 3 dB is below\n20 dB")
    summary = summarize(tmp_path)
    written = write_results(summary)
    assert [p.name for p in written] == ["sweep.md", "sweep.csv", "pareto.png"]

    rows = list(csv.DictReader(io.StringIO((tmp_path / "sweep.csv").read_text())))
    assert [r["job"] for r in rows] == ["0", "1", "2"]
    assert rows[0]["overrides"] == "model=mlp +quant=none"
    assert rows[0]["status"] == "ok" and rows[2]["status"] == "failed"
    assert rows[0]["latency_ms"] == "0.021" and rows[1]["latency_ms"] == "0.015"
    assert rows[0]["planned_sram_bytes"] == "32768" and rows[0]["planned_dram_bytes"] == "1024"
    assert rows[1]["planned_dram_bytes"] == "" and rows[1]["planned_total_bytes"] == "8192"
    assert rows[1]["runtime_bytes"] == "50000" and rows[1]["program_bytes"] == "100000"
    assert rows[1]["size_bytes"] == "150000"
    assert rows[1]["sqnr_db"] == "31.5" and rows[0]["sqnr_db"] == ""
    assert [r["pareto"] for r in rows] == ["yes", "yes", "no"]
    assert rows[2]["error"] == "SQNR 3 dB is below\n20 dB"

    md = (tmp_path / "sweep.md").read_text()
    assert "3 jobs: 2 ok, 1 failed." in md
    assert "Every job: `model=mlp`." in md
    assert "| planned sram KiB | planned dram KiB |" in md
    assert "| 0 | `+quant=none` | ok | 0.021 | 58.6 | 293.0 | 32.0 | 1.0 | fp32 | **yes** |" in md
    assert "| 1 | `+quant=ptq` | ok | 0.015 | 48.8 | 97.7 | 8.0 |  | 31.50 | **yes** |" in md
    assert "## Pareto front: latency vs size (program + runtime) vs SQNR" in md
    assert "## Failed jobs" in md and "### job 2: failed" in md
    assert "SQNR 3 dB is below\n20 dB\n```" in md
    assert f"`{tmp_path / '2_mlp'}`" in md
    assert "![latency vs size](pareto.png)" in md

    png = (tmp_path / "pareto.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    assert not list(tmp_path.glob(".*.tmp"))


def test_results_when_no_job_has_a_latency(tmp_path: Path) -> None:
    make_job(tmp_path, 0, ["+target=android"], latency=None)
    write_results(summarize(tmp_path))
    md = (tmp_path / "sweep.md").read_text()
    assert "No job has a latency measured on this machine and both sizes." in md
    assert "Not compared (not timed: a target that does not run here, or " in md
    assert "pipeline.verify.latency_iters=1; or timed under an emulator): job 0." in md
    assert (tmp_path / "pareto.png").read_bytes().startswith(b"\x89PNG")


def _config(sweep: Path):
    return OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})


def test_callback_exits_1_when_a_job_failed(tmp_path: Path, capsys) -> None:
    """No in-process state: the failure is read from the job's manifest, as it is when the
    jobs ran in other processes or on other machines."""
    cb = SweepCallback()
    cb.on_multirun_start(_config(tmp_path))
    make_job(tmp_path, 0, ["model.seed=0"], latency=0.02)
    failed = make_job(tmp_path, 1, ["model.seed=1"], "failed", "checkpoint does not fit\nmore")
    with pytest.raises(SystemExit) as exc:
        cb.on_multirun_end(_config(tmp_path))
    assert exc.value.code == 1
    out, err = capsys.readouterr()
    assert f"etbuild: sweep: 2 jobs, 1 ok, 1 failed -> {tmp_path / 'sweep.md'}" in out
    assert "etbuild: 1 sweep job(s) failed:" in err
    assert f"  {failed}: checkpoint does not fit\n" in err
    assert (tmp_path / "sweep.md").is_file() and (tmp_path / "pareto.png").is_file()


def test_callback_returns_when_every_job_is_ok(tmp_path: Path, capsys) -> None:
    cb = SweepCallback()
    cb.on_multirun_start(_config(tmp_path / "sweep"))
    make_job(tmp_path / "sweep", 0, ["model.seed=0"], latency=0.02)
    cb.on_multirun_end(_config(tmp_path / "sweep"))
    assert "etbuild: sweep: 1 jobs, 1 ok, 0 failed" in capsys.readouterr().out
    rows = list(csv.DictReader(io.StringIO((tmp_path / "sweep" / "sweep.csv").read_text())))
    assert [r["status"] for r in rows] == ["ok"]


def test_callback_ignores_job_directories_of_an_earlier_sweep(tmp_path: Path) -> None:
    old = make_job(tmp_path, 5, ["model.seed=5"], "failed", "an earlier sweep's failure")
    past = (old / ".hydra" / "overrides.yaml").stat().st_mtime_ns - 10**9
    os.utime(old / ".hydra" / "overrides.yaml", ns=(past, past))
    cb = SweepCallback()
    cb.on_multirun_start(_config(tmp_path))
    make_job(tmp_path, 0, ["model.seed=0"], latency=0.02)
    cb.on_multirun_end(_config(tmp_path))  # no SystemExit: job 5 is not this sweep's
    rows = list(csv.DictReader(io.StringIO((tmp_path / "sweep.csv").read_text())))
    assert [r["job"] for r in rows] == ["0"]


def test_callback_exits_1_when_no_job_wrote_its_directory(tmp_path: Path, capsys) -> None:
    cb = SweepCallback()
    cb.on_multirun_start(_config(tmp_path / "sweep"))
    with pytest.raises(SystemExit) as exc:
        cb.on_multirun_end(_config(tmp_path / "sweep"))
    assert exc.value.code == 1
    assert "the sweep wrote no job directory under" in capsys.readouterr().err

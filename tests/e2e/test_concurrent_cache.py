"""Concurrent runs on one cache directory (pipeline/stage_cache.py's entry locks): each stage
cache key and each runtime build is computed by one process; the others wait and reuse it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from etbuild_test_support import cli_env

pytestmark = pytest.mark.e2e


def test_three_concurrent_runs_build_the_runtime_once(tmp_path: Path) -> None:
    cache = tmp_path / "cache"  # fresh: nothing is cached when the three start
    exe = Path(sys.executable).parent / "etbuild"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "etbuild.pipeline.cli"]
    procs = [
        subprocess.Popen(
            [*cmd, "model=mlp", f"build.cache_dir={cache}", f"hydra.run.dir={tmp_path / str(i)}"],
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(3)
    ]
    outs = [p.communicate(timeout=1200)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out
    manifests = [json.loads((tmp_path / str(i) / "manifest.json").read_text()) for i in range(3)]
    assert [m["status"] for m in manifests] == ["ok"] * 3
    # One process ran every cacheable stage and one compiled the runtime; the others restored
    # and copied what they published (no stage is computed by two processes).
    assert sorted(m["stage_cache"]["hit"] for m in manifests) == [False, True, True]
    builds = [next(s for s in m["stages"] if s["name"] == "build") for m in manifests]
    assert sorted(b["summary"]["cache"] for b in builds) == ["hit", "hit", "miss"]
    assert sorted(b["summary"]["all_ops_cache"] for b in builds) == ["hit", "hit", "miss"]
    assert len({b["summary"]["key"] for b in builds}) == 1
    # The cache holds the tailored runtime and the all-ops baseline, whole (no half-written
    # temporary folder left), and one entry per stage key.
    entries = sorted((cache / "builds").iterdir())
    assert [e.name.startswith(".") for e in entries] == [False, False], entries
    for entry in entries:
        assert (entry / "sizes.json").is_file() and (entry / "install").is_dir()
        assert (entry / "build.log").read_text().count(" --install ") == 1
    keys = {s["key"] for s in manifests[0]["stage_cache"]["stages"].values()}
    assert all({s["key"] for s in m["stage_cache"]["stages"].values()} == keys for m in manifests)
    assert {e.name for e in (cache / "stages").iterdir()} == keys
    assert sum("cache=miss" in out for out in outs) == 1, outs
    runners = {(tmp_path / str(i) / "runtime/bin/etb_runner").read_bytes() for i in range(3)}
    assert len(runners) == 1

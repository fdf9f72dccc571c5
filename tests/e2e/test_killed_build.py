"""A build killed with SIGKILL while the runtime compiles: its compilers die with it (the C++
build runs in a process group that dies with etbuild: pipeline/process_group.py), its run
directory's manifest does not say "ok", and a rerun succeeds and leaves no temporary folder
in the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from etbuild_test_support import cli_env

pytestmark = pytest.mark.e2e


def processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline[:120]}")
    return found


def wait_for(predicate, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc (Linux)")
def test_sigkill_during_the_cxx_build_leaves_no_compiler_and_no_stale_state(tmp_path) -> None:
    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    exe = Path(sys.executable).parent / "etbuild"
    args = [str(exe), "model=mlp", f"build.cache_dir={cache}", f"hydra.run.dir={run_dir}",
            "pipeline.cache=false", "build.compare_all_ops=false", "build.wheel=false"]  # fmt: skip
    env = {k: v for k, v in cli_env().items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: [p for p in processes_mentioning(str(cache)) if "cc1plus" in p],
                 timeout=240, what="the runtime's compilers")  # fmt: skip
    finally:
        proc.kill()
        proc.wait()
    leftovers = wait_for(lambda: not processes_mentioning(str(cache)) or None, timeout=10,
                         what="the build's processes to die")  # fmt: skip
    assert leftovers
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] != "ok", manifest["status"]
    rerun = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "ok"
    stale = [p.name for p in (cache / "builds").iterdir() if p.name.startswith(".")]
    assert stale == [], stale


def test_a_run_removes_what_a_killed_run_left_in_its_directory(tmp_path) -> None:
    from etbuild.pipeline.runner import remove_run_temporaries

    run_dir = tmp_path / "run"
    for d in (".runtime.abc123/runtime/bin", ".verify.k2j3/", ".hydra"):
        (run_dir / d).mkdir(parents=True)
    (run_dir / ".manifest.json.x1y2.tmp").write_text("{")
    (run_dir / ".hydra" / "config.yaml").write_text("a: 1")
    (run_dir / "model.pte").write_bytes(b"program")
    remove_run_temporaries(run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == [".hydra", "model.pte"]
    assert (run_dir / ".hydra" / "config.yaml").is_file()

"""The cache's entry locks (pipeline/stage_cache.py): a process waits for the one that holds an
entry, says so, and prune leaves an entry alone while another process holds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from etbuild_test_support import build_in_process

from etbuild.pipeline.errors import EtbuildError
from etbuild.pipeline.stage_cache import StageCache, entry_lock, prune

HOLD = (
    "import sys, time, filelock\n"
    "lock = filelock.FileLock(sys.argv[1])\n"
    "lock.acquire()\n"
    "print('held', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
    "lock.release()\n"
)


def hold(lock_file: Path, seconds: float) -> subprocess.Popen:
    """Another process holding ``lock_file`` for ``seconds`` (returns once it holds it)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock_file), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_held_entry_makes_the_next_process_wait_and_say_so(tmp_path: Path) -> None:
    other = hold(tmp_path / "locks" / "builds-abc.lock", 1.5)
    notes: list[str] = []
    t0 = time.monotonic()
    with entry_lock(tmp_path, "builds", "abc", note=notes.append):
        waited = time.monotonic() - t0
    other.wait(timeout=30)
    assert waited > 0.5
    assert notes == [
        "etbuild: waiting for another etbuild process that holds the builds cache entry abc "
        f"({tmp_path / 'locks' / 'builds-abc.lock'})"
    ]
    # free: no wait, no note
    with entry_lock(tmp_path, "builds", "abc", note=notes.append):
        pass
    assert len(notes) == 1


def test_stage_cache_lock_excludes_other_processes(tmp_path: Path) -> None:
    cache = StageCache(tmp_path)
    cache.lock("k1", note=lambda _: None)
    probe = (
        "import sys, filelock\n"
        "try:\n"
        "    filelock.FileLock(sys.argv[1]).acquire(timeout=0)\n"
        "    print('acquired')\n"
        "except filelock.Timeout:\n"
        "    print('busy')\n"
    )
    lock_file = str(tmp_path / "locks" / "stages-k1.lock")
    run = [sys.executable, "-c", probe, lock_file]
    assert subprocess.run(run, capture_output=True, text=True).stdout == "busy\n"
    cache.unlock("k1")
    cache.unlock("k1")  # a no-op when not held
    assert subprocess.run(run, capture_output=True, text=True).stdout == "acquired\n"


def test_prune_leaves_an_entry_another_process_holds(tmp_path: Path) -> None:
    for key in ("old1", "old2"):
        entry = tmp_path / "builds" / key
        entry.mkdir(parents=True)
        (entry / "blob").write_bytes(b"x" * 1000)
        os.utime(entry, (1, 1))  # used long ago
    other = hold(tmp_path / "locks" / "builds-old1.lock", 60)
    try:
        removed, freed = prune(tmp_path, 0, keep=set(), keep_since=time.time())
    finally:
        other.kill()
        other.wait()
    assert (removed, freed) == (1, 1000)
    assert sorted(p.name for p in (tmp_path / "builds").iterdir()) == ["old1"]
    assert prune(tmp_path, 0, keep=set(), keep_since=time.time()) == (1, 1000)
    assert list((tmp_path / "builds").iterdir()) == []


def test_a_cache_dir_that_cannot_hold_locks_is_an_etbuild_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "cache"
    not_a_dir.write_text("a file where the cache folder should be")
    with pytest.raises(EtbuildError, match="cannot create the cache's lock folder .*cache/locks"):
        with entry_lock(not_a_dir, "builds", "abc"):
            pass
    run_dir = tmp_path / "run"
    with pytest.raises(EtbuildError, match=r"set build\.cache_dir \(or ETBUILD_CACHE_DIR\)"):
        build_in_process(["model=mlp", f"build.cache_dir={not_a_dir}"], run_dir, stage_cache=True)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert "cannot create the cache's lock folder" in manifest["error"]
    assert manifest["stages"] == []

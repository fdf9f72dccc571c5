"""The runtime builds warning-free (-Wall -Wextra -Werror) with clang as well as gcc.

The package build compiles it with the default compiler (gcc here); this builds the whole
runtime (core, portable and quantized kernels, runner, size test) again with clang++. CI
installs clang; elsewhere the test is skipped when no clang++ is found.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest


@pytest.mark.skipif(shutil.which("clang++") is None, reason="clang++ is not installed")
def test_runtime_builds_warning_free_with_clang(tmp_path) -> None:
    from etbuild.pipeline.paths import RUNTIME_SRC_DIR

    cfg = subprocess.run(
        ["cmake", "-S", str(RUNTIME_SRC_DIR), "-B", str(tmp_path), "-G", "Ninja",
         "-DCMAKE_CXX_COMPILER=clang++", "-DETB_WERROR=ON", "-DETB_BUILD_RUNNER=ON",
         f"-DPython_EXECUTABLE={sys.executable}"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    assert "clang++" in (tmp_path / "CMakeCache.txt").read_text()
    build = subprocess.run(
        ["cmake", "--build", str(tmp_path), "-j2"], capture_output=True, text=True
    )
    assert build.returncode == 0, build.stdout[-6000:] + build.stderr[-3000:]
    assert "warning:" not in build.stdout + build.stderr
    assert (tmp_path / "etb_runner").is_file() and (tmp_path / "etb_size_test").is_file()

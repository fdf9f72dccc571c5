"""The build stage: the tailored runtime (only the selected kernels), its cache, its size
budget, find_package from an application, and the linux_aarch64 cross build under qemu."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from etbuild_test_support import (
    build_cmake_app,
    build_in_process,
    kernels_in_library,
    run_cli,
    stage_record,
)

pytestmark = pytest.mark.e2e

MLP = ["model=mlp"]


@pytest.fixture(scope="session")
def mlp_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("build_mlp")
    build_in_process(MLP, run_dir, wheel=True)
    return run_dir


def test_tailored_library_holds_exactly_the_selected_kernels(mlp_build: Path) -> None:
    runtime = mlp_build / "runtime"
    for rel in (
        "lib/libetb_runtime.a",
        "lib/libetb_kernels.a",
        "bin/etb_runner",
        "include/register_kernels.h",
        "include/executor/program.h",
        "lib/cmake/etbuild_runtime/etbuild_runtimeConfig.cmake",
    ):
        assert (runtime / rel).is_file(), rel
    selected = yaml.safe_load((mlp_build / "selected_operators.yaml").read_text())["operators"]
    present = kernels_in_library(runtime / "lib/libetb_kernels.a")
    assert present == set(selected), (sorted(present), sorted(selected))
    # The build stage records every file it wrote in the manifest.
    writes = stage_record(mlp_build, "build")["writes"]
    assert "runtime/lib/libetb_kernels.a" in writes and "runtime/bin/etb_runner" in writes


def test_verify_runs_the_built_runner(mlp_build: Path) -> None:
    summary = stage_record(mlp_build, "verify")["summary"]
    assert summary["status"] == "ran"
    # The kernels' SIMD path as the runner reports it: the host build is -march=native, like
    # etbuild.runtime, and agrees with the build stage's reading of the compile flags.
    import etbuild.runtime

    isa = etbuild.runtime.kernel_isa()
    assert summary["kernel_isa"] == isa
    build = stage_record(mlp_build, "build")["summary"]
    assert build["kernel_isa"] == isa and build["march"] == "native"
    report = (mlp_build / "report.md").read_text()
    assert f"- kernels: `-march=native`, SIMD path `{isa}` (reported by the runner)" in report
    assert f"| kernel_isa | {isa} |" in report
    # target.threads (1 by default) is the count verify ran at and the report gives.
    assert summary["threads"] == 1
    assert "- threads: 1 (target.threads: `etb_runner --threads 1`" in report
    assert "## Runtime size (host)" in report and "all ops" in report
    assert "Largest kernels" in report


def test_second_identical_build_is_a_cache_hit(mlp_build: Path, tmp_path: Path) -> None:
    assert stage_record(mlp_build, "build")["summary"]["cache"] in ("miss", "hit")
    builds = Path(os.environ["ETBUILD_CACHE_DIR"]) / "builds"
    key = stage_record(mlp_build, "build")["summary"]["key"]

    def entry_files() -> dict[Path, int]:
        """The files of this build's cache entry and of any rebuild of it in progress (a
        hidden folder named after the key); not other tests' builds, which the other test
        worker may be writing meanwhile. Files only: a hit marks its entry folder used (the
        folder's mtime: build.cache_max_gb)."""
        folders = [*builds.glob(f"{key}*"), *builds.glob(f".{key}*")]
        return {p: p.stat().st_mtime_ns for f in folders for p in f.rglob("*") if p.is_file()}

    before = entry_files()
    assert before
    build_in_process(MLP, tmp_path / "again", wheel=True)
    summary = stage_record(tmp_path / "again", "build")["summary"]
    assert summary["cache"] == "hit"
    assert summary["key"] == key
    assert entry_files() == before  # nothing was rebuilt or rewritten
    assert (tmp_path / "again/runtime/lib/libetb_kernels.a").read_bytes() == (
        mlp_build / "runtime/lib/libetb_kernels.a"
    ).read_bytes()


def test_host_wheel_installs_into_a_virtual_environment(mlp_build: Path, tmp_path: Path) -> None:
    """runtime/wheel/ holds a wheel of the tailored runtime: installed into a fresh venv, it
    registers exactly the selected kernels and runs model.pte like eager, also when
    etbuild.runtime is loaded in the same process (each module keeps its own types)."""
    (wheel,) = (mlp_build / "runtime/wheel").glob("etbuild_runtime-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin/python"
    # The packages of this interpreter (torch: the module returns torch tensors; etbuild, for
    # etbuild.runtime), but no etbuild_runtime: a .pth that adds this interpreter's site
    # folders (with their own .pth files, as an editable install's) after the venv's own.
    venv_site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    ours = [p for p in sys.path if p.endswith("site-packages")]
    (Path(venv_site) / "test_parent_env.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in ours)
    )
    subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True
    )
    script = (
        "import json, sys, torch, etbuild_runtime as r\n"
        "ref = torch.load(sys.argv[2], weights_only=True)\n"
        "import etbuild.runtime as full\n"
        "tailored, everything = r.load(sys.argv[1]), full.load(sys.argv[1])\n"
        "out = tailored.run(ref['inputs'])\n"
        "err = (out[0] - ref['outputs'][0]).abs().max().item()\n"
        "same = bool(torch.equal(out[0], everything.run(ref['inputs'])[0]))\n"
        "print(json.dumps({'file': r.__file__, 'kernels': r.registered_kernels(), 'err': err,\n"
        "                  'isa': r.kernel_isa(), 'same': same,\n"
        "                  'types': [type(tailored).__module__, type(everything).__module__],\n"
        "                  'all_ops': len(full.registered_kernels())}))\n"
    )
    proc = subprocess.run(
        [py, "-c", script, str(mlp_build / "model.pte"), str(mlp_build / "reference.pt")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["file"].startswith(str(venv))
    selected = yaml.safe_load((mlp_build / "selected_operators.yaml").read_text())["operators"]
    assert sorted(result["kernels"]) == sorted(selected)
    assert result["err"] < 1e-5
    assert result["isa"] == stage_record(mlp_build, "build")["summary"]["kernel_isa"]
    # Beside the all-ops etbuild.runtime: two modules, two Program types, the same numbers.
    assert result["types"] == ["etbuild_runtime.runtime", "etbuild.runtime"]
    assert result["all_ops"] > len(selected)
    assert result["same"]


def test_size_budget_fails_the_build(mlp_build: Path, tmp_path: Path) -> None:
    proc = run_cli([*MLP, "build.size_budget_kb=1", f"hydra.run.dir={tmp_path}/run"], tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "build.size_budget_kb=1" in out and "KiB" in out and "Traceback" not in out, out


def test_android_without_ndk_stops_before_export(tmp_path: Path) -> None:
    env_backup = {
        k: os.environ.pop(k) for k in ("ANDROID_NDK_HOME", "ANDROID_NDK_ROOT") if k in os.environ
    }
    try:
        proc = run_cli([*MLP, "+target=android", f"hydra.run.dir={tmp_path}/run"], tmp_path)
    finally:
        os.environ.update(env_backup)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    for needle in ("target.ndk", "ANDROID_NDK_HOME", "ANDROID_NDK_ROOT"):
        assert needle in out, out
    assert "export" not in proc.stdout and "[1/" not in proc.stdout, out
    assert not (tmp_path / "run" / "model.pte").exists()


def test_find_package_from_an_application(mlp_build: Path, tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(app CXX)\n"
        "find_package(etbuild_runtime REQUIRED)\n"
        "add_executable(app main.cpp)\ntarget_link_libraries(app PRIVATE etbuild::runtime)\n"
    )
    (app / "main.cpp").write_text(
        '#include "executor/data_loader.h"\n#include "executor/program.h"\n'
        '#include "register_kernels.h"\n#include <cstdio>\n'
        "int main(int argc, char** argv) {\n"
        "  if (argc < 2 || etb::register_all_kernels() != etb::Error::Ok) return 2;\n"
        "  auto loader = etb::FileDataLoader::open(argv[1]);\n"
        "  if (!loader.ok()) return 3;\n"
        "  auto program = etb::Program::load(&loader.value());\n"
        "  if (!program.ok()) return 4;\n"
        '  std::printf("methods=%zu\\n", program->num_methods());\n'
        "  return 0;\n}\n"
    )
    built = build_cmake_app(app, f"-DCMAKE_PREFIX_PATH={mlp_build / 'runtime'}")
    assert built.returncode == 0, built.stdout + built.stderr
    proc = subprocess.run(
        [str(app / "b/app"), str(mlp_build / "model.pte")], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "methods=1" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-g++") is None or shutil.which("qemu-aarch64") is None,
    reason="needs g++-aarch64-linux-gnu and qemu-user (CI installs them)",
)
def test_linux_aarch64_cross_build_runs_under_qemu(tmp_path: Path) -> None:
    build_in_process([*MLP, "+target=linux_aarch64", "target.threads=3"], tmp_path / "run")
    summary = stage_record(tmp_path / "run", "verify")["summary"]
    assert summary["status"] == "ran under qemu-aarch64"
    assert summary["kernel_isa"] == "neon"
    assert summary["threads"] == 3  # the runner's thread pool, under qemu
    runner = tmp_path / "run/runtime/bin/etb_runner"
    header = runner.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64

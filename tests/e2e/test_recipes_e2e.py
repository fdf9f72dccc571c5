"""Recipes, lock files, the Python API and an Optuna search, end to end (programs only:
``pipeline.stop_after=emit``, so no runtime is compiled)."""

from __future__ import annotations

import json
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from etbuild_test_support import cli_env, run_cli

pytestmark = pytest.mark.e2e

MLP_EMIT = ["model=mlp", "pipeline.stop_after=emit", "pipeline.cache=false"]


def test_lock_rebuilds_a_byte_identical_program(tmp_path: Path) -> None:
    first = tmp_path / "first"
    proc = run_cli([*MLP_EMIT, "+quant=ptq", f"hydra.run.dir={first}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    lock_path = first / "recipe.lock.yaml"
    lock = yaml.safe_load(lock_path.read_text())
    assert lock["config"]["model"]["name"] == "mlp"
    assert lock["config"]["quant"]["scheme"] == "ptq"
    assert lock["overrides"] == [*MLP_EMIT, "+quant=ptq"]
    assert set(lock["tools"]) >= {"etbuild", "python", "torch", "torchao", "flatbuffers"}
    assert lock["inputs"]["model_source"].endswith(
        lock["inputs"]["model_source"].rsplit(" ", 1)[-1]
    )
    assert "zoo" in lock["inputs"]["model_source"]

    # From another directory, into another run directory: the same bytes, no warning.
    second = tmp_path / "second"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_cli(["--lock", str(lock_path), f"hydra.run.dir={second}"], elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    assert (second / "model.pte").read_bytes() == (first / "model.pte").read_bytes()
    relock = yaml.safe_load((second / "recipe.lock.yaml").read_text())
    assert relock["config"] == lock["config"]

    # A lock made with other tools: one warning line per difference, and it still builds.
    doc = yaml.safe_load(lock_path.read_text())
    doc["tools"]["torch"] = "2.0.0"
    doc["inputs"]["model_source"] = "/gone/mlp.py 00ff"
    old = tmp_path / "old.lock.yaml"
    old.write_text(yaml.safe_dump(doc))
    third = tmp_path / "third"
    proc = run_cli(
        ["--lock", str(old), f"hydra.run.dir={third}", "pipeline.stop_after=model"], elsewhere
    )
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 2, proc.stderr
    assert warnings[0].startswith(f"etbuild: warning: lock {old}: torch is ")
    assert "the lock was made with 2.0.0" in warnings[0]
    assert "input model_source differs from the lock" in warnings[1]
    assert json.loads((third / "manifest.json").read_text())["status"] == "ok"


def _recipe_wheel(tmp_path: Path) -> tuple[Path, Path]:
    """A recipe package (setuptools project, entry point etbuild.recipes) built as a wheel and
    installed into a fresh venv; returns the venv's python and the installed recipe file.

    The venv reaches etbuild and torch through a .pth file that adds this interpreter's
    site-packages behind its own (installing etbuild afresh would compile the runtime
    again), the way a venv with --system-site-packages reaches the system's; that flag
    itself would not do here, since under CI this interpreter is a venv too."""
    proj = tmp_path / "proj"
    pkg = proj / "team_recipes"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""A team\'s etbuild recipes."""\n')
    (pkg / "team_mlp.yaml").write_text(
        textwrap.dedent(
            """\
            recipe:
              name: team_mlp
              version: 2.0.1
              etbuild: ">=0.1,<1"
              description: the team's MLP, 32-byte aligned
            defaults:
              - config
              - override /model: mlp
              - _self_
            memory:
              alignment: 32
            """
        )
    )
    (proj / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = ["setuptools>=61"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "team-recipes"
            version = "2.0.1"

            [project.entry-points."etbuild.recipes"]
            team = "team_recipes"

            [tool.setuptools]
            packages = ["team_recipes"]

            [tool.setuptools.package-data]
            team_recipes = ["*.yaml"]
            """
        )
    )
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(proj)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("team_recipes-2.0.1-*.whl")
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300
    )
    python = venv / "bin" / "python"
    (own_site,) = venv.glob("lib/python*/site-packages")
    (own_site / "_etbuild_env.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages())
    )
    subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps",
         "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    (installed,) = (venv / "lib").glob("python*/site-packages/team_recipes/team_mlp.yaml")
    return python, installed


def test_recipe_package_wheel_is_listed_and_built_by_name_from_an_empty_dir(
    tmp_path: Path,
) -> None:
    python, installed = _recipe_wheel(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = cli_env()
    # Outside the venv the package is not there: etbuild does not list it.
    proc = subprocess.run(
        [sys.executable, "-m", "etbuild.pipeline.recipe_cli", "list"],
        cwd=empty, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and "team_mlp" not in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run(
        [str(python), "-m", "etbuild.pipeline.recipe_cli", "list"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "team_mlp" in proc.stdout and "2.0.1" in proc.stdout
    assert f"from package team-recipes (team_recipes): {installed}" in proc.stdout

    proc = subprocess.run(
        [str(python), "-m", "etbuild.pipeline.cli", "--recipe", "team_mlp",
         "pipeline.stop_after=emit", "hydra.run.dir=run"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    run = empty / "run"
    assert (run / "model.pte").is_file()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["memory"]["alignment"] == 32
    assert manifest["config"]["recipe"]["name"] == "team_mlp"
    lock = yaml.safe_load((run / "recipe.lock.yaml").read_text())
    assert lock["recipe"] == {"name": "team_mlp", "version": "2.0.1", "file": str(installed)}


def test_python_api_build_sweep_and_errors(tmp_path: Path, monkeypatch) -> None:
    import etbuild

    monkeypatch.chdir(tmp_path)
    result = etbuild.build(["model=mlp", "pipeline.stop_after=emit"], run_dir=tmp_path / "one")
    assert isinstance(result, etbuild.BuildResult)
    assert result.ok and result.status == "ok"
    assert result.model_pte == tmp_path / "one" / "model.pte"
    assert result.manifest is not None and result.lock is not None and result.report is None
    assert result.metrics["program_bytes"] == result.model_pte.stat().st_size

    recipe = etbuild.build(["pipeline.stop_after=plan"], recipe="mcu_int8")  # default run dir
    assert recipe.ok
    assert recipe.run_dir.parent.parent == tmp_path / "outputs"
    assert set(recipe.metrics["planned_bytes"]) == {"sram", "psram"}

    with pytest.raises(etbuild.EtbuildError, match="unknown setting 'quant.foo'"):
        etbuild.build(["model=mlp", "quant.foo=1"])
    with pytest.raises(etbuild.EtbuildError, match="no recipe named 'nope'"):
        etbuild.build([], recipe="nope")
    with pytest.raises(etbuild.EtbuildError, match="a sweep.*call etbuild.sweep"):
        etbuild.build(["model=mlp,transformer"])
    with pytest.raises(etbuild.EtbuildError, match="run it with etbuild -m --recipe search"):
        etbuild.sweep([], recipe="search_int8_mlp")
    with pytest.raises(etbuild.EtbuildError, match="Hydra's own settings"):
        etbuild.build(["model=mlp", "hydra.run.dir=x"])
    # a failing stage: the message the command prints
    with pytest.raises(etbuild.EtbuildError, match="memory"):
        etbuild.build(
            ["model=mlp", "pipeline.stop_after=plan", "memory.banks.0.size_bytes=1024"],
            run_dir=tmp_path / "too_small",
        )

    sweep = etbuild.sweep(
        ["model=mlp", "pipeline.stop_after=emit", "memory.alignment=16,64"],
        sweep_dir=tmp_path / "sweep",
    )
    assert [r.status for r in sweep.results] == ["ok", "ok"]
    assert [r.run_dir.name for r in sweep.results] == ["0_mlp", "1_mlp"]
    assert sweep.results[1].overrides[-1] == "memory.alignment=64"
    assert sweep.sweep_md.is_file() and sweep.sweep_csv.is_file() and sweep.pareto_png.is_file()
    assert "2 jobs: 2 ok, 0 failed." in sweep.sweep_md.read_text()

    with pytest.raises(etbuild.pipeline.api.SweepFailed) as info:
        etbuild.sweep(
            ["model=mlp", "pipeline.stop_after=plan", "memory.banks.0.size_bytes=1024,1000000"],
            sweep_dir=tmp_path / "sweep2",
        )
    failed = info.value.result
    assert [r.status for r in failed.results] == ["failed", "ok"]
    assert str(info.value).startswith("1 sweep job(s) failed:")
    assert "## Failed jobs" in failed.sweep_md.read_text()


def test_optuna_multi_objective_search_writes_its_pareto_set(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep_dir = tmp_path / "search"
    args = [
        "-m",
        "--recipe",
        "search_int8_mlp",
        "pipeline.stop_after=emit",
        # what a program alone measures: its size and its planned memory
        "search.objectives=[program_kb,planned_kb]",
        "hydra.sweeper.direction=[minimize,minimize]",
        "search.min_sqnr_db=null",
        "search.max_size_kb=null",
        "hydra.sweeper.n_trials=4",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    proc = run_cli(args, tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["name"] == "optuna"
    assert results["solutions"], results
    for sol in results["solutions"]:
        assert set(sol["params"]) == {
            "quant.weights",
            "quant.activations",
            "quant.observer",
            "quant.calibration.num_batches",
        }
        assert len(sol["values"]) == 2 and sol["values"][0] < 1e6
    jobs = sorted(p.parent for p in sweep_dir.glob("*/search.json"))
    assert len(jobs) == 4
    for job in jobs:
        sr = json.loads((job / "search.json").read_text())
        manifest = json.loads((job / "manifest.json").read_text())
        assert sr["feasible"] and sr["objectives"] == ["program_kb", "planned_kb"]
        assert sr["values"][0] == pytest.approx(manifest["metrics"]["program_bytes"] / 1024)
    md = (sweep_dir / "sweep.md").read_text()
    assert "## Search: program_kb, planned_kb" in md
    assert "### Pareto set (the sweeper's optimization_results.yaml)" in md
    assert md.count("(job ") >= len(results["solutions"])

    # directions that do not match the objectives: refused before any job
    bad = [a for a in args if not a.startswith("hydra.sweeper.direction")]
    proc = run_cli([*bad, "hydra.sweeper.direction=[minimize]"], tmp_path, timeout=120)
    assert proc.returncode == 1
    assert "does not match search.objectives=['program_kb', 'planned_kb']" in proc.stderr
    assert "set hydra.sweeper.direction=[minimize,minimize]" in proc.stderr

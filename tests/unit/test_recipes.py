"""Recipes (header, search path, etbuild-recipe), lock-file checks and search objectives,
without building: composition only."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from etbuild_test_support import cli_env
from omegaconf import OmegaConf

from etbuild.pipeline import __version__
from etbuild.pipeline import recipes as R
from etbuild.pipeline.errors import EtbuildError
from etbuild.pipeline.paths import RECIPES_DIR

PACKAGED = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def _recipe(folder: Path, name: str, header: str | None, body: str = "") -> Path:
    head = f"recipe: {header}\n" if header is not None else ""
    text = head + "defaults:\n  - config\n  - override /model: mlp\n  - _self_\n" + body
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def _recipe_cli(args: list[str], cwd: Path, env: dict | None = None):
    exe = Path(sys.executable).parent / "etbuild-recipe"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "etbuild.pipeline.recipe_cli"]
    return subprocess.run(
        [*cmd, *args], cwd=cwd, env=env or cli_env(), capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("name", PACKAGED)
def test_packaged_recipes_have_headers_and_compose(name: str) -> None:
    recipe = R.find(name)
    assert recipe.origin == "packaged"
    cfg = R.compose(recipe)  # header, composition, schema
    assert cfg.recipe.name == name
    assert recipe.description


def test_starter_set_covers_the_headline_cases() -> None:
    phone = R.compose(R.find("phone_int8_xnnpack"))
    assert (phone.target.kind.value, phone.quant.scheme.value, phone.partitioner.name) == (
        "android",
        "ptq",
        "xnnpack",
    )
    assert R.compose(R.find("aarch64_board")).target.kind.value == "linux_aarch64"
    mcu = R.compose(R.find("mcu_int8"))
    assert (mcu.target.kind.value, mcu.quant.scheme.value, mcu.model.name) == (
        "cortex_m",
        "ptq",
        "mlp",
    )
    assert [b.name for b in mcu.memory.banks] == ["sram", "psram", "flash"]
    sweep = R.compose(R.find("sweep_quant"), return_hydra_config=True)
    params = dict(sweep.hydra.sweeper.params)
    assert params == {"model": "mlp,mobilenet", "+quant": "none,ptq,dynamic"}
    search = R.compose(R.find("search_int8_mlp"), return_hydra_config=True)
    assert "Optuna" in search.hydra.sweeper._target_
    assert list(search.hydra.sweeper.direction) == ["minimize", "minimize", "maximize"]


@pytest.mark.parametrize(
    "header, body, expected",
    [
        (
            "{name: r, version: 1.0.0, etbuild: '>=99'}",
            "",
            f"needs etbuild >=99 (recipe.etbuild) but this is etbuild {__version__}: install",
        ),
        ("{name: r, version: 1.0.0, etbuild: '>>1'}", "", "recipe.etbuild='>>1' is not a PEP 440"),
        ("{name: r, version: one}", "", "recipe.version='one' is not a PEP 440 version"),
        ("{name: other, version: 1.0.0}", "", "recipe.name='other' differs from the file's name"),
        ("{name: r, version: 1.0.0, autor: me}", "", "unknown header key recipe.autor"),
        ("{name: r}", "", "recipe.version is missing"),
        (None, "", "has no header; add a top-level recipe:"),
        (
            "{name: r, version: 1.0.0}",
            "memory:\n  alignmnt: 64\n",
            "unknown setting 'memory.alignmnt': MemoryConfig has no key 'alignmnt'; its settings "
            "are: planner, schedule, alignment,",
        ),
        (
            "{name: r, version: 1.0.0}",
            "quant:\n  scheme: int4\n",
            "quant.scheme",
        ),
    ],
)
def test_bad_recipes_name_the_file_the_key_and_the_fix(
    tmp_path: Path, header: str | None, body: str, expected: str
) -> None:
    path = _recipe(tmp_path, "r", header, body)
    with pytest.raises(EtbuildError) as info:
        R.compose(R.find(str(path)))
    message = str(info.value)
    assert str(path) in message
    assert expected in message
    assert "\n" not in message


def test_validate_command_exits_1_with_one_line(tmp_path: Path) -> None:
    bad = _recipe(tmp_path, "bad", "{name: bad, version: 1.0.0, etbuild: '>=99'}")
    proc = _recipe_cli(["validate", str(bad)], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"etbuild-recipe: error: recipe {bad} needs etbuild >=99")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    good = _recipe(tmp_path, "good", "{name: good, version: 2.1.0, etbuild: '>=0.1,<1'}")
    proc = _recipe_cli(["validate", str(good)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{good}: ok (good 2.1.0)\n"


def test_search_path_env_folder_list_show_diff(tmp_path: Path, monkeypatch) -> None:
    team = tmp_path / "team"
    team.mkdir()
    _recipe(
        team,
        "team_mlp",
        "{name: team_mlp, version: 0.3.0, description: the team's MLP}",
        "memory:\n  alignment: 32\n",
    )
    # A name the packaged set has: the packaged recipe comes first on the search path.
    _recipe(team, "mobilenet_host", "{name: mobilenet_host, version: 9.0.0}")
    env = cli_env()
    env[R.ENV_VAR] = os.pathsep.join([str(tmp_path / "missing"), str(team)])
    proc = _recipe_cli(["list"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert "team_mlp" in proc.stdout and "0.3.0" in proc.stdout and "the team's MLP" in proc.stdout
    assert f"from ETBUILD_RECIPE_PATH: {team / 'team_mlp.yaml'}" in proc.stdout
    assert f"from packaged: {RECIPES_DIR / 'mobilenet_host.yaml'}" in proc.stdout
    assert "9.0.0" not in proc.stdout

    proc = _recipe_cli(["show", "team_mlp"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first == f"# team_mlp 0.3.0 (ETBUILD_RECIPE_PATH): {team / 'team_mlp.yaml'}"
    shown = yaml.safe_load(proc.stdout)
    assert shown["memory"]["alignment"] == 32 and shown["model"]["name"] == "mlp"

    proc = _recipe_cli(["diff", "team_mlp", "mobilenet_host"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.split() == ["memory.alignment", "32", "->", "64"] for line in lines), lines
    assert any(line.split()[:4] == ["model.name", "mlp", "->", "mobilenet"] for line in lines)
    assert not any(line.startswith("recipe.") for line in lines)

    proc = _recipe_cli(["show", "nope"], tmp_path, env)
    assert proc.returncode == 1
    assert "no recipe named 'nope' on the recipe search path" in proc.stderr
    assert "team_mlp" in proc.stderr


def test_search_objectives_penalty_and_constraints() -> None:
    from etbuild.pipeline.search import evaluate

    search = OmegaConf.create(
        {
            "objectives": ["latency_ms", "size_kb", "sqnr_db"],
            "max_size_kb": 200.0,
            "max_latency_ms": None,
            "min_sqnr_db": 30.0,
            "fp32_sqnr_db": 200.0,
            "penalty": 1e9,
        }
    )
    metrics = {
        "latency_ms": {"median": 0.5},
        "program_bytes": 100 * 1024,
        "runtime_bytes": 50 * 1024,
        "sqnr_db": 35.0,
    }
    ptq = {"status": "ok", "metrics": metrics, "config": {"quant": {"scheme": "ptq"}}}
    ok = evaluate(search, ptq)
    assert ok["feasible"] and ok["values"] == [0.5, 150.0, 35.0]
    low = evaluate(search, {**ptq, "metrics": {**metrics, "sqnr_db": 20.0}})
    assert not low["feasible"] and low["values"] == [1e9, 1e9, -1e9]
    assert low["violations"] == ["sqnr_db=20 breaks search.min_sqnr_db=30"]
    big = evaluate(search, {**ptq, "metrics": {**metrics, "runtime_bytes": 150 * 1024}})
    assert big["violations"] == ["size_kb=250 breaks search.max_size_kb=200"]
    fp32 = evaluate(search, {**ptq, "config": {"quant": {"scheme": "none"}}})
    assert fp32["values"] == [0.5, 150.0, 200.0]
    failed = evaluate(search, {"status": "failed", "error": "lower: no kernel\nmore"})
    assert failed["violations"] == ["the build failed: lower: no kernel"]
    untimed = evaluate(search, {**ptq, "metrics": {"program_bytes": 1024}})
    assert not untimed["feasible"]
    assert any(v.startswith("latency_ms unknown") for v in untimed["violations"])


def test_lock_differences_name_tools_and_inputs(tmp_path: Path) -> None:
    from etbuild_test_support import compose_config

    from etbuild.pipeline.lock import differences, lock_document

    cfg = compose_config(["model=mlp"])
    doc = lock_document(cfg, ["model=mlp"])
    assert differences(doc) == []
    doc["tools"]["torch"] = "0.0.1"
    doc["inputs"]["model_source"] = "/elsewhere/mlp.py 0123"
    lines = differences(doc)
    assert len(lines) == 2
    assert lines[0].startswith("torch is ") and "lock was made with 0.0.1" in lines[0]
    assert lines[1].startswith("input model_source differs from the lock")
    # the same content elsewhere is no difference
    doc = lock_document(cfg, [])
    path, digest = doc["inputs"]["model_source"].rsplit(" ", 1)
    doc["inputs"]["model_source"] = f"/another/checkout/{Path(path).name} {digest}"
    assert differences(doc) == []


def test_bad_lock_and_recipe_flags_fail_in_one_line(tmp_path: Path) -> None:
    from etbuild_test_support import run_cli

    not_lock = tmp_path / "x.yaml"
    not_lock.write_text("a: 1\n")
    cases = [
        (["--lock", str(not_lock)], f"{not_lock} is not an etbuild lock file"),
        (["--lock", str(tmp_path / "none.yaml")], "cannot read lock file"),
        (["--recipe"], "--recipe needs a value"),
        (["--recipe", "mcu_int8", "--lock", str(not_lock)], "give --recipe or --lock, not both"),
        (["--recipe", "mcu_int8", "--config-name", "x"], "--recipe chooses the config"),
        (["--recipe", "nope"], "no recipe named 'nope'"),
    ]
    for args, expected in cases:
        proc = run_cli(args, tmp_path, timeout=120)
        assert proc.returncode == 1, (args, proc.stdout)
        assert proc.stderr.startswith("etbuild: error: ") and expected in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "outputs").exists()


def test_recipe_with_typo_fails_naming_the_file_from_the_command(tmp_path: Path) -> None:
    from etbuild_test_support import run_cli

    path = _recipe(tmp_path, "typo", "{name: typo, version: 1.0.0}", "quant:\n  min_sqnr: 3\n")
    proc = run_cli(["--recipe", str(path)], tmp_path, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"etbuild: error: recipe {path}: unknown setting 'quant.min_sqnr': QuantConfig has no key "
        "'min_sqnr'; its settings are: scheme, weights, activations, observer, calibration, "
        "keep_fp32, qat, min_sqnr_db; fix the key or value in the recipe (or in the override "
        "that sets it)\n"
    )


def test_a_recipe_without_etbuilds_config_fails_in_one_line(tmp_path: Path) -> None:
    """Left out of the defaults, etbuild's config leaves no schema and no model: the build,
    --config-name included, says what the defaults must start with, with no traceback."""
    from etbuild_test_support import run_cli

    path = tmp_path / "bare.yaml"
    path.write_text("recipe: {name: bare, version: 1.0.0}\ndefaults:\n  - _self_\nseed: 1\n")
    expected = "a recipe's defaults list must start with etbuild's config (defaults: [config,"
    with pytest.raises(EtbuildError, match=re.escape(f"recipe {path}: the composed config")):
        R.compose(R.find(str(path)))
    for args in (["--recipe", str(path)], ["--config-dir", str(tmp_path), "--config-name", "bare"]):
        proc = run_cli(args, tmp_path, timeout=120)
        assert proc.returncode == 1, proc.stderr
        assert expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1

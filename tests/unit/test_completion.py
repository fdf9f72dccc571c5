"""Tab completion: etbuild completes its own flags (recipe names after --recipe, files after
--lock) and, on a line with --recipe, completes the recipe's config through Hydra."""

from __future__ import annotations

from pathlib import Path

import pytest
from etbuild_test_support import cli_env, run_cli

from etbuild.pipeline.completion import own_choices, split_line


def complete(line: str, tmp_path: Path) -> list[str]:
    """What ``etbuild -sc query=bash`` offers for ``line``, as the shell asks for it."""
    env = cli_env()
    env["COMP_LINE"] = line
    proc = run_cli(["-sc", "query=bash"], cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr  # nothing printed over the user's prompt
    return proc.stdout.split()


def test_recipe_names_complete_after_recipe(tmp_path: Path) -> None:
    names = complete("etbuild --recipe ", tmp_path)
    assert {"mcu_int8", "phone_int8_xnnpack", "sweep_quant"} <= set(names)
    assert "--recipe=mcu_int8" in complete("etbuild model=mlp --recipe=mc", tmp_path)
    env = {**cli_env(), "COMP_LINE": "etbuild --recipe "}
    fish = run_cli(["-sc", "query=fish"], cwd=tmp_path, timeout=120, env=env)
    assert "\nmcu_int8\nmobilenet_host\n" in fish.stdout  # fish reads one per line


def test_a_recipe_on_the_line_chooses_the_config_that_is_completed(tmp_path: Path) -> None:
    assert complete("etbuild memory.banks.", tmp_path) == ["memory.banks.0."]
    with_recipe = ["memory.banks.0.", "memory.banks.1.", "memory.banks.2."]  # MPS2 AN386's
    assert complete("etbuild --recipe mcu_int8 memory.banks.", tmp_path) == with_recipe
    assert complete("etbuild --recipe=mcu_int8 memory.banks.", tmp_path) == with_recipe
    assert complete("etbuild --recipe no_such_recipe memory.banks.", tmp_path) == []


def test_flags_and_lock_files(tmp_path: Path) -> None:
    assert complete("etbuild --re", tmp_path) == ["--recipe"]
    assert complete("etbuild --lock ", tmp_path) == []  # the shell completes file names
    assert complete("etbuild memory.pl", tmp_path) == ["memory.planner="]  # Hydra's, as before


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("etbuild --recipe a x", ("etbuild x", ["--recipe", "a"])),
        ("etbuild m=1 --lock=f.yaml ", ("etbuild m=1 ", ["--lock=f.yaml"])),
        ("etbuild --lock f --recipe=r k.", ("etbuild k.", ["--lock", "f", "--recipe=r"])),
    ],
)
def test_split_line_takes_out_etbuilds_flags(line: str, want: tuple[str, list[str]]) -> None:
    assert split_line(line) == want


def test_a_word_for_hydra_is_left_to_hydra() -> None:
    assert own_choices("etbuild model=mob") is None
    assert own_choices("etbuild --recipe mcu_int8 ") is None

"""The select stage: per-argument dtypes (scalar and mixed-dtype arguments included), the union
of several programs, and a hand-written, pinned kernel set from a recipe."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from etbuild_test_support import build_in_process, kernels_in_library, run_cli

pytestmark = pytest.mark.e2e


def _selection(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "selected_operators.yaml").read_text())["operators"]


def _kernels_in_library(run_dir: Path) -> set[str]:
    return kernels_in_library(run_dir / "runtime/lib/libetb_kernels.a")


def test_mixed_and_scalar_arguments_are_recorded(zoo_build) -> None:
    sel = _selection(zoo_build("transformer"))
    # embedding: Float weights, Long indices -> exactly that combination.
    assert sel["aten::embedding.out"]["dtypes"] == {
        "indices": ["Long"],
        "out": ["Float"],
        "weight": ["Float"],
    }
    # Scalar arguments carry the kind of scalar the program passes.
    assert sel["aten::addmm.out"]["dtypes"]["alpha"] == ["Long"]
    assert sel["aten::addmm.out"]["dtypes"]["beta"] == ["Long"]
    assert sel["aten::add.out"]["dtypes"]["alpha"] == ["Long"]
    assert sum(info["count"] for info in sel.values()) > len(sel)


def test_union_of_several_programs(zoo_build, tmp_path: Path) -> None:
    """An app shipping the MLP and the transformer gets one runtime for both."""
    other = zoo_build("transformer")
    run_dir = tmp_path / "run"
    build_in_process(["model=mlp", f"selection.programs=[{other}/model.pte]"], run_dir)
    mlp_alone = _selection(zoo_build("mlp"))
    both = _selection(run_dir)
    assert set(both) == set(mlp_alone) | set(_selection(other))
    assert both["aten::addmm.out"]["count"] == (
        mlp_alone["aten::addmm.out"]["count"] + _selection(other)["aten::addmm.out"]["count"]
    )
    assert _kernels_in_library(run_dir) == set(both)
    # The same union from the other build's selected_operators.yaml.
    again = tmp_path / "again"
    build_in_process(["model=mlp", f"selection.programs=[{other}/selected_operators.yaml]"], again)
    assert _selection(again) == both


def test_a_program_list_entry_that_is_not_a_program(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pte"
    junk.write_bytes(b"not a program at all, not even close")
    proc = run_cli(
        [
            "model=mlp",
            f"selection.programs=[{junk},{tmp_path}/absent.pte]",
            f"hydra.run.dir={tmp_path}/run",
        ],
        tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert f"selection.programs: {junk}: not an ExecuTorch program" in out, out
    assert "Traceback" not in out and "[1/" not in proc.stdout


def _recipe(tmp_path: Path, operators: str) -> Path:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "pinned.yaml").write_text(
        textwrap.dedent("""
        defaults:
          - config
          - override /model: mlp
          - _self_

        selection:
          operators:
        """)
        + textwrap.indent(textwrap.dedent(operators), "    ")
    )
    return recipes


def test_pinned_kernel_set_from_a_recipe(tmp_path: Path) -> None:
    recipes = _recipe(
        tmp_path,
        """
        aten::addmm.out: null
        aten::relu.out: {dtypes: {self: [Float], out: [Float]}}
        aten::add.out: {dtypes: {self: [Float, Long], other: [Float, Long], out: [Float, Long]}}
        """,
    )
    run_dir = tmp_path / "run"
    proc = run_cli(
        ["--config-dir", str(recipes), "--config-name", "pinned", f"hydra.run.dir={run_dir}"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sel = _selection(run_dir)
    assert set(sel) == {"aten::addmm.out", "aten::relu.out", "aten::add.out"}
    assert sel["aten::add.out"]["count"] == 0  # pinned though this program does not use it
    assert sel["aten::add.out"]["dtypes"]["self"] == ["Float", "Long"]
    assert sel["aten::addmm.out"]["dtypes"]["mat1"] == ["Float"]  # null: what ops_yaml lists
    assert _kernels_in_library(run_dir) == set(sel)


def test_pinned_kernel_set_that_lacks_a_used_kernel(tmp_path: Path) -> None:
    recipes = _recipe(tmp_path, "aten::addmm.out: {dtypes: {self: [Float]}}\n")
    proc = run_cli(
        ["--config-dir", str(recipes), "--config-name", "pinned", f"hydra.run.dir={tmp_path}/r"],
        tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert (
        "the pinned kernel set (selection.operators) lacks what this program uses: "
        "aten::relu.out;" in out
    ), out
    assert not (tmp_path / "r/selected_operators.yaml").exists()
    assert not (tmp_path / "r/runtime").exists()


@pytest.mark.parametrize(
    "operators, message",
    [
        ("aten::adddmm.out: null\n", "selection.operators: 'aten::adddmm.out' is not an operator"),
        (
            "aten::relu.out: {dtypes: {self: [Long]}}\n",
            "selection.operators: aten::relu.out argument 'self': Long not supported; "
            "ops_yaml lists Float",
        ),
        (
            "aten::relu.out: {dtypes: {input: [Float]}}\n",
            "selection.operators: aten::relu.out has no tensor or Scalar argument 'input'",
        ),
    ],
)
def test_pinned_kernel_set_errors(tmp_path: Path, operators: str, message: str) -> None:
    recipes = _recipe(tmp_path, operators)
    proc = run_cli(
        ["--config-dir", str(recipes), "--config-name", "pinned", f"hydra.run.dir={tmp_path}/r"],
        tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert message in out, out
    assert "Traceback" not in out
    assert "[1/" not in proc.stdout  # refused before any stage ran


class _LinearReluScale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2.0


class _Atan2(torch.nn.Module):
    def forward(self, x):
        return torch.atan2(x, x + 1)


def _executorch_program(module: torch.nn.Module, path: Path) -> Path:
    """``module`` exported by the executorch package (the oracle), no delegate."""
    pytest.importorskip("executorch")
    from executorch.exir import EdgeCompileConfig, to_edge

    ep = torch.export.export(module.eval(), (torch.randn(2, 8),))
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    path.write_bytes(edge.to_executorch().buffer)
    return path


def test_an_executorch_program_joins_the_selection(tmp_path: Path) -> None:
    other = _executorch_program(_LinearReluScale(), tmp_path / "et.pte")
    run_dir = tmp_path / "run"
    build_in_process(
        ["model=mlp", f"selection.programs=[{other}]", "pipeline.stop_after=select"], run_dir
    )
    sel = _selection(run_dir)
    # The MLP's own ops plus what ExecuTorch emitted for linear, relu and the scalar multiply.
    assert {"aten::addmm.out", "aten::relu.out", "aten::permute_copy.out", "aten::mul.out"} <= set(
        sel
    )
    assert sel["aten::mul.out"]["dtypes"]["other"] == ["Float"]


def test_a_program_with_an_operator_the_runtime_lacks(tmp_path: Path) -> None:
    other = _executorch_program(_Atan2(), tmp_path / "atan2.pte")
    proc = run_cli(
        ["model=mlp", f"selection.programs=[{other}]", f"hydra.run.dir={tmp_path}/run"], tmp_path
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert (
        f"selection.programs: {other} uses operators that ops_yaml has no kernel for: "
        "aten::atan2.out" in out
    ), out
    assert "[1/" not in proc.stdout


def test_a_garbled_program_file_is_an_error_not_a_crash(tmp_path: Path) -> None:
    from etbuild.pipeline.errors import EtbuildError
    from etbuild.pipeline.ops import load_ops
    from etbuild.pipeline.stages.select import program_file_selection

    garbled = tmp_path / "garbled.pte"
    garbled.write_bytes(b"\xff\xff\xff\x7fET12" + b"\0" * 64)  # root offset past the end
    with pytest.raises(EtbuildError, match=r"garbled.pte: malformed program: its flatbuffer"):
        program_file_selection(str(garbled), load_ops())

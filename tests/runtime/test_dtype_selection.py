"""Dtype-selective kernels: codegen's compile-time (op, tensor argument) -> dtypes table, the
kernels compiled only for the selected dtypes, and the load-time error of a program that needs
a dtype the runtime was built without (the argument checks run once per instruction at Method
load, not only before each kernel call)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from rt_helpers import build_with_pipeline, cmake_build

from etbuild.codegen import generate
from etbuild.pipeline.paths import OPS_YAML_DIR

BUILD_ROOT = Path(__file__).resolve().parents[2] / "build"

# add.out for Float only. `alpha` (a Scalar, listed with the scalar's type) and `bogus` are not
# tensor arguments of add.out: codegen ignores them.
FLOAT_ADD = {
    "operators": {
        "aten::add.out": {
            "count": 1,
            "dtypes": {
                "self": ["Float"],
                "other": ["Float"],
                "out": ["Float"],
                "alpha": ["Long"],
                "bogus": ["Float"],
            },
        }
    }
}

LONG_ADD_AT_LOAD = (
    "etb_runner: init: method 'forward': instruction 0: aten::add.out: argument 'self' has "
    "dtype Long, which this runtime was not built with (selected: Float); rebuild the runtime "
    "with this program's selected_operators.yaml"
)

ROW = re.compile(r'^\s*\{"([^"]*)", "([^"]*)", dtype_set\(([^)]*)\)\},$', re.M)


def _table(header: str) -> dict[tuple[str, str], list[str]]:
    """The rows of a generated selected_dtypes.h: (op, argument) -> dtype names."""
    rows = {}
    for op, arg, dtypes in ROW.findall(header):
        rows[(op, arg)] = [d.strip().removeprefix("ScalarType::") for d in dtypes.split(",") if d]
    return rows


def _write_selection(path: Path, selection: dict) -> Path:
    path.write_text(yaml.safe_dump(selection))
    return path


# ---- the generated table ------------------------------------------------------------------


def test_table_reflects_the_selection(tmp_path):
    sel = _write_selection(tmp_path / "selected_operators.yaml", FLOAT_ADD)
    generate(OPS_YAML_DIR, tmp_path / "sel", sel)
    generate(OPS_YAML_DIR, tmp_path / "all")
    selected = (tmp_path / "sel" / "selected_dtypes.h").read_text()
    everything = (tmp_path / "all" / "selected_dtypes.h").read_text()
    assert "kDtypeSelectiveBuild = true;" in selected
    assert "kDtypeSelectiveBuild = false;" in everything

    sel_rows, all_rows = _table(selected), _table(everything)
    # Every (op, tensor argument) of ops_yaml has a row in both; Scalar and unknown arguments
    # named by the selection have none.
    assert sel_rows.keys() == all_rows.keys()
    assert ("aten::add.out", "alpha") not in sel_rows
    assert ("aten::add.out", "bogus") not in sel_rows
    for arg in ("self", "other", "out"):
        assert sel_rows[("aten::add.out", arg)] == ["Float"]
        assert all_rows[("aten::add.out", arg)] == ["Float", "Int", "Long"]
    # Operators outside the selection are listed with no dtype.
    assert sel_rows[("aten::mul.out", "self")] == []
    assert sel_rows[("aten::embedding.out", "indices")] == []
    assert all_rows[("aten::embedding.out", "indices")] == ["Long", "Int"]
    assert all(all_rows[k] for k in all_rows)
    # The generated check of add.out takes its selected dtypes from the same table.
    cpp = (tmp_path / "sel" / "register_kernels.cpp").read_text()
    assert 'selected_dtypes("aten::add.out", "self")' in cpp
    entry = '{"aten::add.out", &wrap_aten__add_out, &wrap_aten__add_out_check, false, nullptr}'
    assert entry in cpp


CONSTEXPR_TU = """
#include "selected_dtypes.h"
using etb::ScalarType;
static_assert(etb::dtype_selected("aten::add.out", "self", ScalarType::Float));
static_assert(!etb::dtype_selected("aten::add.out", "self", ScalarType::Long));
static_assert(!etb::dtype_selected("aten::add.out", "out", ScalarType::Int));
static_assert(!etb::dtype_selected("aten::mul.out", "self", ScalarType::Float));
static_assert(etb::selected_dtypes("aten::add.out", "other") == etb::dtype_set(ScalarType::Float));
template <etb::DtypeSet S> constexpr bool has_long() { return etb::dtype_in(S, ScalarType::Long); }
static_assert(!has_long<etb::selected_dtypes("aten::add.out", "out")>());
"""

UNKNOWN_TU = """
#include "selected_dtypes.h"
constexpr etb::DtypeSet kNope = etb::selected_dtypes("aten::add.out", "nope");
"""


def _compile(tu: str, gen: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    from etbuild.pipeline.paths import RUNTIME_SRC_DIR

    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / "tu.cpp"
    src.write_text(tu)
    return subprocess.run(
        [cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
         f"-I{RUNTIME_SRC_DIR}", f"-I{gen}", str(src)],
        capture_output=True, text=True,
    )  # fmt: skip


def test_table_is_a_constant_expression(tmp_path):
    sel = _write_selection(tmp_path / "selected_operators.yaml", FLOAT_ADD)
    generate(OPS_YAML_DIR, tmp_path / "gen", sel)
    res = _compile(CONSTEXPR_TU, tmp_path / "gen", tmp_path)
    assert res.returncode == 0, res.stderr
    # A lookup of an (op, argument) that ops_yaml does not list does not compile.
    res = _compile(UNKNOWN_TU, tmp_path / "gen", tmp_path)
    assert res.returncode != 0
    assert "unknown_operator_argument_in_dtype_table" in res.stderr


# ---- a runtime built for Float add.out ----------------------------------------------------


@pytest.fixture(scope="session")
def float_add_runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runtime_src built with add.out selected for Float only, plus the all-ops runner (every
    kernel, every dtype); built once per session (incrementally under build/)."""
    from etbuild.pipeline.paths import RUNTIME_SRC_DIR

    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        pytest.skip("cmake and ninja are needed to build the runtime")
    work = tmp_path_factory.mktemp("float_add")
    sel = _write_selection(work / "selected_operators.yaml", FLOAT_ADD)
    build = BUILD_ROOT / "dtype-selection" if BUILD_ROOT.is_dir() else work / "build"
    defines = [f"ETB_SELECTED_OPS={sel}", "ETB_ALL_OPS_RUNNER=ON", "ETB_BUILD_PYTHON=OFF",
               f"ETB_OPS_YAML_DIR={OPS_YAML_DIR}"]  # fmt: skip
    cmake_build(RUNTIME_SRC_DIR, build, defines, ["etb_runner", "etb_runner_all_ops"])
    return build


class Add(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def _etbt(path: Path, t: torch.Tensor) -> Path:
    code = {torch.float32: 6, torch.int64: 4, torch.int32: 3}[t.dtype]
    head = b"ETBT" + struct.pack("<III", 1, code, t.dim()) + struct.pack(f"<{t.dim()}q", *t.shape)
    path.write_bytes(head + t.contiguous().numpy().tobytes())
    return path


@pytest.fixture(scope="session")
def add_programs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """dtype -> (model.pte, input files, inputs) of ``x + y``, built by etbuild's pipeline."""
    out = {}
    for dtype in (torch.float32, torch.int64):
        d = tmp_path_factory.mktemp(f"add_{str(dtype).split('.')[1]}")
        x = torch.arange(-6, 6).reshape(3, 4).to(dtype)
        y = (torch.arange(12).reshape(3, 4) * 7).to(dtype)
        pte = build_with_pipeline(Add(), [x, y], d / "run")
        out[dtype] = (pte, [_etbt(d / "x.etbt", x), _etbt(d / "y.etbt", y)], (x, y))
    return out


def _run(exe: Path, pte: Path, inputs: list[Path]) -> subprocess.CompletedProcess:
    args = [str(exe), str(pte)]
    for p in inputs:
        args += ["--input", str(p)]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def _output_sum(stdout: str) -> float:
    m = re.search(r"^output 0: \w+ \[[\d, ]*\] sum=(\S+)", stdout, re.M)
    assert m, stdout
    return float(m.group(1))


def test_unselected_dtype_is_refused_at_load(float_add_runtime, add_programs):
    pte, inputs, _ = add_programs[torch.int64]
    res = _run(float_add_runtime / "etb_runner", pte, inputs)
    assert res.returncode == 1
    # "init" is Program::load_method: the program never started executing.
    assert res.stderr.strip() == LONG_ADD_AT_LOAD
    assert res.stdout == ""


class TwoAdds(torch.nn.Module):
    """Long and Int adds, then a second Long add: two distinct problems, three calls."""

    def forward(self, a, b):
        return (a + a) + a, b + b


def test_every_unselected_dtype_is_reported_at_once(float_add_runtime, tmp_path):
    a = torch.arange(6).reshape(2, 3)
    b = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    pte = build_with_pipeline(TwoAdds(), [a, b], tmp_path / "run")
    res = _run(float_add_runtime / "etb_runner", pte, [_etbt(tmp_path / "a.etbt", a),
               _etbt(tmp_path / "b.etbt", b)])  # fmt: skip
    assert res.returncode == 1
    err = res.stderr.strip()
    assert err.startswith("etb_runner: init: method 'forward': instruction ")
    assert err.count("which this runtime was not built with") == 2, err
    assert "argument 'self' has dtype Long" in err and "argument 'self' has dtype Int" in err
    assert err.endswith("(3 kernel calls in all)"), err


def test_selected_dtype_runs(float_add_runtime, add_programs):
    pte, inputs, (x, y) = add_programs[torch.float32]
    res = _run(float_add_runtime / "etb_runner", pte, inputs)
    assert res.returncode == 0, res.stderr
    assert _output_sum(res.stdout) == pytest.approx(float((x + y).sum()))


def test_all_ops_runner_has_every_dtype(float_add_runtime, add_programs):
    for dtype in (torch.int64, torch.float32):
        pte, inputs, (x, y) = add_programs[dtype]
        res = _run(float_add_runtime / "etb_runner_all_ops", pte, inputs)
        assert res.returncode == 0, res.stderr
        assert f"output 0: {'Long' if dtype == torch.int64 else 'Float'} [3, 4]" in res.stdout
        assert _output_sum(res.stdout) == float((x + y).sum())


def test_python_module_has_every_dtype(rt, add_programs):
    for dtype in (torch.int64, torch.float32):
        pte, _, (x, y) = add_programs[dtype]
        (got,) = rt.load(str(pte)).run([x, y])
        assert got.dtype == dtype and torch.equal(got, x + y)


def _symbols(binary: Path) -> list[tuple[int, str]]:
    out = subprocess.run(
        ["nm", "--size-sort", "-C", "-S", str(binary)], check=True, capture_output=True, text=True
    ).stdout
    syms = []
    for line in out.splitlines():
        m = re.match(r"^[0-9a-fA-F]+ ([0-9a-fA-F]+) [tTwW] (.*)$", line)
        if m:
            syms.append((int(m.group(1), 16), m.group(2)))
    return syms


ADD_CODE = ("etb::native::add_out(", "binary<(etb::native::(anonymous namespace)::BinOp)0>")


def test_unselected_dtype_paths_are_not_compiled(float_add_runtime):
    if shutil.which("nm") is None:
        pytest.skip("nm is needed")
    float_only = _symbols(float_add_runtime / "etb_runner")
    every = _symbols(float_add_runtime / "etb_runner_all_ops")

    def add_bytes(syms):
        return sum(n for n, s in syms if any(m in s for m in ADD_CODE))

    # The Float-only add has no mixed-dtype path at all (the all-ops runner has them) and its
    # kernel (add_out and the binary template it runs) is well under half the all-dtype one.
    assert not [s for _, s in float_only if "binary_mixed" in s]
    assert [s for _, s in every if "binary_mixed" in s]
    assert 0 < add_bytes(float_only) < 0.5 * add_bytes(every), (
        add_bytes(float_only),
        add_bytes(every),
    )


# ---- the load-time check in the Python module ---------------------------------------------


def test_unsupported_dtype_is_refused_at_load(rt, tmp_path):
    """A program whose relu.out runs on Int (ops_yaml lists Float only) fails in init_method,
    before any input is set, with the generated check's message."""
    from etbuild.pipeline import pte

    class Relu(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x)

    src = build_with_pipeline(Relu(), [torch.randn(2, 3)], tmp_path / "run")
    pf = pte.read(src.read_bytes())
    segments = [pf.segment(i) for i in range(len(pf.program.segments or []))]
    assert [seg.offset for seg in pf.program.segments or []][:1] in ([], [0])
    for plan in pf.program.executionPlan:
        for v in plan.values:
            if hasattr(v.val, "scalarType"):
                v.val.scalarType = 3  # Int: 4 bytes like Float, so the memory plan still fits
    path = tmp_path / "int_relu.pte"
    path.write_bytes(pte.serialize(pf.program, segments, 64))
    prog = rt.load(str(path))
    with pytest.raises(rt.Error) as info:
        prog.init_method("forward")
    assert str(info.value) == (
        "method 'forward': instruction 0: aten::relu.out: argument 'self' has dtype Int; "
        "this kernel supports Float"
    )

"""etbuild.codegen: deterministic output, rewritten only on change, selection, bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from etbuild.codegen import generate, parse_schema
from etbuild.codegen.gen import CodegenError
from etbuild.pipeline.paths import OPS_YAML_DIR


def test_parse_schema():
    s = parse_schema(
        "aten::max_pool2d_with_indices.out(Tensor self, int[2] kernel_size, int[2] stride=[], "
        "*, Tensor(a!) out, Tensor(b!) indices) -> (Tensor(a!), Tensor(b!))"
    )
    assert s.key == "aten::max_pool2d_with_indices.out"
    assert [a.name for a in s.args] == ["self", "kernel_size", "stride", "out", "indices"]
    assert [a.is_write for a in s.args] == [False, False, False, True, True]
    assert s.returns == ("Tensor", "Tensor")
    assert parse_schema("sym_size.int(Tensor self, int dim) -> SymInt").key == "aten::sym_size.int"


def test_deterministic_and_write_if_changed(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    written = generate(OPS_YAML_DIR, a)
    names = (
        "native_functions.h",
        "register_kernels.h",
        "register_kernels.cpp",
        "selected_dtypes.h",
    )
    assert {p.name for p in written} == set(names)
    generate(OPS_YAML_DIR, b)
    for name in names:
        assert (a / name).read_text() == (b / name).read_text()
    mtimes = {p.name: p.stat().st_mtime_ns for p in a.iterdir()}
    assert generate(OPS_YAML_DIR, a) == []  # nothing changed, nothing written
    assert {p.name: p.stat().st_mtime_ns for p in a.iterdir()} == mtimes
    cpp = (a / "register_kernels.cpp").read_text()
    assert "Error register_all_kernels()" in cpp
    assert (
        '{"aten::convolution.out", &wrap_aten__convolution_out, '
        "&wrap_aten__convolution_out_check, true, nullptr}" in cpp  # fuses_clamp in ops_yaml
    )
    assert (
        '{"aten::add.out", &wrap_aten__add_out, &wrap_aten__add_out_check, false, nullptr}' in cpp
    )
    # `prepare: true` in ops_yaml: a load-time hook, declared beside the kernel.
    assert (
        '{"etb_quantized::conv2d.out", &wrap_etb_quantized__conv2d_out, '
        "&wrap_etb_quantized__conv2d_out_check, false, &wrap_etb_quantized__conv2d_out_prepare}"
        in cpp
    )
    assert (
        "Error conv2d_out_prepare(PrepareContext& pctx, const Tensor& input"
        in (a / "native_functions.h").read_text()
    )
    # No static initializers: registration happens only in register_all_kernels().
    assert "__attribute__((constructor))" not in cpp and "static bool" not in cpp


def test_every_yaml_op_is_registered(rt):
    ops = []
    for path in sorted(OPS_YAML_DIR.glob("*.yaml")):
        for entry in yaml.safe_load(path.read_text()):
            ops.append(parse_schema(entry["func"]).key)
    assert sorted(rt.registered_kernels()) == sorted(ops)


def test_selection(tmp_path):
    sel = tmp_path / "selected_operators.yaml"
    sel.write_text(
        yaml.safe_dump(
            {"operators": {"aten::add.out": {"count": 1, "dtypes": {"self": ["Float"]}}}}
        )
    )
    generate(OPS_YAML_DIR, tmp_path / "out", sel)
    cpp = (tmp_path / "out" / "register_kernels.cpp").read_text()
    assert "aten::add.out" in cpp and "aten::mul.out" not in cpp
    assert "register_kernels(Span<const Kernel>(kKernels, 1))" in cpp
    sel.write_text(yaml.safe_dump({"operators": {"aten::nope.out": {}}}))
    with pytest.raises(CodegenError, match="aten::nope.out"):
        generate(OPS_YAML_DIR, tmp_path / "out2", sel)


def test_cli_reports_bad_yaml(tmp_path):
    bad = tmp_path / "ops"
    bad.mkdir()
    (bad / "x.yaml").write_text(
        "- func: add.out(Tensor self, Blob b, *, Tensor(a!) out) -> "
        "Tensor(a!)\n  kernels:\n    - kernel_name: etb::native::x\n"
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "etbuild.codegen",
            "--ops-yaml",
            str(bad),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1
    assert "unsupported type Blob" in res.stdout


def test_no_hand_written_registration():
    src = Path(__file__).resolve().parents[2] / "runtime_src"
    if not src.is_dir():
        pytest.skip("needs a checkout")
    for path in src.rglob("*.cpp"):
        text = path.read_text()
        assert "register_kernels(" not in text or path.name == "kernel.cpp", path

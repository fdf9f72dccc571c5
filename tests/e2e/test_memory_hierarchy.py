"""The memory hierarchy end to end: a preset MCU's banks, placement across them, the error
when a model does not fit (before any compile), and the report's per-bank tables and
pictures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from etbuild_test_support import run_cli, run_in_executorch

pytestmark = pytest.mark.e2e

UNET = [
    "model=custom",
    "model.name=unet",
    "model._target_=models_for_tests.unet",
    "+memory=stm32h7",
]


def _run(args: list[str], run_dir: Path):
    return run_cli([*args, f"hydra.run.dir={run_dir}"], run_dir.parent)


def _plan(run_dir: Path) -> dict:
    return json.loads((run_dir / "memory_plan.json").read_text())


def test_unet_on_a_cortex_m7_places_activations_in_dtcm_first(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _run(
        [
            *UNET,
            "model.inputs=[{name:x,shape:[1,3,48,48]}]",
            "memory.scratch_bytes=16384",
            "pipeline.stop_after=plan",
        ],
        run_dir,
    )
    assert proc.returncode == 0, proc.stderr
    plan = _plan(run_dir)
    banks = {b["name"]: b for b in plan["banks"]}
    assert list(banks) == ["dtcm", "sram"]  # flash holds constants, not planned memory
    for bank in banks.values():
        assert bank["planned_bytes"] <= bank["capacity_bytes"]
    # the fast bank fills first: it is nearly full before anything spills to SRAM
    assert banks["dtcm"]["planned_bytes"] >= 0.75 * banks["dtcm"]["capacity_bytes"]
    assert banks["sram"]["planned_bytes"] > 0
    assert plan["scratch"] == {"bank": "dtcm", "offset": plan["scratch"]["offset"], "size": 16384}
    assert plan["constants"]["name"] == "flash"
    # concatenation in place lowers the U-Net's peak below the exported order's
    assert plan["concat_in_place"] == 2
    assert plan["schedule"]["peak_after"] < plan["schedule"]["peak_before"]
    # the configured planner costs no more than the others that fit
    fits = {n: r for n, r in plan["planners"].items() if r["fits"]}
    assert plan["cost"] <= min(r["cost"] for r in fits.values())
    for name in banks:
        png = (run_dir / f"memory_{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG")


def test_a_model_that_does_not_fit_fails_before_compiling(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _run([*UNET, "model.inputs=[{name:x,shape:[1,3,64,64]}]"], run_dir)
    assert proc.returncode == 1
    err = proc.stderr
    assert "the memory plan does not fit the banks (dtcm=131072 bytes, sram=524288 bytes)" in err
    assert "Alive at the peak, largest first:" in err
    assert "made by: " in err and "models_for_tests.py:" in err  # the model's source lines
    assert "+quant=ptq" in err and "memory.banks[*].size_bytes" in err
    assert "Traceback" not in err
    assert not (run_dir / "runtime").exists()  # nothing compiled
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert manifest["stages"][-1]["name"] == "plan"


def test_weights_that_exceed_the_flash_fail_in_plan(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _run(["model=mlp", "+memory=stm32h7", "memory.banks.2.size_bytes=65536"], run_dir)
    assert proc.returncode == 1
    assert "the program's constants (" in proc.stderr
    assert "do not fit bank 'flash' (65536 bytes)" in proc.stderr
    assert not (run_dir / "runtime").exists()


def test_constants_copied_into_faster_banks_run_in_both_runtimes(tmp_path: Path) -> None:
    """memory.constants=copy on the Cortex-M7 preset: the DS-CNN's weights fill the room the
    activations leave in DTCM, the one that does not fit goes to SRAM, and the program carries
    them as planned tensors with initial data, which etbuild's runtime and ExecuTorch's copy
    into place at load."""
    import torch

    import etbuild.runtime

    run_dir = tmp_path / "run"
    proc = _run(
        [
            "model=ds_cnn",
            "+memory=stm32h7",
            "memory.constants=copy",
            "pipeline.stop_after=reference",
        ],
        run_dir,
    )
    assert proc.returncode == 0, proc.stderr
    plan = _plan(run_dir)
    constants = plan["constants"]
    copied = {c["name"]: c for c in constants["copied"]}
    assert constants["copied_bytes"] == constants["constant_bytes"]  # every weight has room
    assert {c["bank"] for c in copied.values()} == {"dtcm", "sram"}
    banks = {b["name"]: b for b in plan["banks"]}
    for name, bank in banks.items():
        assert bank["planned_bytes"] <= bank["capacity_bytes"]
        mine = [c for c in copied.values() if c["bank"] == name]
        assert bank["copied_constant_bytes"] == sum(c["size"] for c in mine)
        # after every planned tensor of the bank
        ends = [t["offset"] + t["size"] for t in plan["tensors"] if t["bank"] == name]
        assert all(c["offset"] >= max(ends, default=0) for c in mine)
    # a weight went to SRAM only when DTCM had no room left for it; small ones came first
    room = banks["dtcm"]["capacity_bytes"] - banks["dtcm"]["planned_bytes"]
    assert all(c["size"] > room for c in copied.values() if c["bank"] == "sram")
    in_dtcm = [c["size"] for c in constants["copied"] if c["bank"] == "dtcm"]
    assert in_dtcm == sorted(in_dtcm)
    assert constants["copied_cost_saved"] > 0
    from etbuild.pipeline.stages.report import _memory_section

    report = "\n".join(_memory_section(plan))
    assert (
        f"Constants copied at load (memory.constants=copy): {len(copied)} tensors, "
        f"{constants['copied_bytes']:,} B"
    ) in report
    assert "the plan is 1.000x of it" in report  # the copies are not counted against the bound
    # the planned tensors' span leaves the copies out
    assert plan["tensor_bytes"] == sum(
        min(
            (c["offset"] for c in copied.values() if c["bank"] == b["name"]),
            default=b["planned_bytes"],
        )
        for b in plan["banks"]
    )
    emit = next(s for s in json.loads((run_dir / "manifest.json").read_text())["stages"]
                if s["name"] == "emit")["summary"]  # fmt: skip
    assert emit["constants"] == 0 and emit["copied_constant_bytes"] >= constants["copied_bytes"]

    ref = torch.load(run_dir / "reference.pt", weights_only=True)
    program = etbuild.runtime.load(str(run_dir / "model.pte"))
    got = program.run(ref["inputs"])
    assert float(ref["outputs"][0].std()) > 0.1
    torch.testing.assert_close(got[0], ref["outputs"][0], rtol=1e-5, atol=1e-5)
    (out,) = run_in_executorch([str(run_dir)])[str(run_dir)]["outputs"]
    assert out["err"] <= 1e-5 * out["scale"], out


def test_scheduling_lowers_a_bottleneck_resnets_peak_and_the_program_still_matches(
    tmp_path: Path,
) -> None:
    """A ResNet-50-style network whose peak is a downsampling bottleneck block: min_peak runs
    the shortcut's projection after the strided 3x3 (the module runs it last), so the block
    input dies before the expansion: 8 -> 6.5 units of 64 KiB. The reordered program matches
    eager in etbuild's runtime and in ExecuTorch's."""
    import torch

    import etbuild.runtime

    run_dir = tmp_path / "run"
    proc = _run(
        [
            "model=custom",
            "model.name=bottleneck_resnet",
            "model._target_=models_for_tests.bottleneck_resnet",
            "model.inputs=[{name:x,shape:[1,3,32,32]}]",
            "memory.schedule=min_peak",
            "pipeline.stop_after=reference",
        ],
        run_dir,
    )
    assert proc.returncode == 0, proc.stderr
    plan = _plan(run_dir)
    unit = 16 * 32 * 32 * 4  # 16 channels of 32x32 fp32
    assert plan["schedule"]["order"] == "min_peak"
    assert plan["schedule"]["peak_before"] == 8 * unit
    assert plan["schedule"]["peak_after"] == int(6.5 * unit)
    assert plan["total_bytes"] == plan["lower_bound_bytes"] == int(6.5 * unit)
    ref = torch.load(run_dir / "reference.pt", weights_only=True)
    (got,) = etbuild.runtime.load(str(run_dir / "model.pte")).run(ref["inputs"])
    assert float(ref["outputs"][0].std()) > 0.1
    torch.testing.assert_close(got, ref["outputs"][0], rtol=1e-4, atol=1e-4)
    (out,) = run_in_executorch([str(run_dir)])[str(run_dir)]["outputs"]
    assert out["err"] <= 1e-4 * out["scale"], out

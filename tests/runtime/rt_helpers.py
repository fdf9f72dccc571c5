"""Helpers for the runtime tests: build a program from an ``nn.Module`` with etbuild's pipeline
(in-process) or with the ``executorch`` package (the oracle exporter); compare outputs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from filelock import FileLock


def compose(overrides: Sequence[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from etbuild.pipeline.config import register_configs
    from etbuild.pipeline.paths import CONF_DIR

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def build_with_pipeline(
    module: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    run_dir: Path,
    overrides: Sequence[str] = ("model.dynamic_dims=[]",),
) -> Path:
    """Runs etbuild's stages from export through emit on ``module``; returns model.pte.

    The config is the mlp model's with ``overrides``; by default no dim is dynamic (the mlp
    config's one input is named ``features``, its dynamic dim is ``batch`` on dim 0)."""
    from etbuild.pipeline.runner import run_stages
    from etbuild.pipeline.stages import STAGES

    cfg = compose(["model=mlp", *overrides])

    def model_stage(ctx) -> None:
        ctx.artifacts["module"] = module.eval()
        ctx.artifacts["example_inputs"] = tuple(inputs)

    wanted = ("export", "lower", "partition", "out_variant", "plan", "emit")
    # The zoo's model stage with this module in place of its model: the same contract.
    model = dataclasses.replace(next(s for s in STAGES if s.name == "model"), fn=model_stage)
    stages = [model] + [s for s in STAGES if s.name in wanted]
    run_stages(stages, cfg, run_dir, log=lambda _line: None)
    return run_dir / "model.pte"


def build_with_executorch(
    module: torch.nn.Module, inputs: Sequence[torch.Tensor], path: Path
) -> Path:
    """Exports ``module`` with the executorch package (no delegate) to ``path``."""
    from executorch.exir import EdgeCompileConfig, to_edge

    ep = torch.export.export(module.eval(), tuple(inputs))
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    path.write_bytes(edge.to_executorch().buffer)
    return path


def cmake_build(source: Path, build: Path, defines: Sequence[str], targets: Sequence[str] = ()):
    """Configures ``source`` into ``build`` (Ninja, with -D ``defines``) and builds ``targets``
    (all when empty); asserts both succeed. One build of a directory at a time: pytest workers
    that build the same directory at once (tests of one file on two workers) can leave ninja's
    dependency log truncated, after which every build there recompiles everything."""
    with FileLock(str(build) + ".lock"):
        cfg = subprocess.run(
            ["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja",
             f"-DPython_EXECUTABLE={sys.executable}", *(f"-D{d}" for d in defines)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert cfg.returncode == 0, cfg.stdout + cfg.stderr
        target_args = [a for t in targets for a in ("--target", t)]
        res = subprocess.run(
            ["cmake", "--build", str(build), "-j2", *target_args], capture_output=True, text=True
        )
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]


def assert_matches(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-4) -> None:
    """Max abs error <= rel * max|want| (exact for integer and bool tensors)."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if not want.dtype.is_floating_point:
        assert torch.equal(got, want)
        return
    if want.numel() == 0:
        return
    scale = max(want.abs().max().item(), 1e-6)
    err = (got - want).abs().max().item()
    assert err <= rel * scale, f"max abs error {err} > {rel} * {scale}"


def _ev(kind, payload):
    from etbuild.schema import EValue, KernelTypes

    e = EValue.EValueT()
    e.valType = getattr(KernelTypes.KernelTypes, kind)
    e.val = payload
    return e


def _tensor(offset):
    """A Float [2, 3] tensor at `offset` in memory bank 1."""
    from etbuild.schema import AllocationDetails, Tensor

    t = Tensor.TensorT()
    t.scalarType = 6
    t.sizes = [2, 3]
    t.dimOrder = [0, 1]
    a = AllocationDetails.AllocationDetailsT()
    a.memoryId, a.memoryOffsetLow, a.memoryOffsetHigh = 1, offset, 0
    t.allocationInfo = a
    return _ev("Tensor", t)


def _scalar(cls, field, value, kind):
    obj = cls()
    setattr(obj, field, value)
    return _ev(kind, obj)


def _instr(kind, obj):
    from etbuild.schema import Instruction, InstructionArguments

    i = Instruction.InstructionT()
    i.instrArgsType = getattr(InstructionArguments.InstructionArguments, kind)
    i.instrArgs = obj
    return i


def _write_add_program(path: Path, values, instructions, bank_bytes, delegates=(), blobs=(),
                       op_name=("aten::add", "out")):  # fmt: skip
    """Serializes a one-chain "forward" plan over one operator (aten::add.out unless
    `op_name` says otherwise): input value 0, output 1."""
    from etbuild.pipeline import pte
    from etbuild.schema import Chain, ExecutionPlan, Operator, Program

    chain = Chain.ChainT()
    chain.inputs, chain.outputs = [0], [1]
    chain.instructions = list(instructions)
    op = Operator.OperatorT()
    op.name, op.overload = op_name
    plan = ExecutionPlan.ExecutionPlanT()
    plan.name = "forward"
    plan.values = values
    plan.inputs, plan.outputs = [0], [1]
    plan.chains = [chain]
    plan.operators = [op]
    plan.delegates = list(delegates)
    plan.nonConstBufferSizes = [0, bank_bytes]
    prog = Program.ProgramT()
    prog.version = 0
    prog.executionPlan = [plan]
    prog.backendDelegateData = list(blobs)
    prog.segments = []
    path.write_bytes(pte.serialize(prog, [], 16))
    return path


def write_one_op_program(path: Path, op: str, out_offset: int) -> Path:
    """A hand-built program of one kernel call on Float [2, 3] x at offset 0 of the bank, with
    its output y at `out_offset`: ``y = x + x`` (op "add") or ``y = x.permute(0, 1)``
    ("permute"). An offset below 24 makes y share memory with x."""
    from etbuild.schema import Int, IntList, KernelCall

    values = [_tensor(0), _tensor(out_offset)]  # 0 x, 1 y
    call = KernelCall.KernelCallT()
    if op == "add":
        values.append(_scalar(Int.IntT, "intVal", 1, "Int"))  # 2 alpha
        call.opIndex, call.args = 0, [0, 0, 2, 1, 1]
        op_name = ("aten::add", "out")
    else:
        dims = IntList.IntListT()
        dims.items = [2, 3]
        values += [_scalar(Int.IntT, "intVal", d, "Int") for d in (0, 1)]  # 2, 3: the dims
        values.append(_ev("IntList", dims))  # 4
        call.opIndex, call.args = 0, [0, 4, 1, 1]
        op_name = ("aten::permute_copy", "out")
    return _write_add_program(path, values, [_instr("KernelCall", call)], 64, op_name=op_name)


def write_loop_program(path: Path, jump_back: bool) -> Path:
    """A hand-built program ``y = x + x`` then a jump on a false condition: back to the add
    (a loop that never ends) when `jump_back`, else past the end. Float [2, 3] in and out."""
    from etbuild.schema import (
        Bool,
        Int,
        JumpFalseCall,
        KernelCall,
    )

    values = [
        _tensor(0),  # 0 x
        _tensor(32),  # 1 y
        _scalar(Bool.BoolT, "boolVal", False, "Bool"),  # 2 cond
        _scalar(Int.IntT, "intVal", 1, "Int"),  # 3 alpha
    ]
    add = KernelCall.KernelCallT()
    add.opIndex, add.args = 0, [0, 0, 3, 1, 1]
    jf = JumpFalseCall.JumpFalseCallT()
    jf.condValueIndex, jf.destinationInstruction = 2, 0 if jump_back else 2
    instructions = [_instr("KernelCall", add), _instr("JumpFalseCall", jf)]
    return _write_add_program(path, values, instructions, 64)


def write_delegate_program(path: Path, scale: float, cond: bool, backend: str = "EtbTestBackend"):
    """A hand-built program exercising a delegate call, a conditional jump, a move, a free and
    a kernel call: ``tmp = delegate(x)`` (x * scale); when ``cond`` is true ``y = x + x`` runs
    and is overwritten; ``t2 = move(tmp)``; ``y = t2 + x``. So ``y = x * (scale + 1)``.
    Input and output are Float [2, 3] in memory bank 1 (the only bank)."""
    import struct

    from etbuild.schema import (
        BackendDelegate,
        BackendDelegateDataReference,
        BackendDelegateInlineData,
        Bool,
        CompileSpec,
        DelegateCall,
        FreeCall,
        Int,
        JumpFalseCall,
        KernelCall,
        MoveCall,
        Null,
    )

    values = [
        _tensor(0),  # 0 x
        _tensor(32),  # 1 y
        _tensor(64),  # 2 tmp
        _scalar(Bool.BoolT, "boolVal", cond, "Bool"),  # 3 cond
        _scalar(Int.IntT, "intVal", 1, "Int"),  # 4 alpha
        _ev("Null", Null.NullT()),  # 5 move target
    ]
    dc = DelegateCall.DelegateCallT()
    dc.delegateIndex, dc.args = 0, [0, 2]
    jf = JumpFalseCall.JumpFalseCallT()
    jf.condValueIndex, jf.destinationInstruction = 3, 3
    k1 = KernelCall.KernelCallT()
    k1.opIndex, k1.args = 0, [0, 0, 4, 1, 1]
    mv = MoveCall.MoveCallT()
    mv.moveFrom, mv.moveTo = 2, 5
    k2 = KernelCall.KernelCallT()
    k2.opIndex, k2.args = 0, [5, 0, 4, 1, 1]
    fr = FreeCall.FreeCallT()
    fr.valueIndex = 2
    instructions = [
        _instr("DelegateCall", dc),
        _instr("JumpFalseCall", jf),
        _instr("KernelCall", k1),
        _instr("MoveCall", mv),
        _instr("KernelCall", k2),
        _instr("FreeCall", fr),
    ]
    spec = CompileSpec.CompileSpecT()
    spec.key, spec.value = "scale", list(struct.pack("<f", scale))
    ref = BackendDelegateDataReference.BackendDelegateDataReferenceT()
    ref.location, ref.index = 0, 0
    dlg = BackendDelegate.BackendDelegateT()
    dlg.id, dlg.processed, dlg.compileSpecs = backend, ref, [spec]
    blob = BackendDelegateInlineData.BackendDelegateInlineDataT()
    blob.data = list(b"ETBTEST")
    return _write_add_program(path, values, instructions, 96, [dlg], [blob])

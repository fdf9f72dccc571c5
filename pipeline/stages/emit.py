"""The `emit` stage: the planned program IR -> an ExecuTorch-format ``model.pte``.

Values are emitted in a deterministic order, immutable scalars and lists are shared, and
constants are deduplicated by content and laid out aligned in the constant segment, so the
same config always gives byte-identical files.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from .. import pte
from ..errors import EtbuildError
from ..ir import Delegate, DelegateCall, Instruction, Program, SymValue, TensorValue
from ..planner import Plan
from ..runner import Context
from ..scalar_types import SCALAR_TYPES

MEMORY_FORMATS = {
    torch.contiguous_format: 0,
    torch.preserve_format: 1,
    torch.channels_last: 2,
    torch.channels_last_3d: 3,
}


def tensor_bytes(t: torch.Tensor, dim_order: tuple[int, ...] | None = None) -> bytes:
    """The tensor's elements as the program stores them: in `dim_order` (None: contiguous)."""
    t = t.detach()
    if dim_order is not None:
        t = t.permute(dim_order)
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


class _Emitter:
    """Builds the value table, operator table and constant segment of one method."""

    def __init__(self, plan: Plan, constant_alignment: int) -> None:
        self.mods = _schema_modules()
        self.plan = plan
        self.constant_alignment = constant_alignment
        self.values: list[Any] = []
        self.cache: dict[Any, int] = {}
        self.operators: list[tuple[str, str]] = []
        self.op_index: dict[tuple[str, str], int] = {}
        self.constants = bytearray()
        self.constant_offsets: list[int] = [0]  # entry 0 is reserved
        self.constant_index: dict[str, int] = {}
        # Constants the plan copies into a bank at load: their initial data, ExecuTorch's
        # mutable data segment (a planned tensor whose data_buffer_idx indexes these offsets).
        self.copied = bytearray()
        self.copied_offsets: list[int] = [0]  # entry 0 is reserved
        self.delegates: list[Delegate] = []
        self.blobs: list[bytes] = []  # one segment each, after the constant segment
        self.blob_index: dict[str, int] = {}

    # -- values ------------------------------------------------------------------------

    def _add(self, kind: str, payload: Any, key: Any = None) -> int:
        if key is not None and key in self.cache:
            return self.cache[key]
        m = self.mods
        ev = m["EValue"].EValueT()
        ev.valType = getattr(m["KernelTypes"].KernelTypes, kind)
        ev.val = payload
        self.values.append(ev)
        index = len(self.values) - 1
        if key is not None:
            self.cache[key] = index
        return index

    def null(self) -> int:
        return self._add("Null", self.mods["Null"].NullT(), ("null",))

    def int_(self, v: int) -> int:
        t = self.mods["Int"].IntT()
        t.intVal = int(v)
        return self._add("Int", t, ("int", int(v)))

    def sym(self, v: SymValue) -> int:
        t = self.mods["Int"].IntT()
        t.intVal = 0
        return self._add("Int", t, ("sym", id(v)))

    def bool_(self, v: bool) -> int:
        t = self.mods["Bool"].BoolT()
        t.boolVal = bool(v)
        return self._add("Bool", t, ("bool", bool(v)))

    def double(self, v: float) -> int:
        t = self.mods["Double"].DoubleT()
        t.doubleVal = float(v)
        return self._add("Double", t, ("double", float(v).hex()))

    def string(self, v: str) -> int:
        t = self.mods["String"].StringT()
        t.stringVal = v
        return self._add("String", t, ("str", v))

    def int_list(self, items: list[Any]) -> int:
        idx = [self.sym(i) if isinstance(i, SymValue) else self.int_(i) for i in items]
        t = self.mods["IntList"].IntListT()
        t.items = idx
        return self._add("IntList", t, ("intlist", tuple(idx)))

    def double_list(self, items: list[float]) -> int:
        t = self.mods["DoubleList"].DoubleListT()
        t.items = [float(i) for i in items]
        return self._add("DoubleList", t, ("doublelist", tuple(float(i).hex() for i in items)))

    def bool_list(self, items: list[bool]) -> int:
        t = self.mods["BoolList"].BoolListT()
        t.items = [bool(i) for i in items]
        return self._add("BoolList", t, ("boollist", tuple(t.items)))

    def tensor_list(self, items: list[Any], optional: bool) -> int:
        idx = [self.null() if i is None else self.tensor(i) for i in items]
        kind = "OptionalTensorList" if optional else "TensorList"
        t = getattr(self.mods[kind], kind + "T")()
        t.items = idx
        return self._add(kind, t, (kind, tuple(idx)))

    def constant_buffer(self, v: TensorValue) -> int:
        raw = tensor_bytes(v.data, v.dim_order)
        digest = hashlib.sha256(raw).hexdigest()
        if digest not in self.constant_index:
            start = pte.align_up(len(self.constants), self.constant_alignment)
            self.constants += b"\0" * (start - len(self.constants)) + raw
            self.constant_offsets.append(start)
            self.constant_index[digest] = len(self.constant_offsets) - 1
        return self.constant_index[digest]

    def tensor(self, v: TensorValue) -> int:
        key = ("tensor", id(v))
        if key in self.cache:
            return self.cache[key]
        m = self.mods
        t = m["Tensor"].TensorT()
        if v.dtype not in SCALAR_TYPES:
            raise EtbuildError(f"tensor {v.name!r} has dtype {v.dtype}, which programs cannot hold")
        t.scalarType = SCALAR_TYPES[v.dtype]
        t.sizes = list(v.shape)
        t.dimOrder = list(v.dim_order or range(len(v.shape)))
        t.shapeDynamism = 1 if v.dynamic else 0
        copied = v.is_constant and id(v) in self.plan.location
        if v.is_constant and not copied:
            t.dataBufferIdx = self.constant_buffer(v)
        else:
            if copied:
                start = pte.align_up(len(self.copied), self.constant_alignment)
                self.copied += b"\0" * (start - len(self.copied)) + tensor_bytes(
                    v.data, v.dim_order
                )
                self.copied_offsets.append(start)
                t.dataBufferIdx = len(self.copied_offsets) - 1
            bank, offset = self.plan.where(v)
            a = m["AllocationDetails"].AllocationDetailsT()
            a.memoryId = bank + 1  # 1-based on the wire
            a.memoryOffsetLow = offset & 0xFFFFFFFF
            a.memoryOffsetHigh = offset >> 32
            t.allocationInfo = a
        return self._add("Tensor", t, key)

    def empty_tensor(self) -> int:
        """What ExecuTorch passes for a None given to a non-optional Tensor argument."""
        t = self.mods["Tensor"].TensorT()
        t.scalarType = 0
        t.sizes = [0]
        t.dimOrder = [0]
        return self._add("Tensor", t, ("empty_tensor",))

    def argument(self, value: Any, arg_type: torch.Type) -> int:
        if isinstance(value, TensorValue):
            return self.tensor(value)
        if isinstance(value, SymValue):
            return self.sym(value)
        if value is None:
            if isinstance(arg_type, torch.TensorType):
                return self.empty_tensor()
            return self.null()
        if isinstance(value, bool):
            return self.bool_(value)
        if isinstance(value, int):
            return self.int_(value)
        if isinstance(value, float):
            return self.double(value)
        if isinstance(value, torch.dtype):
            return self.int_(SCALAR_TYPES[value])
        if isinstance(value, torch.memory_format):
            return self.int_(MEMORY_FORMATS[value])
        if isinstance(value, torch.layout):
            return self.int_(0 if value == torch.strided else 1)
        if isinstance(value, torch.device):
            return self.null()
        if isinstance(value, str):
            return self.string(value)
        if isinstance(value, (list, tuple)):
            elem = _element_type(arg_type)
            if isinstance(elem, (torch.IntType, torch.SymIntType)) or (
                elem is None and all(isinstance(i, (int, SymValue)) for i in value)
            ):
                return self.int_list(list(value))
            if isinstance(elem, torch.FloatType):
                return self.double_list(list(value))
            if isinstance(elem, torch.BoolType):
                return self.bool_list(list(value))
            if isinstance(elem, torch.OptionalType):
                return self.tensor_list(list(value), optional=True)
            return self.tensor_list(list(value), optional=False)
        raise EtbuildError(f"cannot emit argument {value!r} of type {arg_type}")

    # -- instructions -------------------------------------------------------------------

    def instruction(self, ins: Instruction | DelegateCall):
        return self.delegate_call(ins) if isinstance(ins, DelegateCall) else self.kernel_call(ins)

    def delegate_call(self, ins: DelegateCall):
        """A DelegateCall: args are the inputs, then the outputs (ExecuTorch's order)."""
        m = self.mods
        if ins.delegate not in self.delegates:
            self.delegates.append(ins.delegate)
        call = m["DelegateCall"].DelegateCallT()
        call.delegateIndex = self.delegates.index(ins.delegate)
        call.args = [self.tensor(v) for v in [*ins.args, *ins.returns]]
        instr = m["Instruction"].InstructionT()
        instr.instrArgsType = m["InstructionArguments"].InstructionArguments.DelegateCall
        instr.instrArgs = call
        return instr

    def backend_delegates(self) -> list[Any]:
        """The delegate table; each blob goes to a segment (identical blobs share one)."""
        m = self.mods
        table = []
        for d in self.delegates:
            digest = hashlib.sha256(d.processed).hexdigest()
            if digest not in self.blob_index:
                self.blob_index[digest] = len(self.blobs)
                self.blobs.append(d.processed)
            ref = m["BackendDelegateDataReference"].BackendDelegateDataReferenceT()
            ref.location = m["DataLocation"].DataLocation.SEGMENT
            ref.index = 1 + self.blob_index[digest]  # segment 0 holds the constants
            specs = []
            for key, value in d.compile_specs:
                spec = m["CompileSpec"].CompileSpecT()
                spec.key, spec.value = key, list(value)
                specs.append(spec)
            bd = m["BackendDelegate"].BackendDelegateT()
            bd.id, bd.processed, bd.compileSpecs = d.backend_id, ref, specs
            table.append(bd)
        return table

    def kernel_call(self, ins: Instruction):
        m = self.mods
        key = (ins.op.qualified_name, ins.op.overload)
        if key not in self.op_index:
            self.op_index[key] = len(self.operators)
            self.operators.append(key)
        args = [
            self.argument(v, a.type) for v, a in zip(ins.args, ins.op.schema.arguments, strict=True)
        ]
        outs = [self.argument(r, None) for r in ins.returns]
        if len(outs) > 1:  # several returns travel as one TensorList, as ExecuTorch emits them
            t = m["TensorList"].TensorListT()
            t.items = outs
            outs = [self._add("TensorList", t)]
        call = m["KernelCall"].KernelCallT()
        call.opIndex = self.op_index[key]
        call.args = args + outs
        instr = m["Instruction"].InstructionT()
        instr.instrArgsType = m["InstructionArguments"].InstructionArguments.KernelCall
        instr.instrArgs = call
        return instr


def _element_type(arg_type: torch.Type | None) -> torch.Type | None:
    t = arg_type
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    if isinstance(t, torch.ListType):
        return t.getElementType()
    return None


def _schema_modules() -> dict[str, Any]:
    """The flatc-generated modules (etbuild.schema is built from program.fbs at install)."""
    import importlib

    pte.check_schema_installed()

    names = [
        "AllocationDetails", "BackendDelegate", "BackendDelegateDataReference", "Bool",
        "BoolList", "Chain", "CompileSpec", "ContainerMetadata", "DataLocation", "DataSegment",
        "DelegateCall", "Double", "DoubleList", "EValue", "ExecutionPlan", "Instruction",
        "InstructionArguments", "Int", "IntList", "KernelCall", "KernelTypes", "NamedData",
        "Null", "Operator", "OptionalTensorList", "Program", "String", "SubsegmentOffsets",
        "Tensor", "TensorList",
    ]  # fmt: skip
    return {n: importlib.import_module(f"etbuild.schema.{n}") for n in names}


def bank_table_of(plan: Plan, method: str) -> pte.BankTable:
    """The memory bank table of a plan: its banks' names, planned sizes and alignments (the
    plan's ``bank_alignments``; memory.alignment where it gives none) and scratch region."""
    alignments = list(plan.bank_alignments) or [plan.alignment] * len(plan.bank_names)
    return pte.BankTable(
        method=method,
        names=list(plan.bank_names),
        sizes=[int(s) for s in plan.bank_sizes],
        alignments=[int(a) for a in alignments],
        scratch=plan.scratch,
    )


def emit_program(
    program: Program,
    plan: Plan,
    constant_alignment: int,
    segment_alignment: int,
    bank_table: bool = True,
) -> tuple[bytes, dict[str, int]]:
    """Serialize one "forward" method; returns (file bytes, facts for the report).
    ``bank_table``: record the banks' names, sizes, alignments and scratch region (named data
    ``etbuild.memory_banks``); without it the file is what etbuild wrote before it had one."""
    e = _Emitter(plan, constant_alignment)
    m = e.mods
    # Constants first in first-use order, then inputs, then instruction by instruction.
    for ins in program.instructions:
        for t in ins.tensors():
            if t.is_constant:
                e.tensor(t)
    inputs = [e.tensor(v) for v in program.inputs]
    instructions = [e.instruction(ins) for ins in program.instructions]
    outputs = [e.tensor(v) for v in program.outputs]

    chain = m["Chain"].ChainT()
    chain.inputs, chain.outputs, chain.instructions = [], [], instructions
    meta = m["ContainerMetadata"].ContainerMetadataT()
    meta.encodedInpStr, meta.encodedOutStr = program.in_spec, program.out_spec
    plan_t = m["ExecutionPlan"].ExecutionPlanT()
    plan_t.name = "forward"
    plan_t.containerMetaType = meta
    plan_t.values = e.values
    plan_t.inputs = inputs
    plan_t.outputs = outputs
    plan_t.chains = [chain]
    ops = []
    for name, overload in e.operators:
        op = m["Operator"].OperatorT()
        op.name, op.overload = name, overload
        ops.append(op)
    plan_t.operators = ops
    plan_t.delegates = e.backend_delegates()
    plan_t.nonConstBufferSizes = [0] + list(plan.bank_sizes)

    constants = bytes(e.constants)
    prog = m["Program"].ProgramT()
    prog.version = 0
    prog.executionPlan = [plan_t]
    prog.constantBuffer = []
    prog.backendDelegateData = []
    # The memory bank table (names, sizes, alignments, scratch region), then the checksums of
    # the flatbuffer and the other segments (filled in once serialized); the runtime finds each
    # through a named data entry, which ExecuTorch's runtime ignores.
    segments = [constants, *e.blobs]
    prog.mutableDataSegments = []
    if e.copied:
        segments.append(bytes(e.copied))
        copied = m["SubsegmentOffsets"].SubsegmentOffsetsT()
        copied.segmentIndex = len(segments) - 1
        copied.offsets = e.copied_offsets
        prog.mutableDataSegments.append(copied)
    named_data = []
    if bank_table:
        segments.append(pte.encode_bank_tables([bank_table_of(plan, "forward")]))
        named_data.append((pte.BANKS_KEY, len(segments) - 1))
    segments.append(bytes(pte.checksums_size(len(segments) + 1)))
    named_data.append((pte.CHECKSUMS_KEY, len(segments) - 1))
    prog.namedData = []
    for key, index in named_data:
        named = m["NamedData"].NamedDataT()
        named.key, named.segmentIndex = key, index
        prog.namedData.append(named)
    prog.segments = []
    for offset, size in pte.segment_layout([len(s) for s in segments], segment_alignment):
        seg = m["DataSegment"].DataSegmentT()
        seg.offset, seg.size = offset, size
        prog.segments.append(seg)
    cs = m["SubsegmentOffsets"].SubsegmentOffsetsT()
    cs.segmentIndex = 0
    cs.offsets = e.constant_offsets
    prog.constantSegment = cs
    data = pte.serialize(prog, segments, segment_alignment)
    facts = {
        "values": len(e.values),
        "instructions": len(instructions),
        "operators": len(ops),
        "constants": len(e.constant_offsets) - 1,
        "constant_bytes": len(constants),
        "copied_constants": len(e.copied_offsets) - 1,
        "copied_constant_bytes": len(e.copied),
        "delegates": len(e.delegates),
        "delegate_bytes": sum(len(b) for b in e.blobs),
        "file_bytes": len(data),
    }
    return data, facts


def run(ctx: Context) -> None:
    ecfg = ctx.cfg.pipeline.emit
    data, facts = emit_program(
        ctx.artifacts["program"],
        ctx.artifacts["plan"],
        ecfg.constant_alignment,
        ecfg.segment_alignment,
    )
    ctx.write("model.pte", data)
    ctx.artifacts["emit_facts"] = facts
    ctx.artifacts["program_inputs"] = [
        [[int(d) for d in v.shape], str(v.dtype).removeprefix("torch.")]
        for v in ctx.artifacts["program"].inputs
    ]
    ctx.summarize(**facts)
    ctx.measure(program_bytes=facts["file_bytes"])

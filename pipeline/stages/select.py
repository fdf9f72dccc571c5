"""The `select` stage: selected_operators.yaml, each operator with the dtypes it is used with.

The selection is read from program files, not from the pipeline's in-memory graph, so this
run's model.pte, the other programs an app ships (``selection.programs``: .pte files from any
ExecuTorch-format producer, or selected_operators.yaml of other builds) and a hand-written,
pinned kernel set (``selection.operators``) all go through the same code.

``backends`` lists the delegate backends (BackendDelegate ids) the programs call: the runtime
links those and no other.

Per operator: ``count`` (calls) and ``dtypes``: for every tensor argument (outputs and tensor
list items included) the dtypes it has, and for every Scalar argument the kind of scalar the
program passes (Long, Double or Bool), so mixed-dtype calls select exactly what they use.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from omegaconf import OmegaConf

from .. import pte
from ..errors import EtbuildError
from ..ops import OpDef, load_ops
from ..runner import Context, sha256_bytes
from ..scalar_types import DTYPE_NAMES, DTYPES

Selection = dict[str, dict]  # op key -> {"count": int, "dtypes": {argument: [dtype names]}}

# The EValue kinds a Scalar argument may hold, and the dtype name each is recorded as.
SCALAR_KINDS = {"Int": "Long", "Double": "Double", "Bool": "Bool"}


def is_scalar_arg(arg) -> bool:
    """True for a ``Scalar`` or ``Scalar?`` schema argument (recorded as Long/Double/Bool)."""
    t = arg.type
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.NumberType)


def _value_kinds(values, index: int, scalar: bool) -> list[str]:
    """The dtype names an argument value contributes to the selection."""
    from etbuild.schema.KernelTypes import KernelTypes

    if index < 0 or index >= len(values):
        return []
    v = values[index]
    if v.valType == KernelTypes.Tensor:
        dtype = DTYPES.get(v.val.scalarType)
        return [DTYPE_NAMES.get(dtype, str(dtype))]
    if v.valType in (KernelTypes.TensorList, KernelTypes.OptionalTensorList):
        return [k for i in v.val.items for k in _value_kinds(values, int(i), False)]
    if scalar:
        for kind, name in SCALAR_KINDS.items():
            if v.valType == getattr(KernelTypes, kind):
                return [name]
    return []


def program_selection(data: bytes, label: str, ops: dict[str, OpDef]) -> Selection:
    """The selection of one program file (every method)."""
    from etbuild.schema.InstructionArguments import InstructionArguments

    try:
        program = pte.read(data).program
    except EtbuildError as exc:
        raise EtbuildError(f"{label}: {exc}") from None
    counts: dict[str, int] = defaultdict(int)
    dtypes: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    unknown: set[str] = set()
    for plan in program.executionPlan or []:
        values = plan.values or []
        operators = plan.operators or []
        for chain in plan.chains or []:
            for ins in chain.instructions or []:
                if ins.instrArgsType != InstructionArguments.KernelCall:
                    continue
                call = ins.instrArgs
                if not 0 <= call.opIndex < len(operators):
                    raise EtbuildError(
                        f"{label}: an instruction names operator {call.opIndex}, "
                        f"but the program has {len(operators)}"
                    )
                op = operators[call.opIndex]
                name = (op.name or b"").decode()
                overload = (op.overload or b"").decode()
                key = f"{name}.{overload}" if overload else name
                opdef = ops.get(key)
                if opdef is None:
                    unknown.add(key)
                    continue
                counts[key] += 1
                args = [] if call.args is None else [int(i) for i in call.args]
                for arg, index in zip(opdef.schema.arguments, args, strict=False):
                    for kind in _value_kinds(values, index, is_scalar_arg(arg)):
                        dtypes[key][arg.name].add(kind)
    if unknown:
        raise EtbuildError(
            f"{label} uses operators that ops_yaml has no kernel for: {', '.join(sorted(unknown))}"
        )
    return {
        key: {
            "count": counts[key],
            "dtypes": {a: sorted(d) for a, d in sorted(dtypes[key].items())},
        }
        for key in sorted(counts)
    }


def program_backends(data: bytes, label: str) -> list[str]:
    """The ids of the delegate backends a program file calls."""
    try:
        program = pte.read(data).program
    except EtbuildError as exc:
        raise EtbuildError(f"{label}: {exc}") from None
    return sorted(
        {
            (d.id or b"").decode()
            for plan in program.executionPlan or []
            for d in plan.delegates or []
        }
    )


def file_backends(path_text: str) -> list[str]:
    """The backends of a ``selection.programs`` entry (a .pte, or a selection file's
    ``backends`` list)."""
    path = Path(path_text).expanduser()
    if path.suffix in (".yaml", ".yml"):
        return sorted(yaml.safe_load(path.read_text()).get("backends") or [])
    return program_backends(path.read_bytes(), str(path))


def union(selections: list[Selection]) -> Selection:
    """Every operator of every selection, with the union of its dtypes and the sum of calls."""
    out: dict[str, dict] = {}
    for sel in selections:
        for key, info in sel.items():
            entry = out.setdefault(key, {"count": 0, "dtypes": {}})
            entry["count"] += info.get("count", 0)
            for arg, names in info.get("dtypes", {}).items():
                entry["dtypes"][arg] = sorted(set(entry["dtypes"].get(arg, [])) | set(names))
    return {
        k: {"count": v["count"], "dtypes": dict(sorted(v["dtypes"].items()))}
        for k, v in sorted(out.items())
    }


def _load_yaml_selection(path: Path, ops: dict[str, OpDef]) -> Selection:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise EtbuildError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("operators"), dict):
        raise EtbuildError(f"{path}: a selection file has an 'operators' mapping at its top")
    return pinned_selection(doc["operators"], str(path), ops, fill_unlisted=False)


def program_file_selection(path_text: str, ops: dict[str, OpDef]) -> tuple[Selection, str]:
    """The selection of ``selection.programs`` entry: a .pte or a selected_operators.yaml."""
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise EtbuildError(
            f"selection.programs: {path_text!r} is not a file; list .pte program files or "
            "selected_operators.yaml files of other builds"
        )
    data = path.read_bytes()
    if path.suffix in (".yaml", ".yml"):
        return _load_yaml_selection(path, ops), sha256_bytes(data)
    try:
        return program_selection(data, str(path), ops), sha256_bytes(data)
    except EtbuildError as exc:
        raise EtbuildError(f"selection.programs: {exc}") from None


def pinned_selection(
    entries: dict, label: str, ops: dict[str, OpDef], fill_unlisted: bool = True
) -> Selection:
    """A written kernel set: op key -> null or ``{dtypes: {argument: [dtype names]}}``, checked
    against ops_yaml. With ``fill_unlisted`` (a hand-written pin), tensor arguments it does not
    list get every dtype ops_yaml lists; without (another build's selection), none."""
    out: Selection = {}
    for key, spec in entries.items():
        opdef = ops.get(key)
        if opdef is None:
            raise EtbuildError(
                f"{label}: {key!r} is not an operator ops_yaml has; keys look like "
                f"'aten::add.out' (known: {', '.join(sorted(ops))})"
            )
        spec = spec or {}
        if not isinstance(spec, dict) or set(spec) - {"count", "dtypes"}:
            raise EtbuildError(
                f"{label}: {key}: give null (every dtype) or {{dtypes: {{argument: [dtypes]}}}}"
            )
        supported = {a: [DTYPE_NAMES[d] for d in ds] for a, ds in opdef.dtypes.items()}
        scalar_args = {a.name for a in opdef.schema.arguments if is_scalar_arg(a)}
        given = spec.get("dtypes") or {}
        dtypes = dict(supported) if fill_unlisted else {}
        for arg, names in given.items():
            names = [names] if isinstance(names, str) else list(names)
            allowed = supported.get(arg)
            if allowed is None and arg in scalar_args:
                allowed = sorted(SCALAR_KINDS.values())
            if allowed is None:
                raise EtbuildError(
                    f"{label}: {key} has no tensor or Scalar argument {arg!r}; its arguments "
                    f"with dtypes are {', '.join(sorted(supported) + sorted(scalar_args))}"
                )
            bad = [n for n in names if n not in allowed]
            if bad:
                raise EtbuildError(
                    f"{label}: {key} argument {arg!r}: {', '.join(map(str, bad))} not supported; "
                    f"ops_yaml lists {', '.join(allowed)}"
                )
            dtypes[arg] = sorted(names)
        out[key] = {"count": int(spec.get("count", 0)), "dtypes": dict(sorted(dtypes.items()))}
    return dict(sorted(out.items()))


def missing_from(pinned: Selection, needed: Selection) -> list[str]:
    """What ``needed`` uses that ``pinned`` lacks, as 'op (argument: dtypes)' strings."""
    missing = []
    for key, info in needed.items():
        if key not in pinned:
            missing.append(key)
            continue
        have = pinned[key]["dtypes"]
        gaps = [
            f"{arg}: {'/'.join(sorted(set(names) - set(have[arg])))}"
            for arg, names in info["dtypes"].items()
            if arg in have and set(names) - set(have[arg])
        ]
        if gaps:
            missing.append(f"{key} ({', '.join(gaps)})")
    return missing


@dataclass
class ConfiguredSelection:
    """What the config adds to a program's own selection."""

    programs: list[tuple[str, Selection, str]]  # (path, selection, sha256)
    pinned: Selection | None


def configured(scfg) -> ConfiguredSelection:
    """``selection.programs`` read and ``selection.operators`` checked; raises on bad input,
    so the command calls it before any stage runs."""
    ops = load_ops()
    programs = [(path, *program_file_selection(path, ops)) for path in scfg.programs]
    pinned = None
    if scfg.operators:
        entries = OmegaConf.to_container(scfg.operators, resolve=True)
        pinned = pinned_selection(entries, "selection.operators", ops)
    return ConfiguredSelection(programs, pinned)


def run(ctx: Context) -> None:
    extra = configured(ctx.cfg.selection)
    selections = [program_selection(ctx.read("model.pte"), "model.pte", load_ops())]
    for path, sel, digest in extra.programs:
        ctx.note_read(f"selection.programs:{path}", digest)
        selections.append(sel)
    selection = union(selections)
    if extra.pinned is not None:
        missing = missing_from(extra.pinned, selection)
        if missing:
            who = "the programs use" if len(selections) > 1 else "this program uses"
            raise EtbuildError(
                f"the pinned kernel set (selection.operators) lacks what {who}: "
                f"{'; '.join(missing)}; add them to selection.operators, or drop the pin to "
                "select exactly what is used"
            )
        for key, info in extra.pinned.items():
            info["count"] = selection.get(key, {}).get("count", 0)
        selection = extra.pinned
    backends = set(program_backends(ctx.read("model.pte"), "model.pte"))
    for path, _, _ in extra.programs:
        backends.update(file_backends(path))
    ctx.artifacts["selection"] = selection
    ctx.artifacts["backends"] = sorted(backends)
    doc = {"operators": selection}
    if backends:
        doc["backends"] = sorted(backends)  # the delegate backends the runtime links
    ctx.write("selected_operators.yaml", yaml.safe_dump(doc, sort_keys=True).encode())
    ctx.summarize(ops=len(selection), programs=len(selections), backends=len(backends))

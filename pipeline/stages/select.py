"""The `select` stage: selected_operators.yaml, each op with the dtypes it is used with."""

from __future__ import annotations

from collections import defaultdict

import yaml

from ..ir import Program, TensorValue
from ..ops import DTYPE_TO_NAME
from ..runner import Context


def selected_operators(program: Program) -> dict:
    """{op key: {"count": n, "dtypes": {argument: [dtype names]}}} for one program.

    Dtypes are recorded per tensor argument (outputs included), so a mixed-dtype call such as
    an embedding (Long indices, Float weights) selects exactly the combinations it needs.
    """
    counts: dict[str, int] = defaultdict(int)
    dtypes: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for ins in program.instructions:
        key = ins.op.key
        counts[key] += 1
        for arg, value in zip(ins.op.schema.arguments, ins.args, strict=True):
            items = value if isinstance(value, (list, tuple)) else [value]
            for v in items:
                if isinstance(v, TensorValue):
                    dtypes[key][arg.name].add(DTYPE_TO_NAME.get(v.dtype, str(v.dtype)))
    return {
        key: {
            "count": counts[key],
            "dtypes": {a: sorted(d) for a, d in sorted(dtypes[key].items())},
        }
        for key in sorted(counts)
    }


def run(ctx: Context) -> None:
    selection = selected_operators(ctx.artifacts["program"])
    ctx.artifacts["selection"] = selection
    doc = {"operators": selection}
    ctx.write("selected_operators.yaml", yaml.safe_dump(doc, sort_keys=True).encode())
    ctx.summarize(ops=len(selection))

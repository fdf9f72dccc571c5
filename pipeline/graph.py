"""The graph the lowering passes work on: an FX graph plus the constants it reads.

After export, parameters, buffers and lifted constants are placeholders of the graph. Here each
such placeholder carries its tensor in ``Graph.constants``; passes can add new constants
(folded weights) and remove dead ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import fx

_TORCH_DIR = re.escape(str(__import__("pathlib").Path(torch.__file__).parent))
_FRAME = re.compile(
    r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n\s*(?P<code>[^\n]*)'
)


@dataclass
class Graph:
    """An exported graph with its constants bound."""

    fx_graph: fx.Graph
    constants: dict[str, torch.Tensor]  # placeholder name -> tensor
    input_names: list[str]  # user-input placeholder names, in order
    in_spec: object = None  # pytree spec of the user inputs
    out_spec: object = None
    dynamic: bool = False
    notes: list[str] = field(default_factory=list)

    def is_const(self, node: object) -> bool:
        return (
            isinstance(node, fx.Node) and node.op == "placeholder" and node.name in self.constants
        )

    def const(self, node: fx.Node) -> torch.Tensor:
        return self.constants[node.name]

    def add_const(self, tensor: torch.Tensor, hint: str) -> fx.Node:
        """A new constant placeholder holding ``tensor`` (placed before the user inputs)."""
        base = re.sub(r"\W", "_", hint)
        name, i = base, 0
        existing = {n.name for n in self.fx_graph.nodes}
        while name in existing or name in self.constants:
            i += 1
            name = f"{base}_{i}"
        first = next(iter(self.fx_graph.nodes))
        with self.fx_graph.inserting_before(first):
            node = self.fx_graph.placeholder(name)
        node.meta["val"] = tensor
        self.constants[node.name] = tensor.detach().contiguous()
        return node

    def drop_dead(self) -> None:
        """Remove nodes nothing uses, including unused constant placeholders."""
        changed = True
        while changed:
            changed = False
            for node in reversed(list(self.fx_graph.nodes)):
                if node.users or node.op == "output":
                    continue
                if node.op == "call_function" or self.is_const(node):
                    self.constants.pop(node.name, None)
                    self.fx_graph.erase_node(node)
                    changed = True

    def call_nodes(self) -> list[fx.Node]:
        return [n for n in self.fx_graph.nodes if n.op == "call_function"]

    def execute(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        """Run the graph in eager torch, every tensor contiguous as in the runtime.

        A reference execution of the lowered program (int8 ops run their Python reference
        implementations), for checking lowering and kernels.
        """
        it = iter(inputs)
        args = [
            self.constants[n.name] if n.name in self.constants else next(it)
            for n in self.fx_graph.nodes
            if n.op == "placeholder"
        ]
        gm = fx.GraphModule(torch.nn.Module(), self.fx_graph)
        out = _Contiguous(gm).run(*args)
        return list(out) if isinstance(out, (list, tuple)) else [out]


class _Contiguous(fx.Interpreter):
    """An interpreter that makes every tensor it produces contiguous."""

    def run_node(self, n: fx.Node) -> object:
        out = super().run_node(n)
        return out.contiguous() if isinstance(out, torch.Tensor) else out


def source_of(node: fx.Node) -> str:
    """ "file:line  code" of the innermost model frame (outside torch) that made ``node``."""
    trace = node.meta.get("stack_trace") or ""
    frames = list(_FRAME.finditer(trace))
    user = [f for f in frames if not re.match(_TORCH_DIR, f["file"])]
    chosen = (user or frames)[-1] if (user or frames) else None
    if chosen is None:
        return "<unknown source>"
    return f"{chosen['file']}:{chosen['line']}  {chosen['code'].strip()}"


# torch_fn's "<kind>.<name>" -> how users write the call.
_CALL_PREFIX = {
    "function": "F.",
    "builtin_function_or_method": "torch.",
    "method_descriptor": "Tensor.",
}


def origin_of(node: fx.Node) -> str:
    """The torch-level call and module that made ``node``: "F.unfold in nn.Unfold 'enc.unfold'".

    An ATen op that the user never wrote (a piece of nn.GRU, of F.scaled_dot_product_attention)
    is named by what the user did write: the innermost module (``nn_module_stack``) and the
    function or method called (``torch_fn``). "" when export recorded neither.
    """
    parts = []
    fn = node.meta.get("torch_fn")
    if fn and "." in fn[1]:
        kind, name = fn[1].rsplit(".", 1)
        if kind == "function" and not hasattr(torch.nn.functional, name):
            kind = ""  # a user's own function: its line says more than its name
        if kind == "builtin_function_or_method":
            same = getattr(torch.nn.functional, name, None)
            if same is not None and same is getattr(torch, name, None):
                kind = "function"  # F.conv2d is torch.conv2d: users know it as F.conv2d
            name = re.sub(r"^(special|linalg|fft)_", r"\1.", name)  # torch.special.erfcx
        if kind in _CALL_PREFIX:
            parts.append(_CALL_PREFIX[kind] + name)
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, cls = list(stack.values())[-1]
        cls = cls if isinstance(cls, str) else f"{cls.__module__}.{cls.__qualname__}"
        short = cls.rsplit(".", 1)[-1]
        kind = f"nn.{short}" if cls.startswith("torch.nn.") else short
        parts.append(f"{kind} '{path}'" if path else kind)
    return " in ".join(parts)


def is_static(node: fx.Node) -> bool:
    """True when the node's value has a fully static shape."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return all(isinstance(s, int) for s in val.shape)
    if isinstance(val, (list, tuple)):
        return all(
            not isinstance(v, torch.Tensor) or all(isinstance(s, int) for s in v.shape) for v in val
        )
    return isinstance(val, (int, float, bool))

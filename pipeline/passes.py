"""Graph passes of the `lower` stage, each a function of a ``Graph`` that edits it in place."""

from __future__ import annotations

import operator

import torch
from torch import fx

from .graph import Graph, is_static

aten = torch.ops.aten

# View ops and the copy op that materializes them when they do need data movement.
VIEW_TO_COPY: dict[object, object] = {
    aten.view.default: aten.view_copy.default,
    aten._unsafe_view.default: aten.view_copy.default,
    aten.reshape.default: aten.view_copy.default,
    aten.permute.default: aten.permute_copy.default,
    aten.t.default: aten.t_copy.default,
    aten.transpose.int: aten.transpose_copy.int,
    aten.expand.default: aten.expand_copy.default,
    aten.slice.Tensor: aten.slice_copy.Tensor,
    aten.select.int: aten.select_copy.int,
    aten.squeeze.dim: aten.squeeze_copy.dim,
    aten.squeeze.dims: aten.squeeze_copy.dims,
    aten.squeeze.default: aten.squeeze_copy.default,
    aten.unsqueeze.default: aten.unsqueeze_copy.default,
}

# Views that reinterpret a contiguous tensor's sizes without moving data.
_RESHAPES = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.view_copy.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.squeeze_copy.dim,
    aten.squeeze_copy.dims,
    aten.unsqueeze.default,
    aten.unsqueeze_copy.default,
}
_PERMUTES = {aten.permute.default, aten.permute_copy.default}


def _val(node: object) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def is_pure_view(node: fx.Node) -> bool:
    """True when ``node`` only renames the sizes of its contiguous input: no data moves.

    All tensors in an etbuild program are contiguous, so a reshape always qualifies, and so
    does a permute that keeps the order of every dimension larger than one. Only static
    shapes qualify: a dynamic view's sizes must be computed at run time by a kernel.
    """
    if node.op != "call_function" or not node.args or not is_static(node):
        return False
    src = node.args[0]
    if not isinstance(src, fx.Node) or not is_static(src):
        return False
    out, inp = _val(node), _val(src)
    if out is None or inp is None or out.dtype != inp.dtype or out.numel() != inp.numel():
        return False
    if node.target in _RESHAPES:
        return True
    if node.target in _PERMUTES:
        dims = [d % inp.dim() for d in node.args[1]]
        moved = [d for d in dims if inp.shape[d] != 1]
        return moved == sorted(moved)
    return False


def _same_shape_and_dtype(a: object, b: object) -> bool:
    va, vb = _val(a), _val(b)
    return va is not None and vb is not None and va.shape == vb.shape and va.dtype == vb.dtype


def _is_noop(node: fx.Node) -> bool:
    """Copies and views whose output equals their input."""
    t = node.target
    if not node.args or not isinstance(node.args[0], fx.Node):
        return False
    src = node.args[0]
    if t in (aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default):
        return True
    if t == aten.clone.default:
        fmt = node.kwargs.get("memory_format")
        return fmt in (None, torch.contiguous_format, torch.preserve_format)
    if t == aten._to_copy.default:
        allowed = {"dtype", "layout", "device", "memory_format", "non_blocking"}
        if set(node.kwargs) - allowed or node.kwargs.get("memory_format") == torch.channels_last:
            return False
        return _same_shape_and_dtype(node, src)
    if t in _RESHAPES or t in (aten.expand.default, aten.expand_copy.default):
        return _same_shape_and_dtype(node, src) and is_static(node)
    if t in _PERMUTES:
        return list(node.args[1]) == list(range(len(node.args[1])))
    if t in (aten.slice.Tensor, aten.slice_copy.Tensor):
        return _same_shape_and_dtype(node, src) and is_static(node)
    return False


def drop_noops(g: Graph) -> int:
    """Replace no-op copies and same-shape views by their input. Returns how many."""
    count = 0
    for node in g.call_nodes():
        if _is_noop(node):
            node.replace_all_uses_with(node.args[0])
            g.fx_graph.erase_node(node)
            count += 1
    return count


def wrap_scalar_tensor_args(g: Graph) -> int:
    """Turn Python numbers passed where the schema wants a Tensor into 0-dim constants.

    (``x + 1.0`` exports as ``add.Tensor(x, 1.0)``; the out variant needs a tensor.)
    """
    count = 0
    for node in g.call_nodes():
        if not isinstance(node.target, torch._ops.OpOverload):
            continue
        out = _val(node)
        args = list(node.args)
        if _symbolic_tensor_arg(node) and hasattr(node.target.overloadpacket, "Scalar"):
            # ``x + x.shape[0]``: a run-time size where a tensor is expected. The .Scalar
            # overload takes it as a Scalar (and the op check names it if it has no kernel).
            node.target = node.target.overloadpacket.Scalar
            continue
        for i, arg in enumerate(node.target._schema.arguments[: len(args)]):
            value = args[i]
            if isinstance(arg.type, torch.TensorType) and isinstance(value, (int, float, bool)):
                dtype = out.dtype if out is not None and out.dtype != torch.bool else None
                if dtype is None:
                    peer = next((a for a in args if _val(a) is not None), None)
                    dtype = _val(peer).dtype if peer is not None else torch.float32
                args[i] = g.add_const(torch.tensor(value, dtype=dtype), f"scalar_{node.name}")
                count += 1
        node.args = tuple(args)
    return count


def _symbolic_tensor_arg(node: fx.Node) -> bool:
    """True when a Tensor argument of ``node`` is a symbolic size (a SymInt node)."""
    for arg, value in zip(node.target._schema.arguments, node.args, strict=False):
        if isinstance(arg.type, torch.TensorType) and isinstance(value, fx.Node):
            if isinstance(value.meta.get("val"), torch.SymInt):
                return True
    return False


def _getitem_users(node: fx.Node) -> dict[int, fx.Node]:
    return {u.args[1]: u for u in node.users if u.target is operator.getitem}


def fold_batchnorm(g: Graph) -> tuple[int, int]:
    """Fold inference batch norm into the preceding convolution or linear layer.

    A batch norm with no such producer becomes a per-channel multiply and add.
    Returns (folded, rewritten).
    """
    folded = rewritten = 0
    for bn in g.call_nodes():
        if bn.target != aten._native_batch_norm_legit_no_training.default:
            continue
        x, w, b, mean, var, _momentum, eps = bn.args
        users = _getitem_users(bn)
        if set(users) - {0} or len(bn.users) != len(users) or 0 not in users:
            continue
        if not all(a is None or g.is_const(a) for a in (w, b)) or not (
            g.is_const(mean) and g.is_const(var)
        ):
            continue
        mean_t, var_t = g.const(mean), g.const(var)
        scale = torch.rsqrt(var_t.double() + eps)
        if w is not None:
            scale = scale * g.const(w).double()
        shift = -mean_t.double() * scale
        if b is not None:
            shift = shift + g.const(b).double()
        out = users[0]
        if _fold_into_producer(g, x, scale, shift):
            out.replace_all_uses_with(x)
            folded += 1
        else:
            rank = _val(x).dim()
            shape = [-1] + [1] * (rank - 2) if rank >= 2 else [-1]
            dtype = _val(x).dtype
            s = g.add_const(scale.to(dtype).reshape(shape), f"{bn.name}_scale")
            t = g.add_const(shift.to(dtype).reshape(shape), f"{bn.name}_shift")
            with g.fx_graph.inserting_before(out):
                mul = g.fx_graph.call_function(aten.mul.Tensor, (x, s))
                add = g.fx_graph.call_function(aten.add.Tensor, (mul, t))
            for n in (mul, add):
                n.meta = dict(out.meta)
            out.replace_all_uses_with(add)
            rewritten += 1
        g.fx_graph.erase_node(out)
        g.fx_graph.erase_node(bn)
    return folded, rewritten


def _fold_into_producer(g: Graph, x: fx.Node, scale: torch.Tensor, shift: torch.Tensor) -> bool:
    """Scale the producer's output channels by ``scale`` and add ``shift``, if it can."""
    if len(x.users) != 1 or x.op != "call_function":
        return False
    if x.target == aten.convolution.default:
        _inp, weight, bias, _s, _p, _d, transposed, *_rest = x.args
        if transposed or not g.is_const(weight) or not (bias is None or g.is_const(bias)):
            return False
        w = g.const(weight)
        new_w = (w.double() * scale.reshape([-1] + [1] * (w.dim() - 1))).to(w.dtype)
        old_b = g.const(bias).double() if bias is not None else torch.zeros_like(scale)
        new_b = (old_b * scale + shift).to(w.dtype)
        args = list(x.args)
        args[1] = g.add_const(new_w, f"{x.name}_weight_bn")
        args[2] = g.add_const(new_b, f"{x.name}_bias_bn")
        x.args = tuple(args)
        return True
    if x.target == aten.addmm.default and not x.kwargs:
        bias, _inp, mat2 = x.args[:3]
        if len(x.args) > 3 or not (g.is_const(bias) and g.is_const(mat2)):
            return False
        w = g.const(mat2)  # [in, out]
        if w.dim() != 2 or w.shape[1] != scale.numel():
            return False
        new_w = (w.double() * scale.reshape(1, -1)).to(w.dtype)
        new_b = (g.const(bias).double() * scale + shift).to(w.dtype)
        x.args = (
            g.add_const(new_b, f"{x.name}_bias_bn"),
            x.args[1],
            g.add_const(new_w, f"{x.name}_weight_bn"),
        )
        return True
    return False


_FOLD_LIMIT = 1 << 20  # elements a folded constant may have beyond its inputs


def split_into_slices(g: Graph) -> int:
    """``split_with_sizes`` (from ``chunk``, ``split`` and the gates of ``nn.GRU`` and
    ``nn.LSTM``) as one slice per piece that is used: the pieces are then ordinary tensors
    (a view where the slice is contiguous, else a slice_copy), with no multi-output op.
    Returns the number of splits rewritten."""
    count = 0
    for node in g.call_nodes():
        if node.target != aten.split_with_sizes.default:
            continue
        x, sizes = node.args[0], node.args[1]
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
        users = list(node.users)
        if not all(isinstance(s, int) for s in sizes) or not all(
            u.target is operator.getitem for u in users
        ):
            continue  # symbolic sizes or the list used whole: left for the op check
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        for user in users:
            i = user.args[1]
            with g.fx_graph.inserting_before(user):
                piece = g.fx_graph.call_function(
                    aten.slice.Tensor, (x, dim, starts[i], starts[i] + sizes[i], 1)
                )
            piece.meta = dict(user.meta)
            user.replace_all_uses_with(piece)
            g.fx_graph.erase_node(user)
        g.fx_graph.erase_node(node)
        count += 1
    return count


def fold_constants(g: Graph) -> int:
    """Evaluate ops whose tensor inputs are all constants (a weight transpose, say)."""
    count = 0
    for node in g.call_nodes():
        if not isinstance(node.target, torch._ops.OpOverload) or not is_static(node):
            continue
        if torch.Tag.nondeterministic_seeded in node.target.tags:
            continue
        inputs = node.all_input_nodes
        if not all(g.is_const(n) for n in inputs):
            continue
        out = _val(node)
        if out is None:
            continue
        in_numel = sum(g.const(n).numel() for n in inputs)
        if out.numel() > max(in_numel, _FOLD_LIMIT):
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: g.const(n))
        with torch.no_grad():
            value = node.target(*args, **kwargs)
        const = g.add_const(value, f"{node.name}_folded")
        node.replace_all_uses_with(const)
        g.fx_graph.erase_node(node)
        count += 1
    return count

"""The int8 operators (namespace ``etb_quantized``) and their reference semantics.

Each op is defined here with torch.library: a functional form and its ``.out`` form, a Python
reference implementation (the specification the C++ kernels must match) and a fake
implementation for shape propagation. ``ops_yaml/quantized.yaml`` lists the same ``.out``
schemas for the runtime.

Arithmetic shared by all of them (float32 throughout, rounding half to even):
  - int8 activations carry (scale, zero_point); int8 weights are symmetric with one scale per
    output channel (a per-tensor weight scale is given as one scale repeated);
  - quantizing multiplies by inv = float32(1 / scale) (computed in double), as torchao does;
  - convolution and linear accumulate (x - x_zp) * w exactly in int32, then requantize:
        y = float32(acc) * (float32(x_scale) * w_scale[c]) + bias[c]      (bias fp32)
        q = clamp(round(y * inv_out) + out_zp, out_min, out_max)
    a fused ReLU/ReLU6 is just the clamp bounds out_min/out_max. This is the converted
    model's dequantize -> fp32 op -> quantize with the products summed exactly, so results
    agree with it except where float rounding lands on a tie;
  - add (mul) dequantizes both inputs in float32, adds (multiplies) and quantizes; mean
    sums (x - x_zp) exactly in int32, scales by float32(x_scale) / count and quantizes;
  - avg_pool2d does what mean does per window: the sum of (x - x_zp) over the window's taps
    inside the input (padding is a real 0) exactly in int32, then
        q = clamp(round(float32(acc) * float32(x_scale) / float32(divisor) * inv_out) + out_zp)
    with torch's divisor: divisor_override, else the window's size clipped to the padded
    input (count_include_pad) or its taps inside the input (not count_include_pad);
  - max_pool2d and amax (max over dims) take the largest int8 code: dequantizing is
    monotonic, so with the output quantized like the input this is the fp32 op exactly;
  - table_lookup maps each int8 value through a 256-entry table: the lowering computes the
    table of a chain of elementwise fp32 ops (sigmoid, hardswish, SiLU, GELU, ...) between a
    dequantize and a quantize by running the chain on all 256 values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAMESPACE = "etb_quantized"
_lib = torch.library.Library(NAMESPACE, "DEF")

# name -> functional schema arguments (the .out form appends "*, Tensor(a!) out").
SCHEMAS: dict[str, str] = {
    "quantize_per_tensor": "Tensor input, float scale, int zero_point, int quant_min, "
    "int quant_max",
    "dequantize_per_tensor": "Tensor input, float scale, int zero_point",
    "conv2d": "Tensor input, float input_scale, int input_zero_point, Tensor weight, "
    "Tensor weight_scales, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
    "int groups, float output_scale, int output_zero_point, int output_min, int output_max",
    "expand_depthwise_project": "Tensor input, float input_scale, int input_zero_point, "
    "Tensor expand_weight, Tensor expand_weight_scales, Tensor? expand_bias, "
    "float expanded_scale, int expanded_zero_point, int expanded_min, int expanded_max, "
    "Tensor depthwise_weight, Tensor depthwise_weight_scales, Tensor? depthwise_bias, "
    "int[] stride, int[] padding, float filtered_scale, int filtered_zero_point, "
    "int filtered_min, int filtered_max, Tensor project_weight, Tensor project_weight_scales, "
    "Tensor? project_bias, float output_scale, int output_zero_point, int output_min, "
    "int output_max",
    "depthwise_project": "Tensor input, float input_scale, int input_zero_point, "
    "Tensor depthwise_weight, Tensor depthwise_weight_scales, Tensor? depthwise_bias, "
    "int[] stride, int[] padding, float filtered_scale, int filtered_zero_point, "
    "int filtered_min, int filtered_max, Tensor project_weight, Tensor project_weight_scales, "
    "Tensor? project_bias, float output_scale, int output_zero_point, int output_min, "
    "int output_max",
    "linear": "Tensor input, float input_scale, int input_zero_point, Tensor weight, "
    "Tensor weight_scales, Tensor? bias, float output_scale, int output_zero_point, "
    "int output_min, int output_max",
    "dynamic_linear": "Tensor input, Tensor weight, Tensor weight_scales, Tensor? bias",
    "add": "Tensor self, float self_scale, int self_zero_point, Tensor other, "
    "float other_scale, int other_zero_point, float output_scale, int output_zero_point, "
    "int output_min, int output_max",
    "mean": "Tensor input, float input_scale, int input_zero_point, int[] dim, bool keepdim, "
    "float output_scale, int output_zero_point",
    "max_pool2d": "Tensor input, int[] kernel_size, int[] stride, int[] padding, "
    "int[] dilation, bool ceil_mode",
    "avg_pool2d": "Tensor input, float input_scale, int input_zero_point, int[] kernel_size, "
    "int[] stride, int[] padding, bool ceil_mode, bool count_include_pad, "
    "int? divisor_override, float output_scale, int output_zero_point",
    "amax": "Tensor input, int[] dim, bool keepdim",
    "mul": "Tensor self, float self_scale, int self_zero_point, Tensor other, "
    "float other_scale, int other_zero_point, float output_scale, int output_zero_point, "
    "int output_min, int output_max",
    "table_lookup": "Tensor input, Tensor table",
}


def _f32(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def _inv(scale: float) -> torch.Tensor:
    return torch.tensor(1.0 / scale, dtype=torch.float32)


def quantize_per_tensor(x, scale, zero_point, quant_min, quant_max):
    q = torch.round(x.to(torch.float32) * _inv(scale)) + zero_point
    return q.clamp(quant_min, quant_max).to(torch.int8)


def dequantize_per_tensor(x, scale, zero_point):
    return (x.to(torch.int32) - zero_point).to(torch.float32) * _f32(scale)


def requantize(acc, x_scale, w_scales, bias, out_scale, out_zp, out_min, out_max, channel_dim):
    """int32 accumulators -> int8 (see the module docstring)."""
    shape = [1] * acc.dim()
    shape[channel_dim] = -1
    y = acc.to(torch.float32) * (_f32(x_scale) * w_scales.to(torch.float32)).reshape(shape)
    if bias is not None:
        y = y + bias.to(torch.float32).reshape(shape)
    q = torch.round(y * _inv(out_scale)) + out_zp
    return q.clamp(out_min, out_max).to(torch.int8)


def conv2d(x, xs, xzp, w, ws, bias, stride, padding, dilation, groups, os_, ozp, omin, omax):
    # float64 holds every int8 x int8 sum exactly, so this is the exact int32 accumulator.
    acc = F.conv2d(
        x.to(torch.float64) - xzp, w.to(torch.float64), None, stride, padding, dilation, groups
    ).to(torch.int32)
    return requantize(acc, xs, ws, bias, os_, ozp, omin, omax, channel_dim=1)


def expand_depthwise_project(x, xs, xzp, *args):
    """Three conv2d: a pointwise expansion to E channels, a depthwise convolution over them
    and a pointwise projection (one kernel call; the E-channel tensors stay in it)."""
    we, wes, be, es, ezp, emin, emax = args[:7]
    e = conv2d(x, xs, xzp, we, wes, be, [1, 1], [0, 0], [1, 1], 1, es, ezp, emin, emax)
    return depthwise_project(e, es, ezp, *args[7:])


def depthwise_project(x, xs, xzp, *args):
    """Two conv2d: a depthwise convolution and a pointwise projection (one kernel call)."""
    wd, wds, bd, stride, padding, fs, fzp, fmin, fmax = args[:9]
    wp, wps, bp, os_, ozp, omin, omax = args[9:]
    f = conv2d(x, xs, xzp, wd, wds, bd, stride, padding, [1, 1], wd.shape[0], fs, fzp, fmin, fmax)
    return conv2d(f, fs, fzp, wp, wps, bp, [1, 1], [0, 0], [1, 1], 1, os_, ozp, omin, omax)


def linear(x, xs, xzp, w, ws, bias, os_, ozp, omin, omax):
    acc = F.linear(x.to(torch.float64) - xzp, w.to(torch.float64)).to(torch.int32)
    return requantize(acc, xs, ws, bias, os_, ozp, omin, omax, channel_dim=-1)


def dynamic_linear(x, w, ws, bias):
    """fp32 in, fp32 out: the input is quantized per tensor (asymmetric int8) at run time."""
    lo = torch.clamp(x.min(), max=0.0).to(torch.float32)
    hi = torch.clamp(x.max(), min=0.0).to(torch.float32)
    scale = torch.clamp((hi - lo) / 255.0, min=torch.finfo(torch.float32).eps)
    zp = int(torch.clamp(-128 - torch.round(lo / scale), -128, 127))
    xq = torch.clamp(torch.round(x / scale) + zp, -128, 127)
    acc = F.linear(xq.to(torch.float64) - zp, w.to(torch.float64)).to(torch.int32)
    out = acc.to(torch.float32) * (scale * ws.to(torch.float32))
    if bias is not None:
        out = out + bias
    return out


def add(a, as_, azp, b, bs, bzp, os_, ozp, omin, omax):
    y = dequantize_per_tensor(a, as_, azp) + dequantize_per_tensor(b, bs, bzp)
    return (torch.round(y * _inv(os_)) + ozp).clamp(omin, omax).to(torch.int8)


def mul(a, as_, azp, b, bs, bzp, os_, ozp, omin, omax):
    y = dequantize_per_tensor(a, as_, azp) * dequantize_per_tensor(b, bs, bzp)
    return (torch.round(y * _inv(os_)) + ozp).clamp(omin, omax).to(torch.int8)


def mean(x, xs, xzp, dim, keepdim, os_, ozp):
    acc = (x.to(torch.int32) - xzp).sum(dim=dim, keepdim=keepdim, dtype=torch.int32)
    count = 1
    for d in dim:
        count *= x.shape[d]
    y = acc.to(torch.float32) * _f32(xs) / count
    return (torch.round(y * _inv(os_)) + ozp).clamp(-128, 127).to(torch.int8)


def max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode):
    y = F.max_pool2d(x.to(torch.float32), kernel_size, stride or kernel_size, padding, dilation,
                     ceil_mode=ceil_mode)  # fmt: skip
    return y.to(torch.int8)


def _pair(v) -> tuple[int, int]:
    v = [int(i) for i in v] if isinstance(v, (list, tuple)) else [int(v)]
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _pooled_size(size: int, k: int, stride: int, pad: int, ceil_mode: bool) -> int:
    """Output length of a pooling along one axis (torch's pooling_output_shape)."""
    out = (size + 2 * pad - k + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _window_counts(size, k, stride, pad, ceil_mode, count_include_pad) -> list[int]:
    """Per output index along one axis: the taps avg_pool2d divides by (without override)."""
    counts = []
    for o in range(_pooled_size(size, k, stride, pad, ceil_mode)):
        start = o * stride - pad
        end = min(start + k, size + pad)  # the window, clipped to the padded input
        counts.append(end - start if count_include_pad else min(end, size) - max(start, 0))
    return counts


def avg_pool2d(x, xs, xzp, kernel_size, stride, padding, ceil_mode, count_include_pad,
               divisor_override, os_, ozp):  # fmt: skip
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride) if len(stride) else (kh, kw)
    ph, pw = _pair(padding) if len(padding) else (0, 0)
    # float64 holds the sums exactly: a divisor of 1 gives the int32 accumulators.
    acc = F.avg_pool2d(x.to(torch.float64) - xzp, (kh, kw), (sh, sw), (ph, pw), ceil_mode,
                       True, 1).to(torch.int32)  # fmt: skip
    if divisor_override is not None:
        div = torch.tensor(float(divisor_override), dtype=torch.float32)
    else:
        rows = _window_counts(x.shape[-2], kh, sh, ph, ceil_mode, count_include_pad)
        cols = _window_counts(x.shape[-1], kw, sw, pw, ceil_mode, count_include_pad)
        div = (torch.tensor(rows)[:, None] * torch.tensor(cols)[None, :]).to(torch.float32)
    y = acc.to(torch.float32) * _f32(xs) / div
    y = torch.where(div == 0, torch.zeros((), dtype=torch.float32), y)  # no taps: 0, as torch
    return (torch.round(y * _inv(os_)) + ozp).clamp(-128, 127).to(torch.int8)


def amax(x, dim, keepdim):
    """The largest int8 code over ``dim`` (every dim when empty)."""
    return torch.amax(x, dim=list(dim), keepdim=keepdim)


def table_lookup(x, table):
    """Any function of one int8 value: out = table[x + 128] (a 256-entry int8 table)."""
    return table[x.to(torch.int64) + 128]


REFERENCE = {
    "quantize_per_tensor": quantize_per_tensor,
    "dequantize_per_tensor": dequantize_per_tensor,
    "conv2d": conv2d,
    "expand_depthwise_project": expand_depthwise_project,
    "depthwise_project": depthwise_project,
    "linear": linear,
    "dynamic_linear": dynamic_linear,
    "add": add,
    "mul": mul,
    "mean": mean,
    "max_pool2d": max_pool2d,
    "avg_pool2d": avg_pool2d,
    "amax": amax,
    "table_lookup": table_lookup,
}


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=torch.float32, device="meta")


# Output shape and dtype of each op, for fake (shape-only) tensors.
def _fake_conv2d(x, xs, xzp, w, ws, bias, stride, padding, dilation, groups, *_):
    shape = F.conv2d(_meta(x), _meta(w), None, stride, padding, dilation, groups).shape
    return x.new_empty(shape, dtype=torch.int8)


def _fake_expand_depthwise_project(x, xs, xzp, we, wes, be, es, ezp, emin, emax, *args):
    e = x.new_empty((x.shape[0], we.shape[0], *x.shape[2:]), dtype=torch.int8)
    return _fake_depthwise_project(e, es, ezp, *args)


def _fake_depthwise_project(x, xs, xzp, wd, wds, bd, stride, padding, *args):
    wp = args[4]
    f = _fake_conv2d(x, xs, xzp, wd, wds, bd, stride, padding, [1, 1], wd.shape[0])
    return f.new_empty((f.shape[0], wp.shape[0], *f.shape[2:]), dtype=torch.int8)


def _fake_mean(x, xs, xzp, dim, keepdim, *_):
    return x.new_empty(_meta(x).sum(dim=dim, keepdim=keepdim).shape, dtype=torch.int8)


def _fake_max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode):
    shape = F.max_pool2d(
        _meta(x), kernel_size, stride or kernel_size, padding, dilation, ceil_mode=ceil_mode
    ).shape
    return x.new_empty(shape, dtype=torch.int8)


def _fake_avg_pool2d(x, xs, xzp, kernel_size, stride, padding, ceil_mode, *_):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(stride) if len(stride) else (kh, kw)
    ph, pw = _pair(padding) if len(padding) else (0, 0)
    shape = F.avg_pool2d(_meta(x), (kh, kw), (sh, sw), (ph, pw), ceil_mode).shape
    return x.new_empty(shape, dtype=torch.int8)


def _fake_amax(x, dim, keepdim):
    return x.new_empty(_meta(x).amax(dim=list(dim), keepdim=keepdim).shape, dtype=torch.int8)


FAKE = {
    "quantize_per_tensor": lambda x, *_: torch.empty_like(x, dtype=torch.int8),
    "dequantize_per_tensor": lambda x, *_: torch.empty_like(x, dtype=torch.float32),
    "conv2d": _fake_conv2d,
    "expand_depthwise_project": _fake_expand_depthwise_project,
    "depthwise_project": _fake_depthwise_project,
    "linear": lambda x, xs, xzp, w, *_: x.new_empty((*x.shape[:-1], w.shape[0]), dtype=torch.int8),
    "dynamic_linear": lambda x, w, *_: x.new_empty((*x.shape[:-1], w.shape[0])),
    "add": lambda a, as_, azp, b, *_: a.new_empty(
        torch.broadcast_shapes(a.shape, b.shape), dtype=torch.int8
    ),
    "mul": lambda a, as_, azp, b, *_: a.new_empty(
        torch.broadcast_shapes(a.shape, b.shape), dtype=torch.int8
    ),
    "mean": _fake_mean,
    "max_pool2d": _fake_max_pool2d,
    "avg_pool2d": _fake_avg_pool2d,
    "amax": _fake_amax,
    "table_lookup": lambda x, table: torch.empty_like(x, dtype=torch.int8),
}


def define_ops(lib, namespace: str, schemas: dict, reference: dict, fake: dict) -> None:
    """Defines each op of ``schemas`` (name -> argument list) in ``lib``: its functional and
    ``.out`` forms, both running ``reference[name]``, and ``fake[name]`` for shapes."""
    for name, args in schemas.items():
        lib.define(f"{name}({args}) -> Tensor")
        lib.define(f"{name}.out({args}, *, Tensor(a!) out) -> Tensor(a!)")
        ref = reference[name]

        def functional(*args, _ref=ref):
            return _ref(*args)

        def out_variant(*args, out, _ref=ref):
            result = _ref(*args)
            out.resize_(result.shape)
            return out.copy_(result)

        lib.impl(name, functional, "CompositeExplicitAutograd")
        lib.impl(f"{name}.out", out_variant, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{namespace}::{name}", fake[name], lib=lib)


define_ops(_lib, NAMESPACE, SCHEMAS, REFERENCE, FAKE)

ops = getattr(torch.ops, NAMESPACE)

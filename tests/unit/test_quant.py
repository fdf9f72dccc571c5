"""Quantization: etbuild's quantizer and the lowering of quantized patterns to int8 kernels.

The lowered graph runs the int8 kernels' reference implementations (pipeline/quant/ops.py);
it must agree with torchao's converted model (dequantize -> fp32 op -> quantize).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

pytest.importorskip("torchao")

from torchao.quantization.pt2e import move_exported_model_to_eval  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import (  # noqa: E402
    convert_pt2e,
    prepare_pt2e,
    prepare_qat_pt2e,
)

from etbuild.pipeline import passes  # noqa: E402
from etbuild.pipeline.config import QuantConfig, QuantScheme  # noqa: E402
from etbuild.pipeline.errors import EtbuildError  # noqa: E402
from etbuild.pipeline.graph import Graph  # noqa: E402
from etbuild.pipeline.quant import ops as qops  # noqa: E402
from etbuild.pipeline.quant.lowering import lower_quantized  # noqa: E402
from etbuild.pipeline.quant.quantizer import EtbQuantizer  # noqa: E402
from etbuild.pipeline.stages.lower import graph_from_exported  # noqa: E402


def qconfig(scheme: str = "ptq", **overrides) -> object:
    cfg = OmegaConf.structured(QuantConfig(scheme=QuantScheme(scheme)))
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def quantize(model: torch.nn.Module, x: torch.Tensor, cfg, batches: int = 4):
    """torchao's converted model, and our lowered graph of it."""
    torch.manual_seed(1)
    graph = torch.export.export(model, (x,)).module()
    quantizer = EtbQuantizer(cfg)
    qat = cfg.scheme == QuantScheme.qat
    prepared = prepare_qat_pt2e(graph, quantizer) if qat else prepare_pt2e(graph, quantizer)
    with torch.no_grad():
        for _ in range(batches):
            prepared(torch.randn_like(x))
    if qat:
        move_exported_model_to_eval(prepared)
    converted = convert_pt2e(prepared)
    g = graph_from_exported(torch.export.export(converted, (x,)).run_decompositions())
    passes.drop_noops(g)
    lower_quantized(g)
    passes.fold_constants(g)
    g.drop_dead()
    return converted, g


def run_graph(g: Graph, *inputs: torch.Tensor) -> torch.Tensor:
    return g.execute(*inputs)[0]


def targets(g: Graph) -> list[str]:
    return [str(n.target) for n in g.call_nodes()]


def output_scale(g: Graph) -> float:
    (dq,) = [n for n in g.call_nodes() if n.target == qops.ops.dequantize_per_tensor.default]
    return dq.args[1]


class Pattern(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        groups = 8 if kind == "depthwise" else 1
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=groups)
        self.conv2 = torch.nn.Conv2d(8, 8, 1, stride=2, bias=False)
        self.se = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x):
        y = self.conv(x)
        if self.kind == "relu6":
            y = F.relu6(y)
        elif self.kind == "relu":
            y = F.relu(y)
        elif self.kind == "add":
            y = F.relu(y + x)
        elif self.kind == "mean":
            y = y.mean((2, 3))
        elif self.kind == "maxpool":
            y = F.max_pool2d(y, 2)
        elif self.kind == "avgpool":
            y = self.conv2(F.avg_pool2d(y, 3, 1, 1, ceil_mode=True, count_include_pad=False))
        elif self.kind == "avgpool_divisor":
            y = F.avg_pool2d(y, (2, 3), (2, 1), (1, 0), divisor_override=4)
        elif self.kind == "amax":
            y = y.amax((2, 3))
        elif self.kind == "max_values":
            y = self.conv2(y.max(dim=2, keepdim=True).values)
        elif self.kind == "se":  # squeeze-and-excite: an int8 mul with broadcasting
            gate = torch.sigmoid(self.se(y.mean((2, 3), keepdim=True)))
            y = self.conv2(y * gate)
        elif self.kind == "two":
            y = self.conv2(F.relu6(y))
        elif self.kind in TABLE_ACTIVATIONS:  # a chain of fp32 ops between two convs
            y = self.conv2(TABLE_ACTIVATIONS[self.kind](y))
        return y


# Activations that PTQ leaves as fp32 ops between a dequantize and a quantize, which the
# lowering turns into one int8 table lookup.
TABLE_ACTIVATIONS = {
    "hardswish": F.hardswish,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
    "hardsigmoid": F.hardsigmoid,
    "chain": lambda y: torch.tanh(y * 0.5 + 1.0).clamp(-0.5, 0.8) * 3,
    "const_4d": lambda y: F.hardswish(y) * torch.full((1, 1, 1, 1), 0.7),
}


# The int8 kernel a pattern's pooling or reduction becomes.
INT8_KERNEL = {"avgpool": "avg_pool2d", "avgpool_divisor": "avg_pool2d", "amax": "amax",
               "max_values": "amax", "mean": "mean", "maxpool": "max_pool2d"}  # fmt: skip


@pytest.mark.parametrize(
    "kind",
    [
        "plain",
        "depthwise",
        "relu6",
        "relu",
        "add",
        "mean",
        "maxpool",
        "avgpool",
        "avgpool_divisor",
        "amax",
        "max_values",
        "two",
        "se",
        *TABLE_ACTIVATIONS,
    ],  # fmt: skip
)
def test_pattern_lowers_to_int8_kernels_matching_torchao(kind: str) -> None:
    torch.manual_seed(0)
    model = Pattern(kind).eval()
    x = torch.randn(1, 8, 12, 12)
    converted, g = quantize(model, x, qconfig())
    names = targets(g)
    # Everything between the input quantize and the output dequantize is an int8 kernel.
    assert names[0] == "etb_quantized.quantize_per_tensor.default"
    assert names[-1] == "etb_quantized.dequantize_per_tensor.default"
    assert "aten.convolution.default" not in names
    assert not any("quantized_decomposed" in n for n in names)
    assert not any(n.startswith("aten.") for n in names[1:-1]), names  # no fp32 in between
    if kind in TABLE_ACTIVATIONS or kind == "se":
        assert names.count("etb_quantized.table_lookup.default") == 1, names
    if kind == "se":
        assert "etb_quantized.mul.default" in names, names
    if kind in INT8_KERNEL:
        assert f"etb_quantized.{INT8_KERNEL[kind]}.default" in names, names
    ours, ref = run_graph(g, x), converted(x)
    step = output_scale(g)
    assert (ours - ref).abs().max() <= step * 1.0001
    assert ref.std() > 10 * step  # the comparison is not vacuous


class Conv1dStack(torch.nn.Module):
    """Audio-style 1-D convolutions: strided, grouped, dilated, with ReLU and SiLU."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv1d(8, 16, 5, stride=2, padding=2)
        self.c2 = torch.nn.Conv1d(16, 16, 3, padding=2, dilation=2, groups=4)
        self.c3 = torch.nn.Conv1d(16, 8, 1)

    def forward(self, x):
        return self.c3(F.silu(self.c2(F.relu(self.c1(x)))))


def test_conv1d_lowers_to_the_int8_convolution() -> None:
    torch.manual_seed(0)
    model = Conv1dStack().eval()
    x = torch.randn(2, 8, 41)
    converted, g = quantize(model, x, qconfig())
    names = targets(g)
    assert names.count("etb_quantized.conv2d.default") == 3, names
    assert "aten.convolution.default" not in names
    assert not any(n.startswith("aten.") and "view" not in n for n in names[1:-1]), names
    ours, ref = run_graph(g, x), converted(x)
    step = output_scale(g)
    assert ours.shape == ref.shape == (2, 8, 21)
    assert (ours - ref).abs().max() <= step * 1.0001
    assert ref.std() > 10 * step


class AvgPool1d(torch.nn.Module):
    """Audio-style pooling over time between 1-D convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv1d(8, 16, 3), torch.nn.Conv1d(16, 8, 1)
        self.pool = torch.nn.AvgPool1d(4, stride=3, padding=2, ceil_mode=True)

    def forward(self, x):
        return self.c2(self.pool(F.relu(self.c1(x))))


def test_avg_pool1d_lowers_to_the_int8_average_pool() -> None:
    """avg_pool1d decomposes to unsqueeze -> avg_pool2d -> squeeze: views of the int8 tensor."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 41)
    converted, g = quantize(AvgPool1d().eval(), x, qconfig())
    names = targets(g)
    assert names.count("etb_quantized.avg_pool2d.default") == 1, names
    assert not any(n.startswith("aten.") and "squeeze" not in n and "view" not in n
                   for n in names), names  # fmt: skip
    ours, ref = run_graph(g, x), converted(x)
    assert ours.shape == ref.shape == (2, 8, 14)
    assert (ours - ref).abs().max() <= output_scale(g) * 1.0001
    assert ref.std() > 10 * output_scale(g)


class QuantizedAmax(torch.nn.Module):
    """An int8 activation, its max over dims quantized to other parameters, as a graph."""

    def forward(self, x):
        qd = torch.ops.quantized_decomposed
        q = qd.quantize_per_tensor(x, 0.02, -3, -128, 127, torch.int8)
        y = torch.amax(qd.dequantize_per_tensor(q, 0.02, -3, -128, 127, torch.int8), [1])
        q = qd.quantize_per_tensor(y, 0.035, 20, -128, 127, torch.int8)
        return qd.dequantize_per_tensor(q, 0.035, 20, -128, 127, torch.int8)


def test_amax_to_other_quantization_requantizes_by_table_exactly() -> None:
    """Max commutes with monotonic requantization: int8 amax, then one table lookup."""
    model = QuantizedAmax()
    x = torch.randn(3, 50, 7) * 2
    g = graph_from_exported(torch.export.export(model, (x,)).run_decompositions())
    lower_quantized(g)
    g.drop_dead()
    names = targets(g)
    assert "etb_quantized.amax.default" in names and "aten.amax.default" not in names, names
    assert names.count("etb_quantized.table_lookup.default") == 1, names
    assert torch.equal(run_graph(g, x), model(x))


def test_fp32_fallbacks_say_why_pooling_stays_fp32(monkeypatch) -> None:
    """avg_pool2d the int8 kernel does not take, and max's indices, stay fp32 with a reason."""
    from etbuild.pipeline.quant import lowering
    from etbuild.pipeline.stages.lower import required_kernel

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)

        def forward(self, x):
            y = self.conv(x)
            values, indices = y.max(dim=3)
            return F.avg_pool2d(y, 3) + values.mean() + indices.float().mean()

    monkeypatch.setattr(lowering, "_MAX_AVG_TAPS", 4)
    _, g = quantize(Model().eval(), torch.randn(1, 3, 10, 10), qconfig())
    reasons = {f["op"]: f["reason"] for f in lowering.fp32_fallbacks(g, required_kernel)}
    assert reasons["aten::avg_pool2d.out"] == (
        "the int8 kernel does not take windows of more than 4 taps (9 here)"
    )
    assert reasons["aten::max.dim_max"] == (
        "the int8 kernel does not take max's indices (it gives the values only)"
    )


class Concat(torch.nn.Module):
    """A U-Net skip: two branches of different ranges concatenated on channels."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(8, 4, 3, padding=1), torch.nn.Conv2d(8, 6, 1)
        self.out = torch.nn.Conv2d(10, 8, 1)

    def forward(self, x):
        return self.out(torch.cat([self.a(x), F.relu(self.b(x))], dim=1))


def test_concatenation_of_int8_tensors_requantizes_to_one_scale() -> None:
    torch.manual_seed(0)
    model = Concat().eval()
    x = torch.randn(1, 8, 12, 12)
    converted, g = quantize(model, x, qconfig())
    names = targets(g)
    assert "aten.cat.default" in names and names.count("etb_quantized.conv2d.default") == 3
    # the inputs' scales differ from the output's: at least one is requantized by a table
    assert names.count("etb_quantized.table_lookup.default") >= 1, names
    assert not any(n.startswith("aten.") and n != "aten.cat.default" for n in names), names
    ours, ref = run_graph(g, x), converted(x)
    step = output_scale(g)
    assert (ours - ref).abs().max() <= step * 1.0001
    assert ref.std() > 10 * step


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


@pytest.mark.parametrize("weights", ["per_channel", "per_tensor"])
@pytest.mark.parametrize("activations", ["affine", "symmetric"])
def test_linear_schemes_match_torchao(weights: str, activations: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 32)
    converted, g = quantize(Linear().eval(), x, qconfig(weights=weights, activations=activations))
    assert targets(g).count("etb_quantized.linear.default") == 2
    ours, ref = run_graph(g, x), converted(x)
    assert (ours - ref).abs().max() <= output_scale(g) * 1.0001


def test_dynamic_linear_keeps_fp32_activations() -> None:
    torch.manual_seed(0)
    model = Linear().eval()
    x = torch.randn(4, 32)
    converted, g = quantize(model, x, qconfig("dynamic"), batches=1)
    names = targets(g)
    assert names.count("etb_quantized.dynamic_linear.default") == 2
    assert "etb_quantized.quantize_per_tensor.default" not in names
    ours, ref, eager = run_graph(g, x), converted(x), model(x)
    assert torch.allclose(ours, ref, atol=1e-5)
    sqnr = 10 * torch.log10(eager.pow(2).mean() / (ours - eager).pow(2).mean())
    assert sqnr > 30


def test_qat_converts_to_the_same_kernels() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 32)
    converted, g = quantize(Linear().train(), x, qconfig("qat"))
    assert targets(g).count("etb_quantized.linear.default") == 2
    assert (run_graph(g, x) - converted(x)).abs().max() <= output_scale(g) * 1.0001


def test_keep_fp32_by_module_name_and_op_type() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 32)
    _, g = quantize(Linear().eval(), x, qconfig(**{"keep_fp32.modules": ["fc2"]}))
    names = targets(g)
    assert names.count("etb_quantized.linear.default") == 1
    assert "aten.addmm.default" in names  # fc2 stays fp32
    _, g = quantize(Pattern("add").eval(), torch.randn(1, 8, 8, 8),
                    qconfig(**{"keep_fp32.ops": ["add"]}))  # fmt: skip
    names = targets(g)
    assert "etb_quantized.conv2d.default" in names
    assert "etb_quantized.add.default" not in names and "aten.add.Tensor" in names
    # (The lowering makes int8 any dequantize -> op -> quantize, so these end the model.)
    for kind, op, aten_op in (("avgpool_divisor", "avg_pool2d", "aten.avg_pool2d.default"),
                              ("amax", "amax", "aten.amax.default")):  # fmt: skip
        _, g = quantize(Pattern(kind).eval(), torch.randn(1, 8, 8, 8),
                        qconfig(**{"keep_fp32.ops": [op]}))  # fmt: skip
        names = targets(g)
        assert f"etb_quantized.{op}.default" not in names and aten_op in names, names


def test_unknown_keep_fp32_op_type_names_the_allowed_ones() -> None:
    with pytest.raises(
        EtbuildError, match=r"unknown op type\(s\) \[.conv3d.\]; allowed: adaptive_avg_pool2d, add,"
    ):
        EtbQuantizer(qconfig(**{"keep_fp32.ops": ["conv3d"]}))


def test_reference_requantization_rounds_half_to_even_and_clamps() -> None:
    x = torch.tensor([[[[1]]], [[[3]]], [[[100]]]], dtype=torch.int8)  # three 1x1 images
    w = torch.ones(1, 1, 1, 1, dtype=torch.int8)
    scales = torch.tensor([0.5])
    # y = x * 1.0 * 0.5 -> 0.5, 1.5, 50 ; out_scale 1 -> round half even: 0, 2, 50 -> clamp 20
    out = qops.conv2d(x, 1.0, 0, w, scales, None, [1, 1], [0, 0], [1, 1], 1, 1.0, 0, -128, 20)
    assert out.flatten().tolist() == [0, 2, 20]

"""Channels-last activations (``pipeline.lower.channels_last``, pipeline/layout.py): the
program keeps Float convolutions' activations in dim order (0, 2, 3, 1) and their weights in
(2, 3, 1, 0), converts at the edges, and its outputs match torch, bit-identical at any thread
count; the load check refuses a dim order a kernel does not take."""

from __future__ import annotations

import pytest
import torch
from rt_helpers import assert_matches, build_with_pipeline
from torch import nn

CHANNELS_LAST = [0, 2, 3, 1]
OVERRIDES = ("model.dynamic_dims=[]", "pipeline.lower.channels_last=true")


def _program_ops(pte) -> list[tuple[str, list[list[int]]]]:
    """Each kernel call of the program: its op name and its tensor arguments' dim orders."""
    from etbuild.pipeline import pte as pte_format

    program = pte_format.read(pte.read_bytes()).program
    plan = program.executionPlan[0]
    calls = []
    for chain in plan.chains:
        for ins in chain.instructions:
            call = ins.instrArgs
            if not hasattr(call, "opIndex"):
                continue
            op = plan.operators[call.opIndex]
            orders = []
            for i in call.args:
                value = plan.values[i].val
                if hasattr(value, "dimOrder") and value.dimOrder is not None:
                    orders.append([int(d) for d in value.dimOrder])
            calls.append((op.name.decode() if isinstance(op.name, bytes) else op.name, orders))
    return calls


class Twice(nn.Module):
    """tail(2 act(conv(x))), the 2 as an add of act(conv(x)) to itself: the convolution's
    output reaches another convolution (so the pass keeps it channels-last) through ops that
    take channels-last, and the tail's output is the graph's, converted back."""

    def __init__(self, conv: nn.Conv2d, act: nn.Module | None = None) -> None:
        super().__init__()
        self.conv, self.act = conv, act if act is not None else nn.Identity()
        torch.manual_seed(conv.out_channels)
        self.tail = nn.Conv2d(conv.out_channels, 8, 1)

    def forward(self, x):
        y = self.act(self.conv(x))
        return self.tail(y + y)


def _conv(c, oc, k, seed, **kw) -> nn.Conv2d:
    torch.manual_seed(seed)
    conv = nn.Conv2d(c, oc, k, **kw)
    with torch.no_grad():
        if conv.bias is not None:
            conv.bias.normal_(0, 1)
    return conv


# (name, conv, act, input shape): every path of conv_channels_last, with odd channel counts
# (vector tails) and planes.
CASES = [
    ("pointwise", _conv(24, 40, 1, 0), nn.ReLU6(), (1, 24, 13, 11)),
    ("pointwise_batch2", _conv(17, 33, 1, 1, bias=False), None, (2, 17, 7, 9)),
    ("pointwise_deep", _conv(600, 24, 1, 2), None, (1, 600, 5, 6)),
    ("stem_3x3_s2", _conv(3, 32, 3, 3, stride=2, padding=1), nn.ReLU6(), (1, 3, 45, 37)),
    ("stem_7x7_s2", _conv(3, 64, 7, 4, stride=2, padding=3), nn.ReLU(), (1, 3, 40, 44)),
    ("dense_3x3", _conv(20, 36, 3, 5, padding=1), nn.ReLU(), (2, 20, 15, 14)),
    ("dense_5x5_dilated", _conv(9, 12, 5, 6, padding=3, dilation=2), None, (1, 9, 17, 19)),
    ("downsample_1x1_s2", _conv(32, 48, 1, 7, stride=2), None, (1, 32, 14, 15)),
    ("big_weights_3x3", _conv(160, 200, 3, 8, padding=1), nn.ReLU(), (1, 160, 11, 10)),
    ("small_plane_3x3", _conv(64, 80, 3, 12, padding=1), nn.ReLU6(), (2, 64, 7, 7)),
    ("small_plane_1x1", _conv(96, 40, 1, 13), None, (1, 96, 5, 3)),
    ("small_plane_3x3_s2", _conv(37, 19, 3, 14, stride=2, padding=1), None, (1, 37, 13, 11)),
    ("depthwise_3x3", _conv(40, 40, 3, 9, padding=1, groups=40), nn.ReLU6(), (1, 40, 19, 23)),
    (
        "depthwise_3x3_s2",
        _conv(21, 21, 3, 10, stride=2, padding=1, groups=21),
        None,
        (2, 21, 15, 16),
    ),
    ("depthwise_5x5", _conv(70, 70, 5, 11, padding=2, groups=70), None, (1, 70, 9, 8)),
]


@pytest.fixture(scope="module")
def case_programs(tmp_path_factory):
    built = {}
    for name, conv, act, shape in CASES:
        torch.manual_seed(100)
        x = torch.randn(shape)
        module = Twice(conv, act).eval()
        pte = build_with_pipeline(module, [x], tmp_path_factory.mktemp(name), OVERRIDES)
        with torch.no_grad():
            built[name] = (pte, x, module(x))
    return built


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_convolution_paths_match_torch_at_any_thread_count(rt, case_programs, name):
    pte, x, want = case_programs[name]
    ops = _program_ops(pte)
    convs = [orders for op, orders in ops if op == "aten::convolution"]
    # A stem (at most 4 input channels) reads the graph's contiguous input as it is.
    stem = x.shape[1] <= 4
    assert len(convs) == 2 and convs[0][-1] == CHANNELS_LAST
    assert convs[0][0] == ([0, 1, 2, 3] if stem else CHANNELS_LAST)
    assert ("dim_order_ops::_clone_dim_order" in [op for op, _ in ops[:1]]) != stem
    # The weight [KH][KW][C][OC], or on a plane of fewer than 100 pixels as the model has it.
    conv = dict((c[0], c[1]) for c in CASES)[name]
    plain = conv.groups == 1 and conv.in_channels > 4
    small = plain and want.shape[2] * want.shape[3] < 100
    assert convs[0][1] == ([0, 1, 2, 3] if small else [2, 3, 1, 0])
    assert want.abs().max() > 0.5 and want.std() > 0.1  # outputs of order one that vary
    one = rt.load(str(pte), threads=1).run([x])[0]
    assert_matches(one, want)
    for threads in (2, 3):
        got = rt.load(str(pte), threads=threads).run([x])[0]
        assert torch.equal(got, one), f"threads={threads} differs from one thread"


class Residual(nn.Module):
    """A MobileNetV2-like stack: a stem, an inverted residual with an add, and a global average
    pool feeding a linear layer (the mean reads channels-last, writes contiguous); the add's
    result is also an output."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.stem = nn.Conv2d(3, 16, 3, 1, 1)
        self.expand = nn.Conv2d(16, 96, 1)
        self.dw = nn.Conv2d(96, 96, 3, 1, 1, groups=96)
        self.project = nn.Conv2d(96, 16, 1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        s = torch.relu(self.stem(x))
        y = nn.functional.relu6(self.expand(s))
        y = nn.functional.relu6(self.dw(y))
        y = self.project(y) + s
        return self.fc(y.mean((2, 3))), y


def test_residual_stack_converts_only_at_the_edges(rt, tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 30, 26)
    module = Residual().eval()
    pte = build_with_pipeline(module, [x], tmp_path, OVERRIDES)
    ops = _program_ops(pte)
    names = [op for op, _ in ops]
    # The stem reads the input as it is; the second output goes out converted: one conversion.
    assert names.count("dim_order_ops::_clone_dim_order") == 1, names
    assert names.index("dim_order_ops::_clone_dim_order") == len(names) - 3  # before mean, addmm
    for i, (op, orders) in enumerate(ops):
        if op in ("aten::convolution", "aten::add", "aten::relu", "aten::hardtanh"):
            acts = [o for o in orders if len(o) == 4 and o != [2, 3, 1, 0]]
            assert acts == [CHANNELS_LAST] * len(acts) or (i == 0 and acts[0] == [0, 1, 2, 3])
    with torch.no_grad():
        want = module(x)
    outs = {t: rt.load(str(pte), threads=t).run([x]) for t in (1, 2)}
    for got, w in zip(outs[1], want, strict=True):
        assert_matches(got, w)
    for a, b in zip(outs[1], outs[2], strict=True):
        assert torch.equal(a, b)


def test_off_by_default_the_program_is_contiguous(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 30, 26)
    pte = build_with_pipeline(Residual().eval(), [x], tmp_path)
    for _, orders in _program_ops(pte):
        assert all(o == list(range(len(o))) for o in orders)


def test_load_refuses_a_dim_order_the_kernel_does_not_take(rt, tmp_path, monkeypatch):
    """A channels-last tensor into a kernel that takes contiguous tensors only (max_pool2d):
    the pass would convert it; a program made otherwise is refused at load, naming both."""
    from etbuild.pipeline.stages import out_variant

    class Pool(nn.Module):
        def forward(self, x):
            return nn.functional.max_pool2d(torch.relu(x), 2)

    def every_inner_tensor_channels_last(program, ops):
        for v in program.values:
            if len(v.shape) == 4 and not (v.is_constant or v.is_input or v.is_output):
                v.dim_order = (0, 2, 3, 1)
        return 0, 0

    monkeypatch.setattr(out_variant, "to_channels_last", every_inner_tensor_channels_last)
    x = torch.randn(1, 8, 6, 6)
    pte = build_with_pipeline(Pool().eval(), [x], tmp_path, OVERRIDES)
    with pytest.raises(
        rt.Error,
        match=r"instruction 1: aten::max_pool2d_with_indices.out: argument 'self' has dim order "
        r"\(0, 2, 3, 1\); this kernel takes contiguous$",
    ):
        rt.load(str(pte)).run([x])  # the method loads on first use

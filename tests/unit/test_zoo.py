"""Unit tests for the model zoo (etbuild.pipeline.zoo)."""

from __future__ import annotations

import operator
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from etbuild.pipeline.errors import EtbuildError
from etbuild.pipeline.zoo import (
    ds_cnn,
    fc_autoencoder,
    mlp,
    mobilenet_v1_vww,
    mobilenet_v2,
    mobilenet_v3_small,
    reestimate_batchnorm,
    resnet8,
    resnet18,
    transformer,
)

Inputs = tuple[Tensor, ...]


def _image(batch: int) -> Inputs:
    return (torch.randn(batch, 3, 224, 224),)


def _features(batch: int) -> Inputs:
    return (torch.randn(batch, 64),)


def _tokens(batch: int, seq: int = 32) -> Inputs:
    return (torch.randint(0, 1000, (batch, seq)),)


def _mfcc(batch: int) -> Inputs:
    return (torch.randn(batch, 1, 49, 10),)


def _image96(batch: int) -> Inputs:
    return (torch.randn(batch, 3, 96, 96),)


def _image32(batch: int) -> Inputs:
    return (torch.randn(batch, 3, 32, 32),)


def _log_mel(batch: int) -> Inputs:
    return (torch.randn(batch, 640),)


# name -> (builder, input maker taking a batch size)
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[int], Inputs]]] = {
    "mobilenet_v2": (mobilenet_v2, _image),
    "mobilenet_v3_small": (mobilenet_v3_small, _image),
    "resnet18": (resnet18, _image),
    "mlp": (mlp, _features),
    "transformer": (transformer, _tokens),
    "ds_cnn": (ds_cnn, _mfcc),
    "mobilenet_v1_vww": (mobilenet_v1_vww, _image96),
    "resnet8": (resnet8, _image32),
    "fc_autoencoder": (fc_autoencoder, _log_mel),
}


def _seeded(name: str, seed: int = 0) -> nn.Module:
    """Build as the pipeline does: seed, build, re-estimate BatchNorm on random batches."""
    builder, make_inputs = MODELS[name]
    torch.manual_seed(seed)
    model = builder()
    reestimate_batchnorm(model, [make_inputs(8) for _ in range(4)])
    return model


@pytest.fixture(scope="module", params=list(MODELS))
def built(request: pytest.FixtureRequest) -> tuple[str, nn.Module, Inputs]:
    name = request.param
    model = _seeded(name)
    torch.manual_seed(1234)
    return name, model, MODELS[name][1](2)


def test_output_std_is_order_one(built: tuple[str, nn.Module, Inputs]) -> None:
    name, model, inputs = built
    assert not model.training
    with torch.no_grad():
        out = model(*inputs)
    std = out.std().item()
    assert torch.isfinite(out).all()
    assert 0.1 <= std <= 100, f"{name}: output std {std}"


def test_export_matches_eager(built: tuple[str, nn.Module, Inputs]) -> None:
    name, model, inputs = built
    with torch.no_grad():
        expected = model(*inputs)
    ep = torch.export.export(model.eval(), inputs, strict=False)
    torch.testing.assert_close(ep.module()(*inputs), expected, atol=1e-5, rtol=1e-4)

    core = ep.run_decompositions()
    torch.testing.assert_close(core.module()(*inputs), expected, atol=1e-4, rtol=1e-4)
    for node in core.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem:
            assert torch.Tag.core in node.target.tags, f"{name}: {node.target} is not core ATen"


@pytest.mark.parametrize("name", list(MODELS))
def test_builders_are_deterministic(name: str) -> None:
    builder = MODELS[name][0]
    torch.manual_seed(7)
    a = builder().state_dict()
    torch.manual_seed(7)
    b = builder().state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    torch.manual_seed(8)
    c = builder().state_dict()
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


@pytest.mark.parametrize(
    ("builder", "count"),
    [(mobilenet_v2, 3_504_872), (resnet18, 11_689_512), (mobilenet_v3_small, 2_542_856)],
)
def test_parameter_counts_match_torchvision(builder: Callable[[], nn.Module], count: int) -> None:
    assert sum(p.numel() for p in builder().parameters()) == count


# The parameter counts of the Keras references' model.summary(), which also counts each batch
# norm's moving mean and variance (buffers here).
@pytest.mark.parametrize(
    ("builder", "count"),
    [(ds_cnn, 24_908), (mobilenet_v1_vww, 221_794), (resnet8, 78_666), (fc_autoencoder, 269_992)],
)
def test_parameter_counts_match_the_mlperf_tiny_references(
    builder: Callable[[], nn.Module], count: int
) -> None:
    model = builder()
    statistics = sum(b.numel() for n, b in model.named_buffers() if n.endswith(("_mean", "_var")))
    assert sum(p.numel() for p in model.parameters()) + statistics == count


def test_mlperf_tiny_feature_map_shapes() -> None:
    """The references' intermediate shapes: DS-CNN's stride-2 10x4 conv maps 49x10 to 25x5
    (Keras 'same'), of which its 24x5 average pool covers the first 24 rows; MobileNetV1
    reaches 3x3x256 at 96x96 in; ResNet-8 reaches 8x8x64 at 32x32 in."""
    torch.manual_seed(0)
    model = ds_cnn().eval()
    (mfcc,) = _mfcc(1)
    assert model.stem(mfcc).shape == (1, 64, 25, 5)
    assert model.avgpool.kernel_size == (24, 5)
    (image,) = _image96(1)
    assert mobilenet_v1_vww().eval().features(image).shape == (1, 256, 3, 3)
    net = resnet8().eval()
    (image,) = _image32(1)
    assert net.stacks(net.stem(image)).shape == (1, 64, 8, 8)


def test_builder_arguments() -> None:
    torch.manual_seed(0)
    image = torch.randn(1, 3, 64, 64)
    assert mobilenet_v2(num_classes=10, width_mult=0.5).eval()(image).shape == (1, 10)
    assert mobilenet_v3_small(num_classes=5).eval()(image).shape == (1, 5)
    assert resnet18(num_classes=3).eval()(image).shape == (1, 3)
    small = mlp(in_features=8, hidden=[16, 16, 16], out_features=4)
    assert small(torch.randn(2, 8)).shape == (2, 4)
    model = transformer(vocab_size=50, dim=32, heads=2, layers=1, ffn_dim=64, max_seq_len=16)
    assert model(torch.randint(0, 50, (2, 16))).shape == (2, 10)
    with pytest.raises(EtbuildError, match="divisible"):
        transformer(dim=30, heads=4)
    assert ds_cnn(num_classes=5, channels=32).eval()(torch.randn(2, 1, 49, 10)).shape == (2, 5)
    assert mobilenet_v1_vww(num_classes=3, width_mult=0.5).eval()(image).shape == (1, 3)
    assert resnet8(num_classes=4).eval()(image).shape == (1, 4)
    autoencoder = fc_autoencoder(features=32, hidden=16, bottleneck=4).eval()
    assert autoencoder(torch.randn(2, 32)).shape == (2, 32)


def test_transformer_dynamic_seq_export() -> None:
    torch.manual_seed(0)
    model = transformer().eval()
    seq = torch.export.Dim("seq", min=2, max=128)
    ep = torch.export.export(
        model, _tokens(2, 16), dynamic_shapes=({1: seq},), strict=False
    ).run_decompositions()
    for length in (5, 128):
        (tokens,) = _tokens(2, length)
        with torch.no_grad():
            expected = model(tokens)
        torch.testing.assert_close(ep.module()(tokens), expected, atol=1e-5, rtol=1e-4)
        assert expected.std() >= 0.1


def test_reestimate_batchnorm_matches_data_statistics() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.BatchNorm1d(4, momentum=0.3))
    bn = model[2]
    batches = [torch.randn(16, 4) * 3 + 1 for _ in range(5)]
    model.train()
    reestimate_batchnorm(model, batches)  # bare tensors are taken as 1-tuples
    assert not model.training and not bn.training
    assert bn.momentum == 0.3
    assert int(bn.num_batches_tracked) == 5
    with torch.no_grad():
        h = [model[0](x) for x in batches]
    # Cumulative average of per-batch statistics (dropout off during the pass).
    mean = torch.stack([x.mean(0) for x in h]).mean(0)
    var = torch.stack([x.var(0, unbiased=True) for x in h]).mean(0)
    torch.testing.assert_close(bn.running_mean, mean)
    torch.testing.assert_close(bn.running_var, var)


def test_reestimate_batchnorm_tuples_and_no_bn() -> None:
    torch.manual_seed(0)
    model = mlp()
    model.train()
    reestimate_batchnorm(model, [_features(2)])
    assert not model.training
    with pytest.raises(EtbuildError, match="no batches"):
        reestimate_batchnorm(resnet18(), [])

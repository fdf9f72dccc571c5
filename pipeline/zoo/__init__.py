"""Model zoo: plain-torch builders with random (seeded) weights for etbuild examples and tests."""

from .batchnorm import reestimate_batchnorm
from .mlp import mlp
from .mlperf_tiny import ds_cnn, fc_autoencoder, mobilenet_v1_vww, resnet8
from .mobilenet_v2 import mobilenet_v2
from .mobilenet_v3 import mobilenet_v3_small
from .resnet import resnet18
from .transformer import transformer

__all__ = [
    "ds_cnn",
    "fc_autoencoder",
    "mlp",
    "mobilenet_v1_vww",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "reestimate_batchnorm",
    "resnet18",
    "resnet8",
    "transformer",
]

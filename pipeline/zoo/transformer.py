"""A small pre-LayerNorm transformer encoder classifier with hand-written attention."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import EtbuildError


class SelfAttention(nn.Module):
    """Multi-head self-attention from Linear, matmul and softmax only (no fused SDPA)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise EtbuildError(
                f"transformer: dim ({dim}) must be divisible by heads ({heads}); "
                "change model.dim or model.heads"
            )
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = self.head_dim**-0.5
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        # [B, T, D] -> [B, H, T, Dh]
        q = self.q(x).reshape(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).reshape(b, t, self.heads, self.head_dim).transpose(1, 2)
        v = self.v(x).reshape(b, t, self.heads, self.head_dim).transpose(1, 2)
        attn = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(b, t, d)
        return self.out(y)


class Block(nn.Module):
    """Pre-LN block: x + attn(ln(x)), then x + mlp(ln(x)) with a GELU MLP."""

    def __init__(self, dim: int, heads: int, ffn_dim: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, ffn_dim), nn.GELU(), nn.Linear(ffn_dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Encoder classifier: int64 token ids [N, T] (T <= max_seq_len) -> logits [N, num_classes]."""

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        heads: int,
        layers: int,
        ffn_dim: int,
        max_seq_len: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        self.tok_embed = nn.Embedding(vocab_size, dim)
        self.pos_embed = nn.Parameter(torch.randn(max_seq_len, dim) * 0.02)
        self.blocks = nn.Sequential(*(Block(dim, heads, ffn_dim) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        # With random token ids the mean of T near-independent unit-RMS token features has
        # norm ~sqrt(dim / T); this std keeps the logits of order one for every T allowed.
        nn.init.normal_(self.head.weight, std=0.5 * (max_seq_len / dim) ** 0.5)
        nn.init.zeros_(self.head.bias)

    def forward(self, tokens: Tensor) -> Tensor:
        t = tokens.shape[1]
        x = self.tok_embed(tokens) + self.pos_embed[:t]
        x = self.ln_f(self.blocks(x))
        return self.head(x.mean(dim=1))


def transformer(
    vocab_size: int = 1000,
    dim: int = 128,
    heads: int = 4,
    layers: int = 2,
    ffn_dim: int = 512,
    max_seq_len: int = 128,
    num_classes: int = 10,
) -> nn.Module:
    """Build a randomly initialised transformer encoder classifier over token ids."""
    return Transformer(vocab_size, dim, heads, layers, ffn_dim, max_seq_len, num_classes)

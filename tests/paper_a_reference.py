"""An independent reference for Paper A's model as its official code builds it, written from the paper's description
(no code from hf_attn): `MLP(concat(x, attention(x)))` layers with no residual and no LayerNorm, a linear input
encoding and a linear read-out.

Positional heads take queries and keys from the one-hot P (width d_P per head), standard heads from the layer
input (width d_model per head); values are d_model / heads wide. Attention projections are Xavier-uniform with
zero biases, every other layer keeps PyTorch's default initialisation.
"""

import torch
from torch import nn


class ReferenceAttention(nn.Module):
    def __init__(self, width: int, heads: int, positional: bool, positions: int):
        super().__init__()
        self.heads, self.positional = heads, positional
        self.qk_width = positions if positional else width
        self.query_key = nn.Linear(self.qk_width, 2 * self.qk_width * heads)
        self.value = nn.Linear(width, width)
        self.output = nn.Linear(width, width)
        for layer in (self.query_key, self.value, self.output):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        qk = self.query_key(p if self.positional else x).view(-1, length, self.heads, 2 * self.qk_width)
        q, k = qk.transpose(1, 2).chunk(2, dim=-1)  # (1 or B, heads, T, qk_width)
        weights = torch.softmax(q @ k.transpose(-1, -2) / self.qk_width**0.5, dim=-1)  # bidirectional
        v = self.value(x).view(batch, length, self.heads, -1).transpose(1, 2)
        return self.output((weights @ v).transpose(1, 2).reshape(batch, length, width))


class ReferenceModel(nn.Module):
    """Numbers in (B, T), one output per position; the standard model reads [value, one-hot position]."""

    def __init__(self, positional: bool, positions: int, width: int = 64, heads: int = 2, layers: int = 4,
                 hidden: int = 64):  # fmt: skip
        super().__init__()
        self.positional, self.p = positional, torch.eye(positions)
        self.encoding = nn.Linear(1 if positional else 1 + positions, width)
        self.attention = nn.ModuleList(ReferenceAttention(width, heads, positional, positions) for _ in range(layers))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(2 * width, hidden), nn.ReLU(), nn.Linear(hidden, width)) for _ in range(layers)
        )
        self.readout = nn.Linear(width, 1)

    def forward(self, values: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The outputs (B, T) and every layer's output."""
        x = values[..., None]
        if not self.positional:
            x = torch.cat([x, self.p.expand(len(values), -1, -1)], dim=-1)
        h, layer_outputs = self.encoding(x), []
        for attention, mlp in zip(self.attention, self.mlps, strict=True):
            h = mlp(torch.cat([h, attention(h, self.p)], dim=-1))
            layer_outputs.append(h)
        return self.readout(h)[..., 0], layer_outputs

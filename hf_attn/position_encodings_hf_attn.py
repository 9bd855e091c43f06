"""Fixed position encodings: the tables of P (Paper A's one-hot, binary, sinusoidal) and of residual sinusoidal
positions, and rotary embeddings for `position_embedding_type="rope"`."""

import math

import torch


def sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """(num_positions, dim) fixed sinusoids of Vaswani et al., sin in even and cos in odd columns."""
    position = torch.arange(num_positions, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(num_positions, dim)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table


def binary_table(num_positions: int, dim: int) -> torch.Tensor:
    """(num_positions, dim) bits of each index as +-1, least significant first (Paper A's later code)."""
    bits = (torch.arange(num_positions)[:, None] >> torch.arange(dim)[None, :]) & 1
    return bits.float() * 2 - 1


def onehot_table(num_positions: int, dim: int) -> torch.Tensor:
    """The identity: Paper A's `eye(n + 1)`."""
    return torch.eye(num_positions, dim)


FIXED_ENCODINGS = {"sinusoidal": sinusoidal_table, "binary": binary_table, "onehot": onehot_table}


def rotary_cos_sin(position_ids: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B|1, 1, T, dim) cos and sin for rotary embeddings at `position_ids` (B|1, T)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=position_ids.device) / dim)
    angles = position_ids[..., None].float() * inv_freq  # (B|1, T, dim / 2)
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # (B|1, 1, T, dim)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)

"""Fixed position encodings: the tables of P (Paper A's one-hot, binary, sinusoidal) and of residual sinusoidal
positions, and rotary embeddings for `position_embedding_type="rope"`."""

import math

import torch


def sinusoidal_rows(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """(..., dim) fixed sinusoids of Vaswani et al. at `positions`, sin in even and cos in odd columns."""
    angles = positions[..., None].float() * torch.exp(
        torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) * (-math.log(10000.0) / dim)
    )
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[..., :dim]


def binary_rows(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """(..., dim) bits of each position as +-1, least significant first (Paper A's later code)."""
    bits = (positions[..., None] >> torch.arange(dim, device=positions.device)) & 1
    return bits.float() * 2 - 1


def onehot_rows(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """(..., dim) the rows of the identity, Paper A's `eye(n + 1)`: zeros for a position >= dim."""
    return (positions[..., None] == torch.arange(dim, device=positions.device)).float()


# P's rows at given positions, by `positional_encoding`: computed where needed, so no table bounds the positions.
FIXED_ROWS = {"sinusoidal": sinusoidal_rows, "binary": binary_rows, "onehot": onehot_rows}


def fixed_table(kind: str, num_positions: int, dim: int) -> torch.Tensor:
    """(num_positions, dim): the rows of positions 0..num_positions - 1."""
    return FIXED_ROWS[kind](torch.arange(num_positions), dim)


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

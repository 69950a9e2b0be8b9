"""A small MLP: the first model of the data-parallel lab."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MLP"]


class MLP(nn.Module):
    """``in_dim -> hidden (x n_hidden, GELU) -> out_dim``; blocks live in ``self.layers``."""

    def __init__(self, in_dim: int = 16, hidden: int = 64, out_dim: int = 4, n_hidden: int = 2):
        super().__init__()
        dims = [in_dim] + [hidden] * n_hidden
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(a, b), nn.GELU()) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(dims[-1], out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

"""Additive position tables through posenc's operators.

sinusoidal_table(positions, dim, base=10000.0, layout="interleaved", dtype=None)
    Vaswani et al.'s table (sec. 3.5): angle_i = p * base^(-2i/dim), i < dim/2, for positions
    [...] (an int n means 0..n-1; fractional positions such as timestamps are taken as they are)
    -> [..., dim], computed in float64 by torch.ops.posenc.sinusoidal_table and rounded once to
    dtype (default float64). layout "interleaved": sin, cos, sin, cos, ... (Vaswani;
    XLM/DistilBERT's create_sinusoidal_embeddings); "concat": all sines, then all cosines
    (Marian's MarianSinusoidalPositionalEmbedding, MAE's 1D table). In float32 equal to
    transformers' tables to the bit at 512 x 768 and within one float32 ulp where the float64
    values straddle a rounding point (3 of 2M values at 2048 x 1024: numpy divides by
    10000^(2i/d), posenc multiplies by 10000^(-2i/d)); tests/python/test_tables.py.
"""

from __future__ import annotations

import torch

from . import _library

_library.load()

__all__ = ["sinusoidal_table"]


def sinusoidal_table(
    positions: int | torch.Tensor,
    dim: int,
    base: float = 10000.0,
    layout: str = "interleaved",
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """positions [...] (or n: 0..n-1) -> [..., dim] sinusoidal table."""
    if isinstance(positions, bool) or not isinstance(positions, (int, torch.Tensor)):
        raise ValueError(
            f"posenc.sinusoidal_table: positions must be an int or a tensor, got "
            f"{type(positions).__name__}"
        )
    if isinstance(positions, int):
        if positions < 0:
            raise ValueError(f"posenc.sinusoidal_table: a length must be >= 0, got {positions}")
        positions = torch.arange(positions, dtype=torch.float64)
    table = torch.ops.posenc.sinusoidal_table(positions, int(dim), float(base), layout)
    return table if dtype is None else table.to(dtype)

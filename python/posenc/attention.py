"""Attention with the ALiBi or T5 bias computed on the fly (no [H, N, N] bias tensor), in SDPA's
layout.

    out = posenc.alibi_attention(q, k, v, slopes, causal=True)   # q [B, H, Nq, D], slopes [H]
    slopes = posenc.alibi_slopes(heads)                          # Press et al.'s geometric slopes

equals torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias) with
bias[h, i, j] = -slopes[h] * (p_i - p_j) (causal; |p_i - p_j| with symmetric=True), the keys at
positions 0..Nk-1 and the queries at the last Nq of them (cached keys first). CPU kernel with its
backward (torch.ops.posenc.alibi_attention; fake kernels for torch.compile).

    out = posenc.t5_attention(q, k, v, table, scale=1.0)         # table [num_buckets, H]

equals SDPA with attn_mask=T5Attention.compute_bias(Nq, Nk, past_seen_tokens=Nk - Nq) (the same
table as relative_attention_bias.weight), gradients for q, k, v and the table
(torch.ops.posenc.t5_attention).
"""

from __future__ import annotations

import math

import torch

__all__ = ["alibi_attention", "alibi_slopes", "t5_attention"]


def alibi_slopes(heads: int) -> torch.Tensor:
    """ALiBi's slopes for `heads` heads (Press et al. 2022; BLOOM's build_alibi_tensor for a head
    count that is not a power of two): float32 [heads]."""
    if heads < 1:
        raise ValueError(f"posenc.alibi_slopes: heads must be >= 1, got {heads}")
    # float32 powers of a float32 base, as BLOOM computes them (to the bit)
    closest = 2 ** math.floor(math.log2(heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != heads:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        remaining = min(closest, heads - closest)
        powers = torch.arange(1, 1 + 2 * remaining, 2, dtype=torch.int32)
        slopes = torch.cat([slopes, torch.pow(extra, powers)])
    return slopes


def alibi_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor,
                    causal: bool = False, symmetric: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale - slope_h * distance + causal mask) v, [B, H, Nq, Dv]."""
    return torch.ops.posenc.alibi_attention(q, k, v, slopes, causal, symmetric, scale)


def t5_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, *,
                 bidirectional: bool = True, max_distance: int = 128, causal: bool = False,
                 scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + table[bucket(j - p_i), h] + causal mask) v, [B, H, Nq, Dv].

    T5's relative-position bias (transformers' T5Attention.compute_bias) computed inside the
    tiles: table [num_buckets, H] (relative_attention_bias.weight), float32 or q's dtype, with a
    gradient; bucket = T5's _relative_position_bucket(key position - query position,
    bidirectional, num_buckets, max_distance) (encoders: bidirectional=True; decoders:
    bidirectional=False, causal=True). The keys sit at positions 0..Nk-1, the queries at the last
    Nq of them (cached keys first; lower-right causal mask). scale None is 1/sqrt(D) as in SDPA;
    T5 does not scale its logits, so code ported from T5 passes scale=1.0.
    """
    return torch.ops.posenc.t5_attention(q, k, v, table, bidirectional, max_distance, causal,
                                         scale)

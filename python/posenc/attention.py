"""Attention with the ALiBi, T5 or Shaw bias computed on the fly (no [H, N, N] bias tensor), and
RoPE applied inside the same kernel, in SDPA's layout.

    out = posenc.alibi_attention(q, k, v, slopes, causal=True)   # q [B, H, Nq, D], slopes [H]
    slopes = posenc.alibi_slopes(heads)                          # Press et al.'s geometric slopes

equals torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias) with
bias[h, i, j] = -slopes[h] * (p_i - p_j) (causal; |p_i - p_j| with symmetric=True), the keys at
positions 0..Nk-1 and the queries at the last Nq of them (cached keys first): positional_attention
with slopes=slopes (one operator, torch.ops.posenc.positional_attention: its tiled CPU kernel and
backward, its fake kernel for torch.compile, on CUDA tensors its CUDA kernel; Shaw's
query-dependent bias takes the plain-ATen reference there).

    out = posenc.t5_attention(q, k, v, table, scale=1.0)         # table [num_buckets, H]

equals SDPA with attn_mask=T5Attention.compute_bias(Nq, Nk, past_seen_tokens=Nk - Nq) (the same
table as relative_attention_bias.weight), gradients for q, k, v and the table: positional_attention
with t5_table=table.

    out = posenc.shaw_attention(q, k, v, table)                  # table [2K+1, D]

softmax((q_i . k_j + q_i . table[clip(j - p_i, -K, K) + K]) / sqrt(D)) v: Shaw et al.'s
(2018) relative key representations (eq. 5; transformers' position_embeddings_type=
"relative_key" in Wav2Vec2-BERT and SeamlessM4Tv2, BERT's in transformers 4.x), the q . table
scores read inside the tiles; gradients for q, k, v and the table
(torch.ops.posenc.shaw_attention).

    cos, sin = posenc.rope_cos_sin(torch.arange(nk), inv_freq)   # [Nk, W], as transformers' tables
    out = posenc.positional_attention(q, k, v, cos=cos, sin=sin, slopes=slopes, t5_table=table)

softmax(rot(q) rot(k)^T * scale - slope_h (p_i - p_j) + table[bucket(j - p_i), h]) v, each part
optional: RoPE applied to q and k as the kernel loads its tiles (no rotated copy of q or k),
ALiBi and T5's bias summed in the same pass (torch.ops.posenc.positional_attention).
"""

from __future__ import annotations

import math
import operator

import torch

__all__ = [
    "alibi_attention",
    "alibi_slopes",
    "positional_attention",
    "shaw_attention",
    "t5_attention",
]


# alibi_attention and t5_attention are positional_attention with one bias part: the same operator,
# kernels, fake and autograd. What they refuse beyond it (float64, which positional_attention
# takes on its reference path) and the messages that name them are checked here, as the C++ check
# of positional_attention words them (src/bindings/attention_operators.cpp, check_qkv),
# RuntimeError as there; under torch.compile each is a guard on the shapes' relation (true for
# every call that runs).
_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check_sdpa_qkv(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise RuntimeError(
            f"{op}: q, k, v must be [B, H, N, D] (SDPA's layout), got {list(q.shape)}, "
            f"{list(k.shape)}, {list(v.shape)}"
        )
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0]:
        raise RuntimeError(f"{op}: batch sizes differ: {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if q.shape[1] != k.shape[1] or k.shape[1] != v.shape[1]:
        raise RuntimeError(
            f"{op}: head counts differ: q {q.shape[1]}, k {k.shape[1]}, v {v.shape[1]} "
            "(repeat grouped k, v heads first)"
        )
    if q.shape[3] != k.shape[3]:
        raise RuntimeError(f"{op}: q has D={q.shape[3]} but k has D={k.shape[3]}")
    if k.shape[2] != v.shape[2]:
        raise RuntimeError(f"{op}: k has Nk={k.shape[2]} but v has {v.shape[2]}")
    if q.shape[2] > k.shape[2]:
        raise RuntimeError(
            f"{op}: more queries ({q.shape[2]}) than keys ({k.shape[2]}): the queries are the "
            "last keys' positions"
        )
    if q.dtype not in _KERNEL_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise RuntimeError(
            f"{op}: q, k, v must share one of float32, bfloat16, float16; got {q.dtype}, "
            f"{k.dtype}, {v.dtype}"
        )


def alibi_slopes(heads: int) -> torch.Tensor:
    """ALiBi's slopes for `heads` heads (Press et al. 2022; BLOOM's build_alibi_tensor for a head
    count that is not a power of two): float32 [heads]."""
    try:  # an int (or numpy / torch integer); 3.5 or True is not a head count
        count = None if isinstance(heads, bool) else operator.index(heads)
    except TypeError:
        count = None
    if count is None or count < 1:
        raise ValueError(f"posenc.alibi_slopes: heads must be an integer >= 1, got {heads!r}")
    heads = count
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


def alibi_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slopes: torch.Tensor,
    causal: bool = False,
    symmetric: bool = False,
    scale: float | None = None,
    *,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale - slope_h * distance + causal mask) v, [B, H, Nq, Dv].

    attention_mask: transformers' 2-D mask [B, Nk], bool or integer, True / 1 = a key to attend
    to, False / 0 = padding (left or right). Padding keys get no weight; a query that sees no
    key returns 0 (and no gradient), as SDPA returns it. The positions stay the key indices
    0..Nk-1: the relative biases between real tokens are those of an unpadded sequence as long
    as the padding sits at one end (BLOOM's cumsum positions give the same softmax), not for
    padding between real tokens.
    """
    _check_sdpa_qkv("posenc.alibi_attention", q, k, v)
    return positional_attention(
        q,
        k,
        v,
        slopes=slopes,
        symmetric=symmetric,
        causal=causal,
        scale=scale,
        attention_mask=attention_mask,
    )


def t5_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    table: torch.Tensor,
    *,
    bidirectional: bool = True,
    max_distance: int = 128,
    causal: bool = False,
    scale: float | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale + table[bucket(j - p_i), h] + causal mask) v, [B, H, Nq, Dv].

    T5's relative-position bias (transformers' T5Attention.compute_bias) computed inside the
    tiles: table [num_buckets, H] (relative_attention_bias.weight), float32 or q's dtype, with a
    gradient; bucket = T5's _relative_position_bucket(key position - query position,
    bidirectional, num_buckets, max_distance) (encoders: bidirectional=True; decoders:
    bidirectional=False, causal=True). The keys sit at positions 0..Nk-1, the queries at the last
    Nq of them (cached keys first; lower-right causal mask). scale None is 1/sqrt(D) as in SDPA;
    T5 does not scale its logits, so code ported from T5 passes scale=1.0.

    attention_mask: as alibi_attention's.
    """
    _check_sdpa_qkv("posenc.t5_attention", q, k, v)
    if table.dim() != 2 or table.shape[1] != q.shape[1]:
        raise RuntimeError(
            f"posenc.t5_attention: table must be [num_buckets, H] = [num_buckets, {q.shape[1]}], "
            f"got {list(table.shape)}"
        )
    return positional_attention(
        q,
        k,
        v,
        t5_table=table,
        bidirectional=bidirectional,
        max_distance=max_distance,
        causal=causal,
        scale=scale,
        attention_mask=attention_mask,
    )


def shaw_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    table: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax((q_i . k_j + q_i . table[clip(j - p_i, -K, K) + K]) * scale + causal mask) v,
    [B, H, Nq, Dv].

    Shaw et al. 2018 (eq. 5, the key-side a^K_ij; no value-side a^V_ij): table [2K+1, D], one
    for all heads, float32 or q's dtype, with a gradient; row K + d is the representation of
    offset d = key position - query position, offsets beyond +-K clipped to the edge rows. The
    keys sit at positions 0..Nk-1, the queries at the last Nq of them (cached keys first;
    lower-right causal mask). scale multiplies both terms (Shaw's and BERT's 1/sqrt(D) is
    scale=None, as SDPA). q, k, v float32/bfloat16/float16 take the tiled CPU kernel (float32
    inside), float64 a float64 plain-ATen reference; CUDA: the reference. Grouped k, v heads are
    refused (repeat them first), as by alibi_attention and t5_attention.

    Tables from transformers (E = distance_embedding.weight, q, k, v from its projections):

    * Wav2Vec2-BERT / SeamlessM4Tv2 relative_key (offset r - l clamped to [-left, right], row
      offset + left; E [left + right + 1, D]), K = max(left, right):
      ``table = E[torch.arange(-K, K + 1).clamp(-left, right) + left]`` (equal whenever
      left == right, where it is E itself).
    * BERT relative_key (transformers 4.x; row l - r + max_position_embeddings - 1, unclipped,
      E [2 * max_position_embeddings - 1, D]): ``table = E.flip(0)``, K =
      max_position_embeddings - 1 (BERT's sign is query minus key; equal while Nk <=
      max_position_embeddings, past which BERT indexes out of its table). BERT's
      relative_key_query (a key-side q . E term too) is not expressible.

    Both mappings are indexing ops, so gradients reach E.

    attention_mask: as alibi_attention's.
    """
    return torch.ops.posenc.shaw_attention(q, k, v, table, causal, scale, attention_mask)


def positional_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    layout: str = "half",
    slopes: torch.Tensor | None = None,
    symmetric: bool = False,
    t5_table: torch.Tensor | None = None,
    bidirectional: bool = True,
    max_distance: int = 128,
    causal: bool = False,
    scale: float | None = None,
    attention_mask: torch.Tensor | None = None,
    sample_ids: torch.Tensor | None = None,
    variate_ids: torch.Tensor | None = None,
    variate_bias: torch.Tensor | None = None,
    causal_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(rot(q_i) . rot(k_j) * scale - slope_h d(i, j) + t5_table[bucket(j - p_i), h]
    + variate_bias[variate_i == variate_j, h] + masks) v, [B, H, Nq, Dv]; every part optional,
    all in one pass of the tiled kernel.

    q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv]; the keys sit at positions 0..Nk-1, the
    queries at the last Nq of them (cached keys first; lower-right causal mask), for all three
    parts.

    * RoPE (cos, sin): apply_rotary_pos_emb's tables as transformers' rotary modules,
      posenc.rope_cos_sin and posenc.RotaryEmbedding return them: [Nk, W] or [B or 1, Nk, W],
      one row per key position (query i takes row Nk - Nq + i), W <= D even (dims W.. pass
      through: partial rotary), any floating dtype (read in float32). layout "half": each row
      cat(t, t), pairs (i, i + W/2) (rotate_half: Llama, Qwen, ...); "interleaved": t0 t0 t1 t1
      ..., pairs (2i, 2i + 1) (rotate_every_two: GPT-J, GLM; transformers' cat(t, t) tables
      become ``cos[..., :W//2].repeat_interleave(2, -1)``, or RotaryEmbedding's default
      table_order="layout"). k is passed unrotated (a cache holds unrotated keys); the kernel
      rotates q and k as it loads its tiles, and its backward rotates dq, dk back. The tables
      are constants there; where the kernel cannot read them (per-batch tables whose batch rows
      differ, pairs whose two members hold different values) q and k are rotated first in
      float32 by the same formula, and tables that require a gradient (under grad mode) by
      posenc.apply_rotary_pos_emb in q's dtype (gradients for cos and sin through it).
      posenc.positional_attention_route says which path a call takes (a posenc.AttentionRoute).
    * ALiBi (slopes [H], e.g. posenc.alibi_slopes(H); no gradient): -slope_h (p_i - p_j), or
      -slope_h |p_i - p_j| with symmetric=True (Press et al. 2022; BLOOM's build_alibi_tensor up
      to a per-row constant).
    * T5 (t5_table [num_buckets, H] = relative_attention_bias.weight, float32 or q's dtype, with
      a gradient): T5's _relative_position_bucket(j - p_i, bidirectional, num_buckets,
      max_distance), as t5_attention.

    scale None is 1/sqrt(D) as in SDPA (T5 does not scale: pass scale=1.0). q, k, v float32,
    bfloat16 or float16 take the tiled CPU kernel (float32 inside), float64 a float64 plain-ATen
    reference (gradcheck); CUDA tensors the CUDA kernel (RoPE applied first, in float32; the
    reference for float64, head dims above 256, or ALiBi with T5). Grouped k, v heads are
    refused (repeat them first), as by the other attentions.

    attention_mask: as alibi_attention's (for all three parts).

    Packed series (Moirai-2, uni2ts' packed_attention_mask and BinaryAttentionBias):

    * sample_ids [B, Nk] int64: several samples packed in one sequence; key j is visible to
      query i only when their sample ids are equal (queries take the last Nq ids). Each id must
      be one contiguous run per row; the kernel then visits only the tiles whose runs meet, no
      [Nq, Nk] mask is built. A query that sees no key (all its keys padded) gives 0.
    * variate_ids [B, Nk] int64 >= 0 with variate_bias [2, H]: + variate_bias[1, h] where the
      two tokens' variate ids are equal, + variate_bias[0, h] otherwise; variate_bias is
      Moirai's ``nn.Embedding(2, H).weight`` as is, with a gradient (two sums of dS per head).
    * causal_ids [B, Nk] int64: causal in these ids instead of token order: key j is visible to
      query i only when causal_ids[b, j] <= causal_ids[b, Nk - Nq + i] (Moirai-2's
      packed_causal_attention_mask with time_id: a series of several variates packed
      variate-major is not in time order). Together with sample_ids both rules hold; with
      causal=True it is refused (two causal rules). The kernel skips a tile whose keys' smallest
      id exceeds its queries' largest; no [Nq, Nk] mask is built.

    On CUDA the CUDA kernel reads sample_ids and the variate bias the same way (tiles skipped,
    the gradient of variate_bias a deterministic sum); causal_ids take the plain-ATen reference
    path there.
    """
    return torch.ops.posenc.positional_attention(
        q,
        k,
        v,
        cos,
        sin,
        layout,
        slopes,
        symmetric,
        t5_table,
        bidirectional,
        max_distance,
        causal,
        scale,
        attention_mask,
        sample_ids,
        variate_ids,
        variate_bias,
        causal_ids,
    )

"""posenc.positional_attention — RoPE inside the tiled kernel plus ALiBi and T5's bias in one
call — against the plain formula built from transformers' own pieces:

    softmax(rot(q) rot(k)^T * scale + alibi + t5_bias + causal mask) v

* rot: transformers' apply_rotary_pos_emb (Llama: rotate_half, full head; Phi-3: rotate_half,
  partial; GLM: interleaved, partial and full) with the tables of the same family's rotary
  module (LlamaRotaryEmbedding, Phi3RotaryEmbedding, GlmRotaryEmbedding), passed to posenc as
  they come (GLM's cat(t, t) tables re-interleaved as GLM's own function does);
* alibi: BLOOM's build_alibi_tensor (slope_h * p_j: the same softmax as -slope_h (p_i - p_j)),
  the symmetric form written out;
* t5_bias: T5Attention.compute_bias with the same weights (and, for gradients,
  T5Attention._relative_position_bucket + an embedding, differentiable in the table).

The oracle runs in float64; forward and gradients (q, k, v, the T5 table), causal and not,
cached keys (Nq < Nk) and one-token decode, tiles crossed (Nq > 128, Nk > 256); which path
RoPE takes (positional_attention_route: inside the tiles where the kernel can read the tables,
else rotated first — never a different result); learned tables; float16/bfloat16; float64
gradcheck; opcheck (float32, float64, bfloat16; transposed views); empty tensors;
torch.compile(fullgraph=True, dynamic=True) without recompiles; bad input in one line.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import posenc

transformers = pytest.importorskip("transformers")
modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
modeling_phi3 = pytest.importorskip("transformers.models.phi3.modeling_phi3")
modeling_glm = pytest.importorskip("transformers.models.glm.modeling_glm")
modeling_bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")

# float32 kernel against a float64 oracle: tiles summed in float32, the softmax's exp on 8 lanes
# (relative error <= 2^-22), rotation in float32
F32_TOL = dict(rtol=1e-5, atol=1e-5)
# float32 gradients: dS summed over up to 300 keys and 2 batches in float32 (as
# test_t5_attention.py)
F32_GRAD_TOL = dict(rtol=1e-4, atol=1e-4)
# bfloat16/float16 storage (q, k, v and the output rounded to 8 or 11 bits)
HALF_TOL = dict(rtol=2e-2, atol=2e-2)

HEADS, HEAD_DIM = 4, 16
NUM_BUCKETS, MAX_DISTANCE = 32, 20


# ---- transformers' pieces ------------------------------------------------------------------


def _rotary(family, nk, head_dim=HEAD_DIM, heads=HEADS):
    """(apply_rotary_pos_emb, cos, sin, posenc layout) from one transformers family: the tables
    of its rotary module for positions 0..nk-1 ([1, nk, W] float32, transformers' order) and the
    tables posenc reads for that layout."""
    x = torch.zeros(1, nk, heads * head_dim)
    positions = torch.arange(nk)[None]
    if family == "llama":  # rotate_half, full head
        config = transformers.LlamaConfig(
            hidden_size=heads * head_dim, num_attention_heads=heads, head_dim=head_dim
        )
        cos, sin = modeling_llama.LlamaRotaryEmbedding(config)(x, positions)
        return modeling_llama.apply_rotary_pos_emb, cos, sin, "half", cos, sin
    if family == "phi3":  # rotate_half over the first half of each head
        config = transformers.Phi3Config(
            hidden_size=heads * head_dim, num_attention_heads=heads, partial_rotary_factor=0.5
        )
        cos, sin = modeling_phi3.Phi3RotaryEmbedding(config)(x, positions)
        return modeling_phi3.apply_rotary_pos_emb, cos, sin, "half", cos, sin
    factor = 0.5 if family == "glm" else 1.0  # GLM: interleaved pairs, partial or full
    config = transformers.GlmConfig(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        head_dim=head_dim,
        partial_rotary_factor=factor,
    )
    cos, sin = modeling_glm.GlmRotaryEmbedding(config)(x, positions)

    def interleave(t):  # what GLM's apply_rotary_pos_emb does to cat(t, t) itself
        return t[..., : t.shape[-1] // 2].repeat_interleave(2, dim=-1)

    return (
        modeling_glm.apply_rotary_pos_emb,
        cos,
        sin,
        "interleaved",
        interleave(cos),
        interleave(sin),
    )


def _rotate(rope, q, k, cos, sin):
    """transformers' rotation of q (rows Nk - Nq..Nk-1 of the tables) and k (all rows)."""
    nq, nk = q.shape[-2], k.shape[-2]
    qr = rope(q, q, cos[:, nk - nq :], sin[:, nk - nq :])[0]
    kr = rope(k, k, cos, sin)[0]
    return qr, kr


def _bloom_alibi(batch, heads, nk):
    """BLOOM's build_alibi_tensor over nk keys: slope_h * p_j, [B, H, 1, Nk] float64."""
    mask = torch.ones(batch, nk, dtype=torch.long)
    return modeling_bloom.build_alibi_tensor(mask, heads, torch.float64).view(batch, heads, 1, nk)


def _t5_compute_bias(table, nq, nk, bidirectional, max_distance):
    """T5Attention.compute_bias with `table` as relative_attention_bias.weight: [1, H, Nq, Nk]."""
    config = transformers.T5Config(
        d_model=table.shape[1] * 8,
        d_kv=8,
        num_heads=table.shape[1],
        relative_attention_num_buckets=table.shape[0],
        relative_attention_max_distance=max_distance,
        is_decoder=not bidirectional,
        dropout_rate=0.0,
    )
    attn = modeling_t5.T5Attention(config, has_relative_attention_bias=True, layer_idx=0).eval()
    with torch.no_grad():
        attn.relative_attention_bias.weight.copy_(table)
    return attn.compute_bias(nq, nk, past_seen_tokens=nk - nq)


def _t5_bias_with_grad(table, nq, nk, bidirectional, max_distance):
    """The same bias through T5's bucket function and an embedding: differentiable in table."""
    rel = torch.arange(nk)[None, :] - torch.arange(nk - nq, nk)[:, None]
    bucket = modeling_t5.T5Attention._relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=table.shape[0], max_distance=max_distance
    )
    return F.embedding(bucket, table).permute(2, 0, 1)  # [H, Nq, Nk]


def _oracle(
    q,
    k,
    v,
    *,
    rope=None,
    cos=None,
    sin=None,
    alibi=False,
    symmetric=False,
    slopes=None,
    table=None,
    bidirectional=True,
    max_distance=MAX_DISTANCE,
    causal=False,
    scale=None,
    table_grad=False,
):
    """softmax(rot(q) rot(k)^T * scale + alibi + t5_bias + causal) v in float64, written out
    with transformers' pieces; differentiable in q, k, v (and the table with table_grad)."""
    q, k, v = q.double(), k.double(), v.double()
    b, h, nq, d = q.shape
    nk = k.shape[-2]
    if rope is not None:
        q, k = _rotate(rope, q, k, cos.double(), sin.double())
    s = 1.0 / math.sqrt(d) if scale is None else scale
    logits = q @ k.transpose(-1, -2) * s
    rel = torch.arange(nk)[None, :] - torch.arange(nk - nq, nk)[:, None]  # key - query position
    if alibi and symmetric:  # -slope_h |p_i - p_j|, written out
        logits = logits - slopes.double()[:, None, None] * rel.abs().double()
    elif alibi:
        logits = logits + _bloom_alibi(b, h, nk)
    if table is not None:
        bias = (
            _t5_bias_with_grad(table, nq, nk, bidirectional, max_distance)
            if table_grad
            else _t5_compute_bias(table.detach(), nq, nk, bidirectional, max_distance)
        )
        logits = logits + bias.double()
    if causal:
        logits = logits.masked_fill(rel > 0, float("-inf"))
    return torch.softmax(logits, -1) @ v


def _inputs(b, h, nq, nk, d, dtype=torch.float32, seed=0, num_buckets=NUM_BUCKETS):
    g = torch.Generator().manual_seed(seed)
    q = (0.5 * torch.randn(b, h, nq, d, generator=g)).to(dtype).requires_grad_()
    k = (0.5 * torch.randn(b, h, nk, d, generator=g)).to(dtype).requires_grad_()
    v = torch.randn(b, h, nk, d, generator=g).to(dtype).requires_grad_()
    table = (2 * torch.randn(num_buckets, h, generator=g)).requires_grad_()
    return q, k, v, table


def _call(q, k, v, parts, table, causal, family="llama", **kwargs):
    """posenc.positional_attention and the oracle's keyword arguments for `parts`."""
    ours, theirs = {}, {}
    if "rope" in parts:
        rope, cos, sin, layout, pcos, psin = _rotary(family, k.shape[-2])
        ours.update(cos=pcos, sin=psin, layout=layout)
        theirs.update(rope=rope, cos=cos, sin=sin)
    if "alibi" in parts:
        ours.update(slopes=posenc.alibi_slopes(q.shape[1]))
        theirs.update(alibi=True)
    if "t5" in parts:
        ours.update(t5_table=table, bidirectional=not causal, max_distance=MAX_DISTANCE)
        theirs.update(table=table, bidirectional=not causal, max_distance=MAX_DISTANCE)
    ours.update(causal=causal, **kwargs)
    theirs.update(causal=causal, **kwargs)
    return posenc.positional_attention(q, k, v, **ours), theirs


PARTS = ["rope+alibi+t5", "rope+alibi", "rope+t5", "rope", "alibi+t5"]
SIZES = [(37, 37), (5, 64), (1, 19), (130, 300)]


@pytest.mark.parametrize("parts", PARTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", SIZES)
def test_forward_equals_the_formula_from_transformers_pieces(parts, causal, nq, nk):
    q, k, v, table = _inputs(2, HEADS, nq, nk, HEAD_DIM)
    out, theirs = _call(q, k, v, parts, table, causal)
    torch.testing.assert_close(out.double(), _oracle(q, k, v, **theirs), **F32_TOL)
    # every part matters here: the attention without the last one differs
    without = dict(theirs)
    if "t5" in parts:
        without.pop("table")
    elif "alibi" in parts:
        without.pop("alibi")
    else:
        without.pop("rope")
    assert (out.double() - _oracle(q, k, v, **without)).abs().max() > 1e-2


@pytest.mark.parametrize("parts", PARTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(37, 37), (5, 64), (130, 300)])
def test_gradients_equal_autograd_through_the_formula(parts, causal, nq, nk):
    q, k, v, table = _inputs(2, HEADS, nq, nk, HEAD_DIM, seed=1)
    out, theirs = _call(q, k, v, parts, table, causal)
    want = _oracle(q, k, v, table_grad=True, **theirs)
    torch.testing.assert_close(out.double(), want, **F32_TOL)
    g = torch.randn_like(out)
    inputs = (q, k, v, table) if "t5" in parts else (q, k, v)
    got = torch.autograd.grad(out, inputs, g)
    ref = torch.autograd.grad(want, inputs, g.double())
    for name, a, b_ in zip("q k v table".split(), got, ref):
        assert a.shape == b_.shape and a.dtype == b_.dtype, name
        torch.testing.assert_close(a, b_, **F32_GRAD_TOL, msg=lambda m: f"d{name}: {m}")
    if "t5" in parts:
        assert got[3].abs().max() > 1e-3  # the table's gradient is not trivially zero


@pytest.mark.parametrize("family", ["llama", "phi3", "glm", "glm_full"])
@pytest.mark.parametrize("causal", [False, True])
def test_layouts_and_partial_rotary(family, causal):
    """rotate_half over the whole head (Llama) or its first half (Phi-3), interleaved pairs over
    the first half (GLM) or the whole head, with ALiBi and T5: outputs and gradients."""
    q, k, v, table = _inputs(2, HEADS, 21, 50, HEAD_DIM, seed=2)
    _, _, _, layout, pcos, psin = _rotary(family, 50)
    assert (
        torch.ops.posenc.positional_attention_route(q, k, v, pcos, psin, layout)
        == "fused, RoPE inside"
    )
    out, theirs = _call(q, k, v, "rope+alibi+t5", table, causal, family=family)
    want = _oracle(q, k, v, table_grad=True, **theirs)
    torch.testing.assert_close(out.double(), want, **F32_TOL)
    got = torch.autograd.grad(out.sum(), (q, k, v, table))
    ref = torch.autograd.grad(want.sum(), (q, k, v, table))
    for name, a, b_ in zip("q k v table".split(), got, ref):
        torch.testing.assert_close(a, b_, **F32_GRAD_TOL, msg=lambda m: f"d{name}: {m}")
    # the layout matters: the other one's result is far off
    wrong = posenc.positional_attention(
        q,
        k,
        v,
        cos=pcos,
        sin=psin,
        layout="interleaved" if layout == "half" else "half",
        slopes=posenc.alibi_slopes(HEADS),
        t5_table=table,
        bidirectional=not causal,
        max_distance=MAX_DISTANCE,
        causal=causal,
    )
    assert (wrong - out).abs().max() > 1e-2


@pytest.mark.parametrize("causal", [False, True])
def test_symmetric_alibi_with_rope_and_a_scale(causal):
    q, k, v, table = _inputs(1, HEADS, 40, 70, HEAD_DIM, seed=3)
    out, theirs = _call(q, k, v, "rope+alibi+t5", table, causal, symmetric=True, scale=0.3)
    theirs.update(slopes=posenc.alibi_slopes(HEADS))
    want = _oracle(q, k, v, table_grad=True, **theirs)
    torch.testing.assert_close(out.double(), want, **F32_TOL)
    got = torch.autograd.grad(out.sum(), (q, k, v, table))
    ref = torch.autograd.grad(want.sum(), (q, k, v, table))
    for name, a, b_ in zip("q k v table".split(), got, ref):
        torch.testing.assert_close(a, b_, **F32_GRAD_TOL, msg=lambda m: f"d{name}: {m}")


def test_one_token_decode_with_cached_keys():
    """Cached (unrotated) keys, the new queries at the last positions: the rows of the full
    causal attention, for one token and for a chunk of 3."""
    n = 300
    q, k, v, table = _inputs(2, HEADS, n, n, HEAD_DIM, seed=4)
    _, _, _, layout, cos, sin = _rotary("llama", n)
    kwargs = dict(
        cos=cos,
        sin=sin,
        layout=layout,
        slopes=posenc.alibi_slopes(HEADS),
        t5_table=table,
        bidirectional=False,
        max_distance=MAX_DISTANCE,
        causal=True,
    )
    full = posenc.positional_attention(q, k, v, **kwargs)
    for chunk in (1, 3):
        step = posenc.positional_attention(q[:, :, -chunk:], k, v, **kwargs)
        torch.testing.assert_close(step, full[:, :, -chunk:], rtol=1e-6, atol=1e-6)


def test_rope_goes_inside_or_is_rotated_first_never_a_different_result():
    q, k, v, table = _inputs(3, HEADS, 20, 45, HEAD_DIM, seed=5)
    rope, cos, sin, layout, _, _ = _rotary("llama", 45)
    common = dict(
        slopes=posenc.alibi_slopes(HEADS),
        t5_table=table,
        bidirectional=False,
        max_distance=MAX_DISTANCE,
        causal=True,
    )
    route = torch.ops.posenc.positional_attention_route
    positions = torch.stack([torch.arange(45), torch.arange(45) + 7, torch.arange(45) * 2])
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2).double() / HEAD_DIM))
    per_batch = posenc.rope_cos_sin(positions.double(), inv_freq)  # rows differ per batch
    skewed = (cos * torch.linspace(0.5, 1.5, HEAD_DIM), sin)  # pair members differ
    cases = [  # tables, the route they take
        ((cos[0], sin[0]), "fused, RoPE inside"),  # [Nk, W]
        ((cos, sin), "fused, RoPE inside"),  # [1, Nk, W], as transformers returns them
        ((cos.expand(3, -1, -1), sin.expand(3, -1, -1)), "fused, RoPE inside"),  # equal rows
        (per_batch, "fused, RoPE outside: per-batch tables whose rows differ"),
        (skewed, "fused, RoPE outside: the two members of a pair read different table values"),
    ]
    for (c, s), want_route in cases:
        assert route(
            q, k, v, c, s, layout, common["slopes"], False, table, False, MAX_DISTANCE, True, None
        ).startswith(want_route), want_route
        out = posenc.positional_attention(q, k, v, cos=c, sin=s, layout=layout, **common)
        hf_c, hf_s = (c if c.dim() == 3 else c[None]), (s if s.dim() == 3 else s[None])
        want = _oracle(
            q,
            k,
            v,
            rope=rope,
            cos=hf_c,
            sin=hf_s,
            alibi=True,
            table=table,
            bidirectional=False,
            causal=True,
            table_grad=True,
        )
        torch.testing.assert_close(
            out.double(), want, **F32_TOL, msg=lambda m: f"{want_route}: {m}"
        )
        got = torch.autograd.grad(out.sum(), (q, k, v, table))
        ref = torch.autograd.grad(want.sum(), (q, k, v, table))
        for name, a, b_ in zip("q k v table".split(), got, ref):
            torch.testing.assert_close(
                a, b_, **F32_GRAD_TOL, msg=lambda m: f"{want_route} d{name}: {m}"
            )
    assert route(q.double(), k.double(), v.double(), cos, sin).startswith("reference: float64")
    assert route(q, k, v) == "fused"


def test_learned_tables_get_gradients_through_apply_rotary():
    """Tables that require a gradient (learned frequencies): rotated first by apply_rotary,
    so cos and sin get theirs."""
    q, k, v, table = _inputs(2, HEADS, 9, 30, HEAD_DIM, seed=6)
    rope, cos, sin, layout, _, _ = _rotary("llama", 30)
    cos, sin = cos.clone().requires_grad_(), sin.clone().requires_grad_()
    assert torch.ops.posenc.positional_attention_route(q, k, v, cos, sin).startswith(
        "apply_rotary first (cos/sin require grad), then fused"
    )
    out = posenc.positional_attention(
        q,
        k,
        v,
        cos=cos,
        sin=sin,
        t5_table=table,
        causal=True,
        bidirectional=False,
        max_distance=MAX_DISTANCE,
    )
    want = _oracle(
        q,
        k,
        v,
        rope=rope,
        cos=cos,
        sin=sin,
        table=table,
        bidirectional=False,
        causal=True,
        table_grad=True,
    )
    torch.testing.assert_close(out.double(), want, **F32_TOL)
    inputs = (q, k, v, table, cos, sin)
    got = torch.autograd.grad(out.sum(), inputs)
    ref = torch.autograd.grad(want.sum(), inputs)
    for name, a, b_ in zip("q k v table cos sin".split(), got, ref):
        torch.testing.assert_close(a, b_, **F32_GRAD_TOL, msg=lambda m: f"d{name}: {m}")
    with torch.no_grad():  # no gradient wanted: the tables go inside as constants
        torch.testing.assert_close(
            posenc.positional_attention(
                q,
                k,
                v,
                cos=cos,
                sin=sin,
                t5_table=table,
                causal=True,
                bidirectional=False,
                max_distance=MAX_DISTANCE,
            ),
            out.detach(),
            **F32_TOL,
        )


def test_slopes_have_no_gradient():
    q, k, v, _ = _inputs(1, HEADS, 4, 4, HEAD_DIM)
    slopes = posenc.alibi_slopes(HEADS).requires_grad_()
    with pytest.raises(RuntimeError, match="the slopes have no gradient") as e:
        posenc.positional_attention(q, k, v, slopes=slopes)
    assert "\n" not in str(e.value).strip()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("table_dtype", ["float32", "q"])
def test_half_precision_and_default_scale(dtype, table_dtype):
    q, k, v, table = _inputs(1, HEADS, 20, 33, HEAD_DIM, dtype)
    table = table.detach().to(dtype if table_dtype == "q" else torch.float32).requires_grad_()
    rope, cos, sin, layout, _, _ = _rotary("llama", 33)
    out = posenc.positional_attention(
        q,
        k,
        v,
        cos=cos.to(dtype),
        sin=sin.to(dtype),
        slopes=posenc.alibi_slopes(HEADS),
        t5_table=table,
        bidirectional=False,
        max_distance=MAX_DISTANCE,
        causal=True,
    )
    assert out.dtype == dtype
    want = _oracle(
        q.detach().float(),
        k.detach().float(),
        v.detach().float(),
        rope=rope,
        cos=cos.to(dtype),
        sin=sin.to(dtype),
        alibi=True,
        table=table.detach().float(),
        bidirectional=False,
        causal=True,
    )
    torch.testing.assert_close(out.double(), want, **HALF_TOL)
    out.float().sum().backward()
    assert q.grad.dtype == dtype and table.grad.dtype == table.dtype
    table32 = table.detach().float().requires_grad_()
    _oracle(
        q.detach().float(),
        k.detach().float(),
        v.detach().float(),
        rope=rope,
        cos=cos.to(dtype),
        sin=sin.to(dtype),
        alibi=True,
        table=table32,
        bidirectional=False,
        causal=True,
        table_grad=True,
    ).sum().backward()
    torch.testing.assert_close(table.grad.float(), table32.grad, rtol=3e-2, atol=3e-2)


def test_gradcheck_float64():
    """float64 takes the float64 plain-ATen reference: central differences on q, k, v and the
    T5 table, RoPE (partial, interleaved) with ALiBi and T5, cached keys."""
    q, k, v, table = (
        t.detach().double().requires_grad_() for t in _inputs(1, 2, 3, 6, 8, num_buckets=8)
    )
    _, _, _, layout, cos, sin = _rotary("glm", 6, head_dim=8, heads=2)
    slopes = posenc.alibi_slopes(2)
    torch.autograd.gradcheck(
        lambda *a: posenc.positional_attention(
            *a[:3],
            cos=cos,
            sin=sin,
            layout=layout,
            slopes=slopes,
            t5_table=a[3],
            bidirectional=False,
            max_distance=5,
            causal=True,
        ),
        (q, k, v, table),
    )
    # and the float64 result is the float32 kernel's within float32's precision
    out64 = posenc.positional_attention(
        q,
        k,
        v,
        cos=cos,
        sin=sin,
        layout=layout,
        slopes=slopes,
        t5_table=table,
        bidirectional=False,
        max_distance=5,
    )
    out32 = posenc.positional_attention(
        q.float(),
        k.float(),
        v.float(),
        cos=cos,
        sin=sin,
        layout=layout,
        slopes=slopes,
        t5_table=table.float(),
        bidirectional=False,
        max_distance=5,
    )
    torch.testing.assert_close(out32.double(), out64, **F32_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_opcheck(dtype):
    q, k, v, table = (
        t.detach().to(dtype).requires_grad_() for t in _inputs(2, 2, 6, 9, 8, num_buckets=8)
    )
    _, _, _, _, cos, sin = _rotary("llama", 9, head_dim=8, heads=2)
    _, _, _, _, icos, isin = _rotary("glm", 9, head_dim=8, heads=2)
    slopes = posenc.alibi_slopes(2)
    op = torch.ops.posenc.positional_attention
    torch.library.opcheck(
        op, (q, k, v, cos, sin, "half", slopes, False, table, True, 16, False, None)
    )
    torch.library.opcheck(
        op, (q, k, v, icos[0], isin[0], "interleaved", None, False, table, False, 5, True, 0.5)
    )
    torch.library.opcheck(
        op, (q, k, v, None, None, "half", slopes, True, None, True, 128, True, None)
    )
    torch.library.opcheck(op, (q, k, v, cos, sin, "half", None, False, None, True, 128, False, 1.0))
    # non-contiguous inputs (transposed projections) and per-batch tables (rotated first)
    qt, kt, vt = (
        t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v)
    )
    assert not qt.is_contiguous()
    per_batch = (torch.cat([cos, cos.roll(1, 1)]), torch.cat([sin, sin.roll(1, 1)]))
    torch.library.opcheck(
        op, (qt, kt, vt, *per_batch, "half", slopes, False, table, True, 16, True, None)
    )
    args = (cos, sin, "half", slopes, False, table.detach(), False, 6, True, 0.5)
    q, k, v = (t.detach() for t in (qt, kt, vt))
    torch.library.opcheck(torch.ops.posenc._positional_attention_forward, (q, k, v, *args))
    out, lse = torch.ops.posenc._positional_attention_forward(q, k, v, *args)
    torch.library.opcheck(
        torch.ops.posenc._positional_attention_backward,
        (torch.randn_like(out), q, k, v, out, lse, *args),
    )
    args = (None, None, "half", slopes, False, None, False, 6, True, 0.5)  # no table: dtable [0]
    out, lse = torch.ops.posenc._positional_attention_forward(q, k, v, *args)
    torch.library.opcheck(
        torch.ops.posenc._positional_attention_backward,
        (torch.randn_like(out), q, k, v, out, lse, *args),
    )


@pytest.mark.parametrize("shape", [(0, 2, 3, 5), (2, 2, 0, 0), (2, 2, 0, 5), (1, 0, 3, 3)])
def test_empty_tensors(shape):
    b, h, nq, nk = shape
    q = torch.randn(b, h, nq, 8, requires_grad=True)
    k = torch.randn(b, h, nk, 8, requires_grad=True)
    v = torch.randn(b, h, nk, 8, requires_grad=True)
    table = torch.randn(8, h, requires_grad=True)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 8, 2).float() / 8))
    cos, sin = posenc.rope_cos_sin(torch.arange(nk).float(), inv_freq)
    out = posenc.positional_attention(
        q,
        k,
        v,
        cos=cos,
        sin=sin,
        slopes=posenc.alibi_slopes(h) if h else torch.zeros(0),
        t5_table=table,
        max_distance=16,
        causal=True,
    )
    assert out.shape == (b, h, nq, 8)
    out.sum().backward()
    for t in (q, k, v, table):
        assert t.grad.shape == t.shape and not t.grad.any()


def test_compiles_without_graph_breaks_or_recompiles():
    table = torch.randn(NUM_BUCKETS, 2, requires_grad=True)
    slopes = posenc.alibi_slopes(2)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16))

    def f(q, k, v, table):
        cos, sin = posenc.rope_cos_sin(torch.arange(k.shape[2], dtype=torch.float32), inv_freq)
        return posenc.positional_attention(
            q,
            k,
            v,
            cos=cos,
            sin=sin,
            slopes=slopes,
            t5_table=table,
            bidirectional=False,
            max_distance=MAX_DISTANCE,
            causal=True,
        ).sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (9, 13, 21):  # none equal to D or H (duck sizing would specialize)
            q, k, v, _ = _inputs(1, 2, n, n, 16, seed=n)
            table.grad = None
            compiled(q, k, v, table).backward()
            got_table = table.grad.clone()
            table.grad = None
            q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
            f(q2, k2, v2, table).backward()
            torch.testing.assert_close(q.grad, q2.grad)
            torch.testing.assert_close(k.grad, k2.grad)
            torch.testing.assert_close(got_table, table.grad)


def test_bad_input_is_one_line():
    q, k, v, table = _inputs(1, 2, 4, 6, 8)
    cos, sin = torch.ones(6, 8), torch.zeros(6, 8)

    def fails(match, *args, **kwargs):
        with pytest.raises(RuntimeError, match=match) as e:
            posenc.positional_attention(*args, **kwargs)
        assert "\n" not in str(e.value).strip(), str(e.value)

    name = r"posenc.positional_attention: "
    fails(name + r"cos and sin go together; got cos without sin", q, k, v, cos=cos)
    fails(name + r"cos and sin go together; got sin without cos", q, k, v, sin=sin)
    fails(
        name + r"cos and sin shapes differ: \[6, 8\] vs \[6, 6\]", q, k, v, cos=cos, sin=sin[:, :6]
    )
    fails(
        name + r"cos, sin must be \[Nk, W\] or \[B or 1, Nk, W\] \(rows for the key positions "
        r"0..Nk-1\) with Nk=6, got \[4, 8\]",
        q,
        k,
        v,
        cos=cos[:4],
        sin=sin[:4],
    )
    fails(r"cos, sin must be \[Nk, W\].*got \[8\]", q, k, v, cos=cos[0], sin=sin[0])
    fails(
        r"cos, sin batch must be 1 or B=1, got \[3, 6, 8\]",
        q,
        k,
        v,
        cos=cos.expand(3, -1, -1),
        sin=sin.expand(3, -1, -1),
    )
    fails(
        r"the rotary width cos.size\(-1\) must be even, got 7",
        q,
        k,
        v,
        cos=cos[:, :7],
        sin=sin[:, :7],
    )
    fails(
        r"the rotary width cos.size\(-1\)=10 exceeds the head dim D=8",
        q,
        k,
        v,
        cos=torch.ones(6, 10),
        sin=torch.ones(6, 10),
    )
    fails(r"cos, sin must be floating point, got Long", q, k, v, cos=cos.long(), sin=sin.long())
    fails(
        name + r"layout must be 'half' or 'interleaved', got 'rotate_half'",
        q,
        k,
        v,
        cos=cos,
        sin=sin,
        layout="rotate_half",
    )
    fails(name + r"slopes must be \[H\] = \[2\], got \[3\]", q, k, v, slopes=torch.ones(3))
    fails(
        name + r"slopes must be floating point, got Long",
        q,
        k,
        v,
        slopes=torch.ones(2, dtype=torch.long),
    )
    fails(
        name + r"t5_table must be \[num_buckets, H\] = \[num_buckets, 2\], got \[32, 3\]",
        q,
        k,
        v,
        t5_table=torch.zeros(32, 3),
    )
    fails(
        name + r"t5_table.size\(0\) \(num_buckets\) must be >= 4 with bidirectional=True, "
        r"got 3",
        q,
        k,
        v,
        t5_table=torch.zeros(3, 2),
    )
    fails(
        name + r"max_distance must exceed the exact range 8 \(num_buckets=32, bidirectional\), "
        r"got 8",
        q,
        k,
        v,
        t5_table=table,
        max_distance=8,
    )
    fails(
        name + r"t5_table must be float32 or q's dtype \(Float\), got BFloat16",
        q,
        k,
        v,
        t5_table=table.bfloat16(),
    )
    fails(name + r"more queries \(4\) than keys \(3\)", q, k[:, :, :3], v[:, :, :3])
    fails(
        name + r"q, k, v must share one of float32, bfloat16, float16, float64; got Int",
        q.int(),
        k.int(),
        v.int(),
    )
    fails(name + r"head counts differ: q 2, k 1, v 1", q, k[:, :1], v[:, :1])
    fails(name + r"q has D=8 but k has D=4", q, k[..., :4], v)
    assert math.isfinite(posenc.positional_attention(q, k, v, cos=cos, sin=sin).sum().item())

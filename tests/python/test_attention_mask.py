"""transformers' 2-D attention_mask ([B, Nk], 1 = a key to attend to, 0 = padding) in posenc's
attention operators, against PyTorch's own scaled_dot_product_attention with the bias and the
padding materialized as its float mask (the code a user would write): left and right padding,
causal and not, cached keys (Nq < Nk), forward and gradients; the tiled CPU kernel (float32,
bfloat16) and the float64 reference; a query that sees no key gives 0 as SDPA's boolean mask
gives it; integer masks as tokenizers return them; opcheck, torch.compile, bad input."""

import pytest
import torch
import torch.nn.functional as F

import posenc

NEG = float("-inf")


def _inputs(b, h, nq, nk, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    k = torch.randn(b, h, nk, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    v = torch.randn(b, h, nk, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    return q, k, v


def _mask(b, nk, padding, lengths):
    """[B, Nk] bool: row r has lengths[r] real keys, the padding on the left or the right."""
    m = torch.zeros(b, nk, dtype=torch.bool)
    for r, n in enumerate(lengths):
        if padding == "left":
            m[r, nk - n :] = True
        else:
            m[r, :n] = True
    return m


def _rel(nq, nk):
    """key minus query position [Nq, Nk]: keys at 0..Nk-1, queries at the last Nq of them."""
    return torch.arange(nk)[None, :] - torch.arange(nk - nq, nk)[:, None]


def _alibi_bias(slopes, nq, nk):
    return slopes[:, None, None].double() * _rel(nq, nk).double()  # -slope (p_i - p_j)


def _t5_bias(table, nq, nk, bidirectional, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    bucket = T5Attention._relative_position_bucket(
        _rel(nq, nk),
        bidirectional=bidirectional,
        num_buckets=table.shape[0],
        max_distance=max_distance,
    )
    return table[bucket].permute(2, 0, 1)  # [H, Nq, Nk]


def _sdpa(q, k, v, bias, mask, causal, scale=None):
    """SDPA with bias [H or B.., Nq, Nk] + padding + causal as one float mask, in float64."""
    nq, nk = q.shape[2], k.shape[2]
    full = bias.double().expand(q.shape[0], q.shape[1], nq, nk)
    full = full.masked_fill(~mask[:, None, None, :], NEG)
    if causal:
        full = full.masked_fill(_rel(nq, nk) > 0, NEG)
    return F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=full, scale=scale
    )


def _seen(mask, nq, nk, causal):
    """[B, Nq] bool: the queries that see at least one key."""
    visible = mask[:, None, :].expand(-1, nq, -1)
    if causal:
        visible = visible & (_rel(nq, nk) <= 0)
    return visible.any(-1)


def _compare(out, want, inputs, seen, tol):
    """Rows that see a key equal SDPA's (forward and gradients); the others are 0 (SDPA's would
    be NaN with -inf everywhere in a float mask) and pass no gradient."""
    rows = seen[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[rows], want[rows], rtol=tol, atol=tol)
    assert (out[~rows] == 0).all()
    g = torch.randn(out.shape, dtype=torch.float64).masked_fill(~rows, 0)
    got = torch.autograd.grad(out, inputs, g.to(out.dtype))
    ref = torch.autograd.grad(want, inputs, g, allow_unused=True)
    for a, b in zip(got, ref):
        torch.testing.assert_close(
            a.double(), torch.nan_to_num(b.double(), 0.0), rtol=10 * tol, atol=10 * tol
        )


CASES = [
    ("left", False, 11, 11),
    ("right", False, 11, 11),
    ("left", True, 11, 11),
    ("right", True, 11, 11),
    ("left", True, 3, 70),
    ("right", False, 1, 19),
]


@pytest.mark.parametrize("padding,causal,nq,nk", CASES)
def test_alibi_and_t5_with_padding_equal_sdpa(padding, causal, nq, nk):
    dtype = torch.float32  # these two take float32/bfloat16/float16 (the kernel)
    b, h, d = 3, 2, 16
    mask = _mask(b, nk, padding, [nk, nk - 4, 2])
    seen = _seen(mask, nq, nk, causal)
    q, k, v = _inputs(b, h, nq, nk, d, dtype)
    slopes = posenc.alibi_slopes(h)
    out = posenc.alibi_attention(q, k, v, slopes, causal=causal, attention_mask=mask)
    _compare(out, _sdpa(q, k, v, _alibi_bias(slopes, nq, nk), mask, causal), (q, k, v), seen, 1e-5)
    table = torch.randn(32, h, dtype=torch.float64).to(dtype).requires_grad_()
    out = posenc.t5_attention(
        q, k, v, table, bidirectional=not causal, causal=causal, attention_mask=mask
    )
    want = _sdpa(q, k, v, _t5_bias(table.double(), nq, nk, not causal, 128), mask, causal)
    _compare(out, want, (q, k, v, table), seen, 1e-5)


@pytest.mark.parametrize("padding,causal,nq,nk", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shaw_and_positional_with_padding_equal_sdpa(padding, causal, nq, nk, dtype):
    b, h, d = 3, 2, 16
    mask = _mask(b, nk, padding, [nk, nk - 4, 2])
    seen = _seen(mask, nq, nk, causal)
    q, k, v = _inputs(b, h, nq, nk, d, dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    # Shaw: logits (q.k + q.a[clip(j - p_i) + K]) / sqrt(D)
    kmax = 3
    table = torch.randn(2 * kmax + 1, d, dtype=torch.float64).to(dtype).requires_grad_()
    out = posenc.shaw_attention(q, k, v, table, causal=causal, attention_mask=mask)
    index = _rel(nq, nk).clamp(-kmax, kmax) + kmax
    bias = (q.double() @ table.double().t()).gather(-1, index.expand(b, h, nq, nk)) / d**0.5
    _compare(out, _sdpa(q, k, v, bias, mask, causal), (q, k, v, table), seen, tol)
    # RoPE inside + ALiBi + T5 in one call
    cos, sin = posenc.rope_cos_sin(torch.arange(nk), 1.0 / 100 ** (torch.arange(0, d, 2) / d))
    slopes = posenc.alibi_slopes(h)
    t5 = torch.randn(16, h, dtype=torch.float64).to(dtype).requires_grad_()
    out = posenc.positional_attention(
        q,
        k,
        v,
        cos=cos,
        sin=sin,
        slopes=slopes,
        t5_table=t5,
        bidirectional=not causal,
        max_distance=20,
        causal=causal,
        attention_mask=mask,
    )
    qr = (
        q.double() * cos[nk - nq :].double()
        + posenc_rotate_half(q.double()) * sin[nk - nq :].double()
    )
    kr = k.double() * cos.double() + posenc_rotate_half(k.double()) * sin.double()
    bias = _alibi_bias(slopes, nq, nk) + _t5_bias(t5.double(), nq, nk, not causal, 20)
    want = _sdpa(qr, kr, v, bias, mask, causal)
    _compare(out, want, (q, k, v, t5), seen, tol)


def posenc_rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat((-b, a), -1)


def test_bfloat16_with_padding_is_sdpa_within_its_rounding():
    q, k, v = _inputs(2, 2, 9, 9, 16, torch.bfloat16)
    mask = _mask(2, 9, "left", [9, 5])
    slopes = posenc.alibi_slopes(2)
    out = posenc.alibi_attention(q, k, v, slopes, causal=True, attention_mask=mask)
    assert out.dtype == torch.bfloat16
    want = _sdpa(q, k, v, _alibi_bias(slopes, 9, 9), mask, True)
    seen = _seen(mask, 9, 9, True)[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[seen], want[seen], rtol=2e-2, atol=2e-2)


def test_a_query_that_sees_no_key_is_zero_as_sdpa_gives_it():
    # left padding with causal: the padding queries see only padding keys
    q, k, v = _inputs(2, 2, 6, 6, 8)
    mask = _mask(2, 6, "left", [6, 3])
    out = posenc.alibi_attention(q, k, v, torch.zeros(2), causal=True, attention_mask=mask)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=causal & mask[:, None, None, :])
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)  # SDPA's bool mask: rows of 0
    assert (out[1, :, :3] == 0).all()


def test_an_all_ones_mask_changes_nothing_and_integer_masks_equal_bool():
    q, k, v = _inputs(2, 2, 7, 7, 8)
    slopes = posenc.alibi_slopes(2)
    plain = posenc.alibi_attention(q, k, v, slopes, causal=True)
    ones = posenc.alibi_attention(
        q, k, v, slopes, causal=True, attention_mask=torch.ones(2, 7, dtype=torch.long)
    )
    torch.testing.assert_close(ones, plain, rtol=0, atol=0)
    mask = _mask(2, 7, "left", [7, 4])
    for dtype in (torch.long, torch.int32, torch.uint8):
        torch.testing.assert_close(
            posenc.alibi_attention(q, k, v, slopes, attention_mask=mask.to(dtype)),
            posenc.alibi_attention(q, k, v, slopes, attention_mask=mask),
            rtol=0,
            atol=0,
        )


def test_the_padding_keys_values_do_not_matter():
    q, k, v = _inputs(2, 2, 7, 7, 8)
    mask = _mask(2, 7, "right", [7, 4])
    slopes = posenc.alibi_slopes(2)
    out = posenc.alibi_attention(q, k, v, slopes, attention_mask=mask)
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[1, :, 4:] = 1e4
    v2[1, :, 4:] = -1e4  # finite: a weight of 0 times NaN is NaN here as in SDPA
    torch.testing.assert_close(
        posenc.alibi_attention(q, k2, v2, slopes, attention_mask=mask)[1], out[1], rtol=0, atol=0
    )


def test_opcheck_with_a_mask():
    q, k, v = (t.detach() for t in _inputs(2, 2, 5, 9, 8))
    mask = _mask(2, 9, "left", [9, 4])
    slopes = posenc.alibi_slopes(2)
    table = torch.randn(8, 2)
    ops = torch.ops.posenc
    alibi = (None, None, "half", slopes, False, None, True, 128, True, None, mask)
    torch.library.opcheck(ops.positional_attention, (q, k, v, *alibi))
    out, lse = ops._positional_attention_forward(q, k, v, *alibi)
    torch.library.opcheck(
        ops._positional_attention_backward, (torch.randn_like(out), q, k, v, out, lse, *alibi)
    )
    t5 = (None, None, "half", None, False, table, True, 16, False, None, mask)
    torch.library.opcheck(ops.positional_attention, (q, k, v, *t5))
    torch.library.opcheck(ops.shaw_attention, (q, k, v, torch.randn(5, 8), True, None, mask))
    torch.library.opcheck(
        ops.positional_attention,
        (q, k, v, None, None, "half", slopes, False, table, True, 16, True, None, mask),
    )


def test_gradcheck_float64_reference_with_a_mask():
    q, k, v = _inputs(2, 1, 3, 5, 4, torch.float64)
    mask = _mask(2, 5, "left", [5, 2])
    table = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(
        lambda *a: posenc.shaw_attention(*a, causal=True, attention_mask=mask), (q, k, v, table)
    )


def test_compiles_with_a_mask_without_graph_breaks_or_recompiles():
    slopes = posenc.alibi_slopes(2)

    def f(q, k, v, mask):
        return posenc.alibi_attention(q, k, v, slopes, causal=True, attention_mask=mask).sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (9, 13, 21):
            q, k, v = _inputs(2, 2, n, n, 16, seed=n)
            mask = _mask(2, n, "left", [n, n - 5])
            compiled(q, k, v, mask).backward()
            q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
            f(q2, k2, v2, mask).backward()
            torch.testing.assert_close(q.grad, q2.grad)


def test_bad_masks_are_one_line():
    q, k, v = _inputs(2, 2, 4, 6, 8)
    slopes = posenc.alibi_slopes(2)
    with pytest.raises(RuntimeError, match=r"attention_mask must be \[B, Nk\] = \[2, 6\]"):
        posenc.alibi_attention(q, k, v, slopes, attention_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(RuntimeError, match=r"an additive float mask is not taken"):
        posenc.t5_attention(q, k, v, torch.zeros(8, 2), attention_mask=torch.zeros(2, 6))
    with pytest.raises(RuntimeError, match=r"values must be 0 or 1, got values in \[1, 2\]"):
        posenc.shaw_attention(
            q, k, v, torch.zeros(3, 8), attention_mask=torch.tensor([[1, 1, 1, 1, 1, 2]] * 2)
        )
    with pytest.raises(RuntimeError, match=r"posenc.positional_attention: attention_mask must be"):
        posenc.positional_attention(q, k, v, attention_mask=torch.ones(6, dtype=torch.bool))


def test_a_left_padded_batch_equals_blooms_own_attention():
    """transformers' BloomAttention (its cumsum positions from the attention mask, its additive
    causal + padding mask, float32 softmax) against the same module's projections around
    posenc.alibi_attention with the 2-D mask: equal on every real token, forward and gradients."""
    pytest.importorskip("transformers")
    from transformers import BloomConfig
    from transformers.models.bloom.modeling_bloom import BloomAttention, build_alibi_tensor

    torch.manual_seed(0)
    config = BloomConfig(hidden_size=48, n_head=6, attention_dropout=0.0, hidden_dropout=0.0)
    attn = BloomAttention(config, layer_idx=0).eval()
    b, n, h = 3, 10, 6
    mask = _mask(b, n, "left", [10, 6, 1]).long()  # as a tokenizer pads for generation
    hidden = torch.randn(b, n, 48, requires_grad=True)
    residual = torch.zeros(b, n, 48)
    alibi = build_alibi_tensor(mask, h, torch.float32)  # [B*H, 1, N]
    visible = mask.bool()[:, None, None, :] & (_rel(n, n) <= 0)
    additive = torch.zeros(b, 1, n, n).masked_fill(~visible, torch.finfo(torch.float32).min)
    theirs, _ = attn(hidden, residual, alibi, additive)

    q, k, v = attn._reshape(attn.query_key_value(hidden))
    ctx = posenc.alibi_attention(
        q, k, v, posenc.alibi_slopes(h), causal=True, attention_mask=mask
    )  # [B, H, N, D]
    ours = attn.dense(ctx.transpose(1, 2).reshape(b, n, 48)) + residual
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], rtol=1e-5, atol=1e-5)
    g = torch.randn(b, n, 48).masked_fill(~real[..., None], 0)
    got = torch.autograd.grad(ours, [hidden, *attn.parameters()], g)
    want = torch.autograd.grad(theirs, [hidden, *attn.parameters()], g)
    for a, w in zip(got, want):
        torch.testing.assert_close(a, w, rtol=1e-4, atol=1e-5)

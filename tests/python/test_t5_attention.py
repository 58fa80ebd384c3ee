"""posenc.t5_attention against transformers' own T5Attention: its compute_bias (same table in
relative_attention_bias.weight) as SDPA's mask, a plain float64 softmax reference, and the whole
T5Attention module (eager) around it; forward and gradients for q, k, v and the table,
encoder (bidirectional) and decoder (unidirectional, causal), cached keys (Nq < Nk), tiles
crossed (Nq > 128, Nk > 256), float32/bfloat16; opcheck, torch.compile(fullgraph=True,
dynamic=True), bad input."""

import math

import pytest
import torch
import torch.nn.functional as F

import posenc

modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
T5Config = pytest.importorskip("transformers").T5Config


def _hf_attention(heads, num_buckets, max_distance, bidirectional, d_kv=16):
    config = T5Config(
        d_model=heads * d_kv,
        d_kv=d_kv,
        num_heads=heads,
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=not bidirectional,
        dropout_rate=0.0,
    )
    config._attn_implementation = "eager"
    return modeling_t5.T5Attention(config, has_relative_attention_bias=True, layer_idx=0).eval()


def _hf_bias(table, nq, nk, bidirectional, max_distance, causal):
    """T5Attention.compute_bias with `table` as its weight, queries after Nk - Nq cached keys,
    plus the causal mask: [1, H, Nq, Nk] float32."""
    attn = _hf_attention(table.shape[1], table.shape[0], max_distance, bidirectional)
    with torch.no_grad():
        attn.relative_attention_bias.weight.copy_(table)
    bias = attn.compute_bias(nq, nk, past_seen_tokens=nk - nq)
    if causal:
        j = torch.arange(nk)[None, :]
        i = torch.arange(nk - nq, nk)[:, None]
        bias = bias.masked_fill(j > i, float("-inf"))
    return bias


def _bias_with_grad(table, nq, nk, bidirectional, max_distance, causal):
    """The same bias, differentiable in `table` (transformers' bucket function, an embedding)."""
    rel = torch.arange(nk)[None, :] - torch.arange(nk - nq, nk)[:, None]
    bucket = modeling_t5.T5Attention._relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=table.shape[0], max_distance=max_distance
    )
    bias = F.embedding(bucket, table).permute(2, 0, 1)  # [H, Nq, Nk]
    if causal:
        bias = bias.masked_fill(rel > 0, float("-inf"))
    return bias


def _plain(q, k, v, bias, scale):
    """softmax(q k^T * scale + bias) v in float64, written out."""
    logits = torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale + bias.double()
    return torch.matmul(torch.softmax(logits, -1), v.double())


def _inputs(b, h, nq, nk, d, dtype=torch.float32, seed=0, num_buckets=32):
    g = torch.Generator().manual_seed(seed)
    q = (0.5 * torch.randn(b, h, nq, d, generator=g)).to(dtype).requires_grad_()
    k = (0.5 * torch.randn(b, h, nk, d, generator=g)).to(dtype).requires_grad_()
    v = torch.randn(b, h, nk, d, generator=g).to(dtype).requires_grad_()
    table = (2 * torch.randn(num_buckets, h, generator=g)).requires_grad_()
    return q, k, v, table


CASES = [  # bidirectional, causal, max_distance: encoder, decoder, and the other two mixes
    (True, False, 128),
    (False, True, 128),
    (True, False, 20),
    (False, True, 20),
    (False, False, 40),
    (True, True, 40),
]
SIZES = [(37, 37), (5, 64), (1, 19), (130, 300)]


@pytest.mark.parametrize("bidirectional,causal,max_distance", CASES)
@pytest.mark.parametrize("nq,nk", SIZES)
def test_forward_equals_t5_compute_bias_in_sdpa_and_the_plain_reference(
    bidirectional, causal, max_distance, nq, nk
):
    q, k, v, table = _inputs(2, 4, nq, nk, 16)
    out = posenc.t5_attention(
        q,
        k,
        v,
        table,
        bidirectional=bidirectional,
        max_distance=max_distance,
        causal=causal,
        scale=1.0,
    )
    bias = _hf_bias(table.detach(), nq, nk, bidirectional, max_distance, causal)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)
    torch.testing.assert_close(out, sdpa, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), _plain(q, k, v, bias, 1.0), rtol=1e-5, atol=1e-5)
    # the bias matters here: the same attention without it is far off
    assert (out - F.scaled_dot_product_attention(q, k, v, scale=1.0)).abs().max() > 0.1


@pytest.mark.parametrize("bidirectional,causal,max_distance", CASES)
@pytest.mark.parametrize("nq,nk", SIZES)
def test_gradients_equal_autograd_through_the_materialized_bias(
    bidirectional, causal, max_distance, nq, nk
):
    q, k, v, table = _inputs(2, 4, nq, nk, 16, seed=1)
    out = posenc.t5_attention(
        q,
        k,
        v,
        table,
        bidirectional=bidirectional,
        max_distance=max_distance,
        causal=causal,
        scale=1.0,
    )
    want = F.scaled_dot_product_attention(
        q,
        k,
        v,
        scale=1.0,
        attn_mask=_bias_with_grad(table, nq, nk, bidirectional, max_distance, causal),
    )
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, table), g)
    ref = torch.autograd.grad(want, (q, k, v, table), g)
    for name, a, b_ in zip("q k v table".split(), got, ref):
        assert a.shape == b_.shape, name
        torch.testing.assert_close(a, b_, rtol=1e-4, atol=1e-4, msg=lambda m: f"d{name}: {m}")
    assert got[3].abs().max() > 1e-3  # the table's gradient is not trivially zero


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_attention_module_with_posenc_inside(bidirectional):
    """transformers' T5Attention (eager) against its own projections around posenc.t5_attention
    (the table is relative_attention_bias.weight, scale=1.0): output and every parameter's
    gradient, the table's included."""
    heads, d_kv, n = 4, 16, 45
    attn = _hf_attention(heads, 32, 24, bidirectional, d_kv)
    torch.manual_seed(0)
    with torch.no_grad():
        attn.relative_attention_bias.weight.normal_(0.0, 2.0)
    x = torch.randn(2, n, heads * d_kv)
    mask = None
    if not bidirectional:  # decoder self-attention: T5's additive causal mask
        mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
    want = attn(x, mask=mask)[0]
    want_grads = torch.autograd.grad(want.square().sum(), list(attn.parameters()))

    def split(t):
        return t.view(2, n, heads, d_kv).transpose(1, 2)  # non-contiguous, as T5 passes them

    out = posenc.t5_attention(
        split(attn.q(x)),
        split(attn.k(x)),
        split(attn.v(x)),
        attn.relative_attention_bias.weight,
        bidirectional=bidirectional,
        max_distance=24,
        causal=not bidirectional,
        scale=1.0,
    )
    got = attn.o(out.transpose(1, 2).reshape(2, n, heads * d_kv))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got_grads = torch.autograd.grad(got.square().sum(), list(attn.parameters()))
    for (name, _), a, b_ in zip(attn.named_parameters(), got_grads, want_grads):
        torch.testing.assert_close(a, b_, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("table_dtype", ["float32", "q"])
def test_half_precision_and_default_scale(dtype, table_dtype):
    q, k, v, table = _inputs(1, 2, 20, 33, 16, dtype)
    table = table.detach().to(dtype if table_dtype == "q" else torch.float32).requires_grad_()
    out = posenc.t5_attention(q, k, v, table, bidirectional=False, causal=True)  # 1/sqrt(D)
    assert out.dtype == dtype
    bias = _hf_bias(table.detach().float(), 20, 33, False, 128, True)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=bias)
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)
    out.float().sum().backward()
    assert table.grad.dtype == table.dtype and q.grad.dtype == dtype
    table32 = table.detach().float().requires_grad_()
    want = F.scaled_dot_product_attention(
        q.detach().float(),
        k.detach().float(),
        v.detach().float(),
        attn_mask=_bias_with_grad(table32, 20, 33, False, 128, True),
    )
    want.sum().backward()
    torch.testing.assert_close(table.grad.float(), table32.grad, rtol=3e-2, atol=3e-2)


def test_gradcheck_float64():
    q, k, v, table = (t.detach().double().requires_grad_() for t in _inputs(1, 2, 3, 5, 4))
    try:
        posenc.t5_attention(q, k, v, table)
    except RuntimeError as e:
        assert "must share one of float32" in str(e)
        pytest.skip("t5_attention computes in float32 (float64 is refused, as alibi_attention)")
    torch.autograd.gradcheck(
        lambda *a: posenc.t5_attention(*a, bidirectional=False, max_distance=4, causal=True),
        (q, k, v, table),
    )


def test_opcheck():
    # t5_attention is positional_attention with t5_table: its operator, forward and backward
    q, k, v, table = _inputs(1, 2, 6, 9, 8, num_buckets=8)
    ops = torch.ops.posenc

    def t5(table, bidirectional, max_distance, causal, scale):  # positional's arguments after v
        return (None, None, "half", None, False, table, bidirectional, max_distance, causal, scale)

    torch.library.opcheck(ops.positional_attention, (q, k, v, *t5(table, True, 128, False, None)))
    torch.library.opcheck(ops.positional_attention, (q, k, v, *t5(table, False, 5, True, 1.0)))
    # non-contiguous inputs (T5's transposed projections): the fake kernels' strides
    qt, kt, vt = (
        t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v)
    )
    assert not qt.is_contiguous()
    torch.library.opcheck(ops.positional_attention, (qt, kt, vt, *t5(table, True, 16, True, 0.5)))
    torch.library.opcheck(
        ops._positional_attention_forward,
        (q.detach(), k.detach(), v.detach(), *t5(table.detach(), False, 6, True, 0.5)),
    )
    qt, kt, vt, table = (t.detach() for t in (qt, kt, vt, table))
    out, lse = ops._positional_attention_forward(qt, kt, vt, *t5(table, True, 16, True, 0.5))
    torch.library.opcheck(
        ops._positional_attention_backward,
        (torch.randn_like(out), qt, kt, vt, out, lse, *t5(table, True, 16, True, 0.5)),
    )


def test_compiles_without_graph_breaks_or_recompiles():
    table = torch.randn(32, 2, requires_grad=True)

    def f(q, k, v, table):
        return posenc.t5_attention(
            q, k, v, table, bidirectional=False, causal=True, scale=1.0
        ).sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (9, 13, 21):  # none equal to D or H (duck sizing would specialize)
            q, k, v, _ = _inputs(1, 2, n, n, 16, seed=n)
            table.grad = None
            loss = compiled(q, k, v, table)
            loss.backward()
            got_table = table.grad.clone()
            table.grad = None
            q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
            f(q2, k2, v2, table).backward()
            torch.testing.assert_close(q.grad, q2.grad)
            torch.testing.assert_close(got_table, table.grad)


def test_bad_input_is_one_line():
    q, k, v, table = _inputs(1, 2, 4, 4, 8)

    def fails(match, *args, **kwargs):
        with pytest.raises(RuntimeError, match=match) as e:
            posenc.t5_attention(*args, **kwargs)
        assert "\n" not in str(e.value).strip(), str(e.value)

    fails(
        r"posenc.t5_attention: table must be \[num_buckets, H\] = \[num_buckets, 2\], "
        r"got \[32, 3\]",
        q,
        k,
        v,
        torch.zeros(32, 3),
    )
    fails(
        r"table must be \[num_buckets, H\] = \[num_buckets, 2\], got \[64\]",
        q,
        k,
        v,
        torch.zeros(64),
    )
    fails(
        r"table.size\(0\) \(num_buckets\) must be >= 4 with bidirectional=True, got 3",
        q,
        k,
        v,
        torch.zeros(3, 2),
    )
    fails(
        r"table.size\(0\) \(num_buckets\) must be >= 2, got 1",
        q,
        k,
        v,
        torch.zeros(1, 2),
        bidirectional=False,
    )
    fails(
        r"max_distance must exceed the exact range 8 \(num_buckets=32, bidirectional\), got 8",
        q,
        k,
        v,
        table,
        max_distance=8,
    )
    fails(
        r"max_distance must exceed the exact range 16 \(num_buckets=32\), got 3",
        q,
        k,
        v,
        table,
        bidirectional=False,
        max_distance=3,
    )
    fails(
        r"table must be float32 or q's dtype \(BFloat16\), got Double",
        q.bfloat16(),
        k.bfloat16(),
        v.bfloat16(),
        table.double(),
    )
    fails(r"table must be float32 or q's dtype \(Float\), got BFloat16", q, k, v, table.bfloat16())
    fails(r"more queries \(4\) than keys \(3\)", q, k[:, :, :3], v[:, :, :3], table)
    fails(
        r"posenc.t5_attention: q, k, v must share one of float32",
        q.double(),
        k.double(),
        v.double(),
        table,
    )
    fails(r"posenc.t5_attention: head counts differ: q 2, k 1, v 1", q, k[:, :1], v[:, :1], table)
    fails(r"q has D=8 but k has D=4", q, k[..., :4], v, table)
    assert math.isfinite(posenc.t5_attention(q, k, v, table).sum().item())

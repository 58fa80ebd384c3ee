"""posenc.alibi_attention against PyTorch's own scaled_dot_product_attention with the ALiBi bias
materialized as its mask (the code a user would write), and its slopes against BLOOM's
build_alibi_tensor in transformers: forward and gradients, causal and symmetric, cached keys
(Nq < Nk), float32/bfloat16; opcheck, torch.compile(fullgraph=True, dynamic=True), bad input."""

import pytest
import torch
import torch.nn.functional as F

import posenc


def _bias(slopes, nq, nk, causal, symmetric):
    pk = torch.arange(nk, dtype=torch.float32)
    pq = torch.arange(nk - nq, nk, dtype=torch.float32)
    d = pq[:, None] - pk[None, :]
    if symmetric:
        d = d.abs()
    bias = -slopes[:, None, None] * d
    if causal:
        bias = bias.masked_fill(d < 0, float("-inf"))
    return bias


def _inputs(b, h, nq, nk, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g).to(dtype).requires_grad_()
    k = torch.randn(b, h, nk, d, generator=g).to(dtype).requires_grad_()
    v = torch.randn(b, h, nk, d, generator=g).to(dtype).requires_grad_()
    return q, k, v


@pytest.mark.parametrize("causal,symmetric", [(True, False), (False, True), (False, False)])
@pytest.mark.parametrize("nq,nk", [(37, 37), (5, 64), (1, 19), (128, 128)])
def test_forward_and_gradients_equal_sdpa_with_the_bias(causal, symmetric, nq, nk):
    q, k, v = _inputs(2, 4, nq, nk, 32)
    slopes = posenc.alibi_slopes(4)
    out = posenc.alibi_attention(q, k, v, slopes, causal=causal, symmetric=symmetric)
    want = F.scaled_dot_product_attention(
        q, k, v, attn_mask=_bias(slopes, nq, nk, causal, symmetric)
    )
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    ref = torch.autograd.grad(want, (q, k, v), g)
    for a, b_ in zip(got, ref):
        torch.testing.assert_close(a, b_, rtol=1e-4, atol=1e-4)


def test_bfloat16_and_scale():
    q, k, v = _inputs(1, 2, 20, 20, 16, torch.bfloat16)
    slopes = posenc.alibi_slopes(2)
    out = posenc.alibi_attention(q, k, v, slopes, causal=True, scale=0.3)
    assert out.dtype == torch.bfloat16
    want = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), scale=0.3, attn_mask=_bias(slopes, 20, 20, True, False)
    )
    torch.testing.assert_close(out.float(), want, rtol=2e-2, atol=2e-2)


def test_slopes_are_blooms():
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    for heads in (1, 4, 6, 12, 16):
        alibi = build_alibi_tensor(torch.ones(1, 3), heads, torch.float32)  # [H, 1, 3]
        # bloom's cumsum positions start at 0: position 1 holds the slope itself
        torch.testing.assert_close(posenc.alibi_slopes(heads), alibi[:, 0, 1], rtol=0, atol=0)


@pytest.mark.parametrize("heads", [0, -3, 3.5, 4.0, True, "4"], ids=repr)
def test_slopes_refuse_a_head_count_that_is_not_a_positive_integer(heads):
    # 3.5 gave 4 slopes without a word (found by the hostile review)
    with pytest.raises(ValueError, match="posenc.alibi_slopes: heads must be an integer >= 1") as e:
        posenc.alibi_slopes(heads)
    assert "\n" not in str(e.value)


def test_opcheck():
    # alibi_attention is positional_attention with slopes: its operator, forward and backward
    q, k, v = _inputs(1, 2, 6, 9, 8)
    slopes = posenc.alibi_slopes(2)
    ops = torch.ops.posenc
    alibi = (None, None, "half", slopes)  # cos, sin, layout, slopes; then symmetric, t5_table, ...
    causal = (*alibi, False, None, True, 128, True, None)
    torch.library.opcheck(ops.positional_attention, (q, k, v, *causal))
    torch.library.opcheck(
        ops._positional_attention_forward,
        (q.detach(), k.detach(), v.detach(), *alibi, True, None, True, 128, False, 0.5),
    )
    # the backward on transposed views (a model's [B, N, H, D] projections): the fake kernel's
    # strides are the kernel's (contiguous), not q's
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    out, lse = ops._positional_attention_forward(qt, kt, vt, *causal)
    torch.library.opcheck(
        ops._positional_attention_backward,
        (torch.randn_like(out), qt, kt, vt, out, lse, *causal),
    )


def test_compiles_without_graph_breaks_or_recompiles():
    slopes = posenc.alibi_slopes(2)

    def f(q, k, v):
        return posenc.alibi_attention(q, k, v, slopes, causal=True).sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (9, 13, 21):  # none equal to D or H (duck sizing would specialize)
            q, k, v = _inputs(1, 2, n, n, 16, seed=n)
            loss = compiled(q, k, v)
            loss.backward()
            q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
            f(q2, k2, v2).backward()
            torch.testing.assert_close(q.grad, q2.grad)


def test_bad_input_is_one_line():
    q, k, v = _inputs(1, 2, 4, 4, 8)
    with pytest.raises(RuntimeError, match=r"slopes must be \[H\] = \[2\]"):
        posenc.alibi_attention(q, k, v, posenc.alibi_slopes(3))
    with pytest.raises(RuntimeError, match=r"more queries \(4\) than keys \(3\)"):
        posenc.alibi_attention(q, k[:, :, :3], v[:, :, :3], posenc.alibi_slopes(2))
    with pytest.raises(RuntimeError, match=r"must share one of float32"):
        posenc.alibi_attention(q.double(), k.double(), v.double(), posenc.alibi_slopes(2))
    with pytest.raises(RuntimeError, match=r"slopes have no gradient"):
        posenc.alibi_attention(q, k, v, posenc.alibi_slopes(2).requires_grad_())

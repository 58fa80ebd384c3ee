"""posenc.shaw_attention against the Shaw et al. (2018) relative-key attention that transformers
still ships, and against the formula written out.

Peers:
* transformers 5.x's own modules with position_embeddings_type="relative_key":
  Wav2Vec2BertSelfAttention and SeamlessM4Tv2ConformerSelfAttention (offset key - query clamped
  to [-left, right], row offset + left of distance_embedding, scores (q.k + q.E) / sqrt(d)), whole
  module (eager): output and every parameter's gradient, distance_embedding included, symmetric
  and asymmetric (the defaults 64/8 shape) clips, clipping active (N > K + 1), float32 and float64.
* BERT's relative_key (transformers 4.x BertSelfAttention; removed from BERT, RoBERTa, ELECTRA,
  ESM, MarkupLM, LayoutLM... in 5.x, so written out here from 4.x's code: row l - r +
  max_position_embeddings - 1 of an unclipped [2 * max - 1, D] embedding; a one-token decode puts
  the query at key_length - 1): posenc's table is E.flip(0). BERT's relative_key_query adds
  a key-side k . E term the kernel does not compute; not covered.
* Shaw's eq. 5 written out in float64 (plain softmax) with clipping to [-K, K], causal, cached
  keys (Nq < Nk), tiles crossed (Nq > 128, Nk > 256), a scale other than 1/sqrt(D).
Plus opcheck (float32, float64, bfloat16; transposed views), gradcheck in float64, float16/bf16,
torch.compile(fullgraph=True, dynamic=True) without recompiles, empty tensors, bad input.
"""

import math

import pytest
import torch

import posenc

transformers = pytest.importorskip("transformers")
modeling_w2v2_bert = pytest.importorskip("transformers.models.wav2vec2_bert.modeling_wav2vec2_bert")
modeling_m4t_v2 = pytest.importorskip(
    "transformers.models.seamless_m4t_v2.modeling_seamless_m4t_v2"
)

# float32 against a float64 oracle: the kernel sums tiles in float32 (a few ulps per term)
F32_TOL = dict(rtol=1e-5, atol=1e-5)
# float32 gradients: dS summed over up to 300 keys and 2 batches in float32, logits up to ~30
# with scale=1.0 (as test_t5_attention.py)
F32_GRAD_TOL = dict(rtol=1e-4, atol=1e-4)
# float64 runs the float64 reference: only the summation order differs from the oracle
F64_TOL = dict(rtol=1e-12, atol=1e-12)


def _reference(q, k, v, table, causal=False, scale=None, q_positions=None):
    """Shaw et al. 2018, eq. 5 (key side), written out: softmax((q_i . k_j + q_i .
    table[clip(j - p_i, -K, K) + K]) * scale) v, keys at 0..Nk-1, queries at the last Nq
    positions; in the inputs' dtype (float64 in the tests), differentiable in every input."""
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    kmax = (table.shape[0] - 1) // 2
    pq = torch.arange(nk - nq, nk) if q_positions is None else q_positions
    rel = torch.arange(nk)[None, :] - pq[:, None]  # [Nq, Nk]
    a = table[rel.clamp(-kmax, kmax) + kmax]  # [Nq, Nk, D]
    s = 1.0 / math.sqrt(d) if scale is None else scale
    logits = (q @ k.transpose(-1, -2) + torch.einsum("bhld,lrd->bhlr", q, a)) * s
    if causal:
        logits = logits.masked_fill(rel > 0, float("-inf"))
    return torch.softmax(logits, -1) @ v


def _inputs(b, h, nq, nk, d, kmax, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    k = torch.randn(b, h, nk, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    v = torch.randn(b, h, nk, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    table = (2 * torch.randn(2 * kmax + 1, d, generator=g, dtype=torch.float64)).to(dtype)
    return q, k, v, table.requires_grad_()


def _as64(*ts):
    return [t.detach().double().requires_grad_() for t in ts]


def _grads(out, inputs, g):
    return torch.autograd.grad(out, inputs, g)


def _assert_grads_close(got, want, names, **tol):
    for name, a, b in zip(names, got, want):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a.to(b.dtype), b, **tol, msg=lambda m: f"d{name}: {m}")


# ---- transformers 5.x: Wav2Vec2-BERT and SeamlessM4Tv2 relative_key, whole modules ----------


def _hf_module(kind, heads, head_dim, left, right, dtype):
    hidden = heads * head_dim
    if kind == "wav2vec2_bert":
        config = transformers.Wav2Vec2BertConfig(
            hidden_size=hidden,
            num_attention_heads=heads,
            position_embeddings_type="relative_key",
            left_max_position_embeddings=left,
            right_max_position_embeddings=right,
            attention_dropout=0.0,
        )
        config._attn_implementation = "eager"
        module = modeling_w2v2_bert.Wav2Vec2BertSelfAttention(config)
    else:
        config = transformers.SeamlessM4Tv2Config(
            hidden_size=hidden,
            speech_encoder_attention_heads=heads,
            position_embeddings_type="relative_key",
            left_max_position_embeddings=left,
            right_max_position_embeddings=right,
            speech_encoder_dropout=0.0,
        )
        config._attn_implementation = "eager"
        module = modeling_m4t_v2.SeamlessM4Tv2ConformerSelfAttention(config)
    torch.manual_seed(0)
    with torch.no_grad():
        module.distance_embedding.weight.normal_(0.0, 1.0)
    return module.to(dtype).eval()


def hf_relative_key_table(weight, left, right):
    """transformers' relative_key distance_embedding.weight [left + right + 1, D] (row
    clamp(r - l, -left, right) + left) as posenc's [2K+1, D] table, K = max(left, right)
    (the edge rows repeated where one side clips earlier); differentiable in `weight`."""
    kmax = max(left, right)
    return weight[torch.arange(-kmax, kmax + 1).clamp(-left, right) + left]


def _posenc_module_forward(module, x, heads, head_dim, left, right):
    b, n, _ = x.shape

    def split(t):  # non-contiguous [B, H, N, d], as the module passes them
        return t.view(b, n, heads, head_dim).transpose(1, 2)

    q, k, v = split(module.linear_q(x)), split(module.linear_k(x)), split(module.linear_v(x))
    table = hf_relative_key_table(module.distance_embedding.weight, left, right)
    out = posenc.shaw_attention(q, k, v, table)
    return module.linear_out(out.transpose(1, 2).reshape(b, n, heads * head_dim))


@pytest.mark.parametrize("kind", ["wav2vec2_bert", "seamless_m4t_v2"])
@pytest.mark.parametrize(
    "left,right,n",
    [
        (6, 6, 5),  # no clipping (N <= K): the table is distance_embedding.weight itself
        (6, 6, 23),  # clipped on both sides
        (16, 3, 29),  # asymmetric, as the 64/8 default: edge rows repeated
        (2, 9, 14),  # asymmetric the other way
        (64, 8, 140),  # the defaults, a query tile crossed
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hf_relative_key_module_with_posenc_inside(kind, left, right, n, dtype):
    heads, head_dim = 4, 16
    module = _hf_module(kind, heads, head_dim, left, right, dtype)
    x = torch.randn(2, n, heads * head_dim, dtype=dtype, generator=torch.Generator().manual_seed(n))
    want = module(x)[0]
    params = [p for _, p in module.named_parameters()]
    assert any(p is module.distance_embedding.weight for p in params)
    g = torch.randn_like(want)
    want_grads = _grads(want, params, g)
    got = _posenc_module_forward(module, x, heads, head_dim, left, right)
    tol, grad_tol = (F32_TOL, F32_GRAD_TOL) if dtype == torch.float32 else (F64_TOL, F64_TOL)
    torch.testing.assert_close(got, want, **tol)
    got_grads = _grads(got, params, g)
    _assert_grads_close(
        got_grads, want_grads, [name for name, _ in module.named_parameters()], **grad_tol
    )
    # the table's gradient is not trivially zero
    names = [name for name, _ in module.named_parameters()]
    assert got_grads[names.index("distance_embedding.weight")].abs().max() > 1e-4


# ---- BERT's relative_key (transformers 4.x), written out ------------------------------------


def _bert_relative_key(q, k, v, weight, max_position_embeddings):
    """transformers 4.x BertSelfAttention, position_embedding_type="relative_key" (its lines):
    scores = (q k^T + einsum("bhld,lrd->bhlr", q, E[l - r + max - 1])) / sqrt(d), softmax, v;
    with a cache and one query (use_cache), position_ids_l = key_length - 1."""
    query_length, key_length = q.shape[2], k.shape[2]
    if query_length == 1 and key_length > 1:
        position_ids_l = torch.tensor(key_length - 1, dtype=torch.long).view(-1, 1)
    else:
        position_ids_l = torch.arange(query_length, dtype=torch.long).view(-1, 1)
    position_ids_r = torch.arange(key_length, dtype=torch.long).view(1, -1)
    distance = position_ids_l - position_ids_r
    positional_embedding = torch.nn.functional.embedding(
        distance + max_position_embeddings - 1, weight
    ).to(q.dtype)
    scores = q @ k.transpose(-1, -2)
    scores = scores + torch.einsum("bhld,lrd->bhlr", q, positional_embedding)
    scores = scores / math.sqrt(q.shape[-1])
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("nq,nk", [(9, 9), (64, 64), (1, 40), (1, 1)])  # 1: one-token decode
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bert_relative_key_equals_with_the_table_flipped(nq, nk, dtype):
    max_positions = 64  # E [127, D]; BERT indexes out of it past 64 tokens
    q, k, v, _ = _inputs(2, 3, nq, nk, 8, 1, dtype, seed=nq + nk)
    weight = torch.randn(
        2 * max_positions - 1, 8, dtype=dtype, generator=torch.Generator().manual_seed(1)
    ).requires_grad_()
    want = _bert_relative_key(q, k, v, weight, max_positions)
    got = posenc.shaw_attention(q, k, v, weight.flip(0))  # K = max_positions - 1
    tol, grad_tol = (F32_TOL, F32_GRAD_TOL) if dtype == torch.float32 else (F64_TOL, F64_TOL)
    torch.testing.assert_close(got, want, **tol)
    g = torch.randn_like(want)
    _assert_grads_close(
        _grads(got, (q, k, v, weight), g),
        _grads(want, (q, k, v, weight), g),
        ["q", "k", "v", "E"],
        **grad_tol,
    )


# ---- Shaw's formula: causal, cache, tiles, scale ----------------------------------------------

CASES = [(False, None), (True, None), (False, 0.3), (True, 1.0)]  # causal, scale
SIZES = [(37, 37, 4), (5, 64, 8), (1, 19, 3), (130, 300, 20), (12, 12, 40)]  # nq, nk, K


@pytest.mark.parametrize("causal,scale", CASES)
@pytest.mark.parametrize("nq,nk,kmax", SIZES)
def test_forward_and_gradients_equal_the_formula(causal, scale, nq, nk, kmax):
    q, k, v, table = _inputs(2, 3, nq, nk, 16, kmax, seed=nq * nk + kmax)
    out = posenc.shaw_attention(q, k, v, table, causal=causal, scale=scale)
    inputs64 = _as64(q, k, v, table)
    want = _reference(*inputs64, causal=causal, scale=scale)
    torch.testing.assert_close(out.double(), want, **F32_TOL)
    g = torch.randn_like(want)
    got = _grads(out, (q, k, v, table), g.float())
    _assert_grads_close(got, _grads(want, inputs64, g), ["q", "k", "v", "table"], **F32_GRAD_TOL)
    # the relative term matters here: the same attention without it is far off
    without = _reference(*inputs64[:3], torch.zeros_like(inputs64[3]), causal=causal, scale=scale)
    assert (out.double() - without).abs().max() > 0.05
    if 2 * kmax + 1 > 2 * nk - 1:  # rows no offset reaches: a zero gradient
        assert got[3][: kmax - (nk - 1)].abs().max() == 0 and got[3][kmax + nk :].abs().max() == 0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(9, 9), (1, 25), (4, 25)])
def test_float64_takes_the_float64_reference(causal, nq, nk):
    q, k, v, table = _inputs(2, 2, nq, nk, 8, 5, torch.float64, seed=nk)
    out = posenc.shaw_attention(q, k, v, table, causal=causal)
    assert out.dtype == torch.float64
    want = _reference(q, k, v, table, causal=causal)
    torch.testing.assert_close(out, want, **F64_TOL)
    g = torch.randn_like(want)
    _assert_grads_close(
        _grads(out, (q, k, v, table), g),
        _grads(want, (q, k, v, table), g),
        ["q", "k", "v", "table"],
        **F64_TOL,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk,kmax", [(7, 7, 2), (3, 19, 4), (5, 9, 30)])
def test_cuda_registration_reference_equals_the_formula(dtype, causal, nq, nk, kmax):
    """The CUDA kernels (the plain-ATen reference, float32 inside) run here on CPU tensors by
    redispatching to the CUDA key: forward and backward ops against the formula (this build and
    machine may have no GPU)."""
    cuda = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    q, k, v, table = (t.detach() for t in _inputs(2, 3, nq, nk, 8, kmax, dtype, seed=nk))
    out, lse = torch.ops.posenc._shaw_attention_forward.default.redispatch(
        cuda, q, k, v, table, causal, None
    )
    assert out.dtype == dtype and lse.dtype == torch.float32
    inputs64 = _as64(q, k, v, table)
    want = _reference(*inputs64, causal=causal)
    tol = F32_TOL if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out.double(), want, **tol)
    g = torch.randn_like(want)
    got = torch.ops.posenc._shaw_attention_backward.default.redispatch(
        cuda, g.to(dtype), q, k, v, out, lse, table, causal, None
    )
    grad_tol = F32_GRAD_TOL if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    _assert_grads_close(got, _grads(want, inputs64, g), ["q", "k", "v", "table"], **grad_tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("table_dtype", ["float32", "q"])
def test_half_precision(dtype, table_dtype):
    q, k, v, table = _inputs(1, 2, 20, 33, 16, 6, dtype)
    table = table.detach().to(dtype if table_dtype == "q" else torch.float32).requires_grad_()
    out = posenc.shaw_attention(q, k, v, table, causal=True)
    assert out.dtype == dtype
    inputs64 = _as64(q, k, v, table)
    want = _reference(*inputs64, causal=True)
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)
    g = torch.randn_like(want)
    got = _grads(out, (q, k, v, table), g.to(dtype))
    assert got[3].dtype == table.dtype and got[0].dtype == dtype
    _assert_grads_close(
        got, _grads(want, inputs64, g), ["q", "k", "v", "table"], rtol=5e-2, atol=5e-2
    )


def test_transposed_views_equal_contiguous():
    q, k, v, table = _inputs(2, 3, 17, 17, 8, 4)
    qt, kt, vt = (
        t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v)
    )
    assert not qt.is_contiguous()
    out = posenc.shaw_attention(q, k, v, table, causal=True)
    out_t = posenc.shaw_attention(qt, kt, vt, table, causal=True)
    torch.testing.assert_close(out_t, out, rtol=0, atol=0)
    g = torch.randn_like(out)
    _assert_grads_close(
        _grads(out_t, (qt, kt, vt, table), g),
        _grads(out, (q, k, v, table), g),
        ["q", "k", "v", "table"],
        rtol=0,
        atol=0,
    )


def test_one_token_decode_equals_the_last_row_of_the_full_sequence():
    q, k, v, table = _inputs(2, 3, 30, 30, 8, 5, seed=3)
    full = posenc.shaw_attention(q, k, v, table, causal=True)
    step = posenc.shaw_attention(q[:, :, -1:], k, v, table, causal=True)
    torch.testing.assert_close(step, full[:, :, -1:], **F32_TOL)
    # and the one query at position Nk - 1 in the formula
    want = _reference(*_as64(q[:, :, -1:], k, v, table), causal=True)
    torch.testing.assert_close(step.double(), want, **F32_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("b,nq,nk", [(0, 5, 7), (2, 0, 7), (2, 0, 0)])
def test_empty_tensors(dtype, b, nq, nk):
    q, k, v, table = _inputs(b, 2, nq, nk, 8, 3, dtype)
    out = posenc.shaw_attention(q, k, v, table, causal=True)
    assert out.shape == (b, 2, nq, 8) and out.dtype == dtype
    grads = torch.autograd.grad(out.sum(), (q, k, v, table), allow_unused=True)
    for t, gr in zip((q, k, v, table), grads):
        assert gr is not None and gr.shape == t.shape and not gr.any()


# ---- operator checks ---------------------------------------------------------------------------


def test_gradcheck_float64():
    for causal, nq, nk, kmax in [(False, 3, 5, 1), (True, 3, 5, 2), (False, 4, 4, 6)]:
        q, k, v, table = _inputs(1, 2, nq, nk, 4, kmax, torch.float64, seed=nk + kmax)
        torch.autograd.gradcheck(
            lambda *a, c=causal: posenc.shaw_attention(*a, causal=c, scale=0.7), (q, k, v, table)
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_opcheck(dtype):
    q, k, v, table = _inputs(1, 2, 6, 9, 8, 3, dtype)
    torch.library.opcheck(torch.ops.posenc.shaw_attention, (q, k, v, table, False, None))
    torch.library.opcheck(torch.ops.posenc.shaw_attention, (q, k, v, table, True, 0.5))
    table32 = table.detach().float().requires_grad_()
    torch.library.opcheck(torch.ops.posenc.shaw_attention, (q, k, v, table32, True, None))
    # non-contiguous inputs (transposed projections): the fake kernels' strides
    qt, kt, vt = (
        t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v)
    )
    assert not qt.is_contiguous()
    torch.library.opcheck(torch.ops.posenc.shaw_attention, (qt, kt, vt, table, True, 0.5))
    torch.library.opcheck(
        torch.ops.posenc._shaw_attention_forward,
        (q.detach(), k.detach(), v.detach(), table.detach(), False, 0.5),
    )
    qt, kt, vt, table = (t.detach() for t in (qt, kt, vt, table))
    out, lse = torch.ops.posenc._shaw_attention_forward(qt, kt, vt, table, True, 0.5)
    torch.library.opcheck(
        torch.ops.posenc._shaw_attention_backward,
        (torch.randn_like(out), qt, kt, vt, out, lse, table, True, 0.5),
    )


def test_compiles_without_graph_breaks_or_recompiles():
    table = torch.randn(9, 16, requires_grad=True)

    def f(q, k, v, table):
        return posenc.shaw_attention(q, k, v, table, causal=True).sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (11, 13, 21):  # none equal to D, H or 2K+1 (duck sizing would specialize)
            q, k, v, _ = _inputs(1, 2, n, n, 16, 4, seed=n)
            table.grad = None
            compiled(q, k, v, table).backward()
            got = [t.grad.clone() for t in (q, k, v, table)]
            table.grad = None
            q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
            f(q2, k2, v2, table).backward()
            for a, b in zip(got, (q2.grad, k2.grad, v2.grad, table.grad)):
                torch.testing.assert_close(a, b)


def test_bad_input_is_one_line():
    q, k, v, table = _inputs(1, 2, 4, 4, 8, 3)

    def fails(match, *args, **kwargs):
        with pytest.raises(RuntimeError, match=match) as e:
            posenc.shaw_attention(*args, **kwargs)
        assert "\n" not in str(e.value).strip(), str(e.value)

    fails(
        r"posenc.shaw_attention: table must be \[2K\+1, D\] = \[2K\+1, 8\] \(an odd number "
        r"of rows\), got \[8, 8\]",
        q,
        k,
        v,
        torch.zeros(8, 8),
    )
    fails(
        r"table must be \[2K\+1, D\] = \[2K\+1, 8\] \(an odd number of rows\), got \[7, 4\]",
        q,
        k,
        v,
        torch.zeros(7, 4),
    )
    fails(
        r"table must be \[2K\+1, D\] = \[2K\+1, 8\] \(an odd number of rows\), got \[7, 2, 8\]",
        q,
        k,
        v,
        torch.zeros(7, 2, 8),
    )  # per-head tables: Shaw's is shared by the heads
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
        r"posenc.shaw_attention: q, k, v must share one of float32, bfloat16, float16, "
        r"float64; got Float, Double, Float",
        q,
        k.double(),
        v,
        table,
    )
    fails(r"q, k, v must share one of .* got Int", q.int(), k.int(), v.int(), table)
    fails(
        r"posenc.shaw_attention: head counts differ: q 2, k 1, v 1 \(repeat grouped k, v "
        r"heads first\)",
        q,
        k[:, :1],
        v[:, :1],
        table,
    )  # grouped-query heads: refused
    fails(r"q has D=8 but k has D=4", q, k[..., :4], v, table)
    fails(r"q, k, v must be \[B, H, N, D\]", q[0], k[0], v[0], table)
    fails(r"head dim D must be >= 1, got 0", q[..., :0], k[..., :0], v, torch.zeros(7, 0))
    assert math.isfinite(posenc.shaw_attention(q, k, v, table).sum().item())

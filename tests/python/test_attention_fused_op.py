"""posenc::attention_fused, the C++ library's fused attention as a dispatcher operator (its layers,
trainer and tool call it): q, k, v [B, N, H, D] with positions of any axis (real timestamps too),
the bias parts (ALiBi, T5 buckets, Shaw's relative keys) computed inside the tiles and RoPE applied
to the tiles' rows. Checked against attention written out in PyTorch (materialized bias), with
opcheck (schema, fake kernel, autograd registration, torch.compile with backward) over the forms,
empty calls (no batch, query or key: empty outputs and gradients, as the forward), and one line
for bad input."""

import math

import pytest
import torch

import posenc  # noqa: F401  (loads the operators)

OP = torch.ops.posenc.attention_fused.default


def call(
    q,
    k,
    v,
    pq,
    pk,
    slopes=None,
    symmetric=False,
    table=None,
    form="none",
    num_buckets=0,
    max_distance=0,
    bidirectional=True,
    max_relative=0,
    causal=False,
    key_padding=None,
    scale=None,
    rotary=None,
    layout="half",
):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    cos_sin = rotary or (None, None, None, None)
    return (
        q,
        k,
        v,
        pq,
        pk,
        slopes,
        symmetric,
        table,
        form,
        num_buckets,
        max_distance,
        bidirectional,
        max_relative,
        causal,
        key_padding,
        scale,
        *cos_sin,
        layout,
    )


def t5_bucket(rel, bidirectional, num_buckets, max_distance):
    """transformers' T5Attention._relative_position_bucket (relative = key - query)."""
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).long() * num_buckets
        rel = rel.abs()
    else:
        rel = -torch.clamp(rel, max=0)
    max_exact = num_buckets // 2
    small = rel < max_exact
    large = (
        max_exact
        + (
            torch.log(rel.float() / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).long()
    )
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(small, rel, large)


def rotate(x, cos, sin):  # half layout, per-pair tables [N, F]
    f = cos.shape[-1]
    c, s = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    a, b, rest = x[..., :f], x[..., f : 2 * f], x[..., 2 * f :]
    return torch.cat([a * c - b * s, b * c + a * s, rest], -1)


def reference(
    q,
    k,
    v,
    pq,
    pk,
    slopes=None,
    symmetric=False,
    table=None,
    form="none",
    num_buckets=0,
    max_distance=0,
    bidirectional=True,
    max_relative=0,
    causal=False,
    key_padding=None,
    scale=None,
    rotary=None,
    layout="half",
):
    if rotary is not None:
        q, k = rotate(q, rotary[0], rotary[1]), rotate(k, rotary[2], rotary[3])
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    rel = pk[None, :] - pq[:, None]  # key - query: [Nq, Nk]
    if slopes is not None:
        distance = rel.abs() if symmetric else -rel
        logits = logits - slopes.double()[:, None, None].to(logits.dtype) * distance.to(
            logits.dtype
        )
    if form == "bucket_table":
        logits = logits + table[
            t5_bucket(rel.long(), bidirectional, num_buckets, max_distance)
        ].permute(2, 0, 1)
    if form == "relative_table":
        index = rel.long().clamp(-max_relative, max_relative) + max_relative
        scores = torch.einsum("bqhd,rd->bhqr", q, table) / math.sqrt(q.shape[-1])
        logits = logits + scores.gather(-1, index.expand(*scores.shape[:2], *index.shape))
    nq, nk = q.shape[1], k.shape[1]
    if causal:
        i, j = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
        logits = logits.masked_fill(j > i + nk - nq, float("-inf"))
    if key_padding is not None:
        logits = logits.masked_fill(~key_padding[:, None, None, :], float("-inf"))
    # a row that sees no key (every logit -inf) gives 0; a NaN from the inputs stays NaN (as the
    # C++ attention_reference; SDPA's math path gives the same)
    none = (logits == float("-inf")).all(-1, keepdim=True)
    weights = torch.softmax(logits.masked_fill(none, 0.0), -1).masked_fill(none, 0.0)
    return torch.einsum("bhqk,bkhd->bqhd", weights, v)


def cases():
    g = torch.Generator().manual_seed(0)
    b, nq, nk, h, d = 2, 5, 7, 3, 8
    pq = torch.tensor([0.5, 1.25, 2.0, 4.0, 4.5], dtype=torch.float64)  # real timestamps
    pk = torch.linspace(-1.0, 4.5, nk, dtype=torch.float64)
    iq, ik = torch.arange(2, 7, dtype=torch.float64), torch.arange(nk, dtype=torch.float64)
    slopes = torch.rand(h, generator=g)
    t5 = torch.randn(8, h, generator=g)
    shaw = torch.randn(5, d, generator=g)
    keep = torch.ones(b, nk, dtype=torch.bool)
    keep[1, :2] = False
    inv = torch.rand(2, generator=g, dtype=torch.float64)
    tables = [torch.cos(p[:, None] * inv).float() for p in (pq, pk)]
    sines = [torch.sin(p[:, None] * inv).float() for p in (pq, pk)]
    rotary = (tables[0], sines[0], tables[1], sines[1])
    return (
        {
            "plain": dict(pq=iq, pk=ik),
            "alibi_timestamps_causal": dict(pq=pq, pk=pk, slopes=slopes, causal=True),
            "alibi_symmetric_padding": dict(
                pq=pq, pk=pk, slopes=slopes, symmetric=True, key_padding=keep
            ),
            "t5": dict(pq=iq, pk=ik, table=t5, form="bucket_table", num_buckets=8, max_distance=20),
            "alibi_t5_rope": dict(
                pq=iq,
                pk=ik,
                slopes=slopes,
                table=t5,
                form="bucket_table",
                num_buckets=8,
                max_distance=20,
                bidirectional=False,
                rotary=rotary,
            ),
            "shaw": dict(
                pq=iq, pk=ik, table=shaw, form="relative_table", max_relative=2, causal=True
            ),
            "rope_timestamps": dict(pq=pq, pk=pk, rotary=rotary, key_padding=keep),
        },
        (b, nq, nk, h, d),
        g,
    )


CASES, SIZES, _ = cases()


def inputs(dtype=torch.float32, requires_grad=False):
    b, nq, nk, h, d = SIZES
    g = torch.Generator().manual_seed(1)
    return [
        torch.randn(b, n, h, d, generator=g).to(dtype).requires_grad_(requires_grad)
        for n in (nq, nk, nk)
    ]


@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_attention_written_out(name):
    kw = dict(CASES[name])
    pq, pk = kw.pop("pq"), kw.pop("pk")
    q, k, v = inputs(requires_grad=True)
    table = kw.get("table")
    if table is not None:
        kw["table"] = table = table.clone().requires_grad_()
    scale = 0.4
    out = OP(*call(q, k, v, pq, pk, scale=scale, **kw))
    grads = torch.autograd.grad(
        out.square().sum(), [q, k, v] + ([table] if table is not None else [])
    )
    want = reference(
        q.double(),
        k.double(),
        v.double(),
        pq,
        pk,
        scale=scale,
        **{**kw, **({"table": table.double()} if table is not None else {})},
    )
    wgrads = torch.autograd.grad(
        want.square().sum(), [q, k, v] + ([table] if table is not None else [])
    )
    assert out.dtype == q.dtype and out.is_contiguous()
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    for got, exp in zip(grads, wgrads):
        torch.testing.assert_close(got.double(), exp.double(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("batch", "nq", "nk"), [(0, 5, 7), (2, 0, 7), (2, 5, 0), (2, 0, 0), (0, 0, 0)]
)
@pytest.mark.parametrize("name", sorted(CASES))
def test_an_empty_call_has_empty_outputs_and_gradients(name, batch, nq, nk):
    # no batch, no query or no key at all: the forward's empty (or zero) output, and from the
    # backward (the CPU kernel's, through the operator's autograd) gradients of the inputs' shapes,
    # zero where the inputs are not empty (the T5 and Shaw tables: no logit read them), as the
    # attention written out gives them
    kw = dict(CASES[name])
    pq, pk = kw.pop("pq")[-nq:] if nq else kw.pop("pq")[:0], kw.pop("pk")[:nk]
    if kw.get("rotary") is not None:
        cq, sq, ck, sk = kw["rotary"]
        kw["rotary"] = (cq[-nq:] if nq else cq[:0], sq[-nq:] if nq else sq[:0], ck[:nk], sk[:nk])
    if kw.get("key_padding") is not None:
        kw["key_padding"] = kw["key_padding"][:batch, :nk]
    _, _, _, h, d = SIZES
    q, k, v = (torch.randn(batch, n, h, d, requires_grad=True) for n in (nq, nk, nk))
    table = kw.get("table")
    if table is not None:
        kw["table"] = table = table.clone().requires_grad_()
    wrt = [q, k, v] + ([table] if table is not None else [])
    out = OP(*call(q, k, v, pq, pk, scale=0.4, **kw))
    grads = torch.autograd.grad(out.square().sum(), wrt, allow_unused=True)
    want = reference(q, k, v, pq, pk, scale=0.4, **kw)
    wgrads = torch.autograd.grad(want.square().sum(), wrt, allow_unused=True)
    assert out.shape == want.shape == (batch, nq, h, d)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    for x, got, exp in zip(wrt, grads, wgrads):
        exp = torch.zeros_like(x) if exp is None else exp
        assert got is not None and got.shape == x.shape
        torch.testing.assert_close(got, exp, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_opcheck(name, dtype):
    kw = dict(CASES[name])
    pq, pk = kw.pop("pq"), kw.pop("pk")
    q, k, v = inputs(dtype, requires_grad=True)
    if kw.get("table") is not None:
        kw["table"] = kw["table"].clone().requires_grad_()
    torch.library.opcheck(OP, call(q, k, v, pq, pk, **kw))


def test_compiles_without_graph_breaks_or_recompiles():
    kw = dict(CASES["alibi_timestamps_causal"])
    slopes = kw["slopes"]

    def layer(q, k, v, pq, pk):
        return OP(*call(q, k, v, pq, pk, slopes=slopes, causal=True)).sum()

    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    torch._dynamo.reset()
    for n in (6, 9, 13):
        q, k, v = (torch.randn(2, n, 3, 8, requires_grad=True) for _ in range(3))
        p = torch.arange(n, dtype=torch.float64) * 0.5
        got = compiled(q, k, v, p, p)
        got.backward()
        torch.testing.assert_close(got, layer(q.detach(), k.detach(), v.detach(), p, p))


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            dict(pq=torch.arange(4, dtype=torch.float64)),
            "positions must be [Nq] and [Nk] = [5] and [7]",
        ),
        (dict(slopes=torch.ones(2)), "2 ALiBi slopes for 3 heads"),
        (dict(form="bucket_table"), "table_form 'bucket_table' needs a table"),
        (dict(form="t5", table=torch.zeros(8, 3)), "table_form must be 'none', 'bucket_table'"),
        (
            dict(table=torch.zeros(8, 3), form="bucket_table", num_buckets=6, max_distance=20),
            "the bucket table must be [num_buckets, H] = [6, 3], got [8, 3]",
        ),
        (
            dict(
                pq=torch.tensor([0.5, 1, 2, 3, 4], dtype=torch.float64),
                table=torch.zeros(8, 3),
                form="bucket_table",
                num_buckets=8,
                max_distance=20,
            ),
            "needs integer positions",
        ),
        (
            dict(key_padding=torch.ones(2, 6, dtype=torch.bool)),
            "key_padding must be [B, Nk] = [2, 7]",
        ),
        (dict(scale=float("nan")), "scale must be finite"),
        # an additive 0/-inf mask would otherwise be read as "every key real" (nonzero), silently
        (dict(key_padding=torch.zeros(2, 7)), "key_padding must be bool"),
    ],
)
def test_bad_input_is_one_line(edit, message):
    q, k, v = inputs()
    kw = {"pq": torch.arange(5, dtype=torch.float64), "pk": torch.arange(7, dtype=torch.float64)}
    kw.update(edit)
    pq, pk = kw.pop("pq"), kw.pop("pk")
    with pytest.raises(RuntimeError) as e:
        OP(*call(q, k, v, pq, pk, **kw))
    assert message in str(e.value) and "\n" not in str(e.value).strip(), str(e.value)


def test_float64_is_refused_toward_the_reference():
    q, k, v = inputs(torch.float64)
    p = torch.arange(5, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="float32, bfloat16 or float16"):
        OP(*call(q, k, v, p, torch.arange(7, dtype=torch.float64)))


def test_the_backwards_inputs_are_checked():
    q, k, v = inputs()
    p, pk = torch.arange(5, dtype=torch.float64), torch.arange(7, dtype=torch.float64)
    out, lse = torch.ops.posenc._attention_fused_forward(*call(q, k, v, p, pk))
    backward = torch.ops.posenc._attention_fused_backward
    with pytest.raises(RuntimeError, match=r"lse must be \[B, H, Nq\]"):
        backward(out, out, lse[:, :, :2], *call(q, k, v, p, pk))
    with pytest.raises(RuntimeError, match=r"out and grad_out must be \[B, Nq, H, Dv\]"):
        backward(out[:1], out[:1], lse, *call(q, k, v, p, pk))


def test_constant_slopes_and_positions_refuse_a_gradient():
    q, k, v = inputs(requires_grad=True)
    p, pk = torch.arange(5, dtype=torch.float64), torch.arange(7, dtype=torch.float64)
    slopes = torch.rand(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="positions and ALiBi slopes are constants here"):
        OP(*call(q, k, v, p, pk, slopes=slopes))
    with torch.no_grad():  # no gradient asked for: runs
        OP(*call(q, k, v, p, pk, slopes=slopes))


def test_bfloat16_gradients_read_the_unrounded_output():
    # delta_i = dO_i . O_i from the float32 output the forward kept, not from O rounded to
    # bfloat16 (FlashAttention's choice): dq and dk land on float64's correctly rounded values. The backward given
    # the rounded output is the comparison (a forward that handed back bfloat16 would equal it).
    g = torch.Generator().manual_seed(3)
    b, n, h, d = 2, 128, 4, 64
    q, k, v = (torch.randn(b, n, h, d, generator=g).to(torch.bfloat16) for _ in range(3))
    p = torch.arange(n, dtype=torch.float64)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    grad = torch.randn(b, n, h, d, generator=g).to(torch.bfloat16)
    args = dict(slopes=slopes, causal=True)

    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    reference(q64, k64, v64, p, p, slopes=slopes, causal=True, scale=1.0 / math.sqrt(d)).backward(
        grad.double()
    )

    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out = OP(*call(qg, kg, vg, p, p, **args))
    assert out.dtype == torch.bfloat16
    out.backward(grad)
    fwd, lse = torch.ops.posenc._attention_fused_forward(*call(q, k, v, p, p, **args))
    assert fwd.dtype == torch.float32 and torch.equal(fwd.to(torch.bfloat16), out.detach())
    rounded = fwd.to(torch.bfloat16)
    dq_r, dk_r, _, _, _ = torch.ops.posenc._attention_fused_backward(
        grad, rounded, lse, *call(q, k, v, p, p, **args)
    )

    def err(x, ref):  # the share of elements off the correctly rounded float64 value
        return (x != ref.to(torch.bfloat16)).double().mean().item()

    # measured: dq 0.3% vs 26% of elements off, dk 0.02% vs 27%
    assert err(qg.grad, q64.grad) < 0.1 * err(dq_r, q64.grad), (
        err(qg.grad, q64.grad),
        err(dq_r, q64.grad),
    )
    assert err(kg.grad, k64.grad) < 0.1 * err(dk_r, k64.grad), (
        err(kg.grad, k64.grad),
        err(dk_r, k64.grad),
    )


# Non-finite inputs: a NaN anywhere in a query row's scores (from q, k or the bias table, or
# inf - inf from a +inf score) gives that row NaN, a NaN in v NaN in the columns it reaches, as the
# float64 reference (softmax in float64; its autograd gives the gradients' NaN positions); a row
# whose keys are all -inf (masked, or a -inf table) gives 0. Sizes take the MKL/ATen products
# (Nq < 32) and the register-blocked tiles (Nq >= 32), tails of the 16-key panels and the 256-key
# blocks. The CPU level is the process's: run under POSENC_CPU_CAPABILITY=scalar|avx2|avx512 and
# POSENC_ATTENTION_GEMM=mkl|aten for the others (the gtest AttentionFusedEdges.NonFinite* runs in
# CTest's unit_cpu_* and unit_attention_gemm_* at every level).
NONFINITE_SHAPES = [(1, 1), (17, 17), (40, 1), (40, 17), (100, 100), (129, 129), (33, 300)]
NONFINITE_CASES = [
    ("q", float("nan")),
    ("k", float("nan")),
    ("v", float("nan")),
    ("table", float("nan")),
    ("table", float("inf")),
    ("table", float("-inf")),
    ("table_head", float("-inf")),  # every bucket of head 1: its rows see no key
    ("q", float("inf")),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("where", "value"), NONFINITE_CASES)
@pytest.mark.parametrize(("nq", "nk"), NONFINITE_SHAPES)
def test_nonfinite_inputs_give_the_references_nans(nq, nk, where, value, causal):
    g = torch.Generator().manual_seed(nq * 1000 + nk)
    b, h, d, buckets = 2, 3, 16, 8
    q, k, v = (torch.randn(b, n, h, d, generator=g) for n in (nq, nk, nk))
    table = torch.randn(buckets, h, generator=g)
    # the query row and the key that get the value (the last row sees every key when causal)
    i, j = (nq - 1 if causal else nq // 2), nk // 2
    pq = torch.arange(nq, dtype=torch.float64) + (nk - nq)
    pk = torch.arange(nk, dtype=torch.float64)
    bucket = t5_bucket(pk[j : j + 1].long() - pq[i : i + 1].long(), True, buckets, 20).item()
    if where == "q":
        q[1, i, 1, 3] = value
    elif where == "k":
        k[1, j, 1, 3] = value
    elif where == "v":
        v[1, j, 1, 3] = value
    elif where == "table":
        table[bucket, 1] = value
    else:
        table[:, 1] = value
    if where == "v" and causal:
        pytest.skip("a masked key's v is skipped by the kernel, multiplied by 0 by the reference")
    q, k, v, table = (t.requires_grad_() for t in (q, k, v, table))
    kw = dict(form="bucket_table", num_buckets=buckets, max_distance=20, causal=causal)
    out = OP(*call(q, k, v, pq, pk, table=table, scale=0.25, **kw))
    dy = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad(out, (q, k, v, table), dy)
    inputs64 = [t.detach().double().requires_grad_() for t in (q, k, v, table)]
    q64, k64, v64, table64 = inputs64
    want = reference(q64, k64, v64, pq, pk, table=table64, scale=0.25, **kw)
    wgrads = torch.autograd.grad(want, inputs64, dy.double())
    if math.isnan(value):
        assert want.isnan().any()  # the case reaches the output
    torch.testing.assert_close(out.double(), want, rtol=2e-5, atol=2e-5, equal_nan=True)
    for name, got, exp in zip("q k v table".split(), grads, wgrads):
        if where == "q" and math.isinf(value) and name in ("k", "table"):
            # inf q gives +-inf scores; the kernel takes a -inf score as a masked key (dS 0 there,
            # as the reference's masks), the reference's autograd gives dS NaN for it
            continue
        torch.testing.assert_close(
            got.double(),
            exp,
            rtol=1e-4,
            atol=1e-4,
            equal_nan=True,
            msg=lambda m, name=name: f"d{name}: {m}",
        )

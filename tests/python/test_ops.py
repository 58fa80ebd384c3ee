"""torch.ops.posenc.* checked by PyTorch's own tools: torch.library.opcheck (schema, fake kernel,
autograd registration, AOT dispatch), gradcheck/gradgradcheck in float64, and the fused CPU path
against the formula (transformers' `q * cos + rotate_half(q) * sin`, written here in torch)."""

import itertools

import pytest
import torch

import posenc

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def rotate_half(x):  # transformers' modeling_llama.rotate_half
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x):  # GPT-J / GLM's interleaved rotation
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def formula(q, k, cos, sin, unsqueeze_dim=1, layout="half"):
    rot = rotate_half if layout == "half" else rotate_every_two
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    w = c.shape[-1]

    def one(x):
        r = x[..., :w]
        if w == x.shape[-1]:  # as Llama's apply_rotary_pos_emb (a result c/s may broadcast larger)
            return r * c + rot(r) * s
        return torch.cat([r * c + rot(r) * s, x[..., w:]], dim=-1)

    return one(q), one(k)


def tables(batch, tokens, width, layout="half", dtype=torch.float32, offset=0, equal_pairs=True):
    inv = 1.0 / (10000 ** (torch.arange(0, width, 2, dtype=torch.float32) / width))
    pos = (torch.arange(tokens) + offset)[None].expand(batch, tokens).float()
    freqs = pos[..., None] * inv
    emb = torch.cat((freqs, freqs), -1) if layout == "half" else freqs.repeat_interleave(2, -1)
    cos, sin = emb.cos(), emb.sin()
    if not equal_pairs:  # each member of a pair its own value: the reference path
        cos = cos + 0.01 * torch.rand_like(cos)
        sin = sin - 0.01 * torch.rand_like(sin)
    return cos.to(dtype), sin.to(dtype)


# (B, Hq, Hk, N, D, W): full, grouped-query, partial rotary, one-token decode, odd sizes, empty
SHAPES = [
    (2, 4, 4, 7, 16, 16),
    (1, 8, 2, 5, 64, 64),
    (2, 3, 1, 6, 24, 12),
    (3, 4, 2, 1, 32, 32),
    (1, 2, 2, 9, 10, 6),
    (0, 2, 2, 3, 8, 8),
    (2, 2, 2, 0, 8, 8),
]


def inputs(
    shape, dtype, layout="half", unsqueeze_dim=1, equal_pairs=True, grad=False, table_batch=None
):
    b, hq, hk, n, d, w = shape
    if unsqueeze_dim == 1:
        q, k = torch.randn(b, hq, n, d), torch.randn(b, hk, n, d)
    else:
        q, k = torch.randn(b, n, hq, d), torch.randn(b, n, hk, d)
    cos, sin = tables(
        b if table_batch is None else table_batch, n, w, layout, dtype, equal_pairs=equal_pairs
    )
    q, k = q.to(dtype).requires_grad_(grad), k.to(dtype).requires_grad_(grad)
    return q, k, cos, sin


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_equals_the_formula_to_the_bit(dtype, layout, shape):
    torch.manual_seed(0)
    for unsqueeze_dim, equal_pairs in itertools.product([1, 2], [True, False]):
        q, k, cos, sin = inputs(shape, dtype, layout, unsqueeze_dim, equal_pairs)
        got = posenc.apply_rotary_pos_emb(
            q, k, cos, sin, unsqueeze_dim=unsqueeze_dim, layout=layout
        )
        want = formula(q, k, cos, sin, unsqueeze_dim, layout)
        route = torch.ops.posenc.apply_rotary_route(q, k, cos, sin, unsqueeze_dim, layout)
        if q.numel() == 0:
            assert route == "reference: empty"
        elif dtype == torch.float64 and not torch.equal(cos.float().double(), cos):
            assert route == (
                "reference: cos/sin are float64 values float32 cannot hold (the "
                "kernel reads float32 tables)"
            )
        elif equal_pairs:
            assert route == "fused", route
        else:
            assert route == "reference: the two members of a pair read different table values"
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert torch.equal(g, w), (unsqueeze_dim, equal_pairs, (g - w).abs().max())


def test_hf_layout_views_and_batch_one_tables():
    # q as transformers makes it: a [B, N, H, D] projection viewed as [B, H, N, D]
    torch.manual_seed(1)
    b, n, h, d = 2, 5, 4, 16
    q = torch.randn(b, n, h * d).view(b, n, h, d).transpose(1, 2)
    k = torch.randn(b, n, 2 * d).view(b, n, 2, d).transpose(1, 2)
    cos, sin = tables(1, n, d)
    got = posenc.apply_rotary_pos_emb(q, k, cos, sin)
    want = formula(q, k, cos, sin)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert got[0].stride() == torch.empty_like(q).stride()


def test_wider_tables_promote_as_eager_does():
    q, k, cos, sin = inputs((1, 2, 2, 3, 8, 8), torch.bfloat16)
    got = posenc.apply_rotary_pos_emb(q, k, cos.float(), sin.float())
    want = formula(q, k, cos.float(), sin.float())
    assert got[0].dtype == torch.float32 and torch.equal(got[0], want[0])


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(
    "dtype,table_dtype",
    [
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
        (torch.float32, torch.float64),
    ],
    ids=str,
)
@pytest.mark.parametrize("shape", [(2, 4, 2, 7, 16, 16), (1, 2, 2, 5, 24, 12)])
def test_promoting_tables_give_eagers_gradients_to_the_bit(layout, dtype, table_dtype, shape):
    # OLMo's and Ernie 4.5's rotation: x in bfloat16, tables in float32; eager autograd rounds
    # each product's gradient to x's dtype before adding them, and so must the operator
    torch.manual_seed(6)
    q, k, cos, sin = inputs(shape, dtype, layout, grad=True)
    cos, sin = tables(shape[0], shape[3], shape[5], layout, table_dtype)
    got = posenc.apply_rotary_pos_emb(q, k, cos, sin, layout=layout)
    want = formula(q, k, cos, sin, layout=layout)
    assert all(g.dtype == table_dtype and torch.equal(g, w) for g, w in zip(got, want))
    gq = torch.randn(got[0].shape).to(dtype).to(table_dtype)  # what a cast back hands over
    gk = torch.randn(got[1].shape).to(dtype).to(table_dtype)
    mine = torch.autograd.grad(got, (q, k), (gq, gk))
    theirs = torch.autograd.grad(want, (q, k), (gq, gk))
    for m, t in zip(mine, theirs):
        assert m.dtype == dtype and torch.equal(m, t)
    # rounded once instead (the fused path's way: the gradient of a promoted copy, cast) differs,
    # so the equality above is not one any rounding would give
    qq, kk = (x.detach().to(table_dtype).requires_grad_() for x in (q, k))
    once = torch.autograd.grad(formula(qq, kk, cos, sin, layout=layout), (qq, kk), (gq, gk))
    assert not torch.equal(once[0].to(dtype), theirs[0])


@pytest.mark.parametrize(
    "dtype,table_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.float64)], ids=str
)
def test_promoting_tables_that_broadcast_q_give_eagers_gradients(dtype, table_dtype):
    # q of batch 1 with tables of batch 3: eager sums over the broadcast batch in the wider dtype
    # and rounds after
    torch.manual_seed(7)
    q, k, _, _ = inputs((1, 4, 2, 6, 16, 16), dtype, grad=True)
    cos, sin = tables(3, 6, 16, "half", table_dtype)
    got = posenc.apply_rotary_pos_emb(q, k, cos, sin)
    want = formula(q, k, cos, sin)
    g = [torch.randn(t.shape, dtype=table_dtype) for t in got]
    for m, t in zip(torch.autograd.grad(got, (q, k), g), torch.autograd.grad(want, (q, k), g)):
        assert m.shape == t.shape and torch.equal(m, t)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(
    "dtype,table_dtype",
    [
        (torch.float64, torch.float32),
        (torch.float32, torch.bfloat16),
        (torch.float32, torch.float16),
    ],
    ids=str,
)
@pytest.mark.parametrize(
    "shape,table_batch", [((2, 4, 2, 7, 16, 16), 2), ((2, 3, 1, 6, 24, 12), 1)]
)
def test_tables_that_q_promotes_get_eagers_gradients_to_the_bit(
    layout, dtype, table_dtype, shape, table_batch
):
    # q and k wider than the tables: eager rounds q's term and k's term of a table's gradient to
    # the table's dtype each (the cast at the unsqueezed table's two uses), then adds them there;
    # the operator added them in the wider dtype and rounded once, 1 ulp apart (found by review)
    torch.manual_seed(8)
    q, k, _, _ = inputs(shape, dtype, layout, grad=True)
    cos, sin = tables(table_batch, shape[3], shape[5], layout, table_dtype, equal_pairs=False)
    cos.requires_grad_(True)
    sin.requires_grad_(True)
    got = posenc.apply_rotary_pos_emb(q, k, cos, sin, layout=layout)
    want = formula(q, k, cos, sin, layout=layout)
    g = [torch.randn(t.shape, dtype=dtype) for t in want]
    mine = torch.autograd.grad(got, (q, k, cos, sin), g)
    theirs = torch.autograd.grad(want, (q, k, cos, sin), g)
    for name, m, t in zip(["q", "k", "cos", "sin"], mine, theirs):
        assert m.dtype == t.dtype and torch.equal(m, t), (name, (m - t).abs().max())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_opcheck_apply_rotary(dtype, layout):
    torch.manual_seed(2)
    for shape in SHAPES[:5]:
        for unsqueeze_dim in (1, 2):
            grad = dtype in (torch.float32, torch.float64)
            q, k, cos, sin = inputs(shape, dtype, layout, unsqueeze_dim, grad=grad)
            torch.library.opcheck(
                torch.ops.posenc.apply_rotary.default, (q, k, cos, sin, unsqueeze_dim, layout)
            )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck_in_place(dtype):
    torch.manual_seed(3)
    for shape, layout in itertools.product(SHAPES[:5], ["half", "interleaved"]):
        q, k, cos, sin = inputs(shape, dtype, layout)
        want = formula(q, k, cos, sin, 1, layout)
        torch.library.opcheck(
            torch.ops.posenc.apply_rotary_.default, (q.clone(), k.clone(), cos, sin, 1, layout)
        )
        posenc.apply_rotary_pos_emb_(q, k, cos, sin, layout=layout)
        assert torch.equal(q, want[0]) and torch.equal(k, want[1])


def test_in_place_refuses_gradients_in_one_line():
    q, k, cos, sin = inputs((1, 2, 2, 3, 8, 8), torch.float32, grad=True)
    with pytest.raises(RuntimeError, match="in-place rotation records no gradients"):
        posenc.apply_rotary_pos_emb_(q, k, cos, sin)


def test_in_place_refuses_memory_it_would_write_twice():
    # an expanded q (one head's memory for four): the fused kernel would write each element four
    # times, each time from a value already rotated
    q0, k, cos, sin = inputs((1, 1, 2, 5, 8, 8), torch.float32)
    q = q0.expand(1, 4, 5, 8)
    with pytest.raises(RuntimeError, match="q has elements that share memory"):
        posenc.apply_rotary_pos_emb_(q, k, cos, sin)
    qkv = torch.randn(1, 2, 5, 8)
    with pytest.raises(RuntimeError, match="q and k share memory"):  # the same memory, two views
        posenc.apply_rotary_pos_emb_(qkv[:, :2], qkv.view(1, 2, 5, 8), cos, sin)
    buffer = torch.randn(1, 2, 5, 8)
    with pytest.raises(RuntimeError, match="cos shares memory with q or k"):
        posenc.apply_rotary_pos_emb_(buffer, k.clone(), buffer[:, 0], sin)
    # the same inputs out of place are fine and equal the formula
    want = formula(q, k, cos, sin)
    got = posenc.apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_tables_that_broadcast_q_larger_give_transformers_result(layout):
    # q of batch 1 with tables of batch 3 (transformers' formula broadcasts), and k of one token
    # with tables of five: the result takes the broadcast shape, as transformers' does
    torch.manual_seed(4)
    cos, sin = tables(3, 5, 8, layout)
    q, k = (
        torch.randn(1, 2, 5, 8, dtype=torch.float64),
        torch.randn(3, 2, 1, 8, dtype=torch.float64),
    )
    cos, sin = cos.double(), sin.double()
    want = formula(q, k, cos, sin, 1, layout)
    got = posenc.apply_rotary_pos_emb(q, k, cos, sin, layout=layout)
    assert got[0].shape == (3, 2, 5, 8) and got[1].shape == (3, 2, 5, 8)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.library.opcheck(torch.ops.posenc.apply_rotary.default, (q, k, cos, sin, 1, layout))
    q.requires_grad_(True)
    k.requires_grad_(True)
    torch.autograd.gradcheck(
        lambda a, b: torch.ops.posenc.apply_rotary(a, b, cos, sin, 1, layout), (q, k)
    )
    with pytest.raises(RuntimeError, match="in place cannot grow them"):
        posenc.apply_rotary_pos_emb_(
            q.detach().clone(), k.detach().clone(), cos, sin, layout=layout
        )


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("equal_pairs", [True, False])
def test_gradcheck_and_gradgradcheck_float64(layout, equal_pairs):
    torch.manual_seed(4)
    for shape in [(2, 3, 1, 4, 8, 8), (1, 2, 2, 3, 10, 6)]:
        q, k, cos, sin = inputs(shape, torch.float64, layout, equal_pairs=equal_pairs, grad=True)
        cos.requires_grad_(True)
        sin.requires_grad_(True)
        f = lambda *a: torch.ops.posenc.apply_rotary(*a, 1, layout)  # noqa: E731
        assert torch.autograd.gradcheck(f, (q, k, cos, sin))
        assert torch.autograd.gradgradcheck(f, (q, k, cos, sin))


def test_gradients_equal_autograd_through_the_formula():
    torch.manual_seed(5)
    q, k, cos, sin = inputs((2, 4, 2, 6, 16, 12), torch.float32, grad=True)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    a = posenc.apply_rotary_pos_emb(q, k, cos, sin)
    da = torch.autograd.grad(a, (q, k), (gq, gk))
    b = formula(q, k, cos, sin)
    db = torch.autograd.grad(b, (q, k), (gq, gk))
    for x, y in zip(da, db):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "sections,section_layout",
    [([], "contiguous"), ([2, 3, 3], "contiguous"), ([2, 3, 3], "interleaved")],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_opcheck_rope_cos_sin(sections, section_layout, dtype):
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2, dtype=dtype) / 16))
    pos = torch.arange(10.0).view(2, 5)
    if sections:
        pos = torch.stack([pos, pos * 2, pos + 1], -1)
    for layout in ("half", "interleaved"):
        args = (pos, inv, 0.5, sections, section_layout, layout)
        torch.library.opcheck(torch.ops.posenc.rope_cos_sin.default, args)
        cos, sin = torch.ops.posenc.rope_cos_sin(*args)
        assert cos.shape == (2, 5, 16) and cos.dtype == torch.float32
    if not sections and dtype == torch.float32:  # transformers' arithmetic, to the bit
        freqs = pos[..., None].float() * inv
        emb = torch.cat((freqs, freqs), -1)
        cos, sin = posenc.rope_cos_sin(pos, inv, 0.5)
        assert torch.equal(cos, emb.cos() * 0.5) and torch.equal(sin, emb.sin() * 0.5)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda q, k, c, s: posenc.apply_rotary_pos_emb(q, k, c, s, layout="diagonal"), "diagonal"),
        (
            lambda q, k, c, s: posenc.apply_rotary_pos_emb(q, k, c[..., :5], s[..., :5]),
            "must be even",
        ),
        (
            lambda q, k, c, s: posenc.apply_rotary_pos_emb(q[..., :4], k, c, s),
            "exceeds the head dim",
        ),
        (lambda q, k, c, s: posenc.apply_rotary_pos_emb(q, k, c, s[..., :4]), "shapes differ"),
        (
            lambda q, k, c, s: posenc.apply_rotary_pos_emb(q, k, c, s, unsqueeze_dim=7),
            "unsqueeze_dim",
        ),
        (lambda q, k, c, s: posenc.apply_rotary_pos_emb(q.long(), k, c, s), "floating-point"),
    ],
)
def test_bad_input_is_one_line(call, message):
    q, k, cos, sin = inputs((1, 2, 2, 3, 8, 8), torch.float32)
    with pytest.raises(RuntimeError, match=message) as e:
        call(q, k, cos, sin)
    assert "\n" not in str(e.value).split("\nException raised from")[0].strip()


def test_tables_refuse_gradients():
    inv = torch.ones(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="no gradient with respect to positions or inv_freq"):
        posenc.rope_cos_sin(torch.arange(3.0), inv)


def test_float64_tables_keep_float64_precision():
    # tables computed in float64 (values float32 cannot hold): the formula's float64 result
    q, k = (
        torch.randn(2, 4, 5, 64, dtype=torch.float64),
        torch.randn(2, 2, 5, 64, dtype=torch.float64),
    )
    inv = 1 / (1e4 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    f = torch.arange(5, dtype=torch.float64)[None, :, None] * inv
    e = torch.cat([f, f], -1).expand(2, 5, 64)
    cos, sin = e.cos(), e.sin()
    got, want = posenc.apply_rotary_pos_emb(q, k, cos, sin), formula(q, k, cos, sin)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

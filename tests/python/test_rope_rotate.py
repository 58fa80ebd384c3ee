"""torch.ops.posenc.rope_rotate / rope_rotate_qk / rope_rotate_: the C++ library's rotation (its
encoders and trainer call these operators through the dispatcher), checked against transformers'
own apply_rotary_pos_emb (half pairs) and GPT-J's (interleaved pairs), by opcheck (schema, fake,
autograd registration, AOT dispatch) over dtypes, layouts, partial rotary, batched tables, strided
views and empty tensors, by gradcheck/gradgradcheck, and under torch.compile (every operator's fake
kernel: test_fakes.py)."""

import pytest
import torch
from transformers.models.gptj import modeling_gptj
from transformers.models.llama import modeling_llama

import posenc

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
LAYOUTS = ["half", "interleaved"]


def pair_tables(batch, tokens, pairs, theta=10000.0, offset=3):
    """Per-pair float32 tables [N, F] (batch None) or [B, N, F], as posenc's rope_cos_sin makes
    them: float64 angles, float32 values."""
    inv = 1.0 / theta ** (torch.arange(pairs, dtype=torch.float64) * 2 / (2 * pairs))
    if batch is None:
        pos = torch.arange(tokens, dtype=torch.float64) + offset
    else:
        pos = torch.rand(batch, tokens, dtype=torch.float64) * 500
    angles = pos[..., None] * inv
    return angles.cos().float(), angles.sin().float()


def peer(x, cos, sin, layout):
    """The peers' own functions on x [B, N, H, Dh]: transformers' Llama apply_rotary_pos_emb
    (rotate_half, tables cat(t, t)) or GPT-J's (rotate_every_two, tables repeated per pair), with
    partial rotary as their callers do it (rotate the first 2F dims, pass the rest)."""
    f = cos.shape[-1]
    c, s = (cos, sin) if cos.dim() == 3 else (cos[None], sin[None])
    rot, rest = x[..., : 2 * f], x[..., 2 * f :]
    if layout == "half":
        full_c, full_s = torch.cat([c, c], -1), torch.cat([s, s], -1)  # [B, N, 2F]
        y, _ = modeling_llama.apply_rotary_pos_emb(
            rot, rot, full_c.to(x.dtype), full_s.to(x.dtype), unsqueeze_dim=2
        )
    else:  # GPT-J: sin, cos [B, N, F] repeat_interleave'd inside, unsqueezed at dim 2
        y = modeling_gptj.apply_rotary_pos_emb(rot, s.to(x.dtype), c.to(x.dtype))
    return torch.cat([y, rest], -1)


# (B, N, H, Dh, F, batched tables): full, partial, odd F, one token, batched, empty batch/tokens
SHAPES = [
    (2, 7, 3, 16, 8, None),
    (1, 5, 2, 24, 6, None),
    (2, 6, 4, 10, 5, 2),
    (3, 1, 2, 32, 16, None),
    (2, 9, 1, 64, 32, 2),
    (0, 3, 2, 8, 4, None),
    (2, 0, 2, 8, 4, None),
]


def make(shape, dtype, head_major=False, seed=0):
    b, n, h, d, f, batched = shape
    torch.manual_seed(seed)
    if head_major:  # [B, H, N, Dh] storage viewed as [B, N, H, Dh] (SDPA's layout)
        x = torch.randn(b, h, n, d).transpose(1, 2)
    else:
        x = torch.randn(b, n, h, d)
    cos, sin = pair_tables(batched, n, f)
    return x.to(dtype), cos, sin


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("head_major", [False, True])
def test_float32_equals_the_peers_functions_to_the_bit(layout, shape, head_major):
    x, cos, sin = make(shape, torch.float32, head_major)
    got = posenc.rope_rotate(x, cos, sin, layout)
    want = peer(x, cos, sin, layout)
    assert got.dtype == x.dtype and got.shape == x.shape and got.is_contiguous()
    assert torch.equal(got, want), (got - want).abs().max()
    q2 = torch.randn(x.shape[0], x.shape[1], 2 * x.shape[2] + 1, x.shape[3])  # other head count
    gq, gk = posenc.rope_rotate_qk(q2, x, cos, sin, layout)
    assert torch.equal(gq, peer(q2, cos, sin, layout)) and torch.equal(gk, want)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_other_dtypes_round_once_from_the_float_computation(dtype, layout):
    # float64: computed in float64 with the float32 tables; bf16/fp16: in float32, rounded once
    x, cos, sin = make((2, 11, 3, 32, 12, 2), dtype)
    got = posenc.rope_rotate(x, cos, sin, layout)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    want = peer(x.to(compute), cos, sin, layout).to(dtype)
    assert got.dtype == dtype
    if dtype == torch.float64:
        torch.testing.assert_close(got, want, rtol=1e-15, atol=1e-15)
    else:  # one rounding of the same float32 value: equal, or one ulp apart where fma differs
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6)
        assert (got == want).float().mean() > 0.99


@pytest.mark.parametrize("layout", LAYOUTS)
def test_inverse_undoes_the_rotation_and_equals_negated_sine(layout):
    x, cos, sin = make((2, 8, 2, 16, 8, None), torch.float64)
    y = posenc.rope_rotate(x, cos, sin, layout)
    # float32 tables: cos^2 + sin^2 is 1 within ~1e-7, so the round trip is exact to that
    torch.testing.assert_close(
        posenc.rope_rotate(y, cos, sin, layout, inverse=True), x, rtol=0, atol=1e-6
    )
    assert torch.equal(
        posenc.rope_rotate(x, cos, sin, layout, inverse=True),
        posenc.rope_rotate(x, cos, -sin, layout),
    )


def test_batch_one_tables_broadcast():
    x, cos, sin = make((3, 5, 2, 16, 8, None), torch.float32)
    got = posenc.rope_rotate(x, cos[None], sin[None])
    assert torch.equal(got, posenc.rope_rotate(x, cos, sin))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_opcheck(dtype, layout, shape):
    for head_major in (False, True):
        x, cos, sin = make(shape, dtype, head_major)
        grad = dtype in (torch.float32, torch.float64) and x.numel() > 0
        x.requires_grad_(grad)
        torch.library.opcheck(torch.ops.posenc.rope_rotate.default, (x, cos, sin, layout, False))
        k = torch.randn(x.shape[0], x.shape[1], 1, x.shape[3]).to(dtype).requires_grad_(grad)
        torch.library.opcheck(
            torch.ops.posenc.rope_rotate_qk.default, (x, k, cos, sin, layout, True)
        )
        y = x.detach().contiguous()
        torch.library.opcheck(torch.ops.posenc.rope_rotate_.default, (y, cos, sin, layout, False))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradcheck_and_gradgradcheck(layout):
    x, cos, sin = make((2, 5, 2, 12, 4, 2), torch.float64)
    k = torch.randn(2, 5, 3, 12, dtype=torch.float64, requires_grad=True)
    x.requires_grad_(True)
    f = lambda a, b: torch.ops.posenc.rope_rotate_qk(a, b, cos, sin, layout)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, k))
    assert torch.autograd.gradgradcheck(f, (x, k))
    g = lambda a: torch.ops.posenc.rope_rotate(a, cos, sin, layout, True)  # noqa: E731
    assert torch.autograd.gradcheck(g, (x,)) and torch.autograd.gradgradcheck(g, (x,))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tables_that_need_a_gradient_get_the_peers_gradients(layout):
    # learned frequencies: the reference path, differentiable in the tables
    x, cos, sin = make((2, 6, 3, 16, 6, None), torch.float32)
    x.requires_grad_(True)
    c1, s1 = cos.clone().requires_grad_(True), sin.clone().requires_grad_(True)
    c2, s2 = cos.clone().requires_grad_(True), sin.clone().requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    probe = torch.randn(x.shape)
    (posenc.rope_rotate(x, c1, s1, layout) * probe).sum().backward()
    (peer(x2, c2, s2, layout) * probe).sum().backward()
    for a, b in ((x.grad, x2.grad), (c1.grad, c2.grad), (s1.grad, s2.grad)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_only_one_of_q_and_k_used_gets_its_gradient():
    x, cos, sin = make((1, 4, 2, 8, 4, None), torch.float32)
    q, k = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yq, _ = posenc.rope_rotate_qk(q, k, cos, sin)
    yq.sum().backward()
    assert k.grad is None
    torch.testing.assert_close(
        q.grad, posenc.rope_rotate(torch.ones_like(x), cos, sin, inverse=True)
    )


def test_in_place_rotates_bumps_the_version_and_refuses_autograd():
    x, cos, sin = make((2, 5, 2, 16, 8, None), torch.float32)
    want = posenc.rope_rotate(x, cos, sin)
    y = x.clone()
    version = y._version
    torch.ops.posenc.rope_rotate_(y, cos, sin)
    assert torch.equal(y, want) and y._version > version
    z = x.clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="in-place rotation records no gradients"):
        torch.ops.posenc.rope_rotate_(z, cos, sin)
    with torch.no_grad():
        torch.ops.posenc.rope_rotate_(z, cos, sin)
    with pytest.raises(
        RuntimeError, match="single memory location"
    ):  # an expanded tensor writes one element twice
        torch.ops.posenc.rope_rotate_(torch.ones(1, 5, 1, 16).expand(1, 5, 3, 16), cos, sin)


def test_compile_fullgraph_dynamic_no_recompile_with_backward():
    torch._dynamo.reset()

    def block(q, k, cos, sin):
        q, k = posenc.rope_rotate_qk(q, k, cos, sin)
        return (q.sum(2) * k.sum(2)).sum(-1)

    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (5, 9, 17):
            torch.manual_seed(n)
            q = torch.randn(2, n, 4, 16, requires_grad=True)
            k = torch.randn(2, n, 2, 16, requires_grad=True)
            cos, sin = pair_tables(None, n, 8)
            y = compiled(q, k, cos, sin)
            y.sum().backward()
            gq, gk = q.grad.clone(), k.grad.clone()
            q.grad = k.grad = None
            ye = block(q, k, cos, sin)
            ye.sum().backward()
            torch.testing.assert_close(y, ye, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(gq, q.grad, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(gk, k.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda x, c, s: posenc.rope_rotate(x, c.double(), s.double()),
            "rope_rotate: cos/sin must be float32 (the kernels' per-pair tables), got Double and Double",
        ),
        (
            lambda x, c, s: posenc.rope_rotate(x, c[:3], s[:3]),
            "rope_rotate: cos/sin have 3 positions but x has N=5",
        ),
        (
            lambda x, c, s: posenc.rope_rotate(x[..., :6], c, s),
            "rope_rotate: rotary width 2F=8 exceeds head_dim=6",
        ),
        (
            lambda x, c, s: posenc.rope_rotate(x[0], c, s),
            "rope_rotate: x must be [B, N, H, Dh], got shape [5, 2, 8]",
        ),
        (
            lambda x, c, s: posenc.rope_rotate(x, c, s[:, :3]),
            "rope_rotate: cos and sin shapes differ",
        ),
        (lambda x, c, s: posenc.rope_rotate(x, c, s, "sideways"), "unknown layout 'sideways'"),
        (
            lambda x, c, s: posenc.rope_rotate(x, c.expand(4, 5, 4), s.expand(4, 5, 4)),
            "rope_rotate: cos/sin batch 4 is neither 1 nor x's B=2",
        ),
        (
            lambda x, c, s: posenc.rope_rotate_qk(x, x.double(), c, s),
            "rope_rotate_qk: q is Float but k is Double",
        ),
    ],
)
def test_bad_input_is_one_line(call, message):
    x, cos, sin = make((2, 5, 2, 8, 4, None), torch.float32)
    with pytest.raises(RuntimeError) as info:
        call(x, cos, sin)
    text = str(info.value).split("\nException raised from")[0].strip()
    assert message in text and "\n" not in text, text


# Every operator's fake kernel: tests/python/test_fakes.py (enumerated from the dispatcher).


def test_the_device_kernels_are_registered_per_dispatch_key():
    for name in ("posenc::rope_rotate", "posenc::rope_rotate_qk", "posenc::rope_rotate_"):
        for key in ("CPU", "Autograd"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tables_in_any_memory_layout_give_the_same_rotation_and_gradient(layout):
    # a transposed sin is read as laid out, forward, inverse and backward (the inverse negated a
    # permuted table and read it as row-major: a silent wrong backward before)
    x, cos, sin = make((2, 5, 3, 16, 8, None), torch.float32)
    sin_t, cos_t = sin.t().contiguous().t(), cos.t().contiguous().t()
    assert not sin_t.is_contiguous() and torch.equal(sin_t, sin)
    for inverse in (False, True):
        want = posenc.rope_rotate(x, cos, sin, layout, inverse)
        assert torch.equal(posenc.rope_rotate(x, cos_t, sin_t, layout, inverse), want)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    probe = torch.randn(x.shape)
    (posenc.rope_rotate(x1, cos_t, sin_t, layout) * probe).sum().backward()
    (posenc.rope_rotate(x2, cos, sin, layout) * probe).sum().backward()
    assert torch.equal(x1.grad, x2.grad)
    y = x.clone()
    torch.ops.posenc.rope_rotate_(y, cos_t, sin_t, layout, True)
    assert torch.equal(y, posenc.rope_rotate(x, cos, sin, layout, True))


def test_in_place_under_inference_mode_bumps_the_version():
    # a tensor saved for backward and then rotated in place under inference mode: the backward
    # must refuse (as ATen's in-place ops make it), not use the rotated values
    x, cos, sin = make((1, 4, 2, 8, 4, None), torch.float32)
    w = torch.randn(x.shape, requires_grad=True)
    y = (x * w).sum()
    with torch.inference_mode():
        torch.ops.posenc.rope_rotate_(x, cos, sin)
    assert x._version > 0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    c, s = torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None]
    w = torch.randn(q.shape, requires_grad=True)
    y = (q * w).sum() + (k * w).sum()
    with torch.inference_mode():
        posenc.apply_rotary_pos_emb_(q, k, c, s)
    assert q._version > 0 and k._version > 0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_empty_and_unit_width_inputs_in_any_strides():
    x = torch.randn(0, 3, 8, 4).transpose(2, 3)  # empty, last dim not unit-strided
    cos, sin = torch.ones(3, 2), torch.zeros(3, 2)
    assert posenc.rope_rotate(x, cos, sin).shape == x.shape
    torch.ops.posenc.rope_rotate_(x, cos, sin)
    x = torch.randn(100).as_strided((2, 3, 4, 1), (12, 4, 1, 5))  # Dh 1: nothing rotates
    assert torch.equal(posenc.rope_rotate(x, torch.ones(3, 0), torch.zeros(3, 0)), x)


def test_the_reference_path_keeps_the_contract():
    # tables that need a gradient take rope_apply: same checks, contiguous results (the fake's)
    x, cos, sin = make((2, 5, 3, 16, 8, None), torch.float32)
    c, s = cos.clone().requires_grad_(True), sin.clone().requires_grad_(True)
    odd = torch.randn(2, 3, 16, 5).permute(0, 3, 1, 2)  # [B, N, H, Dh] with Dh strided
    got = posenc.rope_rotate(odd, c, s)
    assert got.is_contiguous() and torch.equal(got, posenc.rope_rotate(odd, cos, sin))
    with pytest.raises(RuntimeError, match="rope_rotate_qk: q is Float but k is Double"):
        posenc.rope_rotate_qk(x, x.double(), c, s)
    with pytest.raises(RuntimeError, match="rope_rotate_qk: q has B=2 but k has B=1"):
        posenc.rope_rotate_qk(x, x[:1], c, s)
    with pytest.raises(RuntimeError, match="rope_rotate_qk: k must be"):
        posenc.rope_rotate_qk(x, x[0], c, s)


def test_tables_on_another_device_are_refused():
    x, cos, sin = make((1, 4, 2, 8, 4, None), torch.float32)
    for args in ((x, cos, sin.to("meta")), (x.to("meta"), cos, sin)):
        with pytest.raises(RuntimeError):
            posenc.rope_rotate(*args)

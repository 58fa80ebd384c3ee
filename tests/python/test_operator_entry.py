"""Every torch.ops.posenc operator at its entry: devices, aliasing, shapes and dtypes (issue 53).

* Devices: every tensor argument of every operator, put on meta while the others stay on the CPU,
  is one line naming that argument and both devices (a meta table among CPU tensors sends the call
  to the fake kernel, which handed back uninitialized CPU memory); the same call all on meta still
  runs the fake (compile, export). The operators are enumerated from the dispatcher: a new one
  without an example here fails the enumeration test.
* Aliasing: every in-place operator refuses each operand pair that shares memory (written vs
  written, written vs read), non-dense views included (at::get_overlap_status's TooHard), and takes
  views of one buffer that are apart (q and k sliced from a packed row).
* Shapes: apply_rotary against transformers' own apply_rotary_pos_emb for every unsqueeze_dim
  transformers takes, live; partial rotary with tables that grow q's batch.
* Dtypes: complex and bool positions, float8 activations, float masks: one line.
* The rotary backward takes expanded gradients (a.sum() + b.sum()) on the fused kernel.
"""

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama import modeling_llama

import posenc

OPS = torch.ops.posenc


def one_line(info) -> str:
    text = str(info.value).split("\nException raised from")[0].strip()
    assert "\n" not in text, text
    return text


# ---- one valid CPU call per operator (fresh tensors each time: in-place ones are written) -----


def _rotary():
    torch.manual_seed(0)
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    emb = torch.arange(3.0)[:, None] * inv
    emb = torch.cat([emb, emb], -1)[None]  # [1, 3, 8]
    return torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8), emb.cos(), emb.sin()


def _pairs():  # rope_rotate's per-pair tables [N, F]
    angle = torch.arange(3.0)[:, None] * torch.tensor([1.0, 0.1, 0.01, 0.001])
    return angle.cos(), angle.sin()


def _sdpa():  # q, k, v [B, H, N, D], out, lse, grad_out
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    return q, k, v, torch.randn(1, 2, 3, 4), torch.zeros(1, 2, 3), torch.randn(1, 2, 3, 4)


def _mask():
    return torch.tensor([[True, True, False]])


def _t5_table():
    return torch.randn(8, 2)


def _packed():  # sample_ids, variate_ids [B, Nk], variate_bias [2, H], causal_ids [B, Nk]
    return [
        torch.tensor([[0, 0, 1]]),
        torch.tensor([[0, 1, 1]]),
        torch.randn(2, 2),
        torch.tensor([[0, 0, 0]]),
    ]


def _positional_tail():  # cos, sin, layout, slopes, symmetric, t5_table, bidirectional, ...
    cos, sin = _rotary()[2:]
    return [
        cos[0, :, :4],
        sin[0, :, :4],
        "half",
        posenc.alibi_slopes(2),
        False,
        _t5_table(),
        True,
        16,
        False,
        None,
        _mask(),
        *_packed(),
    ]


def _fused_tail():  # attention_fused's parameters after q, k, v
    qc, qs = _pairs()
    return [
        torch.arange(3.0),
        torch.arange(3.0),
        posenc.alibi_slopes(2),
        False,
        _t5_table(),
        "bucket_table",
        8,
        16,
        True,
        0,
        False,
        _mask(),
        0.5,
        qc[:, :2],
        qs[:, :2],
        qc[:, :2].clone(),
        qs[:, :2].clone(),
        "half",
        *_packed(),
    ]


def _bnhd():  # attention_fused's q, k, v [B, N, H, D], grad_out, out [B, N, H, Dv], lse [B, H, N]
    q, k, v, g, lse, out = _sdpa()

    def t(x):
        return x.transpose(1, 2).contiguous()

    return t(q), t(k), t(v), t(g), t(out), lse


def _streams():
    types = torch.zeros(1, 4, dtype=torch.long)
    return [
        types,
        torch.ones(1, 4, dtype=torch.long),
        torch.zeros(0, 3, dtype=torch.long),
        torch.zeros(0, 3, dtype=torch.long),
    ]


EXAMPLES = {
    "apply_rotary": lambda: [*_rotary(), 1, "half"],
    "apply_rotary_": lambda: [*_rotary(), 1, "half"],
    "apply_rotary_reference": lambda: [*_rotary(), 1, "half"],
    "apply_rotary_route": lambda: [*_rotary(), 1, "half"],
    "apply_rotary_backward_route": lambda: [
        *_rotary(),
        1,
        "half",
        torch.randn(1, 2, 3, 8),
        torch.randn(1, 1, 3, 8),
    ],
    "rope_rotate": lambda: [torch.randn(1, 3, 2, 8), *_pairs(), "half", False],
    "rope_rotate_": lambda: [torch.randn(1, 3, 2, 8), *_pairs(), "half", False],
    "rope_rotate_qk": lambda: [
        torch.randn(1, 3, 2, 8),
        torch.randn(1, 3, 1, 8),
        *_pairs(),
        "half",
        False,
    ],
    "rope_cos_sin": lambda: [
        torch.arange(3.0),
        torch.tensor([1.0, 0.1]),
        1.0,
        [],
        "contiguous",
        "half",
    ],
    "shaw_attention": lambda: [*_sdpa()[:3], torch.randn(5, 4), False, None, _mask()],
    "_shaw_attention_forward": lambda: [*_sdpa()[:3], torch.randn(5, 4), False, None, _mask()],
    "_shaw_attention_backward": lambda: [
        _sdpa()[5],
        *_sdpa()[:5],
        torch.randn(5, 4),
        False,
        None,
        _mask(),
    ],
    "positional_attention": lambda: [*_sdpa()[:3], *_positional_tail()],
    "_positional_attention_forward": lambda: [*_sdpa()[:3], *_positional_tail()],
    "_positional_attention_backward": lambda: [_sdpa()[5], *_sdpa()[:5], *_positional_tail()],
    "positional_attention_route": lambda: [*_sdpa()[:3], *_positional_tail()],
    "attention_fused": lambda: [*_bnhd()[:3], *_fused_tail()],
    "_attention_fused_forward": lambda: [*_bnhd()[:3], *_fused_tail()],
    "_attention_fused_backward": lambda: [
        _bnhd()[3],
        _bnhd()[4],
        _bnhd()[5],
        *_bnhd()[:3],
        *_fused_tail(),
    ],
    "rope_periods_cos_sin": lambda: [torch.rand(6, 2), torch.tensor([1.0, 4.0, 16.0]), "half"],
    "rope_mixed_cos_sin": lambda: [torch.rand(6, 2), torch.randn(2, 3, 4), "interleaved"],
    "qwen2_vl_rope_index": lambda: [*_streams(), torch.zeros(0, dtype=torch.float64), 2, 2.0, True],
    "qwen2_5_omni_rope_index": lambda: [
        *_streams(),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.float64),
        False,
        2,
        25.0,
        2.0,
    ],
}

# Operators with fewer than two tensor arguments: nothing to mix.
SINGLE_TENSOR = {
    "sinusoidal_table",
    "hf_rope",
    "patch_grid_bands",
    "patch_grid_rope",
    "resample_grid_table",
    "axial_sincos_table",
    "patch_grid_coords",
    "dinov3_periods",
}
# The streams read their arguments' values on the host: real devices may mix (the documented
# exception), a meta tensor among real ones (no values) is refused; all on meta, their fakes give
# the shapes.
HOST_VALUES = {"qwen2_vl_rope_index", "qwen2_5_omni_rope_index"}
# Inspection operators (composite, reading the tables' values): the all-meta call is not theirs.
NO_ALL_META = {"apply_rotary_route", "apply_rotary_backward_route", "positional_attention_route"}


def all_operators():
    return sorted(
        n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("posenc::")
    )


def tensor_arguments(name):
    schema = getattr(OPS, name).default._schema
    return [
        (i, a.name)
        for i, a in enumerate(schema.arguments)
        if str(a.type) in ("Tensor", "Optional[Tensor]")
    ]


CASES = [
    (name, arg)
    for name in sorted(EXAMPLES)
    if hasattr(OPS, name)
    for _, arg in tensor_arguments(name)
]


def test_every_operator_is_enumerated_here():
    names = all_operators()
    assert "apply_rotary" in names and all(hasattr(OPS, n) for n in names)
    missing = [n for n in names if n not in EXAMPLES and n not in SINGLE_TENSOR]
    assert not missing, f"operators without a device example: {missing}"
    for name, example in EXAMPLES.items():  # each runs on the CPU (the refusals are the device's)
        getattr(OPS, name)(*example())
    # the in-place operators, each with its aliasing test below
    assert [n for n in names if n.endswith("_")] == ["apply_rotary_", "rope_rotate_"]


@pytest.mark.parametrize("name,arg", CASES)
def test_a_tensor_on_meta_among_cpu_ones_is_one_line(name, arg):
    args = EXAMPLES[name]()
    index = {a: i for i, a in tensor_arguments(name)}[arg]
    args[index] = args[index].to("meta")
    with pytest.raises(RuntimeError) as info:
        getattr(OPS, name)(*args)
    text = one_line(info)
    assert f"{arg} is on meta" in text, text
    if name not in HOST_VALUES:
        assert "cpu" in text, text
    if name in NO_ALL_META:
        return
    # every tensor on meta: the fake kernel's shapes, as compile and export run it
    want = getattr(OPS, name)(*EXAMPLES[name]())
    metas = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in EXAMPLES[name]()]
    got = getattr(OPS, name)(*metas)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for w, g in zip(want, got):
        if isinstance(w, torch.Tensor):
            assert g.device.type == "meta" and g.shape == w.shape and g.dtype == w.dtype


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name,arg", [c for c in CASES if c[0] not in HOST_VALUES])
def test_a_tensor_on_cuda_among_cpu_ones_is_one_line(name, arg):
    args = EXAMPLES[name]()
    index = {a: i for i, a in tensor_arguments(name)}[arg]
    args[index] = args[index].cuda()
    with pytest.raises(RuntimeError) as info:
        getattr(OPS, name)(*args)
    text = one_line(info)
    assert f"{arg} is on cuda" in text and "cpu" in text, text


# ---- aliasing: every in-place operator, every operand pair -------------------------------------


def rotary_inplace(q, k, cos, sin):
    torch.ops.posenc.apply_rotary_(q, k, cos, sin, 1, "half")


@pytest.mark.parametrize("pair", ["q-k", "q-cos", "q-sin", "k-cos", "k-sin", "q-q", "k-k"])
def test_apply_rotary_inplace_refuses_every_overlapping_pair(pair):
    q, k, cos, sin = _rotary()
    buffer = torch.randn(1, 2, 3, 16)
    a, b = pair.split("-")
    views = {"q": q, "k": k.clone(), "cos": cos.clone(), "sin": sin.clone()}
    if a == b:  # one operand over itself: rows 4 floats apart, 8 wide (non-dense: TooHard)
        views[a] = buffer.view(-1)[:64].as_strided(views[a].shape, (48, 24, 4, 1))
        message = f"{a} has elements that share memory"
    else:  # two non-dense views of one buffer, overlapping: [..., 0:8] and [..., 4:12]
        views[a] = buffer[..., 0:8][:, : views[a].shape[1]]
        other = buffer[..., 4:12]
        views[b] = other[:, : views[b].shape[1]] if b in "qk" else other[:, 0]
        message = "q and k share memory" if b == "k" else f"{b} shares memory with q or k"
    with pytest.raises(RuntimeError, match=message) as info:
        rotary_inplace(views["q"], views["k"], views["cos"], views["sin"])
    one_line(info)
    takes_views_of_one_buffer_that_are_apart()


def takes_views_of_one_buffer_that_are_apart():
    # q and k sliced from one packed row (a fused projection), non-dense views of one storage
    q0, k0, cos, sin = _rotary()
    packed = torch.cat(
        [
            q0.transpose(1, 2).reshape(1, 3, 16),
            k0.transpose(1, 2).reshape(1, 3, 8),
            torch.randn(1, 3, 8),
        ],
        -1,
    )  # [B, N, (2 + 1 + 1) * 8]: q, k, v
    q = packed[..., :16].view(1, 3, 2, 8).transpose(1, 2)
    k = packed[..., 16:24].view(1, 3, 1, 8).transpose(1, 2)
    want = torch.ops.posenc.apply_rotary(q0, k0, cos, sin, 1, "half")
    rotary_inplace(q, k, cos, sin)
    assert torch.equal(q, want[0]) and torch.equal(k, want[1])
    # even and odd elements of one buffer: interleaved, apart
    buffer = torch.randn(1, 2, 3, 16)
    q, k = buffer[..., 0::2], buffer[..., 1::2]
    want = torch.ops.posenc.apply_rotary(q.clone(), k.clone(), cos, sin, 1, "half")
    rotary_inplace(q, k, cos, sin)
    assert torch.equal(q, want[0]) and torch.equal(k, want[1])


@pytest.mark.parametrize("pair", ["x-cos", "x-sin", "x-x"])
def test_rope_rotate_inplace_refuses_every_overlapping_pair(pair):
    cos, sin = _pairs()
    buffer = torch.randn(1, 3, 2, 16)
    x = buffer[..., :8]  # non-dense
    tables = {"cos": cos, "sin": sin}
    if pair == "x-x":  # heads 4 floats apart, 8 wide: two heads share four elements
        x = buffer.view(-1).as_strided((1, 3, 2, 8), (32, 16, 4, 1))
        message = "x has elements that share memory"
    else:  # the table: x's first head's first four pairs, a non-dense view of x's storage
        tables[pair[2:]] = buffer[0, :, 0, 0:4]
        message = f"{pair[2:]} shares memory with x"
    want = torch.ops.posenc.rope_rotate(x.clone(), tables["cos"].clone(), tables["sin"].clone())
    with pytest.raises(RuntimeError, match=message) as info:
        torch.ops.posenc.rope_rotate_(x, tables["cos"], tables["sin"])
    one_line(info)
    assert want.shape == x.shape
    # a non-dense x apart from its tables is taken
    x = buffer[..., :8]
    want = torch.ops.posenc.rope_rotate(x.clone(), cos, sin)
    torch.ops.posenc.rope_rotate_(x, cos, sin)
    assert torch.equal(x, want)


# ---- shapes as transformers computes them -------------------------------------------------------

TABLE_SHAPES = [  # (q shape, k shape, cos shape)
    ((1, 4, 4, 4), (1, 4, 4, 4), (1, 4, 4)),  # the hostile pass's: -1 broadcasts over D
    ((2, 3, 5, 8), (2, 1, 5, 8), (2, 5, 8)),
    ((2, 3, 5, 8), (2, 3, 5, 8), (1, 5, 8)),
    ((1, 2, 4, 8), (1, 2, 4, 8), (4, 8)),
    ((2, 4, 2, 6), (2, 4, 2, 6), (2, 4, 2)),
    ((1, 3, 5, 8), (1, 3, 5, 8), (1, 5, 1)),  # width 1: over the whole head dim
    ((3, 3, 3, 4), (3, 3, 3, 4), (3, 3, 4)),
]


def _cases():
    for shapes in TABLE_SHAPES:
        rank = len(shapes[2]) + 1
        for u in range(-rank, rank):
            yield shapes, u


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shapes,unsqueeze_dim", list(_cases()))
def test_every_unsqueeze_dim_gives_transformers_shapes(shapes, unsqueeze_dim, dtype):
    torch.manual_seed(2)
    q, k = torch.randn(shapes[0], dtype=dtype), torch.randn(shapes[1], dtype=dtype)
    cos, sin = torch.randn(shapes[2], dtype=dtype), torch.randn(shapes[2], dtype=dtype)
    width = cos.unsqueeze(unsqueeze_dim).shape[-1]

    def transformers(x):  # its formula; partial rotary (1 < W < D, posenc's own) on x[..., :W]
        if width in (1, x.shape[-1]):
            return modeling_llama.apply_rotary_pos_emb(x, x, cos, sin, unsqueeze_dim=unsqueeze_dim)[
                0
            ]
        rot = modeling_llama.apply_rotary_pos_emb(
            x[..., :width], x[..., :width], cos, sin, unsqueeze_dim=unsqueeze_dim
        )[0]
        return torch.cat([rot, x[..., width:].expand(*rot.shape[:-1], -1)], -1)

    try:
        want = transformers(q), transformers(k)
    except RuntimeError:
        want = None
    if want is None:  # transformers' formula fails: one posenc line
        with pytest.raises(RuntimeError, match="posenc.apply_rotary") as info:
            posenc.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        one_line(info)
        return
    got = posenc.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    assert got[0].shape == want[0].shape and got[1].shape == want[1].shape
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    meta = torch.ops.posenc.apply_rotary(*(t.to("meta") for t in (q, k, cos, sin)), unsqueeze_dim)
    assert meta[0].shape == want[0].shape and meta[1].shape == want[1].shape
    if dtype == torch.float64:  # gradients as autograd through transformers' formula
        qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
        cg, sg = cos.clone().requires_grad_(), sin.clone().requires_grad_()
        torch.autograd.gradcheck(
            lambda a, b, c, s: posenc.apply_rotary_pos_emb(a, b, c, s, unsqueeze_dim=unsqueeze_dim),
            (qg, kg, cg, sg),
        )


def test_partial_rotary_with_tables_that_grow_q():
    # q of batch 1, tables of batch 3, rotary width 4 of 8: the pass-through dims follow
    torch.manual_seed(3)
    q, k = (
        torch.randn(1, 2, 5, 8, dtype=torch.float64),
        torch.randn(3, 2, 5, 8, dtype=torch.float64),
    )
    cos, sin = torch.randn(3, 5, 4, dtype=torch.float64), torch.randn(3, 5, 4, dtype=torch.float64)
    got = posenc.apply_rotary_pos_emb(q, k, cos, sin)
    c, s = cos[:, None], sin[:, None]
    for x, y in zip((q, k), got):
        rotated = modeling_llama.apply_rotary_pos_emb(x[..., :4], x[..., :4], cos, sin)[0]
        want = torch.cat([rotated, x[..., 4:].expand(3, 2, 5, 4)], -1)
        assert y.shape == (3, 2, 5, 8) and torch.equal(y, want)
        assert torch.equal(y[..., :4], x[..., :4] * c + modeling_llama.rotate_half(x[..., :4]) * s)
    torch.library.opcheck(torch.ops.posenc.apply_rotary.default, (q, k, cos, sin, 1, "half"))
    torch.autograd.gradcheck(
        lambda a, b: posenc.apply_rotary_pos_emb(a, b, cos, sin),
        (q.requires_grad_(), k.requires_grad_()),
    )


# ---- dtypes: real positions, supported activations, masks --------------------------------------


@pytest.mark.parametrize("dtype", [torch.complex64, torch.bool])
def test_positions_must_be_real(dtype):
    positions = torch.arange(3).to(dtype)
    with pytest.raises(RuntimeError, match="positions must be real") as info:
        posenc.rope_cos_sin(positions, torch.tensor([1.0, 0.1]))
    one_line(info)
    fused = _fused_tail()
    fused[0] = fused[0].to(dtype)
    with pytest.raises(RuntimeError, match="q_positions must hold real numbers") as info:
        torch.ops.posenc.attention_fused(*_bnhd()[:3], *fused)
    one_line(info)


@pytest.mark.parametrize("call", ["apply_rotary", "apply_rotary_reference", "apply_rotary_"])
@pytest.mark.parametrize("argument", [0, 2])
def test_float8_and_complex_activations_are_one_line(call, argument):
    for dtype in (torch.float8_e4m3fn, torch.complex64):
        args = [*_rotary(), 1, "half"]
        args[argument] = args[argument].to(dtype)
        with pytest.raises(
            RuntimeError, match="must be a floating-point tensor of float32"
        ) as info:
            getattr(torch.ops.posenc, call)(*args)
        one_line(info)


def test_stream_inputs_are_integers_and_masks_not_float():
    types, mask, images, videos = _streams()
    seconds = torch.zeros(0, dtype=torch.float64)
    for bad, message in [
        ((types.bool(), mask, images, videos, seconds), "token types must be integers"),
        (
            (types.to(torch.complex64), mask, images, videos, seconds),
            "token types must be integers",
        ),
        ((types, mask.float(), images, videos, seconds), "attention_mask must be bool or integer"),
        (
            (types, mask, torch.tensor([[1, 2, 2]]).to(torch.complex64), videos, seconds),
            "image_grid_thw must hold integers",
        ),
        (
            (types, mask, images, videos, torch.ones(1, dtype=torch.complex64)),
            "second_per_grid_ts must hold real numbers",
        ),
    ]:
        with pytest.raises(RuntimeError, match=message) as info:
            torch.ops.posenc.qwen2_vl_rope_index(*bad)
        one_line(info)


def test_alibi_slopes_must_be_real():
    q, k, v = _sdpa()[:3]
    with pytest.raises(RuntimeError, match="slopes must be floating point") as info:
        posenc.alibi_attention(q, k, v, posenc.alibi_slopes(2).to(torch.complex64))
    one_line(info)


# ---- Plan.attention and Plan.bias ----------------------------------------------------------------


def _t5_plan(heads=2):
    enc = posenc.build_encoder(
        {"type": "t5", "num_buckets": 8, "max_distance": 16}, num_heads=heads
    )
    return enc(posenc.Positions.sequence(5))


def test_plan_attention_refuses_a_float_mask_and_reads_integers_as_transformers():
    plan = _t5_plan()
    torch.manual_seed(5)
    q, k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    additive = torch.zeros(2, 5).masked_fill(keep == 0, float("-inf"))
    with pytest.raises(ValueError, match="key_padding must be bool or integer"):
        plan.attention(q, k, v, key_padding=additive)
    with pytest.raises(ValueError, match="key_padding must be bool or integer"):
        plan.attention(q, k, v, key_padding=keep.float())
    with pytest.raises(ValueError, match="values must be 0 or 1"):
        plan.attention(q, k, v, key_padding=keep * 2)
    got = plan.attention(q, k, v, key_padding=keep)
    assert torch.equal(got, plan.attention(q, k, v, key_padding=keep.bool()))
    want = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=plan.bias(2)
        + torch.zeros(2, 1, 1, 5).masked_fill(keep[:, None, None] == 0, float("-inf")),
    )
    assert torch.allclose(got, want, atol=1e-5)


def test_plan_bias_refuses_another_head_count():
    plan = _t5_plan(heads=2)
    assert plan.bias(2).shape == (2, 5, 5)
    with pytest.raises(ValueError, match="bias has 2 heads .* heads=3"):
        plan.bias(3)


def test_head_dim_zero_with_default_scale_is_sdpa():
    # D = 0: the dot products are empty sums; SDPA's logits are the bias alone (no NaN)
    q, k, v = torch.randn(1, 2, 3, 0), torch.randn(1, 2, 3, 0), torch.randn(1, 2, 3, 5)
    slopes = posenc.alibi_slopes(2)
    bias = -slopes[:, None, None] * (torch.arange(3.0)[:, None] - torch.arange(3.0)).abs()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    got = posenc.alibi_attention(q, k, v, slopes, symmetric=True)
    assert torch.allclose(got, want, atol=1e-6), (got, want)
    got = posenc.positional_attention(q, k, v, slopes=slopes, symmetric=True)
    assert torch.allclose(got, want, atol=1e-6), (got, want)
    plan = posenc.build_encoder({"type": "t5", "num_buckets": 8, "max_distance": 16}, num_heads=2)(
        posenc.Positions.sequence(3)
    )
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=plan.bias(2))
    got = plan.attention(q, k, v)
    assert torch.allclose(got, want, atol=1e-6), (got, want)


# ---- the rotary backward on expanded gradients ---------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_backward_takes_expanded_gradients_on_the_fused_kernel(dtype):
    torch.manual_seed(6)
    q = torch.randn(1, 6, 4, 32).transpose(1, 2).to(dtype).requires_grad_()  # [B, H, N, D] view
    k = torch.randn(1, 6, 2, 32).transpose(1, 2).to(dtype).requires_grad_()
    inv = 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))
    cos, sin = posenc.rope_cos_sin(torch.arange(6)[None], inv)
    cos, sin = cos.to(dtype), sin.to(dtype)
    a, b = posenc.apply_rotary_pos_emb(q, k, cos, sin)
    ga, gb = (
        torch.ones((), dtype=dtype).expand(a.shape),
        torch.ones((), dtype=dtype).expand(b.shape),
    )
    route = torch.ops.posenc.apply_rotary_backward_route(q, k, cos, sin, 1, "half", ga, gb)
    assert route == "gradients made dense first, then fused", route
    assert torch.ops.posenc.apply_rotary_backward_route(q, k, cos, sin, 1, "half") == "fused"
    (a.sum() + b.sum()).backward()
    dq, dk = q.grad.clone(), k.grad.clone()
    q.grad, k.grad = None, None
    a, b = posenc.apply_rotary_pos_emb(q, k, cos, sin)
    torch.autograd.backward((a, b), (ga.contiguous(), gb.contiguous()))
    assert torch.equal(dq, q.grad) and torch.equal(dk, k.grad)

"""posenc.positional_attention with packed samples and Moirai's binary variate bias, against
uni2ts' own code (uni2ts 2.0.0, installed in the test venv) run live:

    softmax(rot(q) rot(k)^T * scale + alibi + BinaryAttentionBias(variate_id)
            + packed_attention_mask(sample_id) + causal) v

* the bias: uni2ts.module.position.attn_bias.BinaryAttentionBias with posenc's variate_bias
  copied into its nn.Embedding(2, H) (row 0 different variate ids, row 1 the same), gradients
  into that weight compared with posenc's d variate_bias;
* the mask: uni2ts.common.torch_util.packed_attention_mask(sample_id) (True = attend);
* rot: transformers' Llama apply_rotary_pos_emb, with one shared table or per-row tables whose
  positions restart in every sample (Moirai's time_id).

The oracle is torch's SDPA in float64 with the materialized bias + mask (a row that sees no key
is set to 0, posenc's convention, where SDPA gives NaN). Cases: several samples of different
lengths per row, tiles crossed (N > 256), causal and not, cached keys (Nq < Nk), ALiBi with RoPE,
unscaled attention (scale=1.0), padding that leaves a sample with no visible key, float32 /
bfloat16 / float16, float64 gradcheck (the reference path), opcheck (the fake kernel), the route,
bad input in one line, and CUDA against the CPU (skipped without a GPU): positional_attention
and the C++ library's operator attention_fused on CUDA tensors run the CUDA kernel
(src/kernels/cuda/attention_cuda.cu reads the ids; the route says so), outputs and gradients
(q, k, v, variate_bias) equal the CPU kernel's, with the ids on the GPU or on the CPU, and
d variate_bias is the same bits on every run (the kernel's two-pass reduce has no atomics).
Without a GPU the same CUDA kernels run on the CPU emulator in CTest (cuda_emu:
tests/test_cuda_raw.cpp, tests/cuda_emu/test_tensor_launch_emu.cpp). causal_ids (Moirai-2's
time_id, several variates per series packed variate-major) against uni2ts'
packed_causal_attention_mask, and its refusals (CPU).
"""

import pytest
import torch
import torch.nn.functional as F

import posenc

attn_bias = pytest.importorskip("uni2ts.module.position.attn_bias")
torch_util = pytest.importorskip("uni2ts.common.torch_util")
modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")

# float32 kernel against a float64 oracle: tiles summed in float32, the softmax's exp on 8 or 16
# lanes (relative error <= 2^-22), the rotation in float32
F32_TOL = dict(rtol=2e-5, atol=2e-5)
# bfloat16 / float16 inputs rounded once, then float32 inside; the oracle runs on the same rounded
# inputs in float64, so only the output's and the gradients' final rounding (2^-8, 2^-11) remains
LOW_TOL = {torch.bfloat16: dict(rtol=2e-2, atol=2e-2), torch.float16: dict(rtol=3e-3, atol=3e-3)}


def _packed_ids(lengths_per_row, n, variates=3, seed=0):
    """sample_ids [B, N] from run lengths (the remainder a padding sample of its own), and
    variate_ids [B, N]: a few variates per sample, each a contiguous run inside it."""
    g = torch.Generator().manual_seed(seed)
    samples, variate = [], []
    for lengths in lengths_per_row:
        lengths = list(lengths) + ([n - sum(lengths)] if sum(lengths) < n else [])
        samples.append(torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)))
        row = []
        for length in lengths:
            cut = torch.sort(torch.randint(0, length + 1, (variates - 1,), generator=g)).values
            sizes = torch.diff(torch.cat([torch.tensor([0]), cut, torch.tensor([length])]))
            row.append(torch.repeat_interleave(torch.arange(variates), sizes))
        variate.append(torch.cat(row))
    return torch.stack(samples), torch.stack(variate)


def _inputs(dtype, b=2, h=4, nq=300, nk=300, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g).to(dtype)
    k = torch.randn(b, h, nk, d, generator=g).to(dtype)
    v = torch.randn(b, h, nk, d, generator=g).to(dtype)
    weight = torch.randn(2, h, generator=g)
    return q, k, v, weight


def _tables(positions, d, base=10000.0):
    """Llama's cat(t, t) tables at positions [..., N]: cos, sin [..., N, d] float32."""
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = positions.to(torch.float32)[..., None] * inv
    emb = torch.cat([angles, angles], -1)
    return emb.cos(), emb.sin()


def _uni2ts_bias(weight, variate_ids, nq):
    """BinaryAttentionBias's own forward with `weight` as its Embedding weight: [B, H, Nq, Nk]."""
    heads = weight.shape[1]
    module = attn_bias.BinaryAttentionBias(dim=heads * 4, num_heads=heads, num_groups=heads)
    with torch.no_grad():
        module.emb.weight.copy_(weight)
    nk = variate_ids.shape[1]
    query_id = variate_ids[:, None, None, nk - nq :]
    kv_id = variate_ids[:, None, None, :]
    q_dummy = torch.zeros(variate_ids.shape[0], heads, 1, nq, 4, dtype=weight.dtype)
    k_dummy = torch.zeros(variate_ids.shape[0], heads, 1, nk, 4, dtype=weight.dtype)
    bias = module(q_dummy, k_dummy, query_id, kv_id)  # [B, group=H, hpg=1, Nq, Nk]
    return bias.squeeze(2), module.emb.weight


def _oracle(
    q,
    k,
    v,
    sample_ids,
    variate_ids,
    weight,
    *,
    cos=None,
    sin=None,
    slopes=None,
    causal=False,
    scale=None,
    attention_mask=None,
    time_ids=None,
):
    """uni2ts' mask and bias, materialized, through SDPA in float64 (time_ids: uni2ts'
    packed_causal_attention_mask instead of packed_attention_mask). Returns (out, the weight
    leaf that gradients reach)."""
    nq, nk = q.shape[2], k.shape[2]
    q64, k64, v64 = q.double(), k.double(), v.double()
    if cos is not None:
        if cos.dim() == 2:  # apply_rotary_pos_emb unsqueezes dim 1: [B or 1, N, W]
            cos, sin = cos[None], sin[None]
        cq, sq = cos[..., nk - nq :, :], sin[..., nk - nq :, :]
        q64 = modeling_llama.apply_rotary_pos_emb(q64, q64, cq.double(), sq.double())[0]
        k64 = modeling_llama.apply_rotary_pos_emb(k64, k64, cos.double(), sin.double())[0]
    bias, leaf = _uni2ts_bias(weight.double(), variate_ids, nq)
    visible = torch_util.packed_attention_mask(sample_ids)[:, None, nk - nq :, :]
    if time_ids is not None:
        visible = torch_util.packed_causal_attention_mask(sample_ids, time_ids)
        visible = visible[:, None, nk - nq :, :]
    if causal:
        visible = visible & torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
    if attention_mask is not None:
        visible = visible & attention_mask[:, None, None, :]
    if slopes is not None:
        rel = torch.arange(nk)[None, :] - torch.arange(nk - nq, nk)[:, None]  # p_j - p_i
        bias = bias + slopes.double()[:, None, None] * rel
    bias = bias.masked_fill(~visible, float("-inf"))
    out = F.scaled_dot_product_attention(q64, k64, v64, attn_mask=bias, scale=scale)
    out = torch.where(visible.any(-1, keepdim=True), out, torch.zeros_like(out))  # no key: 0
    return out, leaf


def _run(fn, tensors):
    """fn(*leaves) and the gradients of a fixed random projection of its output."""
    leaves = [t.detach().requires_grad_(True) for t in tensors]
    out = fn(*leaves)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    (out.double() * probe).sum().backward()
    return out.detach(), [x.grad for x in leaves]


LENGTHS = [[70, 130, 9, 51], [300], [1, 180, 64]]  # the second row one sample; the third padded


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rope", ["none", "shared", "per_sample"])
@pytest.mark.parametrize("scale", [None, 1.0])
def test_matches_uni2ts_float32(causal, rope, scale):
    n, h, d = 300, 4, 32
    q, k, v, weight = _inputs(torch.float32, b=3, h=h, nq=n, nk=n, d=d)
    sample_ids, variate_ids = _packed_ids(LENGTHS, n)
    cos = sin = None
    if rope == "shared":
        cos, sin = _tables(torch.arange(n), d)
    elif rope == "per_sample":  # Moirai's time_id: positions restart in every sample
        start = torch.cat(
            [torch.zeros(3, 1, dtype=torch.long), (sample_ids[:, 1:] != sample_ids[:, :-1]).long()],
            1,
        )
        first = torch.cummax(torch.where(start.bool(), torch.arange(n), 0), 1).values
        cos, sin = _tables(torch.arange(n) - first, d)
    slopes = posenc.alibi_slopes(h) if rope == "shared" else None
    scale_value = 1.0 / d if scale == 1.0 else None  # unscaled: q pre-scaled so softmax is sane
    if scale == 1.0:
        q = q * scale_value

    def ours(q, k, v, w):
        return posenc.positional_attention(
            q,
            k,
            v,
            cos=cos,
            sin=sin,
            slopes=slopes,
            causal=causal,
            scale=scale,
            sample_ids=sample_ids,
            variate_ids=variate_ids,
            variate_bias=w,
        )

    def theirs(q, k, v, w):
        out, leaf = _oracle(
            q,
            k,
            v,
            sample_ids,
            variate_ids,
            w,
            cos=cos,
            sin=sin,
            slopes=slopes,
            causal=causal,
            scale=scale,
        )
        theirs.leaf = leaf
        return out

    out, grads = _run(ours, [q, k, v, weight])
    ref, ref_grads = _run(theirs, [q, k, v, weight])
    ref_grads[3] = theirs.leaf.grad  # the gradient into BinaryAttentionBias's own weight
    torch.testing.assert_close(out.double(), ref, **F32_TOL)
    for name, a, b in zip("q k v variate_bias".split(), grads, ref_grads):
        torch.testing.assert_close(
            a.double(), b.double(), **F32_TOL, msg=lambda m, name=name: f"{name}: {m}"
        )


def _variate_major_ids(rows, n):
    """Moirai-2's packing: per row, series of (variates, times) listing variate 0's time ids
    0..T-1, then variate 1's, ...; the rest of the row one padding series. (sample_ids,
    variate_ids, time_ids) [B, n] int64."""
    out = [[], [], []]
    for series in rows:
        series = series + [(1, n - sum(v * t for v, t in series))]
        sample = torch.cat([torch.full((v * t,), i) for i, (v, t) in enumerate(series)])
        variate = torch.cat([torch.arange(v).repeat_interleave(t) for v, t in series])
        time = torch.cat([torch.arange(t).repeat(v) for v, t in series])
        for ids, row in zip(out, (sample, variate, time)):
            ids.append(row)
    return tuple(torch.stack(ids) for ids in out)


@pytest.mark.parametrize("nq", [600, 70])
@pytest.mark.parametrize("rope", [False, True])
def test_causal_ids_match_uni2ts(nq, rope):
    """causal_ids = Moirai-2's time_id over series of several variates packed variate-major
    (uni2ts' packed_causal_attention_mask: causal in time, not in token order), with the sample
    mask, the variate bias, RoPE and ALiBi, cached keys (the queries take the last Nq ids):
    outputs and gradients of q, k, v and variate_bias against SDPA with uni2ts' materialized
    mask and bias (float64)."""
    n, h, d = 600, 4, 32
    q, k, v, weight = _inputs(torch.float32, b=2, h=h, nq=nq, nk=n, d=d, seed=9)
    sample_ids, variate_ids, time_ids = _variate_major_ids(
        [[(3, 40), (2, 150), (1, 10)], [(2, 250), (4, 20)]], n
    )
    cos, sin = _tables(torch.arange(n), d) if rope else (None, None)
    slopes = posenc.alibi_slopes(h) if rope else None

    def ours(q, k, v, w):
        return posenc.positional_attention(
            q,
            k,
            v,
            cos=cos,
            sin=sin,
            slopes=slopes,
            sample_ids=sample_ids,
            variate_ids=variate_ids,
            variate_bias=w,
            causal_ids=time_ids,
        )

    def theirs(q, k, v, w):
        out, leaf = _oracle(
            q, k, v, sample_ids, variate_ids, w, cos=cos, sin=sin, slopes=slopes, time_ids=time_ids
        )
        theirs.leaf = leaf
        return out

    assert torch.ops.posenc.positional_attention_route(
        q, k, v, cos=cos, sin=sin, sample_ids=sample_ids, causal_ids=time_ids
    ) == ("fused, RoPE inside" if rope else "fused")
    out, grads = _run(ours, [q, k, v, weight])
    ref, ref_grads = _run(theirs, [q, k, v, weight])
    ref_grads[3] = theirs.leaf.grad
    torch.testing.assert_close(out.double(), ref, **F32_TOL)
    for name, a, b in zip("q k v variate_bias".split(), grads, ref_grads):
        torch.testing.assert_close(
            a.double(), b.double(), **F32_TOL, msg=lambda m, name=name: f"{name}: {m}"
        )


@pytest.mark.parametrize(
    "case,message",
    [
        (dict(causal=True), "causal and causal_ids together are two causal rules"),
        (dict(causal_ids=torch.zeros(2, 16)), "causal_ids must be an integer tensor"),
        (dict(causal_ids=torch.zeros(2, 15, dtype=torch.long)), "must be [B, Nk] = [2, 16]"),
    ],
)
def test_bad_causal_ids_are_one_line(case, message):
    q, k, v, _ = _inputs(torch.float32, b=2, h=2, nq=16, nk=16, d=8)
    case.setdefault("causal_ids", torch.zeros(2, 16, dtype=torch.long))
    with pytest.raises(ValueError) as info:
        posenc.positional_attention(q, k, v, **case)
    text = str(info.value).splitlines()[0]
    assert "posenc.positional_attention" in text and message in text, text


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision(dtype):
    n, h, d = 300, 4, 32
    q, k, v, weight = _inputs(dtype, b=3, h=h, nq=n, nk=n, d=d, seed=3)
    sample_ids, variate_ids = _packed_ids(LENGTHS, n, seed=3)
    cos, sin = _tables(torch.arange(n), d)

    def ours(q, k, v, w):
        return posenc.positional_attention(
            q,
            k,
            v,
            cos=cos,
            sin=sin,
            causal=True,
            sample_ids=sample_ids,
            variate_ids=variate_ids,
            variate_bias=w,
        )

    def theirs(q, k, v, w):
        out, leaf = _oracle(q, k, v, sample_ids, variate_ids, w, cos=cos, sin=sin, causal=True)
        theirs.leaf = leaf
        return out

    out, grads = _run(ours, [q, k, v, weight])
    ref, ref_grads = _run(theirs, [q, k, v, weight])
    ref_grads[3] = theirs.leaf.grad
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, **LOW_TOL[dtype])
    for a, b in zip(grads[:3], ref_grads[:3]):
        torch.testing.assert_close(a.double(), b.double(), **LOW_TOL[dtype])
    # the variate gradient sums N^2 terms: relative to its size
    torch.testing.assert_close(
        grads[3].double(),
        ref_grads[3].double(),
        rtol=2e-2,
        atol=2e-2 * ref_grads[3].abs().max().item(),
    )


def test_cached_keys():
    """Nq < Nk: the queries take the last Nq ids (a decode step over a packed cache)."""
    q, k, v, weight = _inputs(torch.float32, b=2, h=3, nq=40, nk=280, d=16, seed=5)
    sample_ids, variate_ids = _packed_ids([[100, 150, 30], [200, 80]], 280, seed=5)

    def ours(q, k, v, w):
        return posenc.positional_attention(
            q, k, v, causal=True, sample_ids=sample_ids, variate_ids=variate_ids, variate_bias=w
        )

    def theirs(q, k, v, w):
        out, leaf = _oracle(q, k, v, sample_ids, variate_ids, w, causal=True)
        theirs.leaf = leaf
        return out

    out, grads = _run(ours, [q, k, v, weight])
    ref, ref_grads = _run(theirs, [q, k, v, weight])
    ref_grads[3] = theirs.leaf.grad
    torch.testing.assert_close(out.double(), ref, **F32_TOL)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a.double(), b.double(), **F32_TOL)


def test_sample_with_no_visible_key_gives_zero():
    """Padding every key of one sample (attention_mask) leaves its queries no key: 0, as the
    reference gives, and no NaN in any gradient."""
    n = 64
    q, k, v, weight = _inputs(torch.float32, b=1, h=2, nq=n, nk=n, d=8, seed=9)
    sample_ids, variate_ids = _packed_ids([[20, 30, 14]], n, seed=9)
    mask = sample_ids[0] != 1  # sample 1's keys all padded
    out, grads = _run(
        lambda q, k, v, w: posenc.positional_attention(
            q,
            k,
            v,
            sample_ids=sample_ids,
            variate_ids=variate_ids,
            variate_bias=w,
            attention_mask=mask[None],
        ),
        [q, k, v, weight],
    )
    assert torch.equal(out[0, :, 20:50], torch.zeros_like(out[0, :, 20:50]))
    ref, _ = _oracle(q, k, v, sample_ids, variate_ids, weight, attention_mask=mask[None])
    torch.testing.assert_close(out.double(), ref, **F32_TOL)
    assert all(torch.isfinite(g).all() for g in grads)


def test_samples_only_and_variates_only():
    """Each part alone: the mask without a bias, the bias without a mask."""
    n = 270
    q, k, v, weight = _inputs(torch.float32, b=2, h=2, nq=n, nk=n, d=16, seed=11)
    sample_ids, variate_ids = _packed_ids([[100, 170], [5, 5, 260]], n, seed=11)
    out = posenc.positional_attention(q, k, v, sample_ids=sample_ids)
    ref, _ = _oracle(q, k, v, sample_ids, torch.zeros_like(variate_ids), torch.zeros(2, 2))
    torch.testing.assert_close(out.double(), ref, **F32_TOL)
    out = posenc.positional_attention(q, k, v, variate_ids=variate_ids, variate_bias=weight)
    ref, _ = _oracle(q, k, v, torch.zeros_like(sample_ids), variate_ids, weight)
    torch.testing.assert_close(out.double(), ref, **F32_TOL)


def test_gradcheck_float64():
    """float64 takes the plain-ATen reference: central differences for q, k, v, variate_bias."""
    q, k, v, weight = _inputs(torch.float64, b=2, h=2, nq=9, nk=12, d=4, seed=13)
    sample_ids, variate_ids = _packed_ids([[5, 7], [3, 3, 6]], 12, variates=2, seed=13)
    tensors = [t.detach().requires_grad_(True) for t in (q, k, v, weight.double())]
    assert torch.autograd.gradcheck(
        lambda q, k, v, w: posenc.positional_attention(
            q, k, v, causal=True, sample_ids=sample_ids, variate_ids=variate_ids, variate_bias=w
        ),
        tensors,
    )


def test_opcheck():
    q, k, v, weight = _inputs(torch.float32, b=2, h=2, nq=20, nk=20, d=8, seed=17)
    sample_ids, variate_ids = _packed_ids([[8, 12], [20]], 20, seed=17)
    args = (
        q.requires_grad_(),
        k.requires_grad_(),
        v.requires_grad_(),
        None,
        None,
        "half",
        None,
        False,
        None,
        True,
        128,
        False,
        None,
        None,
        sample_ids,
        variate_ids,
        weight.requires_grad_(),
    )
    torch.library.opcheck(torch.ops.posenc.positional_attention.default, args)
    times = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3] + list(range(12)), list(range(20))])
    torch.library.opcheck(torch.ops.posenc.positional_attention.default, (*args, times))


def test_route():
    q, k, v, weight = _inputs(torch.float32, b=1, h=2, nq=16, nk=16, d=8)
    sample_ids, variate_ids = _packed_ids([[8, 8]], 16)
    cos, sin = _tables(torch.arange(16), 8)
    route = torch.ops.posenc.positional_attention_route(
        q,
        k,
        v,
        cos,
        sin,
        "half",
        None,
        False,
        None,
        True,
        128,
        False,
        None,
        None,
        sample_ids,
        variate_ids,
        weight,
    )
    assert route == "fused, RoPE inside"


@pytest.mark.parametrize(
    "case, message",
    [
        (dict(sample_ids=torch.zeros(2, 16)), "sample_ids must be an integer tensor"),
        (
            dict(sample_ids=torch.zeros(2, 15, dtype=torch.long)),
            "sample_ids must be [B, Nk] = [2, 16]",
        ),
        (
            dict(sample_ids=torch.tensor([[0] * 4 + [1] * 4 + [0] * 8, [0] * 16])),
            "sample_ids[0, 8] = 0 starts a second run",
        ),
        (
            dict(
                variate_ids=torch.tensor([[0] * 16, [0] * 5 + [-1] + [0] * 10]),
                variate_bias=torch.zeros(2, 2),
            ),
            "variate_ids[1, 5] = -1 is negative",
        ),
        (dict(variate_ids=torch.zeros(2, 16, dtype=torch.long)), "variate_ids and variate_bias go"),
        (
            dict(variate_ids=torch.zeros(2, 16, dtype=torch.long), variate_bias=torch.zeros(2, 3)),
            "variate_bias must be [2, H] = [2, 2]",
        ),
        (
            dict(
                variate_ids=torch.zeros(2, 16, dtype=torch.long),
                variate_bias=torch.zeros(2, 2, dtype=torch.long),
            ),
            "variate_bias must be floating point",
        ),
    ],
)
def test_bad_input_is_one_line(case, message):
    q, k, v, _ = _inputs(torch.float32, b=2, h=2, nq=16, nk=16, d=8)
    with pytest.raises(RuntimeError) as info:
        posenc.positional_attention(q, k, v, **case)
    text = str(info.value).splitlines()[0]
    assert "posenc.positional_attention" in text and message in text, text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_cpu(dtype):
    n = 300
    q, k, v, weight = _inputs(dtype, b=3, h=4, nq=n, nk=n, d=32, seed=21)
    sample_ids, variate_ids = _packed_ids(LENGTHS, n, seed=21)
    cos, sin = _tables(torch.arange(n), 32)
    results = []
    for device in ("cpu", "cuda"):

        def ours(q, k, v, w, device=device):
            return posenc.positional_attention(
                q,
                k,
                v,
                cos=cos.to(device),
                sin=sin.to(device),
                causal=True,
                sample_ids=sample_ids.to(device),
                variate_ids=variate_ids.to(device),
                variate_bias=w,
            )

        results.append(_run(ours, [t.to(device) for t in (q, k, v, weight)]))
    (cpu, gc), (cuda, gg) = results
    tol = F32_TOL if dtype == torch.float32 else LOW_TOL[dtype]
    torch.testing.assert_close(cuda.cpu().double(), cpu.double(), **tol)
    for a, b in zip(gg, gc):
        torch.testing.assert_close(a.cpu().double(), b.double(), **tol)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
def test_cuda_route_takes_the_kernel():
    """Sample ids and the variate bias no longer send a CUDA call to the reference."""
    q, k, v, weight = _inputs(torch.float32, b=1, h=2, nq=16, nk=16, d=8)
    sample_ids, variate_ids = _packed_ids([[8, 8]], 16)
    cos, sin = _tables(torch.arange(16), 8)
    q, k, v, weight, cos, sin, sample_ids, variate_ids = (
        t.cuda() for t in (q, k, v, weight, cos, sin, sample_ids, variate_ids)
    )
    route = torch.ops.posenc.positional_attention_route(
        q, k, v, cos, sin, "half", None, False, None, True, 128, False, None, None,
        sample_ids, variate_ids, weight,
    )  # fmt: skip
    assert route == "CUDA kernel, RoPE outside (float32)", route


def _fused_call(q, k, v, slopes, cos, sin, padding, sample_ids, variate_ids, weight, causal):
    """posenc::attention_fused's arguments: q, k, v [B, N, H, D], keys at positions 0..Nk-1, the
    queries the last Nq of them, ALiBi slopes, RoPE tables inside, key padding, the ids."""
    nq, nk = q.shape[1], k.shape[1]
    pk = torch.arange(nk, dtype=torch.float64, device=slopes.device)
    scale = 1.0 / q.shape[-1] ** 0.5
    return (
        q, k, v, pk[nk - nq :], pk, slopes, False, None, "none", 0, 0, True, 0, causal, padding,
        scale, cos[nk - nq :], sin[nk - nq :], cos, sin, "half", sample_ids, variate_ids, weight,
    )  # fmt: skip


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("ids_on", ["cuda", "cpu"])
def test_cuda_attention_fused_matches_cpu(dtype, causal, ids_on):
    """The C++ library's operator on CUDA (RoPE kernel, then the attention kernel with the ids)
    against its CPU kernel: 3 rows of several samples across 32-key tiles, cached keys (the
    queries the last 200 of 300 tokens), ALiBi, padding that leaves a sample without a key, the
    ids and variate_bias on the GPU or left on the CPU (the operator's device exception)."""
    n, nq, h, d = 300, 200, 4, 32
    g = torch.Generator().manual_seed(23)
    q = torch.randn(3, nq, h, d, generator=g).to(dtype)
    k = torch.randn(3, n, h, d, generator=g).to(dtype)
    v = torch.randn(3, n, h, d, generator=g).to(dtype)
    weight = torch.randn(2, h, generator=g)
    sample_ids, variate_ids = _packed_ids(LENGTHS, n, seed=23)
    padding = torch.ones(3, n, dtype=torch.bool)
    padding[2, 1:181] = False  # row 2's sample 1: no real key
    cos, sin = (t[:, : d // 2] for t in _tables(torch.arange(n), d))  # [N, F] per pair
    slopes = posenc.alibi_slopes(h)
    results = []
    for device in ("cpu", "cuda"):
        small = ids_on if device == "cuda" else "cpu"  # positions, tables, ids: CPU allowed
        leaves = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
        w = weight.detach().to(small).requires_grad_()
        args = _fused_call(
            *leaves,
            slopes.to(small),
            cos.to(small),
            sin.to(small),
            padding.to(small),
            sample_ids.to(small),
            variate_ids.to(small),
            w,
            causal,
        )
        out = torch.ops.posenc.attention_fused(*args)
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
        (out.float() * probe.to(device)).sum().backward()
        results.append((out.detach().cpu().double(), [x.grad.cpu().double() for x in leaves + [w]]))
    (cpu, gc), (cuda, gg) = results
    tol = F32_TOL if dtype == torch.float32 else LOW_TOL[dtype]
    torch.testing.assert_close(cuda, cpu, **tol)
    # row 2's queries 0..80 are tokens 100..180 of its sample 1, whose keys are all padded: 0
    assert torch.equal(cuda[2, :81], torch.zeros_like(cuda[2, :81]))
    for name, a, b in zip("q k v".split(), gg, gc):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, name=name: f"{name}: {m}")
    # d variate_bias sums every pair's dS: relative to its size
    scale = gc[3].abs().max().item()
    torch.testing.assert_close(gg[3], gc[3], rtol=tol["rtol"], atol=tol["atol"] * scale)


@needs_cuda
def test_cuda_variate_gradient_is_the_same_bits_every_run():
    """d variate_bias: per-key-tile partial sums reduced in a fixed order (no atomics)."""
    n, h, d = 300, 4, 32
    q, k, v, weight = (t.cuda() for t in _inputs(torch.float32, b=3, h=h, nq=n, nk=n, d=d, seed=5))
    sample_ids, variate_ids = (t.cuda() for t in _packed_ids(LENGTHS, n, seed=5))
    grads = []
    for _ in range(3):
        w = weight.detach().clone().requires_grad_()
        out = posenc.positional_attention(
            q, k, v, causal=True, sample_ids=sample_ids, variate_ids=variate_ids, variate_bias=w
        )
        out.sum().backward()
        grads.append(w.grad)
    assert all(torch.equal(grads[0], g) for g in grads[1:])

"""posenc's attention operators on CUDA tensors (alibi_attention, t5_attention,
positional_attention: the CUDA kernel through the CUDA registration in
src/bindings/attention_operators.cpp) against the same operators on the CPU (the tiled CPU
kernel, itself checked against SDPA and transformers in test_attention.py, test_t5_attention.py
and test_positional_attention.py): outputs and gradients (q, k, v, the T5 table), causal with
cached keys, padding masks, RoPE with ALiBi or T5, float32 and bfloat16; the route string; the
calls the CUDA kernel does not take (float64, ALiBi with T5) give the reference's result.

Every test skips without a CUDA device (CI has none; scripts/gpu.sh runs this file on a lent
GPU). Without a GPU, the glue these operators call is run on the CPU emulator by CTest's
cuda_emu (tests/cuda_emu/test_tensor_launch_emu.cpp), with the operators' [B, H, N, D] views.
"""

import pytest
import torch

import posenc

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# both sides accumulate in float32 in another order: a few float32 ulps of O(1) values; bfloat16
# outputs are rounded once from float32 on each side (one bfloat16 ulp, 2^-8 relative)
TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}


def _inputs(dtype, b=2, h=3, nq=40, nk=70, d=64, dv=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g).to(dtype)
    k = torch.randn(b, h, nk, d, generator=g).to(dtype)
    v = torch.randn(b, h, nk, dv, generator=g).to(dtype)
    mask = torch.ones(b, nk, dtype=torch.bool)
    mask[-1, :5] = False  # left padding in the last row
    return q, k, v, mask


def _both(fn, tensors, dtype, grads=True):
    """fn(*tensors) on the CPU and on CUDA: (outputs, gradients) for each."""
    results = []
    for device in ("cpu", "cuda"):
        xs = [
            t.to(device).detach().requires_grad_(t.is_floating_point() and grads) for t in tensors
        ]
        out = fn(*xs)
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
        (out.float() * probe.to(device).float()).sum().backward()
        results.append(
            (
                out.detach().cpu().float(),
                [x.grad.cpu().float() if x.grad is not None else None for x in xs],
            )
        )
    return results


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alibi_causal_cached_keys_padding(dtype):
    q, k, v, mask = _inputs(dtype)
    slopes = posenc.alibi_slopes(3)
    (cpu, gc), (cuda, gg) = _both(
        lambda q, k, v: posenc.alibi_attention(
            q, k, v, slopes.to(q.device), causal=True, attention_mask=mask.to(q.device)
        ),
        [q, k, v],
        dtype,
    )
    torch.testing.assert_close(cuda, cpu, **TOL[dtype])
    for a, b in zip(gg, gc):
        torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_with_table_gradient(dtype, bidirectional):
    q, k, v, mask = _inputs(dtype, nq=33, nk=33)
    table = torch.randn(32, 3)
    (cpu, gc), (cuda, gg) = _both(
        lambda q, k, v, t: posenc.t5_attention(
            q,
            k,
            v,
            t,
            bidirectional=bidirectional,
            causal=not bidirectional,
            scale=1.0,
            attention_mask=mask.to(q.device),
        ),
        [q, k, v, table],
        dtype,
    )
    torch.testing.assert_close(cuda, cpu, **TOL[dtype])
    for a, b in zip(gg, gc):
        torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("part", ["alibi", "t5"])
def test_positional_rope_with_one_bias(dtype, part):
    q, k, v, mask = _inputs(dtype, d=64)
    inv = 10000.0 ** (-torch.arange(0, 48, 2, dtype=torch.float64) / 48)
    cos, sin = posenc.rope_cos_sin(torch.arange(70), inv)  # partial rotary: W = 48 of 64
    slopes = posenc.alibi_slopes(3) if part == "alibi" else None
    table = torch.randn(32, 3) if part == "t5" else None

    def fn(q, k, v):
        d = q.device
        return posenc.positional_attention(
            q,
            k,
            v,
            cos=cos.to(d),
            sin=sin.to(d),
            slopes=None if slopes is None else slopes.to(d),
            t5_table=None if table is None else table.to(d),
            causal=True,
            attention_mask=mask.to(d),
        )

    (cpu, gc), (cuda, gg) = _both(fn, [q, k, v], dtype)
    torch.testing.assert_close(cuda, cpu, **TOL[dtype])
    for a, b in zip(gg, gc):
        torch.testing.assert_close(a, b, **TOL[dtype])
    route = torch.ops.posenc.positional_attention_route(
        q.cuda(),
        k.cuda(),
        v.cuda(),
        cos.cuda(),
        sin.cuda(),
        "half",
        None if slopes is None else slopes.cuda(),
        False,
        None if table is None else table.cuda(),
        True,
        128,
        True,
        None,
        None,
    )
    assert route == "CUDA kernel, RoPE outside (float32)"


def test_calls_the_kernel_does_not_take_give_the_reference():
    q, k, v, _ = _inputs(torch.float64, nq=9, nk=9, d=16, dv=16)
    slopes, table = posenc.alibi_slopes(3).double(), torch.randn(32, 3, dtype=torch.float64)
    for s, t in ((slopes, None), (slopes, table)):
        cpu = posenc.positional_attention(q, k, v, slopes=s, t5_table=t)
        cuda = posenc.positional_attention(
            q.cuda(), k.cuda(), v.cuda(), slopes=s.cuda(), t5_table=None if t is None else t.cuda()
        )
        torch.testing.assert_close(cuda.cpu(), cpu, rtol=1e-10, atol=1e-10)
    route = torch.ops.posenc.positional_attention_route(
        q.float().cuda(),
        k.float().cuda(),
        v.float().cuda(),
        None,
        None,
        "half",
        slopes.float().cuda(),
        False,
        table.float().cuda(),
        True,
        128,
        False,
        None,
        None,
    )
    assert route.startswith("reference: a call the CUDA kernel does not take")

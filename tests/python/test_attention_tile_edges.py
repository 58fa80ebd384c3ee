"""posenc::attention_fused's CPU tiles at their edges: the register-blocked micro-kernels
(src/kernels/cpu/attention_tiles_rows.h; AVX-512 8 rows x 32 columns, AVX2 6 x 16, forward and
backward, taken where Nq >= 32 and the head widths are whole 16-float panels) against attention
written out in float64 (softmax(scale q k^T + mask) v, a row that sees no key set to 0, posenc's
convention; the oracle is test_attention_fused_op.reference) with autograd for the gradients.

Sizes that are not multiples of the micro-kernel's rows (6, 8), the key panels (16) or the tiles
(128 queries, 256 keys): Nq 32/33/65/129/257, Nk 1/15/17/63/300; causal with Nk < Nq (first rows
see nothing), key padding that masks a whole sample, q/k/v as strided slices of one packed buffer
starting one float off (no 64-byte alignment), zero-size batch, and the same bits at 1 and 3
threads. The float32 kernels are held to the float64 oracle within a tolerance (tiles summed in
float32, Cephes' expf on 8 or 16 lanes), so this holds on every CPU level
(POSENC_CPU_CAPABILITY=scalar|avx2|avx512 take MKL, AVX2 or AVX-512 tiles).
"""

import math

import pytest
import torch

import posenc  # noqa: F401  (loads the operators)
from test_attention_fused_op import OP, call, reference

# float32 tiles against float64: products of D <= 64 terms, an exp on 8/16 lanes (rel <= 2^-22)
TOL = dict(rtol=2e-5, atol=2e-5)

SHAPES = [  # (Nq, Nk, D, Dv)
    (32, 1, 16, 16),
    (33, 15, 16, 32),
    (65, 17, 32, 16),
    (129, 63, 16, 48),
    (257, 300, 64, 16),
    (40, 300, 17, 16),  # D not whole panels: the backward on MKL, the forward on the tiles
]


def _inputs(nq, nk, d, dv, batch=2, heads=3, strided=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    if strided:  # q, k, v slices of one [B, N, H, 2D + Dv + 1] buffer, one float off its start
        n = max(nq, nk)
        packed = torch.randn(batch, n, heads, 2 * d + dv + 1, generator=g)[..., 1:]
        return packed[:, :nq, :, :d], packed[:, :nk, :, d : 2 * d], packed[:, :nk, :, 2 * d :]
    return (
        torch.randn(batch, nq, heads, d, generator=g),
        torch.randn(batch, nk, heads, d, generator=g),
        torch.randn(batch, nk, heads, dv, generator=g),
    )


def _check(q, k, v, causal=False, key_padding=None):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    nq, nk = q.shape[1], k.shape[1]
    pq = torch.arange(nq, dtype=torch.float32) + (nk - nq)
    pk = torch.arange(nk, dtype=torch.float32)
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = OP(*call(q, k, v, pq, pk, causal=causal, key_padding=key_padding, scale=scale))
    dy = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dy) if out.numel() else (None,) * 3
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = reference(
        q64, k64, v64, pq.double(), pk.double(), causal=causal, key_padding=key_padding, scale=scale
    )
    torch.testing.assert_close(out.double(), want.detach(), **TOL)
    if out.numel():
        want_grads = torch.autograd.grad(want, (q64, k64, v64), dy.double())
        for name, got, expected in zip("qkv", grads, want_grads):
            torch.testing.assert_close(
                got.double(), expected, **TOL, msg=lambda m, name=name: f"d{name}: {m}"
            )
    return out


# causal only where Nk >= Nq (fewer keys: test_causal_with_fewer_keys_than_queries)
CASES = [(s, False) for s in SHAPES] + [(s, True) for s in SHAPES if s[1] >= s[0]]


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "offset_slices"])
@pytest.mark.parametrize(
    "shape,causal", CASES, ids=["x".join(map(str, s)) + ("-causal" if c else "") for s, c in CASES]
)
def test_tiles_at_odd_sizes_equal_the_float64_oracle(shape, causal, strided):
    nq, nk, d, dv = shape
    _check(*_inputs(nq, nk, d, dv, strided=strided), causal=causal)


def test_causal_with_fewer_keys_than_queries():
    # keys j <= i + Nk - Nq: the first 30 query rows see no key and give 0
    out = _check(*_inputs(70, 40, 16, 16), causal=True)
    assert torch.equal(out[:, :30], torch.zeros_like(out[:, :30]))


def test_key_padding_that_masks_a_whole_sample():
    q, k, v = _inputs(65, 50, 16, 32)
    keep = torch.rand(2, 50, generator=torch.Generator().manual_seed(1)) > 0.3
    keep[0, 0] = True
    keep[1] = False  # sample 1 sees no key: its output is 0
    out = _check(q, k, v, key_padding=keep)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_zero_size_batch():
    q, k, v = _inputs(40, 50, 16, 16, batch=0)
    assert _check(q, k, v).shape == (0, 40, 3, 16)


def test_the_same_bits_at_one_and_three_threads():
    q, k, v = _inputs(129, 300, 16, 32, batch=1, heads=2)
    pq, pk = torch.arange(129.0) + 171, torch.arange(300.0)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
            out = OP(*call(qg, kg, vg, pq, pk, causal=True))
            results.append((out, *torch.autograd.grad(out.sum(), (qg, kg, vg))))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results):
        assert torch.equal(a, b)

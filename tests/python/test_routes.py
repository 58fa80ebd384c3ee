"""posenc.AttentionRoute: the three route explainers (Plan.attention_route,
posenc.positional_attention_route, posenc.apply_rotary_route) in one shape, read from the C++ code
that decides (python/posenc/routes.py); and alibi_attention / t5_attention, which are
positional_attention with one bias part, take its path and give its results to the bit.

Each explainer's line is produced here by a real call where this machine can make it (CPU); the
CUDA lines of positional_attention_route, which need a GPU, are read from the C++ code's own
strings (describe in src/bindings/positional_route.cpp, whose decisions tests/test_positional_route.cpp
checks for every device) so the parser is pinned to them; a line of no grammar is a ValueError,
never a guessed route.
"""

from pathlib import Path

import pytest
import torch

import posenc
from posenc.routes import AttentionRoute

ROOT = Path(__file__).resolve().parents[2]


def _qkv(b=1, h=2, nq=5, nk=7, d=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(b, h, n, d, generator=g, dtype=torch.float64).to(dtype) for n in (nq, nk, nk)
    )


def _tables(nk, width=8):
    inv = 1.0 / (10000 ** (torch.arange(0, width, 2).float() / width))
    emb = torch.arange(float(nk))[:, None] * inv
    emb = torch.cat([emb, emb], -1)
    return emb.cos(), emb.sin()


def test_positional_routes_on_the_cpu():
    q, k, v = _qkv()
    cos, sin = _tables(7)
    route = posenc.positional_attention_route(q, k, v, cos=cos, sin=sin)
    assert (route.taken, route.rope_inside, route.not_taken, route.first) == ("fused", True, (), ())
    assert str(route) == route.text == "fused, RoPE inside"

    # tables whose pair members differ: rotated first, and why not inside
    uneven = sin.clone()
    uneven[:, -1] += 1.0
    route = posenc.positional_attention_route(q, k, v, cos=cos, sin=uneven)
    assert (route.taken, route.rope_inside) == ("fused", False)
    assert route.why_not("RoPE inside") == "the two members of a pair read different table values"

    # float64: the reference, and why not the tiled kernel
    q64, k64, v64 = (t.double() for t in (q, k, v))
    route = posenc.positional_attention_route(q64, k64, v64, slopes=posenc.alibi_slopes(2))
    assert route.taken == "reference"
    assert route.why_not("fused") == "float64 (the kernel computes in float32)"

    # learned tables: apply_rotary first, then the kernel
    route = posenc.positional_attention_route(
        q, k, v, cos=cos.requires_grad_(), sin=sin.requires_grad_()
    )
    assert (route.taken, route.first) == ("fused", ("apply_rotary (cos/sin require grad)",))

    # the arguments are checked as the call checks them
    with pytest.raises(RuntimeError, match=r"more queries \(7\) than keys \(5\)"):
        posenc.positional_attention_route(k, q, q)


def test_the_cuda_lines_of_positional_attention_route():
    # the CUDA lines of positional_attention_route, as describe() in src/bindings/positional_route.cpp
    # writes them (tests/test_positional_route.cpp checks which call gets which; a GPU runs them)
    source = (ROOT / "src/bindings/positional_route.cpp").read_text()
    describe = source[source.index("std::string describe(const PositionalRoute& route)") :]
    for line in ("CUDA kernel", "CUDA kernel, RoPE outside (float32)"):
        assert f'"{line}"' in describe, line
    assert '"reference: a call the CUDA kernel does not take ("' in describe
    route = AttentionRoute.from_positional(
        "reference: a call the CUDA kernel does not take (ALiBi and T5 together)", cuda=True
    )
    assert route.taken == "reference"
    assert route.not_taken == (
        ("cuda", "a call the CUDA kernel does not take (ALiBi and T5 together)"),
    )
    route = AttentionRoute.from_positional("CUDA kernel", cuda=True)
    assert (route.taken, route.rope_inside, route.not_taken) == ("cuda", False, ())
    route = AttentionRoute.from_positional("CUDA kernel, RoPE outside (float32)", cuda=True)
    assert (route.taken, route.rope_inside) == ("cuda", False)
    assert route.why_not("RoPE inside") is not None


def test_apply_rotary_routes():
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    cos, sin = (t[None] for t in _tables(3))
    route = posenc.apply_rotary_route(q, k, cos, sin)
    assert (route.taken, route.not_taken) == ("fused", ())
    route = posenc.apply_rotary_route(q.double(), k.double(), cos.double() + 1e-12, sin.double())
    assert route.taken == "reference"
    assert route.why_not("fused").startswith("cos/sin are float64 values float32 cannot hold")
    route = posenc.apply_rotary_route(q[..., :0], k[..., :0], cos[..., :0], sin[..., :0])
    assert route.taken == "reference" and route.why_not("fused") == "empty"
    # the backward: dense gradients, and expanded ones made dense first
    assert posenc.apply_rotary_route(q, k, cos, sin, backward=True).taken == "fused"
    grad_q = torch.ones(1, 1, 1, 1).expand(1, 2, 3, 8)
    route = posenc.apply_rotary_route(q, k, cos, sin, grad_q=grad_q, grad_k=torch.randn(1, 1, 3, 8))
    assert (route.taken, route.first) == ("fused", ("gradients made dense",))


def test_plan_routes():
    h, dh = 2, 8
    plan = posenc.build_encoder({"type": "alibi"}, num_heads=h)(posenc.Positions.sequence(8))
    q = torch.randn(2, h, 8, dh)
    route = plan.attention_route(q, q, q)
    assert isinstance(route, AttentionRoute) and route.taken == "fused"
    assert [path for path, _ in route.not_taken] == ["short_rotary", "short", "sdpa"]
    assert all(why for _, why in route.not_taken)
    assert str(route).startswith("fused (short_rotary: ")
    # a reason holding "; " stays whole (the split is on the next backend's name)
    line = "sdpa (short_rotary: a; b; short: c)"
    assert AttentionRoute.from_plan(line).not_taken == (("short_rotary", "a; b"), ("short", "c"))


def test_a_line_of_no_grammar_is_a_value_error():
    for parse, line in (
        (AttentionRoute.from_plan, "flash (sdpa: no)"),
        (lambda t: AttentionRoute.from_positional(t, cuda=False), "fused; RoPE inside"),
        (AttentionRoute.from_rotary, "fused: yes"),
    ):
        with pytest.raises(ValueError, match="posenc.AttentionRoute: not a"):
            parse(line)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alibi_and_t5_attention_are_positional_attention(dtype):
    q, k, v = _qkv(2, 2, 5, 9, 8, dtype)
    slopes, table = posenc.alibi_slopes(2), torch.randn(16, 2)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False
    cases = (  # (the wrapper's call, the same call to positional_attention)
        (
            lambda *x: posenc.alibi_attention(*x, slopes, causal=True, attention_mask=mask),
            lambda *x: posenc.positional_attention(
                *x, slopes=slopes, causal=True, attention_mask=mask
            ),
        ),
        (
            lambda *x: posenc.t5_attention(*x, table, max_distance=20, attention_mask=mask),
            lambda *x: posenc.positional_attention(
                *x, t5_table=table, max_distance=20, attention_mask=mask
            ),
        ),
    )
    for wrapper, positional in cases:
        qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
        got = wrapper(qs, ks, vs)
        qp, kp, vp = (t.clone().requires_grad_() for t in (q, k, v))
        want = positional(qp, kp, vp)
        assert torch.equal(got, want)
        g = torch.randn_like(got)
        for a, b in zip(
            torch.autograd.grad(got, (qs, ks, vs), g), torch.autograd.grad(want, (qp, kp, vp), g)
        ):
            assert torch.equal(a, b)
    for kwargs in ({"slopes": slopes, "causal": True}, {"t5_table": table, "max_distance": 20}):
        route = posenc.positional_attention_route(q, k, v, attention_mask=mask, **kwargs)
        assert route.taken == "fused"

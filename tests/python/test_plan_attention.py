"""Plan.attention: attention with an encoder's positions in one call (the C++ layers' backend
choice: the short kernel, SDPA, the fused bias kernel with RoPE inside, else the materialized
bias), against what a user writes by hand with the same plan: SDPA over plan.rotate(q, k) with
attn_mask=plan.bias(H). Outputs and gradients (q, k, v and the encoder's parameters)."""

import pytest
import torch
import torch.nn.functional as F

import posenc

H, DH = 4, 16


def by_hand(plan, q, k, v, causal=False, key_padding=None):
    qr, kr = plan.rotate(q, k)
    bias = plan.bias(H, q)
    nq, nk = q.shape[2], k.shape[2]
    mask = torch.zeros(nq, nk) if bias is None else bias.float()
    if causal:
        mask = mask.masked_fill(
            torch.ones(nq, nk, dtype=torch.bool).triu(1 + nk - nq), float("-inf")
        )
    if key_padding is not None:
        mask = (
            mask
            + torch.zeros(key_padding.shape).masked_fill(~key_padding, float("-inf"))[
                :, None, None, :
            ]
        )
    return F.scaled_dot_product_attention(qr, kr, v, attn_mask=mask)


CONFIGS = {
    "rope": ({"type": "rope"}, None, "short_rotary with RoPE inside"),
    "alibi_timestamps": ({"type": "alibi"}, [0.0, 0.5, 1.75, 2.0, 4.5, 7.0, 7.25, 9.0], "fused"),
    "t5": ({"type": "t5"}, None, "fused"),
    "rope_alibi": (
        {"type": "compose", "encoders": [{"type": "rope"}, {"type": "alibi"}]},
        None,
        "fused with RoPE inside",
    ),
    "shaw": ({"type": "shaw", "max_relative_position": 3}, None, "fused"),
}


# posenc::select_attention's backends in priority order (src/nn/attention_backend.cpp): the
# route names every one before the taken one, with why.
PRIORITY = ["short_rotary", "short", "sdpa", "fused", "reference"]


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("causal", [False, True])
def test_equals_sdpa_over_the_plans_parts(name, causal):
    config, times, route = CONFIGS[name]
    torch.manual_seed(0)
    encoder = posenc.build_encoder(config, dim=H * DH, num_heads=H)
    positions = posenc.Positions.values(times) if times else posenc.Positions.sequence(8)
    plan = encoder(positions)
    q, k, v = (torch.randn(2, H, 8, DH, requires_grad=True) for _ in range(3))
    taken = plan.attention_route(q, k, v, causal=causal)  # a posenc.AttentionRoute
    assert taken.taken == route.split()[0], str(taken)
    assert taken.rope_inside == route.endswith("with RoPE inside"), str(taken)
    assert [path for path, _ in taken.not_taken] == PRIORITY[: PRIORITY.index(taken.taken)]
    got = plan.attention(q, k, v, causal=causal)
    want = by_hand(plan, q, k, v, causal)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    params = [p for p in encoder.parameters() if p.requires_grad]
    g_got = torch.autograd.grad(got.square().sum(), [q, k, v] + params)
    g_want = torch.autograd.grad(want.square().sum(), [q, k, v] + params)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_keys_apart_with_padding():
    encoder = posenc.build_encoder({"type": "alibi"}, num_heads=H)
    plan = encoder(posenc.Positions.sequence(3, offset=5), keys=posenc.Positions.sequence(8))
    q = torch.randn(2, H, 3, DH)
    k, v = torch.randn(2, H, 8, DH), torch.randn(2, H, 8, DH)
    keep = torch.ones(2, 8, dtype=torch.bool)
    keep[0, :2] = False
    got = plan.attention(q, k, v, causal=True, key_padding=keep)
    torch.testing.assert_close(got, by_hand(plan, q, k, v, True, keep), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "config,positions",
    [
        ({"type": "alibi"}, posenc.Positions.sequence(6)),  # the fused route
        ({"type": "relative_2d", "grid_height": 4, "grid_width": 4}, posenc.Positions.grid(2, 3)),
        (
            {"type": "shaw", "max_relative_position": 2},
            posenc.Positions.values([0, 1.5, 2, 5, 7, 9]),
        ),
    ],
    ids=["fused", "reference_relative_2d", "reference_shaw_timestamps"],
)
def test_a_query_that_sees_no_key_gives_0_on_every_route(config, positions):
    # causal with the first key padded: query 0 sees no key. The fused kernel gives 0 there (and
    # SDPA with a boolean mask); the materialized-bias reference gave NaN rows and NaN gradients
    # for q, k, v (found by the hostile review)
    torch.manual_seed(0)
    plan = posenc.build_encoder(config, dim=H * DH, num_heads=H)(positions)
    q, k, v = (torch.randn(2, H, 6, DH, requires_grad=True) for _ in range(3))
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[0, 0] = False
    keep[1] = False  # a sample with every key padded: every one of its rows sees none
    route = plan.attention_route(q, k, v, causal=True, key_padding=True).taken
    assert route == ("fused" if config["type"] == "alibi" else "reference")
    got = plan.attention(q, k, v, causal=True, key_padding=keep)
    assert torch.equal(got[0, :, 0], torch.zeros(H, DH)) and torch.equal(
        got[1], torch.zeros_like(got[1])
    )
    rows = [(0, i) for i in range(1, 6)]  # the rest as SDPA over the plan's parts
    want = by_hand(plan, q, k, v, True, keep)
    for b, i in rows:
        torch.testing.assert_close(got[b, :, i], want[b, :, i], rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.equal(grads[0][1], torch.zeros_like(grads[0][1]))  # no key: no gradient


def test_bad_input_is_one_line():
    plan = posenc.build_encoder({"type": "alibi"}, num_heads=H)(posenc.Positions.sequence(8))
    q = torch.randn(2, H, 8, DH)
    with pytest.raises(RuntimeError, match="the plan covers 8 queries and 8 keys, but q has Nq=5"):
        plan.attention(q[:, :, :5], q, q)
    with pytest.raises(RuntimeError, match=r"key_padding must be \[B, Nk\] = \[2, 8\]"):
        plan.attention(q, q, q, key_padding=torch.ones(2, 7, dtype=torch.bool))
    # attention_route checks what attention checks (it is the same C++ call's first half)
    with pytest.raises(RuntimeError, match="the plan covers 8 queries and 8 keys, but q has Nq=5"):
        plan.attention_route(q[:, :, :5], q, q)
    with pytest.raises(RuntimeError, match=r"q \[B, Nq, H, Dh\], k \[B, Nk, H, Dh\] and v"):
        plan.attention_route(q, q[:, :1], q)

"""posenc.build_encoder and posenc.Positions: the C++ encoders as nn.Modules.

Each entry is checked against code from outside posenc: ALiBi's bias against BLOOM's
build_alibi_tensor, T5's against transformers' T5Attention.compute_bias with the same weights, RoPE
against transformers' Llama rotary module and apply_rotary_pos_emb, the sinusoidal table against
the formula of Vaswani et al.; learned tables train from Python (gradients reach the C++ module's
tensors, an optimizer's step changes its output, .to() and state_dict carry them).
"""

import math

import pytest
import torch

import posenc

transformers = pytest.importorskip("transformers")


def test_positions_builders_follow_the_cpp_layouts():
    g = posenc.Positions.grid(2, 3)
    assert g.axes == ("h", "w")
    assert g.coords.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    v = posenc.Positions.volume(2, 1, 2)
    assert v.axes == ("t", "h", "w")
    assert v.coords.tolist() == [[0, 0, 0], [0, 0, 1], [1, 0, 0], [1, 0, 1]]
    s = posenc.Positions.sequence(3, offset=5)
    assert s.coords[:, 0].tolist() == [5, 6, 7] and len(s) == 3
    assert posenc.Positions.values([0.5, 3.25], axis="time").axes == ("time",)
    with pytest.raises(ValueError, match="axis names"):
        posenc.Positions(torch.zeros(3, 2), ("h", "h"))
    with pytest.raises(ValueError, match="2 axes"):
        posenc.Positions(torch.zeros(3, 2), ("t",))


def test_alibi_bias_is_blooms():
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    heads, n = 8, 7
    plan = posenc.build_encoder({"type": "alibi"}, num_heads=heads)(posenc.Positions.sequence(n))
    bias = plan.bias(heads)  # [H, N, N]: slope_h * (j - i)
    assert plan.parts == ["alibi: bias (alibi)"]
    bloom = build_alibi_tensor(torch.ones(1, n), heads, torch.float32)  # [H, 1, N]: slope_h * j
    i = torch.arange(n, dtype=torch.float32)[None, :, None]
    slopes = bloom[:, 0, 1:2].unsqueeze(-1)  # slope_h
    torch.testing.assert_close(bias + slopes * i, bloom.expand(heads, n, n), rtol=0, atol=1e-6)


def test_t5_bias_is_transformers_with_the_same_weights():
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    heads, n = 4, 40
    enc = posenc.build_encoder(
        {"type": "t5", "num_buckets": 32, "max_distance": 128}, num_heads=heads
    )
    ((name, weight),) = list(enc.named_parameters())
    cfg = T5Config(
        num_heads=heads,
        d_model=64,
        d_kv=16,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        is_decoder=False,
    )
    hf = T5Attention(cfg, has_relative_attention_bias=True)
    with torch.no_grad():
        hf.relative_attention_bias.weight.copy_(weight)
    expected = hf.compute_bias(n, n)[0]  # [H, N, N]
    bias = enc(posenc.Positions.sequence(n)).bias(heads)
    torch.testing.assert_close(bias, expected, rtol=0, atol=0)
    # the bias is trainable from Python: the gradient reaches the C++ module's table
    bias.sum().backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0


def test_rope_rotates_as_transformers_llama():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    heads, head_dim, n = 2, 16, 12
    cfg = LlamaConfig(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    q, k = torch.randn(1, heads, n, head_dim), torch.randn(1, heads, n, head_dim)
    cos, sin = LlamaRotaryEmbedding(cfg)(q, torch.arange(n)[None])
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    enc = posenc.build_encoder(
        {"type": "rope", "rope_theta": 10000.0}, dim=heads * head_dim, num_heads=heads
    )
    q_pe, k_pe = enc(posenc.Positions.sequence(n)).rotate(q, k)
    torch.testing.assert_close(q_pe, q_hf, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_pe, k_hf, rtol=1e-5, atol=1e-5)
    # posenc's own layout [B, N, H, Dh] gives the same rotation
    enc_bnhd = posenc.build_encoder(
        {"type": "rope", "rope_theta": 10000.0},
        dim=heads * head_dim,
        num_heads=heads,
        layout="bnhd",
    )
    q2, _ = enc_bnhd(posenc.Positions.sequence(n)).rotate(q.transpose(1, 2), k.transpose(1, 2))
    torch.testing.assert_close(q2.transpose(1, 2), q_pe, rtol=0, atol=0)


def test_sinusoidal_table_is_the_formula():
    dim, n = 16, 9
    x = torch.zeros(1, n, dim, dtype=torch.float64)
    enc = posenc.build_encoder({"type": "sinusoidal"}, dim=dim)
    table = enc(posenc.Positions.sequence(n)).add(x)[0]
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    expected = torch.zeros(n, dim, dtype=torch.float64)
    expected[:, 0::2], expected[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    # (posenc's layout option: interleaved sin/cos as Vaswani et al., or concatenated)
    concat = torch.cat([torch.sin(pos * freq), torch.cos(pos * freq)], 1)
    assert torch.allclose(table, expected, atol=1e-6) or torch.allclose(table, concat, atol=1e-6)


def test_a_learned_table_trains_from_python_and_moves_with_the_module():
    torch.manual_seed(0)
    dim, n = 8, 5
    enc = posenc.build_encoder({"type": "learned", "max_positions": 16}, dim=dim)
    ((name, weight),) = list(enc.named_parameters())
    assert weight.shape == (16, dim) and weight.requires_grad
    positions = posenc.Positions.sequence(n)
    target = torch.randn(1, n, dim)
    opt = torch.optim.AdamW(enc.parameters(), lr=0.1)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = (enc(positions).add(torch.zeros(1, n, dim)) - target).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]
    # state_dict round trip into a fresh encoder gives the same output
    fresh = posenc.build_encoder({"type": "learned", "max_positions": 16}, dim=dim)
    fresh.load_state_dict(enc.state_dict())
    x = torch.zeros(1, n, dim)
    torch.testing.assert_close(fresh(positions).add(x), enc(positions).add(x), rtol=0, atol=0)
    # .double() moves the C++ module's tensor itself: its output follows
    enc.double()
    assert weight.dtype == torch.float64
    assert enc(positions).add(x.double()).dtype == torch.float64


def test_compose_holds_every_part():
    enc = posenc.build_encoder(
        {"type": "compose", "encoders": [{"type": "rope"}, {"type": "alibi"}]}, dim=16, num_heads=2
    )
    plan = enc(posenc.Positions.sequence(8))
    assert plan.parts == ["rope: rotary", "alibi: bias (alibi)"]
    assert plan.bias(2).shape == (2, 8, 8)
    q = torch.randn(1, 2, 8, 8)
    assert not torch.equal(plan.rotate(q, q)[0], q)


def test_bad_configs_are_one_line():
    with pytest.raises(RuntimeError, match="rope_thetta"):
        posenc.build_encoder({"type": "rope", "rope_thetta": 1.0}, dim=16, num_heads=2)
    with pytest.raises(RuntimeError) as e:
        posenc.build_encoder({"type": "no_such_encoder"})
    assert "no_such_encoder" in str(e.value).splitlines()[0]
    with pytest.raises(ValueError, match="must be a dict"):
        posenc.build_encoder([1, 2])
    with pytest.raises(ValueError, match="posenc.Positions"):
        posenc.build_encoder({"type": "alibi"}, num_heads=2)(torch.arange(4))
    with pytest.raises(ValueError, match="layout"):
        posenc.build_encoder({"type": "alibi"}, num_heads=2, layout="nhd")


@pytest.mark.parametrize(
    ("variates", "message"),
    [
        ([0.0, 2.5], r"'variate': 2.5 at index \[1\] is not an integer"),
        ([0.0, 3.0], r"'variate': id 3 at index \[1\] is outside \[0, 3\)"),
        ([-1.0, 0.0], r"'variate': id -1 at index \[0\] is outside \[0, 3\)"),
        ([0.0, 2.0**60], r"is beyond 2\^53"),
    ],
)
def test_bad_variate_ids_are_one_value_error_line(variates, message):
    # bad ids are bad input (src/core/ids.cpp): ValueError, as the Python wrappers' own checks
    enc = posenc.build_encoder({"type": "variate_bias", "num_variates": 3}, num_heads=2)
    positions = posenc.Positions(torch.tensor(variates, dtype=torch.float64)[:, None], ["variate"])
    with pytest.raises(ValueError, match=message) as e:
        enc(positions)
    assert len(str(e.value).strip().splitlines()) == 1, str(e.value)

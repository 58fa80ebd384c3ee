"""posenc.build_encoder and posenc.Positions: the C++ encoders as nn.Modules.

Each entry is checked against code from outside posenc: ALiBi's bias against BLOOM's
build_alibi_tensor, T5's against transformers' T5Attention.compute_bias with the same weights, RoPE
against transformers' Llama rotary module and apply_rotary_pos_emb, the sinusoidal table against
the formula of Vaswani et al.; learned tables train from Python (gradients reach the C++ module's
tensors, an optimizer's step changes its output, .to() and state_dict carry them). Copies: every
encoder type of the registry through copy.deepcopy, pickle and torch.save computes what the
original computes to the bit (outputs, gradients) with tensors of its own; AveragedModel (SWA, EMA)
over a model holding an encoder; a Plan, .to("meta") and a tensor put in the C++ module's place
are one ValueError line each.
"""

import copy
import io
import math
import pickle

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


# ---- copy.deepcopy, pickle and torch.save of an encoder ------------------------------------------
# An Encoder wraps a C++ module (a TorchScript custom class): a copy is rebuilt from its config and
# given the original's tensors (values, dtype, device, requires_grad). One row per encoder type of
# posenc's registry (the list the registry names in its "unknown type" line): a new type without
# a row fails test_every_registered_type_has_a_copy_row.
_DIM, _HEADS = 16, 2
_SEQ = posenc.Positions.sequence(6)
_GRID = posenc.Positions.grid(3, 3)
_VOLUME = posenc.Positions.volume(2, 2, 2)
_COPY_ROWS = {
    "alibi": ({"type": "alibi"}, _SEQ),
    "axial_sincos": ({"type": "axial_sincos"}, _GRID),
    "calendar": ({"type": "calendar"}, _SEQ),
    "compose": (
        {
            "type": "compose",
            "encoders": [
                {"type": "learned", "max_positions": 16},
                {"type": "rope"},
                {"type": "alibi"},
                {"type": "t5", "num_buckets": 8, "max_distance": 16},
            ],
        },
        _SEQ,
    ),
    "freq_time": (
        {"type": "freq_time"},
        posenc.Positions(
            torch.tensor([[0.0, 0], [1, 0], [0, 1], [1, 1], [2, 3]]), ("freq", "time")
        ),
    ),
    "hf": (
        {
            "type": "hf",
            "config": {
                "model_type": "llama",
                "hidden_size": _DIM,
                "num_attention_heads": _HEADS,
                "rope_theta": 500.0,
            },
        },
        _SEQ,
    ),
    "learned": ({"type": "learned", "max_positions": 16}, _SEQ),
    "learned_grid": ({"type": "learned_grid"}, _GRID),
    "learned_spacetime": ({"type": "learned_spacetime"}, _VOLUME),
    "nope": ({"type": "nope"}, _SEQ),
    "relative_2d": ({"type": "relative_2d", "grid_height": 4, "grid_width": 4}, _GRID),
    "rope": ({"type": "rope", "rope_theta": 100.0}, _SEQ),
    "rope_dinov3": ({"type": "rope_dinov3"}, _GRID),
    "rope_fractional": ({"type": "rope_fractional"}, _VOLUME),
    "rope_mixed": ({"type": "rope_mixed"}, _GRID),
    "shaw": ({"type": "shaw", "max_relative_position": 3}, _SEQ),
    "sinusoidal": ({"type": "sinusoidal"}, _SEQ),
    "t5": ({"type": "t5", "num_buckets": 8, "max_distance": 16}, _SEQ),
    "time2vec": ({"type": "time2vec"}, posenc.Positions.values([0.0, 0.5, 2.25, 7.0])),
    "time_sinusoidal": ({"type": "time_sinusoidal"}, posenc.Positions.values([0.0, 0.5, 2.25])),
    "variate_bias": (
        {"type": "variate_bias", "num_variates": 3, "init_std": 1.0},
        posenc.Positions(torch.tensor([[0.0], [2], [1], [2]]), ["variate"]),
    ),
}


def _deepcopy(module):
    return copy.deepcopy(module)


def _pickle(module):
    return pickle.loads(pickle.dumps(module))


def _torch_save(module):
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


_COPIES = {"deepcopy": _deepcopy, "pickle": _pickle, "torch_save": _torch_save}


def _registered_types() -> list[str]:
    with pytest.raises(RuntimeError) as e:
        posenc.build_encoder({"type": "no_such_encoder"})
    line = str(e.value).splitlines()[0]
    assert "known types: " in line, line
    return line.split("known types: ")[1].split(", ")


def _forward_and_backward(enc, positions, dtype=torch.float32):
    """Every entry of the plan (add, rotate, bias) and the gradients of a fixed random loss
    through them: for the inputs and for each of the encoder's parameters (by name)."""
    g = torch.Generator().manual_seed(7)
    n, dh = len(positions), _DIM // _HEADS
    x = torch.randn(1, n, _DIM, generator=g, dtype=dtype).requires_grad_()
    q = torch.randn(1, _HEADS, n, dh, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(1, _HEADS, n, dh, generator=g, dtype=dtype).requires_grad_()
    enc.zero_grad(set_to_none=True)
    plan = enc(positions)
    outputs = [plan.add(x), *plan.rotate(q, k)]
    bias = plan.bias(_HEADS, q)
    if bias is not None:
        outputs.append(bias)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outputs)
    loss.backward()
    grads = {"x": x.grad, "q": q.grad, "k": k.grad}
    grads.update({name: p.grad for name, p in enc.named_parameters()})
    return [o.detach() for o in outputs], grads


def _assert_same_bits(a, b):
    assert a.dtype == b.dtype and a.device == b.device and a.shape == b.shape
    assert torch.equal(a, b)


def test_every_registered_type_has_a_copy_row():
    assert sorted(_registered_types()) == sorted(_COPY_ROWS)


@pytest.mark.parametrize("how", sorted(_COPIES))
@pytest.mark.parametrize("kind", sorted(_COPY_ROWS))
def test_a_copy_of_an_encoder_computes_the_same_bits_with_its_own_tensors(kind, how):
    config, positions = _COPY_ROWS[kind]
    torch.manual_seed(0)
    enc = posenc.build_encoder(config, dim=_DIM, num_heads=_HEADS)
    enc.eval()  # rope_dinov3 may draw its training augmentations
    with torch.no_grad():  # away from the initial values: a rebuild from the config alone differs
        for t in list(enc.parameters()) + list(enc.buffers()):
            t.add_(torch.randn(t.shape, dtype=t.dtype))
    state = {name: t.clone() for name, t in enc.state_dict().items()}
    torch.manual_seed(1)  # the copy's C++ constructor draws other initial values
    dup = _COPIES[how](enc)
    assert type(dup) is posenc.Encoder and dup.type == enc.type and not dup.training
    assert dup.config == enc.config and dup.layout == enc.layout
    # the same state_dict (names, values, dtypes), and requires_grad as the original's
    assert list(dup.state_dict()) == list(state)
    for name, t in dup.state_dict().items():
        _assert_same_bits(t, state[name])
    for (name, a), (_, b) in zip(enc.named_parameters(), dup.named_parameters()):
        assert a.requires_grad == b.requires_grad, name
    # the same outputs and gradients, to the bit
    outputs, grads = _forward_and_backward(enc, positions)
    dup_outputs, dup_grads = _forward_and_backward(dup, positions)
    for a, b in zip(outputs, dup_outputs):
        _assert_same_bits(a, b)
    assert list(grads) == list(dup_grads)
    for name in grads:
        _assert_same_bits(grads[name], dup_grads[name])
    # its own tensors: changing the copy's leaves the original alone, and the copy's C++ module
    # computes with the changed values
    with torch.no_grad():
        for t in list(dup.parameters()) + list(dup.buffers()):
            t.add_(1.0)
    for name, t in enc.state_dict().items():
        _assert_same_bits(t, state[name])
    again, _ = _forward_and_backward(enc, positions)
    for a, b in zip(outputs, again):
        _assert_same_bits(a, b)
    changed, _ = _forward_and_backward(dup, positions)
    if any(t.numel() for t in list(dup.parameters()) + list(dup.buffers())):
        assert any(not torch.equal(a, b) for a, b in zip(outputs, changed))
    # the copy's state_dict loads into a fresh encoder, and the fresh one computes as the copy
    fresh = posenc.build_encoder(config, dim=_DIM, num_heads=_HEADS).eval()
    fresh.load_state_dict(dup.state_dict())
    for a, b in zip(changed, _forward_and_backward(fresh, positions)[0]):
        _assert_same_bits(a, b)


@pytest.mark.parametrize("how", sorted(_COPIES))
def test_a_copy_keeps_dtype_training_mode_requires_grad_and_gradients(how):
    torch.manual_seed(0)
    config = {
        "type": "compose",
        "encoders": [{"type": "learned", "max_positions": 16}, {"type": "t5"}],
    }
    enc = posenc.build_encoder(config, dim=_DIM, num_heads=_HEADS, layout="bnhd").double()
    enc.train()
    names = [name for name, _ in enc.named_parameters()]
    dict(enc.named_parameters())[names[1]].requires_grad_(False)
    _forward_and_backward(enc, _SEQ, torch.float64)  # leaves .grad on the first parameter
    dup = _COPIES[how](enc)
    assert dup.training and dup.layout == "bnhd"
    for (name, a), (_, b) in zip(enc.named_parameters(), dup.named_parameters()):
        assert b.dtype == torch.float64 and b.requires_grad == a.requires_grad, name
        if how == "deepcopy":  # as torch's deepcopy of a tensor: the gradient is copied along
            assert (a.grad is None) == (b.grad is None), name
            if a.grad is not None:
                _assert_same_bits(a.grad, b.grad)
                assert a.grad.data_ptr() != b.grad.data_ptr()
    outputs, grads = _forward_and_backward(enc, _SEQ, torch.float64)
    dup_outputs, dup_grads = _forward_and_backward(dup, _SEQ, torch.float64)
    for a, b in zip(outputs, dup_outputs):
        _assert_same_bits(a, b)
    assert dup_grads[names[1]] is None
    _assert_same_bits(grads[names[0]], dup_grads[names[0]])


def test_a_model_holding_an_encoder_averages_with_averaged_model():
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = posenc.build_encoder({"type": "learned", "max_positions": 8}, dim=4)
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.proj(self.enc(posenc.Positions.sequence(x.shape[1])).add(x))

    torch.manual_seed(0)
    model = Model()
    x = torch.randn(2, 5, 4)
    swa = AveragedModel(model)  # deep-copies the model, encoder included
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    weights = []
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        swa.update_parameters(model)
        ema.update_parameters(model)
        weights.append(model.enc.weight.detach().clone())
    # SWA's running mean of the three tables, EMA's decayed one (torch's formulas)
    mean, decayed = weights[0], weights[0]
    for i, w in enumerate(weights[1:], start=1):
        mean = mean + (w - mean) / (i + 1)
        decayed = torch.lerp(decayed, w, 0.1)
    _assert_same_bits(swa.module.enc.weight.detach(), mean)
    torch.testing.assert_close(ema.module.enc.weight.detach(), decayed, rtol=1e-6, atol=1e-6)
    for averaged in (swa, ema):
        assert averaged.module.enc.weight is not model.enc.weight
        assert not torch.equal(averaged.module.enc.weight, model.enc.weight)
        # the averaged encoder's C++ module computes with the averaged table
        expected = Model()
        expected.load_state_dict(averaged.module.state_dict())
        _assert_same_bits(averaged(x), expected(x))


def test_an_hf_config_file_is_read_once_not_again_by_a_copy(tmp_path):
    import json

    path = tmp_path / "config.json"
    hf = {"model_type": "llama", "hidden_size": _DIM, "num_attention_heads": _HEADS}
    path.write_text(json.dumps({**hf, "rope_theta": 500.0}))
    enc = posenc.build_encoder({"type": "hf", "config": str(path)}, dim=_DIM, num_heads=_HEADS)
    path.write_text(json.dumps({**hf, "rope_theta": 10000.0}))  # the file changes afterwards
    for how in _COPIES.values():
        for a, b in zip(
            _forward_and_backward(enc, _SEQ)[0], _forward_and_backward(how(enc), _SEQ)[0]
        ):
            _assert_same_bits(a, b)
    path.unlink()
    _assert_same_bits(
        _forward_and_backward(_deepcopy(enc), _SEQ)[0][1], _forward_and_backward(enc, _SEQ)[0][1]
    )


def test_a_plan_refuses_to_be_copied_or_pickled_in_one_line():
    enc = posenc.build_encoder({"type": "learned", "max_positions": 8}, dim=4)
    plan = enc(posenc.Positions.sequence(3))
    for how in (_deepcopy, _pickle, _torch_save):
        with pytest.raises(ValueError, match="posenc Plan: a plan cannot be copied") as e:
            how(plan)
        assert len(str(e.value).splitlines()) == 1
    shallow = copy.copy(plan)  # the same C++ plan, read only
    x = torch.zeros(1, 3, 4)
    _assert_same_bits(shallow.add(x), plan.add(x))


def test_moving_an_encoder_to_meta_is_one_value_error_line_and_changes_nothing():
    enc = posenc.build_encoder({"type": "learned", "max_positions": 8}, dim=4)
    state = {name: t.clone() for name, t in enc.state_dict().items()}
    with pytest.raises(ValueError, match="posenc Encoder: cannot move") as e:
        enc.to("meta")
    assert len(str(e.value).splitlines()) == 1
    for name, t in enc.state_dict().items():
        _assert_same_bits(t, state[name])
    x = torch.zeros(1, 3, 4)
    _assert_same_bits(enc(posenc.Positions.sequence(3)).add(x), state["weight"][:3][None])


def test_an_encoder_loaded_to_meta_is_one_value_error_line():
    enc = posenc.build_encoder({"type": "learned", "max_positions": 8}, dim=4)
    buffer = io.BytesIO()
    torch.save(enc, buffer)
    buffer.seek(0)
    with pytest.raises(ValueError, match="'weight' is on meta") as e:
        torch.load(buffer, weights_only=False, map_location="meta")
    assert len(str(e.value).splitlines()) == 1


def test_load_state_dict_with_assign_reaches_the_cpp_module():
    enc = posenc.build_encoder({"type": "learned", "max_positions": 8}, dim=4)
    table = torch.randn(8, 4, dtype=torch.float64)
    enc.load_state_dict({"weight": torch.nn.Parameter(table)}, assign=True)
    assert enc.weight.dtype == torch.float64 and enc.weight.requires_grad
    x = torch.zeros(1, 3, 4, dtype=torch.float64)
    _assert_same_bits(enc(posenc.Positions.sequence(3)).add(x), table[:3][None])
    with pytest.raises(ValueError, match="cannot assign 'weight'") as e:
        enc.load_state_dict({"weight": torch.nn.Parameter(table.to("meta"))}, assign=True)
    assert len(str(e.value).splitlines()) == 1
    _assert_same_bits(enc(posenc.Positions.sequence(3)).add(x), table[:3][None])


def test_a_tensor_put_in_the_encoders_place_is_refused_not_ignored():
    enc = posenc.build_encoder({"type": "learned", "max_positions": 8}, dim=4)
    positions = posenc.Positions.sequence(3)
    with pytest.raises(ValueError, match="'weight' was replaced") as e:
        torch.func.functional_call(enc, {"weight": torch.ones(8, 4)}, (positions,))
    assert len(str(e.value).splitlines()) == 1
    enc(positions)  # functional_call put the module's own tensor back
    enc.weight = torch.nn.Parameter(torch.ones(8, 4))
    with pytest.raises(ValueError, match="'weight' was replaced"):
        enc(positions)

"""The time-series foundation models' attention reproduced by posenc, checked live against the
packages' own code (tiny random instances of their own classes, in this process):

* Chronos-2 (chronos-forecasting 2.3.2, chronos/chronos2/layers.py): time attention with
  rotate-half RoPE on the patch index (float32 tables, autocast off) and unscaled attention
  (scale 1.0), the padding as a key mask: posenc.rope_cos_sin + posenc.positional_attention;
  posenc.integrations.chronos.patch(model): forecasts equal, forward and backward; where the
  fused kernel does not compute what Chronos does (half precision, autocast, attention weights,
  dropout, masks other than one key padding, rows with every key masked) posenc's tables and
  rotation with Chronos' own attention function: to the bit. The group
  attention (across series, no positions): positional_attention with the groups as sample_ids.
* Moirai-2 (uni2ts 2.0.0, uni2ts/model/moirai2/module.py): RoPE on time_id over the first half of
  each head (pairs (2i, 2i + 1)), the binary variate bias Embedding(2, H), the packed mask per
  sample_id (causal in time across a series' variates), packed batches of several series and
  variates of different lengths: posenc's tables and rotation, to the bit; the sample-id mask
  and the variate bias in posenc's fused kernel (sample_ids, variate_ids, variate_bias) where
  the mask is a block per run (Moirai 1), that and causal (series of one variate), or that and
  causal in time_id (causal_ids: series of several variates packed variate-major), 1e-6;
  posenc.integrations.uni2ts.patch(module): predictions and gradients to 1e-6 on the fused
  path (several variates per series too, packed series of different lengths crossing the
  kernel's tiles), equal to the bit on the materialized path (a sample id in two runs).
* TimesFM 2.5 (timesfm 3.0.2 timesfm/torch/transformer.py, and transformers 5.24's timesfm2_5):
  position = arange - num_masked (left padding shifts the positions), RoPE before the per-head
  RMSNorm and the per-dimension query scale, unscaled causal attention with the left padding
  masked: posenc's positions, tables, rotation and fused attention;
  posenc.integrations.timesfm.patch(model) on timesfm's own Transformer layers and on
  transformers' TimesFm2_5Model: 1e-6; every rope type transformers builds its rotary module
  with (linear, dynamic, yarn, longrope, llama3, proportional): tables to the bit, the model to
  1e-6.
* Toto (toto-ts 0.2.0, toto/model/rope.py, attention.py): interleaved RoPE
  (rotary-embedding-torch's tables) with xPos on the time layers, none on the variate layers:
  posenc's tables and rotation with Toto's own xPos scale, and posenc's causal attention.
  Toto's xPos scale is laid out cat(s, s) over interleaved pairs (the two members of a pair take
  different scales; scale base 512, rotary-embedding-torch's default), which posenc's xPos (one
  scale per pair) does not express: test_toto_xpos_layout pins that finding.
  posenc.integrations.toto.patch(model) (posenc's tables and rotation, Toto's own xPos scale) on
  Toto's own Transformer: 1e-6.

Tolerances: where the arithmetic is the same operations in the same order (tables, rotations,
Moirai's SDPA) the results are compared to the bit; posenc's tiled online-softmax attention
against SDPA/eager softmax to 1e-6 relative (RTOL below); TimesFM's tables, whose angles are
position / timescale there and position * (1 / timescale) in posenc, to the same 1e-6.
"""

import collections
import copy
import importlib
import sys
import types
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import posenc
from posenc.integrations import chronos as posenc_chronos
from posenc.integrations import timesfm as posenc_timesfm
from posenc.integrations import toto as posenc_toto
from posenc.integrations import uni2ts as posenc_uni2ts

RTOL = 1e-6  # posenc's tiled float32 softmax vs SDPA's / eager (different summation order)
GRAD_RTOL = 1e-5  # gradients, relative to each tensor's largest: the backward's extra reductions
GRAD_ATOL = 1e-9  # a gradient tensor that cancels to ~1e-8 overall has no relative precision


class CountOps(TorchDispatchMode):
    """Counts the operators called below autograd (posenc's among them)."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _attention_calls(ops: CountOps) -> int:
    """Calls of posenc's fused attention (its forward operator, below autograd)."""
    return sum(
        n
        for name, n in ops.calls.items()
        if name.startswith("posenc.") and "attention" in name and "backward" not in name
    )


def _close(got, want, rtol=RTOL):
    scale = want.detach().abs().max().clamp_min(1e-30)
    err = ((got.detach() - want.detach()).abs().max() / scale).item()
    assert err <= rtol, f"max error {err:.3g} relative to max |want| (bound {rtol:g})"


def _grads_close(got, want, rtol=GRAD_RTOL):
    """Each gradient tensor to rtol (GRAD_RTOL unless given) of its largest element, plus
    GRAD_ATOL (a tensor whose gradient cancels to ~1e-8 overall has no relative precision
    left)."""
    for g, w in zip(got, want):
        err = (g - w).abs().max().item()
        bound = rtol * w.abs().max().item() + GRAD_ATOL
        assert err <= bound, f"gradient error {err:.3g} above {bound:.3g} (shape {tuple(w.shape)})"


def _grads_as_exact_as_peer(got, peer, exact):
    """Each of posenc's float32 gradient tensors against the peer's own code run in float64
    (exact): within RTOL of its largest element, or no further from exact than twice the peer's
    own float32 gradient is (a sum over N^2 logits, like the variate bias's, carries ~1e-6 of
    float32 rounding in any order of summation)."""
    for g, p, e in zip(got, peer, exact):
        scale = e.abs().max().item()
        err, peer_err = (g.double() - e).abs().max().item(), (p.double() - e).abs().max().item()
        bound = max(RTOL * scale, 2 * peer_err) + GRAD_ATOL
        assert err <= bound, (
            f"gradient error {err / scale:.3g} relative (the peer's float32: "
            f"{peer_err / scale:.3g}) above {bound / scale:.3g} (shape {tuple(e.shape)})"
        )


def _grads(out, inputs, seed_grad):
    return torch.autograd.grad(out, inputs, seed_grad, allow_unused=False)


# ---- Chronos-2 -------------------------------------------------------------------------------


def _chronos_model(attn="sdpa", dropout_rate=0.0):
    pytest.importorskip("chronos.chronos2.model")
    from chronos.chronos2.config import Chronos2CoreConfig
    from chronos.chronos2.model import Chronos2Model

    torch.manual_seed(0)
    config = Chronos2CoreConfig(
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        dropout_rate=dropout_rate,
        attn_implementation=attn,
        chronos_config=dict(
            context_length=64,
            output_patch_size=4,
            input_patch_size=4,
            input_patch_stride=4,
            quantiles=[0.1, 0.5, 0.9],
            use_reg_token=True,
            max_output_patches=2,
        ),
    )
    return Chronos2Model(config).eval()


def test_chronos2_tables_are_chronos_own():
    mha = _chronos_model().encoder.block[0].layer[0].self_attention
    for positions in (torch.arange(17)[None], torch.arange(40).view(2, 20)):
        x = torch.zeros(positions.shape[0], 4, positions.shape[1], 8)
        want_cos, want_sin = mha.rope_embed(x, positions)
        cos, sin = posenc.rope_cos_sin(positions, mha.rope_embed.inv_freq)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_chronos2_time_attention(attn):
    """posenc's tables + fused attention (scale 1.0, left padding as a key mask) = Chronos' MHA,
    outputs and gradients (input and all four projections)."""
    mha = _chronos_model(attn).encoder.block[0].layer[0].self_attention
    batch, length, heads, dim = 3, 12, 4, 8
    x = torch.randn(batch, length, 32, requires_grad=True)
    kept = torch.ones(batch, length)
    kept[1, :4] = 0  # a left-padded series
    kept[2, :1] = 0
    mask = (1.0 - kept[:, None, None, :]) * torch.finfo(torch.float32).min
    positions = torch.arange(length)[None]
    want = mha(x, mask=mask, position_ids=positions).hidden_states

    def split(t):
        return t.view(batch, length, heads, dim).transpose(1, 2)

    q, k, v = split(mha.q(x)), split(mha.k(x)), split(mha.v(x))
    cos, sin = posenc.rope_cos_sin(positions, mha.rope_embed.inv_freq)
    with CountOps() as ops:
        out = posenc.positional_attention(
            q, k, v, cos=cos, sin=sin, scale=1.0, attention_mask=kept.bool()
        )
    assert _attention_calls(ops) == 1
    got = mha.o(out.transpose(1, 2).reshape(batch, length, heads * dim))
    _close(got, want)
    seed = torch.randn_like(want)
    params = [x, mha.q.weight, mha.k.weight, mha.v.weight, mha.o.weight]
    _grads_close(_grads(got, params, seed), _grads(want, params, seed))


def test_chronos2_group_attention():
    """Chronos-2's group attention (across the series of a batch at each time step, no positions,
    unscaled): posenc.positional_attention(scale=1.0) with the groups as sample_ids and the
    padding as a key mask = Chronos' MHA over its group-time mask, outputs and gradients. Every
    query here has an unpadded key in its group (a padded series alone in its group sees no key:
    Chronos averages every value of the batch there, posenc gives 0; patch() leaves the group
    attention to Chronos for that reason)."""
    model = _chronos_model()
    group = model.encoder.block[0].layer[1]
    mha = group.self_attention
    batch, length, heads, dim = 5, 9, 4, 8
    groups = torch.tensor([0, 0, 0, 1, 1])  # contiguous runs, as posenc's sample_ids take them
    kept = torch.ones(batch, length)
    kept[1, :4] = 0  # series 1 and 4 left-padded; 0 and 3 cover their groups there
    kept[4, :2] = 0
    mask = model.encoder._construct_and_invert_group_time_mask(groups, kept, torch.float32)
    x = torch.randn(batch, length, 32, requires_grad=True)
    want = group(x, attention_mask=mask).hidden_states
    h = group.layer_norm(x.transpose(0, 1))  # [time, batch, d]: attention along the batch

    def split(t):
        return t.view(length, batch, heads, dim).transpose(1, 2)

    q, k, v = split(mha.q(h)), split(mha.k(h)), split(mha.v(h))
    with CountOps() as ops:
        out = posenc.positional_attention(
            q, k, v, scale=1.0, sample_ids=groups.expand(length, -1), attention_mask=kept.T.bool()
        )
    assert _attention_calls(ops) == 1
    got = x + mha.o(out.transpose(1, 2).reshape(length, batch, heads * dim)).transpose(0, 1)
    _close(got, want)
    seed = torch.randn_like(want)
    params = [x, mha.q.weight, mha.k.weight, mha.v.weight, mha.o.weight]
    _grads_close(_grads(got, params, seed), _grads(want, params, seed))


def _chronos_inputs():
    torch.manual_seed(1)
    context = torch.randn(4, 40)
    context[1, :13] = float("nan")  # left padding (missing values): masked patches
    context[3, :29] = float("nan")
    return context, torch.tensor([0, 0, 1, 2])


def test_chronos2_patch_forecasts_equal():
    model = _chronos_model()
    context, groups = _chronos_inputs()
    want = model(context, num_output_patches=2, group_ids=groups).quantile_preds
    assert posenc_chronos.patch(model) == [
        "encoder.block.0.layer.0.self_attention",
        "encoder.block.1.layer.0.self_attention",
    ]
    with CountOps() as ops:
        got = model(context, num_output_patches=2, group_ids=groups).quantile_preds
    assert _attention_calls(ops) == 2  # a time attention per block
    _close(got, want)
    # gradients of every parameter, patched vs unpatched
    seed = torch.randn_like(want)
    params = [p for p in model.parameters() if p.requires_grad]
    got_grads = _grads(
        model(context, num_output_patches=2, group_ids=groups).quantile_preds, params, seed
    )
    assert posenc_chronos.unpatch(model) == [
        "encoder.block.0.layer.0.self_attention",
        "encoder.block.1.layer.0.self_attention",
    ]
    want_grads = _grads(
        model(context, num_output_patches=2, group_ids=groups).quantile_preds, params, seed
    )
    _grads_close(got_grads, want_grads)
    # unpatched: Chronos' own forward, the same bits as before, posenc not called
    with CountOps() as ops:
        again = model(context, num_output_patches=2, group_ids=groups).quantile_preds
    assert _attention_calls(ops) == 0 and torch.equal(again, want)
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_chronos2_patch_float64():
    """A float64 model: posenc's float64 attention with Chronos' float32 tables (cast to float64,
    as Chronos casts them) gives its forecasts to float64 rounding."""
    model = _chronos_model().double()
    context, groups = _chronos_inputs()
    want = model(context.double(), num_output_patches=2, group_ids=groups).quantile_preds
    posenc_chronos.patch(model)
    with CountOps() as ops:
        got = model(context.double(), num_output_patches=2, group_ids=groups).quantile_preds
    assert _attention_calls(ops) == 2
    _close(got, want, 1e-12)
    posenc_chronos.unpatch(model)


def test_chronos2_patch_refusals():
    with pytest.raises(ValueError, match="no Chronos-2 RoPE time attention"):
        posenc_chronos.patch(torch.nn.Linear(2, 2))
    model = _chronos_model()
    posenc_chronos.patch(model)
    mha = model.encoder.block[0].layer[0].self_attention
    with pytest.raises(ValueError, match="position_ids must be given") as e:
        mha(torch.randn(1, 5, 32), mask=torch.zeros(1, 1, 1, 5))
    assert "\n" not in str(e.value)
    # cross attention (refused before): Chronos rotates nothing there, its own forward runs
    x, states = torch.randn(1, 5, 32), torch.randn(1, 5, 32)
    cross = dict(
        mask=torch.zeros(1, 1, 1, 5), encoder_states=states, position_ids=torch.zeros(1, 5)
    )
    got = mha(x, **cross).hidden_states
    posenc_chronos.unpatch(model)
    assert torch.equal(got, mha(x, **cross).hidden_states)


def test_chronos2_time_attention_without_a_mask():
    """mask=None: Chronos' SDPA masks nothing (posenc's fused kernel, every key kept: 1e-6); its
    eager attention fails on None, and so does the patched one (Chronos' own function)."""
    for attn in ("sdpa", "eager"):
        model = _chronos_model(attn)
        mha = model.encoder.block[0].layer[0].self_attention
        x, positions = torch.randn(2, 6, 32), torch.arange(6)[None]
        posenc_chronos.patch(model)
        if attn == "eager":
            with pytest.raises(TypeError):
                mha(x, mask=None, position_ids=positions)
            posenc_chronos.unpatch(model)
            with pytest.raises(TypeError):
                mha(x, mask=None, position_ids=positions)
            continue
        with CountOps() as ops:
            got = mha(x, mask=None, position_ids=positions).hidden_states
        posenc_chronos.unpatch(model)
        assert _attention_calls(ops) == 1
        _close(got, mha(x, mask=None, position_ids=positions).hidden_states)


def _chronos_time_attention_calls():
    """Calls of the time attention that the fused kernel does not compute as Chronos does: each
    (name, attn implementation, keyword arguments of MHA.forward but hidden_states)."""
    low = torch.finfo(torch.float32).min
    kept = torch.tensor([[False, True, True, True, True]])[:, None, None, :]
    per_head = torch.zeros(1, 4, 1, 5)
    per_head[:, 1, :, 0] = low  # head 1 masks key 0
    every_key = torch.zeros(2, 1, 1, 5)
    every_key[1] = low  # series 1 sees no key
    positions = torch.arange(5)[None]
    return [
        ("weights", "sdpa", dict(mask=torch.zeros(1, 1, 1, 5), output_attentions=True)),
        ("every key masked", "sdpa", dict(mask=every_key)),
        ("every key masked", "eager", dict(mask=every_key)),
        ("not a padding mask", "sdpa", dict(mask=torch.full((1, 1, 1, 5), -1.0))),
        ("mask per head", "sdpa", dict(mask=per_head)),
        ("boolean under eager", "eager", dict(mask=kept)),
    ], positions


@pytest.mark.parametrize("case", range(6))
def test_chronos2_time_attention_the_fused_kernel_does_not_take_equal_to_the_bit(case):
    """Calls posenc refused ("unpatch() for it"), which Chronos computes: attention weights, a
    query row with every key masked (Chronos averages the values), masks that are not one padding
    mask on the keys, a boolean mask under eager attention (added as 0 / 1). Patched, posenc's
    tables and rotation with Chronos' own attention function: its output (and weights) to the
    bit."""
    calls, positions = _chronos_time_attention_calls()
    name, attn, kwargs = calls[case]
    model = _chronos_model(attn)
    mha = model.encoder.block[0].layer[0].self_attention
    torch.manual_seed(2)
    x = torch.randn(kwargs["mask"].shape[0], 5, 32)
    want = mha(x, position_ids=positions, **kwargs)
    posenc_chronos.patch(model)
    with CountOps() as ops:
        got = mha(x, position_ids=positions, **kwargs)
    posenc_chronos.unpatch(model)
    assert ops.calls["posenc.rope_cos_sin"] == 1 and ops.calls["posenc.apply_rotary"] == 1, name
    assert _attention_calls(ops) == 0
    assert torch.equal(got.hidden_states, want.hidden_states), name
    if want.attn_weights is None:
        assert got.attn_weights is None
    else:
        assert torch.equal(got.attn_weights, want.attn_weights), name


def test_chronos2_patched_with_dropout_while_training_equal_to_the_bit():
    """Training with dropout (posenc refused it): Chronos' own SDPA call draws the same dropout
    from the same generator state, after posenc's rotation; forecasts and gradients to the bit."""
    model = _chronos_model(dropout_rate=0.1).train()
    context, groups = _chronos_inputs()

    def run():
        torch.manual_seed(3)
        out = model(context, num_output_patches=2, group_ids=groups).quantile_preds
        grads = torch.autograd.grad(out.sum(), [p for p in model.parameters()], allow_unused=True)
        return out, grads

    want, want_grads = run()
    posenc_chronos.patch(model)
    with CountOps() as ops:
        got, got_grads = run()
    posenc_chronos.unpatch(model)
    assert ops.calls["posenc.apply_rotary"] >= 2 and _attention_calls(ops) == 0
    assert torch.equal(got, want)
    for g, w in zip(got_grads, want_grads):
        assert (g is None and w is None) or torch.equal(g, w)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("moved", ["before", "after"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chronos2_patch_in_half_precision_equal_to_the_bit(dtype, moved, attn):
    """A bfloat16/float16 Chronos-2 (cast before or after patch(); posenc refused both): Chronos
    rounds its tables, rotation, scores and softmax to that dtype; patched, posenc's tables and
    rotation with Chronos' own attention function: forecasts equal to the bit."""
    model = _chronos_model(attn)
    context, groups = _chronos_inputs()
    if moved == "before":
        model.to(dtype)
    posenc_chronos.patch(model)
    model.to(dtype)
    with CountOps() as ops:
        got = model(context.to(dtype), num_output_patches=2, group_ids=groups).quantile_preds
    assert ops.calls["posenc.apply_rotary"] == 2 and _attention_calls(ops) == 0
    posenc_chronos.unpatch(model)
    want = model(context.to(dtype), num_output_patches=2, group_ids=groups).quantile_preds
    assert got.dtype == want.dtype
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chronos2_patch_under_autocast_equal_to_the_bit(dtype):
    """Under autocast Chronos projects in the autocast dtype and rounds its float32 tables to it
    (the projections' dtype); posenc refused it. Patched: equal to the bit."""
    model = _chronos_model()
    context, groups = _chronos_inputs()
    with torch.autocast("cpu", dtype):
        want = model(context, num_output_patches=2, group_ids=groups).quantile_preds
        posenc_chronos.patch(model)
        with CountOps() as ops:
            got = model(context, num_output_patches=2, group_ids=groups).quantile_preds
    posenc_chronos.unpatch(model)
    assert ops.calls["posenc.apply_rotary"] == 2 and _attention_calls(ops) == 0
    assert torch.equal(got, want)


# ---- Moirai-2 --------------------------------------------------------------------------------


def _moirai_module():
    """uni2ts' Moirai2Module, imported without uni2ts.model.moirai2's package file (it imports
    Moirai2Forecast: lightning, gluonts)."""
    uni2ts_model = pytest.importorskip("uni2ts.model")
    pytest.importorskip("jaxtyping")
    name = "uni2ts.model.moirai2"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [uni2ts_model.__path__[0] + "/moirai2"]
        sys.modules[name] = package
    return importlib.import_module(name + ".module")


def _moirai(seed=0):
    module = _moirai_module()
    torch.manual_seed(seed)
    model = module.Moirai2Module(
        d_model=128,
        d_ff=64,
        num_layers=2,
        patch_size=4,
        max_seq_len=64,
        attn_dropout_p=0.0,
        dropout_p=0.0,
    ).eval()
    with torch.no_grad():  # learned variate bias away from its init, distinct per head
        for layer in model.encoder.layers:
            layer.self_attn.var_attn_bias.emb.weight.normal_()
    return model


def _packed_ids():
    """Two packed rows: row 0 = a series of 2 variates x 5 patches and one of 3 variates x 3,
    then 3 padding tokens (sample_id 0, uni2ts' padding); row 1 = one univariate series of 11
    and one of 2 variates x 4, then 3 padding tokens."""
    sample = torch.tensor([[1] * 10 + [2] * 9 + [0] * 3, [1] * 11 + [2] * 8 + [0] * 3])
    variate = torch.tensor(
        [
            [0] * 5 + [1] * 5 + [0] * 3 + [1] * 3 + [2] * 3 + [0] * 3,
            [0] * 11 + [0] * 4 + [1] * 4 + [0] * 3,
        ]
    )
    time = torch.tensor(
        [
            list(range(5)) * 2 + list(range(3)) * 3 + [0] * 3,
            list(range(11)) + list(range(4)) * 2 + [0] * 3,
        ]
    )
    return sample, variate, time


def test_moirai2_tables_are_uni2ts_own():
    model = _moirai()
    rotary = model.encoder.layers[0].self_attn.time_qk_proj.query_proj
    _, _, time = _packed_ids()
    cos, sin = posenc.rope_cos_sin(time, rotary.theta, layout="interleaved")
    assert cos.shape[-1] == model.encoder.layers[0].self_attn.head_dim // 2  # half of each head
    assert torch.equal(cos, rotary.cos[time]) and torch.equal(sin, rotary.sin[time])


@pytest.mark.parametrize("packing", ["causal", "bidirectional"])
def test_moirai2_attention_packed(packing):
    """posenc's tables and partial interleaved rotation, with the variate bias and the packed
    mask (Moirai-2's, causal in time across the variates; Moirai 1's packed_attention_mask, the
    same attention class): uni2ts' attention output and gradients to the bit."""
    torch_util = importlib.import_module("uni2ts.common.torch_util")
    attention = _moirai().encoder.layers[0].self_attn
    sample, variate, time = _packed_ids()
    batch, length = sample.shape
    heads, dim = attention.num_heads, attention.head_dim
    if packing == "causal":
        mask = torch_util.packed_causal_attention_mask(sample, time)
    else:
        mask = torch_util.packed_attention_mask(sample)
    x = torch.randn(batch, length, 128, requires_grad=True)
    want = attention(
        x,
        x,
        x,
        attn_mask=mask,
        query_var_id=variate,
        kv_var_id=variate,
        query_time_id=time,
        kv_time_id=time,
    )

    def split(t):
        return t.view(batch, length, heads, dim).transpose(1, 2)

    q = attention.q_norm(split(attention.q_proj(x)))
    k = attention.k_norm(split(attention.k_proj(x)))
    v = split(attention.v_proj(x))
    rotary = attention.time_qk_proj.query_proj
    cos, sin = posenc.rope_cos_sin(time, rotary.theta, layout="interleaved")
    with CountOps() as ops:
        q, k = posenc.apply_rotary_pos_emb(q, k, cos, sin, layout="interleaved")
    assert ops.calls["posenc.apply_rotary"] == 1
    table = attention.var_attn_bias.emb.weight  # [2, H]: row 0 other variate, row 1 same
    same = (variate[:, :, None] == variate[:, None, :])[:, None]
    bias = torch.where(same, table[1][None, :, None, None], table[0][None, :, None, None])
    bias = bias.masked_fill(~mask[:, None], float("-inf"))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    got = attention.out_proj(out.transpose(1, 2).reshape(batch, length, heads * dim))
    assert torch.equal(got, want)
    seed = torch.randn_like(want)
    params = [x, table, attention.q_proj.weight, attention.k_proj.weight]
    _grads_close(_grads(got, params, seed), _grads(want, params, seed))


def _univariate_ids():
    """Packed series of one variate each (time in token order within a series), then padding:
    Moirai-2's packed causal mask is then causal in token order within each run."""
    sample = torch.tensor([[1] * 7 + [2] * 5 + [3] * 7 + [0] * 3, [1] * 12 + [2] * 10])
    time = torch.cat(
        [
            torch.cat([torch.arange(n) for n in (7, 5, 7, 3)])[None],
            torch.cat([torch.arange(n) for n in (12, 10)])[None],
        ]
    )
    variate = torch.zeros_like(sample)
    variate[0, 12:19] = 1  # ids need not be 0 in a series of one variate
    return sample, variate, time


@pytest.mark.parametrize("packing", ["bidirectional", "causal"])
def test_moirai_fused_sample_mask_and_variate_bias(packing):
    """posenc.positional_attention with sample_ids, variate_ids and variate_bias (uni2ts'
    BinaryAttentionBias weight as is) and RoPE inside the tiles: uni2ts' attention with its own
    packed mask (Moirai 1's packed_attention_mask over several variates; Moirai-2's
    packed_causal_attention_mask over series of one variate) to 1e-6, gradients of the input and
    of the variate bias."""
    torch_util = importlib.import_module("uni2ts.common.torch_util")
    attention = _moirai().encoder.layers[0].self_attn
    if packing == "bidirectional":
        sample, variate, time = _packed_ids()
        mask = torch_util.packed_attention_mask(sample)
    else:
        sample, variate, time = _univariate_ids()
        mask = torch_util.packed_causal_attention_mask(sample, time)
    batch, length = sample.shape
    heads, dim = attention.num_heads, attention.head_dim
    x = torch.randn(batch, length, 128, requires_grad=True)
    want = attention(
        x,
        x,
        x,
        attn_mask=mask,
        query_var_id=variate,
        kv_var_id=variate,
        query_time_id=time,
        kv_time_id=time,
    )

    def split(t):
        return t.view(batch, length, heads, dim).transpose(1, 2)

    q = attention.q_norm(split(attention.q_proj(x)))
    k = attention.k_norm(split(attention.k_proj(x)))
    v = split(attention.v_proj(x))
    cos, sin = posenc.rope_cos_sin(
        time, attention.time_qk_proj.query_proj.theta, layout="interleaved"
    )
    table = attention.var_attn_bias.emb.weight
    runs = torch.cat(
        [torch.ones(batch, 1, dtype=torch.bool), sample[:, 1:] != sample[:, :-1]], 1
    ).cumsum(1)  # uni2ts' ids renumbered as contiguous runs (0 is a sample too)
    with CountOps() as ops:
        out = posenc.positional_attention(
            q,
            k,
            v,
            cos=cos,
            sin=sin,
            layout="interleaved",
            scale=attention.softmax_scale,
            causal=packing == "causal",
            sample_ids=runs,
            variate_ids=variate,
            variate_bias=table,
        )
    assert _attention_calls(ops) == 1
    got = attention.out_proj(out.transpose(1, 2).reshape(batch, length, heads * dim))
    _close(got, want)
    seed = torch.randn_like(want)
    params = [x, table, attention.q_proj.weight, attention.v_proj.weight]
    got_grads, want_grads = _grads(got, params, seed), _grads(want, params, seed)
    if packing == "causal":  # one variate per series: every logit of a row takes the same
        # bias, whose gradient is 0 in exact arithmetic (softmax's shift invariance); both are
        # float32 noise of a sum over the row
        assert got_grads[1].abs().max() < 1e-5 and want_grads[1].abs().max() < 1e-5
        got_grads, want_grads = got_grads[:1] + got_grads[2:], want_grads[:1] + want_grads[2:]
    _grads_close(got_grads, want_grads)


def _moirai_inputs():
    sample, variate, time = _packed_ids()
    torch.manual_seed(2)
    target = torch.randn(*sample.shape, 4)
    observed = torch.rand(*sample.shape, 4) > 0.1
    prediction = (time == time.max()) & (sample > 0)
    return dict(
        target=target,
        observed_mask=observed,
        sample_id=sample,
        time_id=time,
        variate_id=variate,
        prediction_mask=prediction,
        training_mode=False,
    )


def test_moirai2_patch_predictions_equal():
    """Several variates per series (Moirai-2's mask causal in time across them): the patched
    attention runs in posenc's fused kernel with causal_ids = time_id; predictions to 1e-6 of
    uni2ts' own model, every parameter's gradient (the variate biases' among them) against
    uni2ts' own model in float64 (_grads_as_exact_as_peer)."""
    model = _moirai()
    inputs = _moirai_inputs()
    exact = copy.deepcopy(model).double()
    inputs64 = {
        k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
        for k, v in inputs.items()
    }
    want = model(**inputs)
    names = posenc_uni2ts.patch(model)
    assert names == ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    with CountOps() as ops:
        got = model(**inputs)
    assert _attention_calls(ops) == 2 and ops.calls["posenc.rope_cos_sin"] == 2
    assert ops.calls["posenc.apply_rotary"] == 0  # RoPE inside the kernel's tiles
    _close(got, want)
    seed = torch.randn_like(want)
    params = [p for p in model.parameters() if p.requires_grad]
    got_grads = _grads(model(**inputs), params, seed)
    assert posenc_uni2ts.unpatch(model) == names
    want_grads = _grads(model(**inputs), params, seed)
    params64 = [p for p in exact.parameters() if p.requires_grad]
    exact_grads = _grads(exact(**inputs64), params64, seed.double())
    _grads_as_exact_as_peer(got_grads, want_grads, exact_grads)
    with CountOps() as ops:
        again = model(**inputs)
    assert ops.calls["posenc.apply_rotary"] == 0 and torch.equal(again, want)


def _long_variate_major_ids():
    """Two packed rows crossing the kernel's 128 x 256 tiles, Moirai-2's variate-major packing:
    row 0 = a series of 3 variates x 150 patches, one of 2 x 40, then 20 padding tokens (sample
    0); row 1 = a univariate series of 300 and one of 4 variates x 60, then 10 padding tokens.
    (sample_id, variate_id, time_id) [2, 550]."""
    rows = [[(1, 3, 150), (2, 2, 40), (0, 1, 20)], [(1, 1, 300), (2, 4, 60), (0, 1, 10)]]
    ids = [[], [], []]
    for row in rows:
        sample, variate, time = [], [], []
        for sid, variates, times in row:
            for var in range(variates):
                sample += [sid] * times
                variate += [var] * times
                time += list(range(times))
        for out, row_ids in zip(ids, (sample, variate, time)):
            out.append(row_ids)
    return tuple(torch.tensor(x) for x in ids)


def test_moirai2_patch_several_variates_long():
    """uni2ts' own attention with Moirai-2's packed causal mask over long series of several
    variates (a query tile's keys span variates whose times run ahead: the kernel skips the
    tiles whose keys all lie later in time): the patched attention in the fused kernel
    (causal_ids = time_id), output to 1e-6, the gradients of the input, the variate bias and the
    projections against uni2ts' attention in float64 (_grads_as_exact_as_peer)."""
    torch_util = importlib.import_module("uni2ts.common.torch_util")
    model = _moirai()
    attention = model.encoder.layers[0].self_attn
    exact = copy.deepcopy(attention).double()
    sample, variate, time = _long_variate_major_ids()
    mask = torch_util.packed_causal_attention_mask(sample, time)
    x = torch.randn(*sample.shape, 128, requires_grad=True)
    x64 = x.detach().double().requires_grad_()

    def run(module=attention, x=x):
        return module(
            x,
            x,
            x,
            attn_mask=mask,
            query_var_id=variate,
            kv_var_id=variate,
            query_time_id=time,
            kv_time_id=time,
        )

    want = run()
    posenc_uni2ts.patch(model)
    try:
        with CountOps() as ops:
            got = run()
        assert _attention_calls(ops) == 1 and ops.calls["posenc.apply_rotary"] == 0
        _close(got, want)
        seed = torch.randn_like(want)
        params = [x, attention.var_attn_bias.emb.weight, attention.q_proj.weight]
        params += [attention.k_proj.weight, attention.v_proj.weight]
        got_grads = _grads(got, params, seed)
    finally:
        posenc_uni2ts.unpatch(model)
    params64 = [x64, exact.var_attn_bias.emb.weight, exact.q_proj.weight]
    params64 += [exact.k_proj.weight, exact.v_proj.weight]
    exact_grads = _grads(run(exact, x64), params64, seed.double())
    _grads_as_exact_as_peer(got_grads, _grads(want, params, seed), exact_grads)


def test_moirai2_patch_fused_path():
    """Series of one variate each: Moirai-2's mask is causal in token order within each packed
    run, so the patched attention runs in posenc's fused kernel (sample ids, variate bias and
    RoPE inside the tiles): predictions and every parameter's gradient to 1e-6 / 1e-5."""
    model = _moirai()
    sample, variate, time = _univariate_ids()
    torch.manual_seed(3)
    inputs = dict(
        target=torch.randn(*sample.shape, 4),
        observed_mask=torch.rand(*sample.shape, 4) > 0.1,
        sample_id=sample,
        time_id=time,
        variate_id=variate,
        prediction_mask=(time >= 4) & (sample > 0),
        training_mode=False,
    )
    want = model(**inputs)
    names = posenc_uni2ts.patch(model)
    with CountOps() as ops:
        got = model(**inputs)
    assert _attention_calls(ops) == 2 and ops.calls["posenc.apply_rotary"] == 0
    _close(got, want)
    seed = torch.randn_like(want)
    # the variate biases' gradients are 0 in exact arithmetic here (one variate per series: a
    # row's logits all take the same bias) and float32 noise in both: checked small, not equal
    biases = [layer.self_attn.var_attn_bias.emb.weight for layer in model.encoder.layers]
    params = [p for p in model.parameters() if p.requires_grad and all(p is not b for b in biases)]
    got_grads = _grads(model(**inputs), params + biases, seed)
    assert posenc_uni2ts.unpatch(model) == names
    want_grads = _grads(model(**inputs), params + biases, seed)
    _grads_close(got_grads[: len(params)], want_grads[: len(params)])
    for g, w in zip(got_grads[len(params) :], want_grads[len(params) :]):
        assert g.abs().max() < 1e-5 and w.abs().max() < 1e-5


def test_moirai2_patch_negative_variate_ids():
    """uni2ts' binary variate bias reads only whether two ids are equal, so it accepts negative
    ids; the fused path takes them too (shifted by their minimum, which keeps every equality):
    predictions to 1e-6, where posenc's kernel refused negative ids before."""
    model = _moirai()
    sample, variate, time = _univariate_ids()
    torch.manual_seed(3)
    inputs = dict(
        target=torch.randn(*sample.shape, 4),
        observed_mask=torch.rand(*sample.shape, 4) > 0.1,
        sample_id=sample,
        time_id=time,
        variate_id=variate - 5,
        prediction_mask=(time >= 4) & (sample > 0),
        training_mode=False,
    )
    want = model(**inputs)
    posenc_uni2ts.patch(model)
    with CountOps() as ops:
        got = model(**inputs)
    assert _attention_calls(ops) == 2
    _close(got, want)


def test_moirai2_patch_non_contiguous_samples():
    """A sample id in two separate runs (1, 1, 2, 2, 1, 1): the mask is not a block per run, so
    the patched attention takes the materialized path and equals uni2ts' to the bit (the fused
    kernel is never given runs it would misread)."""
    torch_util = importlib.import_module("uni2ts.common.torch_util")
    model = _moirai()
    attention = model.encoder.layers[0].self_attn
    sample = torch.tensor([[1, 1, 1, 2, 2, 2, 1, 1]])
    time = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
    variate = torch.zeros_like(sample)
    x = torch.randn(1, 8, 128)
    for mask in (
        torch_util.packed_attention_mask(sample),
        torch_util.packed_causal_attention_mask(sample, time),
    ):
        want = attention(
            x,
            x,
            x,
            attn_mask=mask,
            query_var_id=variate,
            kv_var_id=variate,
            query_time_id=time,
            kv_time_id=time,
        )
        posenc_uni2ts.patch(model)
        with CountOps() as ops:
            got = attention(
                x,
                x,
                x,
                attn_mask=mask,
                query_var_id=variate,
                kv_var_id=variate,
                query_time_id=time,
                kv_time_id=time,
            )
        posenc_uni2ts.unpatch(model)
        assert _attention_calls(ops) == 0 and ops.calls["posenc.apply_rotary"] == 1
        assert torch.equal(got, want)


def test_moirai2_patch_refuses_negative_time_ids():
    """uni2ts' RotaryProjection indexes its cos/sin rows by time_id (self.cos[seq_id]), so a
    negative id reads a row from the end of the buffer (position max_len - 3 for -3), where
    posenc's tables rotate by the id itself: the patched attention gave 0.24 relative error
    against uni2ts' own without a word; it refuses in one line (both paths), nothing changed."""
    torch_util = importlib.import_module("uni2ts.common.torch_util")
    model = _moirai()
    attention = model.encoder.layers[0].self_attn
    sample, variate, time = _packed_ids()
    time = time - 3
    x = torch.randn(*sample.shape, 128)
    posenc_uni2ts.patch(model)
    for mask in (torch_util.packed_causal_attention_mask(sample, time), None):
        with pytest.raises(ValueError) as info:
            attention(
                x,
                x,
                x,
                attn_mask=mask,
                query_var_id=variate,
                kv_var_id=variate,
                query_time_id=time,
                kv_time_id=time,
            )
        text = str(info.value)
        assert "\n" not in text and "time_id" in text and "-3" in text, text
    posenc_uni2ts.unpatch(model)


def test_moirai2_patch_refusals():
    with pytest.raises(ValueError, match="no uni2ts attention"):
        posenc_uni2ts.patch(torch.nn.Linear(2, 2))
    # (a float64 model, refused here before, is computed: test_moirai_in_float64_equal_to_the_bit)
    model = _moirai()
    posenc_uni2ts.patch(model)
    attention = model.encoder.layers[0].self_attn
    x = torch.randn(1, 4, 128)
    time, other = torch.arange(4)[None], torch.arange(1, 5)[None]
    with pytest.raises(ValueError, match="same time_id"):
        attention(
            x, x, x, query_var_id=time * 0, kv_var_id=time * 0, query_time_id=time, kv_time_id=other
        )
    posenc_uni2ts.unpatch(model)


# ---- TimesFM 2.5 -----------------------------------------------------------------------------


def _left_padding(batch, length):
    padded = torch.zeros(batch, length, dtype=torch.bool)
    padded[1, :5] = True  # a short context, left-padded
    padded[2, :1] = True
    return padded


def test_timesfm25_attention_left_padded():
    """timesfm's MultiHeadAttention (RoPE at position = arange - num_masked, then RMSNorm and the
    per-dimension query scale, unscaled causal attention over the unpadded keys): posenc's
    positions, tables, rotation and fused attention."""
    transformer = pytest.importorskip("timesfm.torch.transformer")
    torch.manual_seed(0)
    batch, length, heads, dim = 3, 16, 4, 16
    attention = transformer.MultiHeadAttention(num_heads=heads, in_features=heads * dim).eval()
    with torch.no_grad():
        attention.per_dim_scale.per_dim_scale.normal_()
    x = torch.randn(batch, length, heads * dim, requires_grad=True)
    padded = _left_padding(batch, length)
    want, _ = attention(x, patch_mask=padded)
    rotary = attention.rotary_position_embedding
    # timesfm's timescales; posenc takes their inverse (a product where timesfm divides)
    fraction = 2 * torch.arange(0, dim // 2) / dim
    timescale = rotary.min_timescale * (rotary.max_timescale / rotary.min_timescale) ** fraction
    positions = torch.arange(length)[None] - padded.sum(-1, keepdim=True)  # left pad shifts
    cos, sin = posenc.rope_cos_sin(positions, (1.0 / timescale).float())
    angles = positions[..., None].float() / timescale.float()
    _close(cos, torch.cat([angles.cos(), angles.cos()], -1))
    _close(sin, torch.cat([angles.sin(), angles.sin()], -1))

    def split(t):
        return t.view(batch, length, heads, dim)

    q, k = posenc.apply_rotary_pos_emb(
        split(attention.query(x)), split(attention.key(x)), cos, sin, unsqueeze_dim=2
    )
    q = attention.per_dim_scale(attention.query_ln(q)).transpose(1, 2)
    k = attention.key_ln(k).transpose(1, 2)
    v = split(attention.value(x)).transpose(1, 2)
    with CountOps() as ops:
        out = posenc.positional_attention(q, k, v, scale=1.0, causal=True, attention_mask=~padded)
    assert _attention_calls(ops) == 1
    got = attention.out(out.transpose(1, 2).reshape(batch, length, heads * dim))
    kept = (~padded)[..., None]
    _close(got * kept, want * kept)
    # padded queries see no key: 0 from SDPA and from posenc (their rows feed nothing downstream)
    assert torch.equal(got[padded], want[padded])
    seed = torch.randn_like(want) * kept
    params = [
        x,
        attention.query.weight,
        attention.key.weight,
        attention.per_dim_scale.per_dim_scale,
    ]
    _grads_close(_grads(got, params, seed), _grads(want, params, seed))


class _TimesFMStack(torch.nn.Module):
    """Two of timesfm's own Transformer layers, run as TimesFM_2p5_200M_torch_module runs its
    stack (the patch mask of each patch's last step)."""

    def __init__(self, transformer, configs):
        super().__init__()
        config = configs.TransformerConfig(
            model_dims=64,
            hidden_dims=64,
            num_heads=4,
            attention_norm="rms",
            feedforward_norm="rms",
            qk_norm="rms",
            use_bias=True,
            use_rotary_position_embeddings=True,
            ff_activation="swish",
            fuse_qkv=True,
        )
        self.layers = torch.nn.ModuleList([transformer.Transformer(config) for _ in range(2)])

    def forward(self, x, padded):
        for layer in self.layers:
            x, _ = layer(x, padded)
        return x


def test_timesfm25_patch_equal():
    transformer = pytest.importorskip("timesfm.torch.transformer")
    configs = importlib.import_module("timesfm.configs")
    torch.manual_seed(0)
    model = _TimesFMStack(transformer, configs).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.attn.per_dim_scale.per_dim_scale.normal_()
    batch, length = 3, 16
    padded = _left_padding(batch, length)
    x = torch.randn(batch, length, 64)
    want = model(x, padded)
    names = posenc_timesfm.patch(model)
    assert names == ["layers.0.attn", "layers.1.attn"]
    with CountOps() as ops:
        got = model(x, padded)
    assert _attention_calls(ops) == 2 and ops.calls["posenc.rope_rotate"] == 4
    kept = (~padded)[..., None]
    _close(got * kept, want * kept)
    seed = torch.randn_like(want) * kept
    params = [p for p in model.parameters() if p.requires_grad]
    got_grads = _grads(model(x, padded), params, seed)
    # a mask that is not causal + left padding (a decode step's) runs timesfm's own function
    attention = model.layers[0].attn
    q, k, v = (torch.randn(batch, 4, 4, 16) for _ in range(3))
    other = torch.rand(batch, 1, 4, 4) > 0.3
    other[..., 0] = True
    with CountOps() as ops:
        fallback = attention.attention_fn(q, k, v, mask=other)
    assert not any(name.startswith("posenc.") for name in ops.calls)
    assert torch.equal(fallback, transformer._torch_dot_product_attention(q, k, v, mask=other))
    assert posenc_timesfm.unpatch(model) == names
    _grads_close(got_grads, _grads(model(x, padded), params, seed))
    with CountOps() as ops:
        again = model(x, padded)
    assert "posenc.rope_rotate" not in ops.calls and torch.equal(again, want)


def test_timesfm25_patch_refusals():
    with pytest.raises(ValueError, match="no timesfm MultiHeadAttention"):
        posenc_timesfm.patch(torch.nn.Linear(2, 2))
    transformer = pytest.importorskip("timesfm.torch.transformer")
    model = _TimesFMStack(transformer, importlib.import_module("timesfm.configs")).double()
    with pytest.raises(ValueError, match="float64 weights"):
        posenc_timesfm.patch(model)
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_transformers_timesfm2_5_positions_and_tables():
    """transformers' TimesFm2_5Model: position_ids = arange - num_masked; posenc's tables are
    TimesFm2_5RotaryEmbedding's to the bit, and its attention layer gives the same output with
    them; posenc's rotation + fused attention give that output to 1e-6."""
    tf = pytest.importorskip("transformers.models.timesfm2_5.modeling_timesfm2_5")
    from transformers import TimesFm2_5Config

    torch.manual_seed(0)
    config = TimesFm2_5Config(
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
        attn_implementation="sdpa",
    )
    rotary = tf.TimesFm2_5RotaryEmbedding(config)
    attention = tf.TimesFm2_5Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        attention.scaling.normal_()
    batch, length = 3, 16
    padded = _left_padding(batch, length)
    positions = torch.arange(length)[None] - padded.to(torch.int32).sum(-1, keepdim=True)
    x = torch.randn(batch, length, 64, requires_grad=True)
    want_cos, want_sin = rotary(x, positions)
    cos, sin = posenc.rope_cos_sin(positions, rotary.inv_freq)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    from transformers.masking_utils import create_causal_mask

    mask = create_causal_mask(
        config=config, inputs_embeds=x, attention_mask=(~padded).to(torch.int64), cache=None
    )
    want, _ = attention(x, position_embeddings=(want_cos, want_sin), attention_mask=mask)
    with_posenc_tables, _ = attention(x, position_embeddings=(cos, sin), attention_mask=mask)
    assert torch.equal(with_posenc_tables, want)
    shape = (batch, length, 4, 16)
    q = attention.q_proj(x).view(shape).transpose(1, 2)
    k = attention.k_proj(x).view(shape).transpose(1, 2)
    v = attention.v_proj(x).view(shape).transpose(1, 2)
    q, k = posenc.apply_rotary_pos_emb(q, k, cos, sin)
    q, k = attention.q_norm(q), attention.k_norm(k)
    q = q * torch.nn.functional.softplus(attention.scaling).mul(1.442695041 / 4.0)
    out = posenc.positional_attention(q, k, v, scale=1.0, causal=True, attention_mask=~padded)
    got = attention.o_proj(out.transpose(1, 2).reshape(batch, length, 64))
    kept = (~padded)[..., None]
    _close(got * kept, want * kept)


def test_transformers_timesfm2_5_patch_equal():
    """posenc.integrations.timesfm.patch on transformers' TimesFm2_5Model (tiny, random):
    left-padded contexts, last hidden states patched = unpatched to 1e-6, forward and backward;
    tables through posenc.rope_cos_sin, attention through posenc's fused kernel."""
    tf = pytest.importorskip("transformers.models.timesfm2_5.modeling_timesfm2_5")
    from transformers import TimesFm2_5Config

    torch.manual_seed(0)
    config = TimesFm2_5Config(
        patch_length=4,
        context_length=64,
        horizon_length=8,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        output_quantile_len=8,
        attn_implementation="sdpa",
    )
    model = tf.TimesFm2_5Model(config).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.scaling.normal_()
    values = torch.randn(3, 64)
    padding = torch.zeros(3, 64, dtype=torch.long)
    padding[1, :20] = 1  # a short context, left-padded by 5 patches
    padding[2, :4] = 1
    kept = (padding.view(3, 16, 4)[..., -1] == 0)[..., None]  # the unpadded patches
    want = model(values, padding).last_hidden_state
    names = posenc_timesfm.patch(model)
    assert names == ["layers.0.self_attn", "layers.1.self_attn", "rotary_emb"]
    with CountOps() as ops:
        got = model(values, padding).last_hidden_state
    assert ops.calls["posenc.rope_cos_sin"] == 1 and _attention_calls(ops) == 2
    _close(got * kept, want * kept)
    seed = torch.randn_like(want) * kept
    params = [p for p in model.parameters() if p.requires_grad]
    got_grads = _grads(model(values, padding).last_hidden_state, params, seed)
    assert posenc_timesfm.unpatch(model) == names
    _grads_close(got_grads, _grads(model(values, padding).last_hidden_state, params, seed))
    with CountOps() as ops:
        again = model(values, padding).last_hidden_state
    assert _attention_calls(ops) == 0 and torch.equal(again, want)


_TIMESFM_ROPE_TYPES = {
    "linear": {"factor": 2.5},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 4},
    "longrope": {
        "short_factor": [1.0, 1.1, 1.3, 1.2, 1.0, 1.7, 2.0, 1.5],
        "long_factor": [1.5, 2.0, 3.0, 1.0, 4.0, 2.5, 6.0, 8.0],
        "original_max_position_embeddings": 6,
    },
    "llama3": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 6,
    },
    "proportional": {"partial_rotary_factor": 0.5},
}


def _timesfm_rope_config(rope_type, **extra):
    from transformers import TimesFm2_5Config

    return TimesFm2_5Config(
        patch_length=4,
        context_length=64,
        horizon_length=8,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        output_quantile_len=8,
        attn_implementation="sdpa",
        max_position_embeddings=10,  # below the 16 patches: dynamic grows, longrope goes long
        rope_parameters={
            "rope_type": rope_type,
            "rope_theta": 10000.0,
            **_TIMESFM_ROPE_TYPES[rope_type],
        },
        **extra,
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("rope_type", sorted(_TIMESFM_ROPE_TYPES))
def test_transformers_timesfm2_5_rope_types_patched(rope_type):
    """TimesFm2_5RotaryEmbedding of every rope type transformers builds it with (its
    ROPE_INIT_FUNCTIONS; posenc refused all but "default"): the patched module's tables equal the
    class's to the bit at positions below, above and again below the original context (dynamic
    grows its ladder and resets it, longrope switches ladders: transformers' own
    dynamic_rope_update runs around posenc's forward), negative positions (left padding)
    included; the patched model's last hidden states equal to 1e-6 (posenc's fused softmax)."""
    tf = pytest.importorskip("transformers.models.timesfm2_5.modeling_timesfm2_5")
    config = _timesfm_rope_config(rope_type)
    theirs = tf.TimesFm2_5RotaryEmbedding(config)
    ours = copy.deepcopy(theirs)
    assert posenc_timesfm.patch(ours) == [""]
    x = torch.zeros(2, 1, 64)
    for length in (5, 16, 37, 7, 16):
        positions = torch.arange(length)[None] - torch.tensor([[0], [3]])
        with CountOps() as ops:
            got = ours(x, positions)
        assert ops.calls["posenc.rope_cos_sin"] == 1
        want = theirs(x, positions)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (rope_type, length)
        assert torch.equal(ours.inv_freq, theirs.inv_freq)
    assert posenc_timesfm.unpatch(ours) == [""]

    torch.manual_seed(0)
    model = tf.TimesFm2_5Model(config).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.scaling.normal_()
    values = torch.randn(3, 64)
    padding = torch.zeros(3, 64, dtype=torch.long)
    padding[1, :20] = 1
    kept = (padding.view(3, 16, 4)[..., -1] == 0)[..., None]
    want = model(values, padding).last_hidden_state
    posenc_timesfm.patch(model)
    with CountOps() as ops:
        got = model(values, padding).last_hidden_state
    assert ops.calls["posenc.rope_cos_sin"] == 1 and _attention_calls(ops) == 2
    posenc_timesfm.unpatch(model)
    _close(got * kept, want * kept)


def test_timesfm_rows_without_keys_take_the_peer():
    """A left-padded query row sees no key: posenc gives 0 there, as SDPA with a boolean mask does,
    but transformers' eager attention (finfo.min added) and timesfm's einsum attention
    (_dot_product_attention) average the values: with left padding those run their own function,
    every position equal (padded ones too); without padding posenc's kernel still runs."""
    tf = pytest.importorskip("transformers.models.timesfm2_5.modeling_timesfm2_5")
    from transformers import TimesFm2_5Config

    torch.manual_seed(0)
    config = TimesFm2_5Config(
        patch_length=4,
        context_length=64,
        horizon_length=8,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        output_quantile_len=8,
        attn_implementation="eager",
    )
    model = tf.TimesFm2_5Model(config).eval()
    values = torch.randn(3, 64)
    padding = torch.zeros(3, 64, dtype=torch.long)
    padding[1, :20] = 1
    want = model(values, padding).last_hidden_state
    posenc_timesfm.patch(model)
    with CountOps() as ops:
        got = model(values, padding).last_hidden_state
    assert _attention_calls(ops) == 0 and torch.equal(got, want)
    unpadded = torch.zeros_like(padding)
    with CountOps() as ops:
        got = model(values, unpadded).last_hidden_state
    assert _attention_calls(ops) == 2
    posenc_timesfm.unpatch(model)
    _close(got, model(values, unpadded).last_hidden_state)

    transformer = pytest.importorskip("timesfm.torch.transformer")
    stack = _TimesFMStack(transformer, importlib.import_module("timesfm.configs")).eval()
    for layer in stack.layers:
        layer.attn.attention_fn = transformer._dot_product_attention
    padded = _left_padding(3, 16)
    x = torch.randn(3, 16, 64)
    want = stack(x, padded)
    posenc_timesfm.patch(stack)
    with CountOps() as ops:
        got = stack(x, padded)
    assert _attention_calls(ops) == 0
    _close(got, want)  # every position, the padded ones too (posenc's rotation: 1e-6)
    with CountOps() as ops:
        got = stack(x, torch.zeros_like(padded))
    assert _attention_calls(ops) == 2
    posenc_timesfm.unpatch(stack)
    _close(got, stack(x, torch.zeros_like(padded)))


# ---- Toto ------------------------------------------------------------------------------------


def _toto():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImportWarning)  # xFormers not installed: SDPA path
        pytest.importorskip("jaxtyping")
        attention = pytest.importorskip("toto.model.attention")
        rope = importlib.import_module("toto.model.rope")
        importlib.import_module("toto.model.transformer")  # its xFormers SwiGLU warning too
    torch.manual_seed(0)
    heads, dim = 4, 16
    # as toto/model/transformer.py builds it: TimeAwareRotaryEmbedding(head_dim, use_xpos=True)
    rotary = rope.TimeAwareRotaryEmbedding(
        dim, use_xpos=True, cache_if_possible=True, seq_before_head_dim=False
    )
    time = attention.TimeWiseMultiheadAttention(
        embed_dim=heads * dim,
        num_heads=heads,
        dropout=0.0,
        rotary_emb=rotary,
        use_memory_efficient_attention=False,
    ).eval()
    return time, rotary


def test_toto_time_attention():
    """Toto's time-wise attention: posenc's interleaved tables (rotary-embedding-torch's to the
    bit) and rotation, Toto's own xPos scale (q * s, k / s), posenc's causal attention."""
    attention, rotary = _toto()
    batch, variates, length = 2, 3, 12
    x = torch.randn(batch, variates, length, 64, requires_grad=True)
    want = attention(0, x)
    q, k, v = attention.get_qkv(attention.rearrange_inputs(x))  # [B * V, H, N, D]
    seq = torch.arange(length, dtype=torch.float32)
    cos, sin = posenc.rope_cos_sin(seq, rotary.freqs, layout="interleaved")
    freqs = rotary.forward(seq)
    assert torch.equal(cos, freqs.cos()) and torch.equal(sin, freqs.sin())
    q, k = posenc.apply_rotary_pos_emb(q, k, cos[None], sin[None], layout="interleaved")
    scale = rotary.get_scale(seq)
    out = posenc.positional_attention(q * scale, k * scale**-1, v, causal=True)
    got = attention.wO(attention.rearrange_output(out, batch, variates, length))
    _close(got, want)
    seed = torch.randn_like(want)
    params = [x, attention.wQKV.weight]
    _grads_close(_grads(got, params, seed), _grads(want, params, seed))


def test_toto_xpos_layout():
    """Toto's get_scale lays the per-pair xPos scales out cat(s, s) while its pairs are (2i, 2i+1)
    (rotary-embedding-torch's own get_scale repeats each twice): the reason posenc's xPos, one
    scale per pair, does not stand in for Toto's. Scale base 512 (the library's default)."""
    _, rotary = _toto()
    seq = torch.arange(12, dtype=torch.float32)
    per_pair = rotary.scale ** ((seq - seq.max() // 2) / rotary.scale_base)[:, None]
    scale = rotary.get_scale(seq)
    assert rotary.scale_base == 512
    assert torch.equal(scale, torch.cat([per_pair, per_pair], -1))
    assert not torch.equal(scale, per_pair.repeat_interleave(2, -1))


def test_toto_patch_equal():
    """toto's own Transformer (time-wise and space-wise layers, SDPA path): patched = unpatched
    to 1e-6, forward and backward; the rotation of every time-wise layer through posenc."""
    _toto()  # imports toto quietly (the xFormers warnings)
    transformer = importlib.import_module("toto.model.transformer")
    torch.manual_seed(0)
    model = transformer.Transformer(
        num_layers=4,
        embed_dim=64,
        num_heads=4,
        mlp_hidden_dim=64,
        dropout=0.0,
        spacewise_every_n_layers=2,
        spacewise_first=False,
        use_memory_efficient_attention=False,
    ).eval()
    time_layers = sum(
        layer.attention_axis == importlib.import_module("toto.model.attention").AttentionAxis.TIME
        for layer in model.layers
    )
    assert 0 < time_layers < 4
    batch, variates, length = 2, 3, 12
    x = torch.randn(batch, variates, length, 64)
    ids = torch.tensor([[0, 0, 1], [0, 1, 2]])[..., None].expand(-1, -1, length)
    want = model(x, ids)
    assert posenc_toto.patch(model) == ["rotary_emb"]  # one module, shared by the layers
    with CountOps() as ops:
        got = model(x, ids)
    assert ops.calls["posenc.apply_rotary"] == time_layers
    _close(got, want)
    seed = torch.randn_like(want)
    params = [p for p in model.parameters() if p.requires_grad]
    got_grads = _grads(model(x, ids), params, seed)
    assert posenc_toto.unpatch(model) == ["rotary_emb"]
    _grads_close(got_grads, _grads(model(x, ids), params, seed))
    with CountOps() as ops:
        again = model(x, ids)
    assert "posenc.apply_rotary" not in ops.calls and torch.equal(again, want)


@pytest.mark.parametrize("seq_dim", [-2, -3])
def test_toto_patch_rotation_layouts(seq_dim):
    """rotate_queries_and_keys patched = Toto's for both of its layouts: [B, H, N, D] (SDPA) and
    [B, N, H, D] (xFormers, seq_dim -3), with a KV-cache offset."""
    _, rotary = _toto()
    shape = (6, 4, 12, 16) if seq_dim == -2 else (6, 12, 4, 16)
    q, k = torch.randn(shape), torch.randn(shape)
    want = rotary.rotate_queries_and_keys(q, k, seq_dim=seq_dim, seq_pos_offset=5)
    posenc_toto.patch(rotary)
    with CountOps() as ops:
        got = rotary.rotate_queries_and_keys(q, k, seq_dim=seq_dim, seq_pos_offset=5)
    assert ops.calls["posenc.apply_rotary"] == 1
    posenc_toto.unpatch(rotary)
    _close(got[0], want[0])
    _close(got[1], want[1])


def test_toto_patch_refusals():
    with pytest.raises(ValueError, match="no Toto TimeAwareRotaryEmbedding"):
        posenc_toto.patch(torch.nn.Linear(2, 2))
    _, rotary = _toto()
    posenc_toto.patch(rotary)
    q = torch.randn(2, 4, 6, 16)
    with pytest.raises(ValueError, match="one position per step"):
        rotary.rotate_queries_and_keys(q, q, seq_pos=torch.arange(12.0).view(2, 6))
    posenc_toto.unpatch(rotary)

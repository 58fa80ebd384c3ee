"""The time-series drop-ins (posenc.integrations.uni2ts, .toto, .timesfm) on activations of another
dtype than the float32 they were patched at (transformers' TimesFM 2.5 also cast before patch()):
each equals the package's own code there, or refuses in one line (ValueError). Checked live
against the packages' own classes (uni2ts 2.0.0, toto-ts 0.2.0, timesfm 3.0.2, transformers 5.24's
timesfm2_5), tiny random instances built by test_timeseries_models' helpers.

What the packages do there, and why posenc refuses rather than computes:

* uni2ts' RotaryProjection keeps float32 cos/sin buffers that model.double() only casts, while
  posenc's tables for float64 theta are float64 products: the patched Moirai attention differed by
  3.8e-8 relative (float64), silently; bfloat16/float16 failed inside posenc.rope_cos_sin, and
  autocast inside posenc.positional_attention (q float32 from the norm, v bfloat16), neither
  naming the patch. That became one line at call time; now those calls (and a cast through a
  lower precision and back) read uni2ts' own rows in their dtype, rotate with posenc's rotation
  and run uni2ts' mask, bias and SDPA: equal to the bit.
* Toto's rotate_queries_and_keys multiplies q of any dtype by float32 tables (products in float32,
  one rounding to q's dtype at the end); so does the patch (posenc's rotation of bfloat16 q by
  float32 tables is float32, then Toto's own scale): equal but for the order of two float32
  products, a few elements in 10^4 one ulp of q's dtype apart (bfloat16: 3 to 8 of 230,400). A
  module moved to float64 after patch() (float64 tables) differed by 3e-8 relative: refused.
* transformers' TimesFm2_5Attention in bfloat16 rounds q, k, the scores and the softmax to
  bfloat16 (SDPA); posenc's kernel computes in float32 inside: last hidden states differed by
  1.7e-2 relative, so the patch refused it. Now, in bfloat16, float16, float64 and under
  autocast, the patch takes transformers' own attention function with posenc's tables and
  rotation (transformers' roundings): equal to the bit, SDPA and eager. The timesfm package's own
  rotation returns float32 for bfloat16 inputs and its attention then raises; the patch answered:
  refused (patch() refuses those weights).
"""

import importlib

import pytest
import torch

from posenc.integrations import timesfm as posenc_timesfm
from posenc.integrations import toto as posenc_toto
from posenc.integrations import uni2ts as posenc_uni2ts
from test_timeseries_models import (
    CountOps,
    _attention_calls,
    _left_padding,
    _moirai,
    _moirai_inputs,
    _packed_ids,
    _TimesFMStack,
    _toto,
)

# ---- Moirai (uni2ts) ------------------------------------------------------------------------


def _moirai_attention_call(attention, dtype):
    torch_util = importlib.import_module("uni2ts.common.torch_util")
    sample, variate, time = _packed_ids()
    x = torch.randn(*sample.shape, 128).to(dtype)
    mask = torch_util.packed_attention_mask(sample)
    return attention(
        x,
        x,
        x,
        attn_mask=mask,
        query_var_id=variate,
        kv_var_id=variate,
        query_time_id=time,
        kv_time_id=time,
    )


def _moirai_patched_equal(model, inputs):
    """The patched model's predictions against uni2ts' own (unpatched afterwards): to the bit,
    through posenc's rotation of uni2ts' own cos/sin rows (its mask, bias and SDPA)."""
    with CountOps() as ops:
        got = model(**inputs)
    assert ops.calls["posenc.apply_rotary"] == 2 and _attention_calls(ops) == 0
    posenc_uni2ts.unpatch(model)
    want = model(**inputs)
    assert got.dtype == want.dtype
    assert torch.equal(got, want), (got.double() - want.double()).abs().max()


def _moirai_attention_equal(model, dtype, time_scale=1):
    """One patched attention of `model` against uni2ts' own: packed and packed-causal masks, ids
    times time_scale (beyond max_seq_len 64: uni2ts' _init_freq regrows its rows in theta's
    dtype); to the bit, posenc's rotation called, no posenc table."""
    torch_util = importlib.import_module("uni2ts.common.torch_util")
    attention = model.encoder.layers[0].self_attn
    sample, variate, time = _packed_ids()
    time = time * time_scale
    torch.manual_seed(4)
    x = torch.randn(*sample.shape, 128).to(dtype)
    for mask in (
        torch_util.packed_attention_mask(sample),
        torch_util.packed_causal_attention_mask(sample, time),
    ):
        call = dict(attn_mask=mask, query_var_id=variate, kv_var_id=variate, query_time_id=time)
        call["kv_time_id"] = time
        want = attention(x, x, x, **call)
        posenc_uni2ts.patch(model)
        with CountOps() as ops:
            got = attention(x, x, x, **call)
        posenc_uni2ts.unpatch(model)
        assert ops.calls["posenc.apply_rotary"] == 1 and "posenc.rope_cos_sin" not in ops.calls
        assert got.dtype == want.dtype == dtype
        assert torch.equal(got, want), (got.double() - want.double()).abs().max()


@pytest.mark.parametrize("time_scale", [1, 40])
@pytest.mark.parametrize("moved", ["before", "after"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_moirai_attention_in_other_dtypes_equal_to_the_bit(dtype, moved, time_scale):
    """Moirai-2's attention cast to float64 / bfloat16 / float16, before or after patch() (posenc
    refused both): uni2ts keeps its cos/sin rows as cast buffers (float32 values in float64,
    rounded in bfloat16/float16) and rounds its rotation, scores and softmax to the dtype; the
    patch reads those rows, rotates with posenc's rotation (uni2ts' roundings) and runs uni2ts'
    mask, bias and SDPA on its layouts: equal to the bit. (uni2ts' Moirai2Module itself does not
    run in bfloat16/float16: its scaling stays float32.)"""
    model = _moirai()
    if moved == "before":
        model.to(dtype)
    posenc_uni2ts.patch(model)
    model.to(dtype)
    posenc_uni2ts.unpatch(model)
    _moirai_attention_equal(model, dtype, time_scale)


def test_moirai_in_float64_equal_to_the_bit():
    """A float64 Moirai2Module, predictions patched = unpatched to the bit (refused before)."""
    model = _moirai().double()
    posenc_uni2ts.patch(model)
    inputs = _moirai_inputs()
    inputs["target"] = inputs["target"].double()
    _moirai_patched_equal(model, inputs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_moirai_under_autocast_equal_to_the_bit(dtype):
    """Under autocast uni2ts projects in the autocast dtype and rotates by its float32 rows
    (posenc refused it): the patch reads those rows and takes uni2ts' mask and SDPA call: equal
    to the bit."""
    model = _moirai()
    posenc_uni2ts.patch(model)
    with torch.autocast("cpu", dtype):
        _moirai_patched_equal(model, _moirai_inputs())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_moirai_cast_through_a_lower_precision_and_back_equal_to_the_bit(dtype):
    # .to(dtype).float() rounds uni2ts' cached cos/sin rows (and theta); uni2ts reads those rows,
    # posenc's tables from theta are 2.1e-4 relative apart (bfloat16): the patch (which refused
    # such a model) now reads uni2ts' rounded rows there, at patch() time and after it
    model = _moirai().to(dtype).float()
    posenc_uni2ts.patch(model)
    _moirai_patched_equal(model, _moirai_inputs())
    model = _moirai()  # cast after patch(): noticed at the call
    posenc_uni2ts.patch(model)
    model.to(dtype).float()
    _moirai_patched_equal(model, _moirai_inputs())


def test_moirai_checked_tables_are_kept_alive_so_a_cast_cannot_reuse_their_address():
    # the call-time check is skipped while the tables' (address, version) are the ones checked;
    # a cast frees the old tables and may allocate the rounded ones at the same address with
    # version 0: the checked storages are kept, so no new table can take their address
    model = _moirai()
    posenc_uni2ts.patch(model)
    model(**_moirai_inputs())
    rotaries = [m for m in model.modules() if "_posenc_uni2ts_table_checked" in m.__dict__]
    assert rotaries
    for rotary in rotaries:
        state, kept, differs = rotary.__dict__["_posenc_uni2ts_table_checked"]
        tables = (rotary.cos, rotary.sin, rotary.theta)
        assert [s.data_ptr() for s in kept] == [t.untyped_storage().data_ptr() for t in tables]
        assert not differs
    model.half().float()  # noticed: uni2ts' rounded rows are read, not posenc's tables
    _moirai_patched_equal(model, _moirai_inputs())
    assert all(r.__dict__["_posenc_uni2ts_table_checked"][2] for r in rotaries)


# ---- Toto -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("seq_dim", [-2, -3])
def test_toto_patched_rotation_other_query_dtypes(dtype, seq_dim):
    """q, k of another dtype than the module's float32 tables: Toto's rotation (float32 products,
    one rounding to q's dtype) to one ulp of q's dtype relative to the largest value, and in
    bfloat16/float16 all but 1e-3 of the elements to the bit (the two float32 products in another
    order move a rounding of q's dtype only near its midpoint: measured 3 to 8 of 230,400 in
    bfloat16, 31 to 35 in float16); 300 positions (bfloat16 positions above 256 are Toto's own
    rounded get_seq_pos)."""
    _, rotary = _toto()
    shape = (6, 4, 300, 16) if seq_dim == -2 else (6, 300, 4, 16)
    torch.manual_seed(0)
    q, k = (torch.randn(shape) * 3).to(dtype), (torch.randn(shape) * 3).to(dtype)
    want = rotary.rotate_queries_and_keys(q, k, seq_dim=seq_dim, seq_pos_offset=5)
    posenc_toto.patch(rotary)
    got = rotary.rotate_queries_and_keys(q, k, seq_dim=seq_dim, seq_pos_offset=5)
    posenc_toto.unpatch(rotary)
    ulp = torch.finfo(dtype).eps
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == dtype
        err = ((g.double() - w.double()).abs().max() / w.double().abs().max()).item()
        assert err <= ulp, f"relative error {err:.3g} above one ulp {ulp:.3g} of {dtype}"
        if dtype != torch.float64:
            assert int((g != w).sum()) <= 1e-3 * w.numel()


def test_toto_patched_then_moved_refuses():
    _, rotary = _toto()
    posenc_toto.patch(rotary)
    rotary.to(torch.float64)
    q = torch.randn(2, 4, 6, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"posenc.integrations.toto: .*float32 frequencies"):
        rotary.rotate_queries_and_keys(q, q)
    posenc_toto.unpatch(rotary)


# ---- TimesFM 2.5 ----------------------------------------------------------------------------


def test_timesfm_patched_then_bfloat16_refuses():
    transformer = pytest.importorskip("timesfm.torch.transformer")
    configs = importlib.import_module("timesfm.configs")
    torch.manual_seed(0)
    model = _TimesFMStack(transformer, configs).eval()
    posenc_timesfm.patch(model)
    model.to(torch.bfloat16)
    x = torch.randn(3, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"posenc.integrations.timesfm: .*bfloat16"):
        model(x, _left_padding(3, 16))
    posenc_timesfm.unpatch(model)


def _hf_timesfm():
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
    return tf.TimesFm2_5Model(config).eval()


def _hf_timesfm_inputs(dtype):
    torch.manual_seed(1)
    values = torch.randn(3, 64).to(dtype)
    padding = torch.zeros(3, 64, dtype=torch.long)
    padding[1, :20] = 1  # left padding: 5 patches
    padding[2, :3] = 1
    return values, padding


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("moved", ["before", "after"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_transformers_timesfm2_5_in_other_dtypes_equal_to_the_bit(dtype, moved, attn):
    """transformers' TimesFM 2.5 in bfloat16 / float16 / float64 (moved before or after patch();
    posenc refused both): its attention rounds q, k, the scores and the softmax to that dtype,
    so the patch takes transformers' own attention function there, with posenc's tables and
    rotation (transformers' roundings): last hidden states equal to the bit."""
    model = _hf_timesfm()
    model.config._attn_implementation = attn
    if moved == "before":
        model.to(dtype)
    names = posenc_timesfm.patch(model)
    model.to(dtype)
    values, padding = _hf_timesfm_inputs(dtype)
    with CountOps() as ops:
        got = model(values, padding).last_hidden_state
    assert ops.calls["posenc.rope_cos_sin"] == 1 and ops.calls["posenc.apply_rotary"] == 2
    assert _attention_calls(ops) == 0
    assert posenc_timesfm.unpatch(model) == names
    want = model(values, padding).last_hidden_state  # transformers' own forward
    assert got.dtype == want.dtype == dtype
    # float64 eager: transformers' own forward gives NaN throughout the series left-padded by 5
    # patches (measured; not posenc's to fix): the same NaN there, every other value to the bit
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num()), (got - want).abs().max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_transformers_timesfm2_5_under_autocast_equal_to_the_bit(dtype):
    """Under autocast transformers projects in the autocast dtype and rotates those q, k by
    float32 tables (float32 products): the patch takes its attention function there, with
    posenc's tables and rotation: equal to the bit (posenc refused autocast)."""
    model = _hf_timesfm()
    values, padding = _hf_timesfm_inputs(torch.float32)
    with torch.autocast("cpu", dtype):
        want = model(values, padding).last_hidden_state
        posenc_timesfm.patch(model)
        with CountOps() as ops:
            got = model(values, padding).last_hidden_state
    assert ops.calls["posenc.apply_rotary"] == 2 and _attention_calls(ops) == 0
    assert torch.equal(got, want), (got.double() - want.double()).abs().max()
    posenc_timesfm.unpatch(model)


def test_transformers_timesfm2_5_linear_rope_in_bfloat16_equal_to_the_bit():
    """A bfloat16 TimesFM 2.5 with rope_parameters {"rope_type": "linear"} (both refused before):
    its inv_freq buffer is rounded to bfloat16 by the cast and read back as float32, by
    transformers and by the patch alike."""
    from test_timeseries_models import _timesfm_rope_config

    tf = pytest.importorskip("transformers.models.timesfm2_5.modeling_timesfm2_5")
    torch.manual_seed(0)
    model = tf.TimesFm2_5Model(_timesfm_rope_config("linear")).eval().to(torch.bfloat16)
    values, padding = _hf_timesfm_inputs(torch.bfloat16)
    want = model(values, padding).last_hidden_state
    posenc_timesfm.patch(model)
    got = model(values, padding).last_hidden_state
    posenc_timesfm.unpatch(model)
    assert torch.equal(got, want)


@pytest.mark.parametrize("packing", ["bidirectional", "causal"])
def test_moirai_patched_without_ids_takes_uni2ts_defaults(packing):
    """Ids left out: uni2ts' GroupedQueryAttention takes time_id = 0..N-1 and variate_id = 0 for
    every token (_get_time_id, _get_var_id); the patch refused that call with a message about
    queries and keys differing. Now the same defaults, equal to uni2ts' to 1e-6 (the fused path's
    tolerance) on a block-per-run mask and on Moirai-2's mask across variates."""
    from test_timeseries_models import _close, _univariate_ids

    torch_util = importlib.import_module("uni2ts.common.torch_util")
    model = _moirai()
    attention = model.encoder.layers[0].self_attn
    if packing == "bidirectional":
        sample, _, _ = _univariate_ids()
        mask = torch_util.packed_attention_mask(sample)
    else:
        sample, _, time = _packed_ids()
        mask = torch_util.packed_causal_attention_mask(sample, time)
    x = torch.randn(*sample.shape, 128)
    want = attention(x, x, x, attn_mask=mask)
    posenc_uni2ts.patch(model)
    got = attention(x, x, x, attn_mask=mask)
    posenc_uni2ts.unpatch(model)
    _close(got, want)

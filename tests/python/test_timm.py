"""posenc.timm against timm's own functions (timm.layers: resample_abs_pos_embed,
build_sincos2d_pos_embed), and the operators behind them under PyTorch's own checks."""

import pytest
import torch

import posenc

timm_layers = pytest.importorskip("timm.layers")


@pytest.mark.parametrize("old,new,prefix,mode,antialias", [
    ((4, 4), (6, 6), 1, "bicubic", True),     # the main job's 1.5x evaluation grid, a CLS row
    ((14, 14), (7, 7), 0, "bicubic", True),   # shrinking: antialias matters
    ((4, 6), (8, 3), 2, "bilinear", False),   # non-square both ways, two prefix rows
    ((7, 7), (9, 12), 1, "bilinear", True),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_resample_abs_pos_embed_equals_timm(old, new, prefix, mode, antialias, dtype):
    torch.manual_seed(0)
    posemb = torch.randn(1, prefix + old[0] * old[1], 24).to(dtype)
    want = timm_layers.resample_abs_pos_embed(posemb, list(new), list(old), num_prefix_tokens=prefix,
                                              interpolation=mode, antialias=antialias)
    got = posenc.timm.resample_abs_pos_embed(posemb, new, old, num_prefix_tokens=prefix,
                                             interpolation=mode, antialias=antialias)
    assert got.shape == want.shape and got.dtype == want.dtype
    # the same F.interpolate on the same float32 values: the same bits
    assert torch.equal(got, want), (got.double() - want.double()).abs().max()
    assert torch.equal(got[:, :prefix], posemb[:, :prefix])  # prefix rows untouched


def test_resample_keeps_timms_early_outs_and_its_square_default():
    posemb = torch.randn(1, 1 + 25, 8)
    assert posenc.timm.resample_abs_pos_embed(posemb, (5, 5)) is posemb
    want = timm_layers.resample_abs_pos_embed(posemb, [7, 7])  # old size: sqrt(25) = 5
    assert torch.equal(posenc.timm.resample_abs_pos_embed(posemb, (7, 7)), want)


def test_resample_keeps_float64_prefix_rows_as_timm_does():
    posemb = torch.randn(1, 1 + 49, 12, dtype=torch.float64)
    want = timm_layers.resample_abs_pos_embed(posemb, [14, 14])
    got = posenc.timm.resample_abs_pos_embed(posemb, (14, 14))
    assert torch.equal(got, want) and torch.equal(got[:, :1], posemb[:, :1])


def test_resample_refuses_in_one_line():
    with pytest.raises(RuntimeError, match="table has 17 rows but prefix 1 \\+ grid 3x3 needs 10"):
        posenc.timm.resample_abs_pos_embed(torch.randn(1, 17, 8), (5, 5), (3, 3))
    with pytest.raises(ValueError, match="interpolation must be 'bicubic' or 'bilinear'"):
        posenc.timm.resample_abs_pos_embed(torch.randn(1, 17, 8), (5, 5), interpolation="nearest")
    with pytest.raises(RuntimeError, match="new_size must be positive"):
        torch.ops.posenc.resample_grid_table(torch.randn(16, 8), [4, 4], [0, 3])


@pytest.mark.parametrize("shape", [(4, 4), (14, 14), (3, 5)])
@pytest.mark.parametrize("reverse_coord", [False, True])
@pytest.mark.parametrize("interleave", [False, True])
def test_build_sincos2d_pos_embed_equals_timm(shape, reverse_coord, interleave):
    kw = dict(dim=64, temperature=10000.0, reverse_coord=reverse_coord,
              interleave_sin_cos=interleave)
    want = timm_layers.build_sincos2d_pos_embed(list(shape), **kw)
    got = posenc.timm.build_sincos2d_pos_embed(shape, **kw)
    assert got.shape == want.shape and got.dtype == want.dtype
    # timm's angles are float32 products (positions <= 13: ~1e-6), posenc's float64 rounded once
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    exact = posenc.timm.build_sincos2d_pos_embed(shape, dtype=torch.float64, **kw)
    assert (exact - got.double()).abs().max() <= 2 ** -24  # posenc's: one rounding of the exact


def test_sincos_takes_two_dimensional_grids_only():
    with pytest.raises(ValueError, match="feat_shape must be \\[height, width\\]"):
        posenc.timm.build_sincos2d_pos_embed([7], dim=24)


def test_the_layouts_would_be_seen():
    # the comparison can fail: sin/cos interleaved against timm's default order differ
    want = timm_layers.build_sincos2d_pos_embed([4, 4], dim=32)
    got = posenc.timm.build_sincos2d_pos_embed((4, 4), dim=32, interleave_sin_cos=True)
    assert (got - want).abs().max() > 0.1


def test_opcheck_grid_operators():
    torch.manual_seed(1)
    table = torch.randn(1 + 16, 8, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.posenc.resample_grid_table.default,
                          (table, [4, 4], [6, 5], 1, "bicubic", True, False))
    coords = torch.rand(2, 6, 2, dtype=torch.float64) * 10
    torch.library.opcheck(torch.ops.posenc.axial_sincos_table.default, (coords, 16, 100.0, "mae"))
    # a learned table trained at one grid takes gradients through the resampling
    torch.autograd.gradcheck(
        lambda t: torch.ops.posenc.resample_grid_table(t, [4, 4], [3, 5], 1, "bilinear", False,
                                                       False), (table,))


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("dtype,emb_dtype", [(torch.float32, torch.float32),
                                             (torch.bfloat16, torch.float32),
                                             (torch.bfloat16, torch.bfloat16)])
def test_apply_rot_embed_cat_is_timms(half, dtype, emb_dtype):
    from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, apply_rot_embed_cat
    rope = RotaryEmbeddingCat(dim=32, in_pixels=False, feat_shape=[7, 9], rotate_half=half)
    emb = rope.get_embed().to(emb_dtype)  # [63, 64]
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 63, 32, generator=g).to(dtype).requires_grad_()
    k = torch.randn(2, 3, 63, 32, generator=g).to(dtype).requires_grad_()
    want_q, want_k = apply_rot_embed_cat(q, emb, half=half), apply_rot_embed_cat(k, emb, half=half)
    got_q, got_k = posenc.timm.apply_rot_embed_cat_qk(q, k, emb, half=half)
    assert got_q.dtype == want_q.dtype
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(posenc.timm.apply_rot_embed_cat(q, emb, half=half), want_q)
    gq = torch.randn_like(want_q)
    want = torch.autograd.grad(want_q, q, gq)[0]
    got = torch.autograd.grad(posenc.timm.apply_rot_embed_cat(q, emb, half=half), q, gq)[0]
    # float32: to the bit; bfloat16 gradients: within one bfloat16 rounding (the backward's
    # products round in another order)
    exact = dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0 if exact else 1e-2, atol=1e-6 if exact else 1.6e-2)


def test_apply_rot_embed_cat_bad_shape_is_one_line():
    with pytest.raises(ValueError, match=r"emb must be \[\.\.\., N, 2D\]"):
        posenc.timm.apply_rot_embed_cat(torch.zeros(1, 2, 5, 8), torch.zeros(5, 8))

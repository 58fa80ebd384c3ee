"""posenc.timm_layers against timm's own functions (timm.layers: resample_abs_pos_embed,
build_sincos2d_pos_embed), and the operators behind them under PyTorch's own checks."""

import pytest
import torch

import posenc

timm_layers = pytest.importorskip("timm.layers")


@pytest.mark.parametrize(
    "old,new,prefix,mode,antialias",
    [
        ((4, 4), (6, 6), 1, "bicubic", True),  # the main job's 1.5x evaluation grid, a CLS row
        ((14, 14), (7, 7), 0, "bicubic", True),  # shrinking: antialias matters
        ((4, 6), (8, 3), 2, "bilinear", False),  # non-square both ways, two prefix rows
        ((7, 7), (9, 12), 1, "bilinear", True),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_resample_abs_pos_embed_equals_timm(old, new, prefix, mode, antialias, dtype):
    torch.manual_seed(0)
    posemb = torch.randn(1, prefix + old[0] * old[1], 24).to(dtype)
    want = timm_layers.resample_abs_pos_embed(
        posemb,
        list(new),
        list(old),
        num_prefix_tokens=prefix,
        interpolation=mode,
        antialias=antialias,
    )
    got = posenc.timm_layers.resample_abs_pos_embed(
        posemb, new, old, num_prefix_tokens=prefix, interpolation=mode, antialias=antialias
    )
    assert got.shape == want.shape and got.dtype == want.dtype
    # the same F.interpolate on the same float32 values: the same bits
    assert torch.equal(got, want), (got.double() - want.double()).abs().max()
    assert torch.equal(got[:, :prefix], posemb[:, :prefix])  # prefix rows untouched


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
@pytest.mark.parametrize("old,new", [((7, 2), (2, 1)), ((3, 3), (5, 1)), ((2, 1), (14, 1))])
def test_resample_to_one_column_with_antialias_equals_timm(old, new, mode):
    # timm hands F.interpolate a channels-last view; torch 2.15's antialiased kernel for a
    # contiguous [1, D, H, W] (posenc's layout before) gives every output row of a one-column
    # grid the first row's value, where the channels-last kernel filters each row: posenc was up
    # to 3.4 apart from timm without a word (found by the hostile review)
    torch.manual_seed(0)
    posemb = torch.randn(1, 1 + old[0] * old[1], 8)
    want = timm_layers.resample_abs_pos_embed(
        posemb, list(new), list(old), interpolation=mode, antialias=True
    )
    got = posenc.timm_layers.resample_abs_pos_embed(
        posemb, new, old, interpolation=mode, antialias=True
    )
    assert torch.equal(got, want), (got - want).abs().max()
    # the first and last rows differ (each filtered at its own place), as the filter's math says
    assert not torch.equal(got[0, 1], got[0, -1])


def test_resample_keeps_timms_early_outs_and_its_square_default():
    posemb = torch.randn(1, 1 + 25, 8)
    assert posenc.timm_layers.resample_abs_pos_embed(posemb, (5, 5)) is posemb
    want = timm_layers.resample_abs_pos_embed(posemb, [7, 7])  # old size: sqrt(25) = 5
    assert torch.equal(posenc.timm_layers.resample_abs_pos_embed(posemb, (7, 7)), want)


def test_resample_keeps_float64_prefix_rows_as_timm_does():
    posemb = torch.randn(1, 1 + 49, 12, dtype=torch.float64)
    want = timm_layers.resample_abs_pos_embed(posemb, [14, 14])
    got = posenc.timm_layers.resample_abs_pos_embed(posemb, (14, 14))
    assert torch.equal(got, want) and torch.equal(got[:, :1], posemb[:, :1])


def test_resample_refuses_in_one_line():
    with pytest.raises(RuntimeError, match="table has 17 rows but prefix 1 \\+ grid 3x3 needs 10"):
        posenc.timm_layers.resample_abs_pos_embed(torch.randn(1, 17, 8), (5, 5), (3, 3))
    with pytest.raises(ValueError, match="interpolation must be 'bicubic' or 'bilinear'"):
        posenc.timm_layers.resample_abs_pos_embed(
            torch.randn(1, 17, 8), (5, 5), interpolation="nearest"
        )
    with pytest.raises(RuntimeError, match="new_size must be positive"):
        torch.ops.posenc.resample_grid_table(torch.randn(16, 8), [4, 4], [0, 3])


@pytest.mark.parametrize("shape", [(4, 4), (14, 14), (3, 5)])
@pytest.mark.parametrize("reverse_coord", [False, True])
@pytest.mark.parametrize("interleave", [False, True])
def test_build_sincos2d_pos_embed_equals_timm(shape, reverse_coord, interleave):
    kw = dict(
        dim=64, temperature=10000.0, reverse_coord=reverse_coord, interleave_sin_cos=interleave
    )
    want = timm_layers.build_sincos2d_pos_embed(list(shape), **kw)
    got = posenc.timm_layers.build_sincos2d_pos_embed(shape, **kw)
    assert got.shape == want.shape and got.dtype == want.dtype
    # timm's angles are float32 products (positions <= 13: ~1e-6), posenc's float64 rounded once
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    exact = posenc.timm_layers.build_sincos2d_pos_embed(shape, dtype=torch.float64, **kw)
    assert (exact - got.double()).abs().max() <= 2**-24  # posenc's: one rounding of the exact


def test_sincos_takes_two_dimensional_grids_only():
    with pytest.raises(ValueError, match="feat_shape must be \\[height, width\\]"):
        posenc.timm_layers.build_sincos2d_pos_embed([7], dim=24)


def test_the_layouts_would_be_seen():
    # the comparison can fail: sin/cos interleaved against timm's default order differ
    want = timm_layers.build_sincos2d_pos_embed([4, 4], dim=32)
    got = posenc.timm_layers.build_sincos2d_pos_embed((4, 4), dim=32, interleave_sin_cos=True)
    assert (got - want).abs().max() > 0.1


def test_opcheck_grid_operators():
    torch.manual_seed(1)
    table = torch.randn(1 + 16, 8, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(
        torch.ops.posenc.resample_grid_table.default,
        (table, [4, 4], [6, 5], 1, "bicubic", True, False),
    )
    coords = torch.rand(2, 6, 2, dtype=torch.float64) * 10
    torch.library.opcheck(torch.ops.posenc.axial_sincos_table.default, (coords, 16, 100.0, "mae"))
    # a learned table trained at one grid takes gradients through the resampling
    torch.autograd.gradcheck(
        lambda t: torch.ops.posenc.resample_grid_table(
            t, [4, 4], [3, 5], 1, "bilinear", False, False
        ),
        (table,),
    )


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize(
    "dtype,emb_dtype",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.bfloat16, torch.bfloat16),
    ],
)
def test_apply_rot_embed_cat_is_timms(half, dtype, emb_dtype):
    from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, apply_rot_embed_cat

    rope = RotaryEmbeddingCat(dim=32, in_pixels=False, feat_shape=[7, 9], rotate_half=half)
    emb = rope.get_embed().to(emb_dtype)  # [63, 64]
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 63, 32, generator=g).to(dtype).requires_grad_()
    k = torch.randn(2, 3, 63, 32, generator=g).to(dtype).requires_grad_()
    want_q, want_k = apply_rot_embed_cat(q, emb, half=half), apply_rot_embed_cat(k, emb, half=half)
    got_q, got_k = posenc.timm_layers.apply_rot_embed_cat_qk(q, k, emb, half=half)
    assert got_q.dtype == want_q.dtype
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(posenc.timm_layers.apply_rot_embed_cat(q, emb, half=half), want_q)
    gq = torch.randn_like(want_q)
    want = torch.autograd.grad(want_q, q, gq)[0]
    got = torch.autograd.grad(posenc.timm_layers.apply_rot_embed_cat(q, emb, half=half), q, gq)[0]
    # float32: to the bit; bfloat16 gradients: within one bfloat16 rounding (the backward's
    # products round in another order)
    exact = dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0 if exact else 1e-2, atol=1e-6 if exact else 1.6e-2)


def test_apply_rot_embed_cat_bad_shape_is_one_line():
    with pytest.raises(ValueError, match=r"emb must be \[\.\.\., N, 2D\]"):
        posenc.timm_layers.apply_rot_embed_cat(torch.zeros(1, 2, 5, 8), torch.zeros(5, 8))


# --- axial RoPE tables: build_rotary_pos_embed, RotaryEmbeddingCat, RotaryEmbedding ---

pos_embed_sincos = pytest.importorskip("timm.layers.pos_embed_sincos")

_GRIDS = [(14, 14), (7, 9), (3, 5, 4), (1, 6)]


@pytest.mark.parametrize("feat_shape", _GRIDS, ids=str)
@pytest.mark.parametrize("grid_type", ["index", "pixel", "centered"])
@pytest.mark.parametrize("in_pixels", [False, True])
@pytest.mark.parametrize("rotate_half", [False, True])
def test_build_rotary_pos_embed_equals_timm(feat_shape, grid_type, in_pixels, rotate_half):
    ref = [16] * len(feat_shape)
    for kwargs in [
        dict(),
        dict(ref_feat_shape=ref),
        dict(grid_offset=0.5),
        dict(grid_indexing="xy"),
        dict(normalize_coords="max"),
        dict(normalize_coords="min", ref_feat_shape=ref, grid_indexing="xy"),
    ]:
        args = dict(
            dim=64, in_pixels=in_pixels, grid_type=grid_type, rotate_half=rotate_half, **kwargs
        )
        want = pos_embed_sincos.build_rotary_pos_embed(list(feat_shape), **args)
        got = posenc.timm_layers.build_rotary_pos_embed(feat_shape, **args)
        for g, w in zip(got, want):  # sin, cos
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape)
            assert torch.equal(g, w), (kwargs, (g - w).abs().max())


@pytest.mark.parametrize("linear_bands", [False, True])
@pytest.mark.parametrize("max_res", [224, 100, 37])
def test_pixel_and_ladder_bands_equal_timm(linear_bands, max_res):
    want = pos_embed_sincos.pixel_freq_bands(16, float(max_res), linear_bands=linear_bands)
    got = torch.ops.posenc.patch_grid_bands(16, True, float(max_res), 1e4, linear_bands)
    assert torch.equal(got, want)
    for temperature in [10000.0, 100.0, 7.5]:
        want = pos_embed_sincos.freq_bands(16, temperature=temperature, step=1)
        assert torch.equal(
            torch.ops.posenc.patch_grid_bands(16, False, 224.0, temperature, False), want
        )


def _eva_settings():  # EVA-02's: ladder bands, index grid, pretraining grid 16 x 16
    return dict(in_pixels=False, ref_feat_shape=[16, 16])


@pytest.mark.parametrize(
    "settings",
    [
        dict(),
        _eva_settings(),
        dict(rotate_half=True),
        dict(grid_type="centered", normalize_coords="max"),
        dict(grid_indexing="xy", linear_bands=True),
    ],
    ids=str,
)
@pytest.mark.parametrize("cached", [False, True])
def test_rotary_embedding_cat_module_equals_timms(settings, cached):
    feat_shape = [12, 10] if cached else None
    want_m = pos_embed_sincos.RotaryEmbeddingCat(32, feat_shape=feat_shape, **settings)
    got_m = posenc.timm_layers.RotaryEmbeddingCat(32, feat_shape=feat_shape, **settings)
    from_timm = posenc.timm_layers.RotaryEmbeddingCat.from_timm(want_m)
    for shape in ([12, 10], [7, 7]):
        want = want_m.get_embed(shape)
        assert torch.equal(got_m.get_embed(shape), want)
        assert torch.equal(from_timm.get_embed(shape), want)
        assert torch.equal(
            got_m.get_embed(shape, dtype=torch.bfloat16),
            want_m.get_embed(shape, dtype=torch.bfloat16),
        )
    x = torch.randn(2, 32, 12, 10)
    assert torch.equal(got_m(x), want_m(x))
    if not cached:
        shapes = [(3, 4), (5, 2), (4, 4)]
        for g, w in zip(got_m.get_batch_embeds(shapes), want_m.get_batch_embeds(shapes)):
            assert torch.equal(g, w)
        assert torch.equal(
            got_m.get_batch_embeds(shapes, seq_len=20), want_m.get_batch_embeds(shapes, seq_len=20)
        )
    else:  # a new grid: the cache follows, as timm's does
        got_m.update_feat_shape([6, 8])
        want_m.update_feat_shape([6, 8])
        assert torch.equal(got_m.get_embed(), want_m.get_embed())


def test_rotary_embedding_module_and_casts_equal_timms():
    want_m = pos_embed_sincos.RotaryEmbedding(32, feat_shape=[8, 8], in_pixels=False)
    got_m = posenc.timm_layers.RotaryEmbedding(32, feat_shape=[8, 8], in_pixels=False)
    for g, w in zip(got_m.get_embed(), want_m.get_embed()):
        assert torch.equal(g, w)
    x = torch.randn(2, 32, 8, 8)
    assert torch.equal(got_m(x), want_m(x))
    # .bfloat16(): the cached tables are cast, the bands stay float32 (as timm keeps them)
    got_m, want_m = got_m.bfloat16(), want_m.bfloat16()
    assert got_m.bands.dtype == torch.float32
    for g, w in zip(got_m.get_embed(), want_m.get_embed()):
        assert g.dtype == torch.bfloat16 and torch.equal(g, w)
    free = posenc.timm_layers.RotaryEmbeddingCat(32, in_pixels=False).half()
    reference = pos_embed_sincos.RotaryEmbeddingCat(32, in_pixels=False).half()
    assert torch.equal(free.get_embed([5, 5]), reference.get_embed([5, 5]))


def test_rotary_tables_rotate_as_timms_eva_attention_does():
    # EVA's attention: q, k [B, H, N, Dh] rotated by RotaryEmbeddingCat(Dh / 2 ... ) tables
    torch.manual_seed(0)
    rope_t = pos_embed_sincos.RotaryEmbeddingCat(
        32, in_pixels=False, feat_shape=[6, 6], ref_feat_shape=[16, 16]
    )
    rope_p = posenc.timm_layers.RotaryEmbeddingCat.from_timm(rope_t)
    q = torch.randn(2, 3, 36, 32)
    want = pos_embed_sincos.apply_rot_embed_cat(q, rope_t.get_embed())
    assert torch.equal(posenc.timm_layers.apply_rot_embed_cat(q, rope_p.get_embed()), want)


def test_axial_rope_bad_input_is_one_line():
    with pytest.raises(ValueError, match="jitter_coords must be finite and >= 1, got 0.5"):
        posenc.timm_layers.RotaryEmbeddingCat(32, jitter_coords=0.5)
    with pytest.raises(ValueError, match="shift_coords must be a real number"):
        posenc.timm_layers.build_rotary_pos_embed([4, 4], shift_coords=True)
    with pytest.raises(RuntimeError, match="unknown grid_type 'pixels'"):
        posenc.timm_layers.build_rotary_pos_embed([4, 4], grid_type="pixels")
    with pytest.raises(RuntimeError, match="grid_indexing must be 'ij' or 'xy', got 'yx'"):
        posenc.timm_layers.build_rotary_pos_embed([4, 4], grid_indexing="yx")
    with pytest.raises(RuntimeError, match="every axis needs >= 1 patch, got shape \\[4, 0\\]"):
        posenc.timm_layers.build_rotary_pos_embed([4, 0])
    with pytest.raises(RuntimeError, match="reference shape \\[16\\] must have one size per axis"):
        posenc.timm_layers.build_rotary_pos_embed([4, 4], ref_feat_shape=[16])
    with pytest.raises(RuntimeError, match="bands must be \\[F\\]"):
        torch.ops.posenc.patch_grid_rope([4, 4], torch.ones(2, 2))
    with pytest.raises(RuntimeError, match="give a shape"):
        posenc.timm_layers.RotaryEmbeddingCat(32).get_embed()


def test_axial_rope_ops_pass_opcheck():
    # the band count is a module constant (a buffer's length): static shapes only; test_schema's
    # mode cannot inspect the Device argument of the aten::to inside (new tensors, no aliasing)
    static = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_static")
    bands = torch.ops.posenc.patch_grid_bands(8, False, 224.0, 100.0, False)
    torch.library.opcheck(
        torch.ops.posenc.patch_grid_rope,
        ([5, 6], bands),
        {"grid_type": "centered", "ref_feat_shape": [8, 8]},
        test_utils=static,
    )
    with pytest.raises(RuntimeError, match="no gradient with respect to the bands"):
        torch.ops.posenc.patch_grid_rope([2, 2], bands.clone().requires_grad_())
    # the fake kernel's shapes are the kernel's
    from torch._subclasses.fake_tensor import FakeTensorMode

    cos, sin = torch.ops.posenc.patch_grid_rope([3, 4, 5], bands, layout="half")
    with FakeTensorMode() as mode:
        fake = torch.ops.posenc.patch_grid_rope([3, 4, 5], mode.from_tensor(bands), layout="half")
    assert fake[0].shape == cos.shape == (60, 48) and fake[1].dtype == sin.dtype


# --- casts: timm keeps its bands >= float32, computes cached tables from fresh float32 bands and
# casts them to the cache's current dtype, and its free tables from the bands buffer as it is ---

_CLASSES = ["RotaryEmbeddingCat", "RotaryEmbedding"]


def _both(cls, *args, **kwargs):
    return (
        getattr(posenc.timm_layers, cls)(*args, **kwargs),
        getattr(pos_embed_sincos, cls)(*args, **kwargs),
    )


def _same(got, want):
    got = torch.cat(got, -1) if isinstance(got, tuple) else got
    want = torch.cat(want, -1) if isinstance(want, tuple) else want
    assert got.dtype == want.dtype and got.device == want.device, (got.dtype, want.dtype)
    assert torch.equal(got, want), (got.double() - want.double()).abs().max()


def _same_buffers(got_m, want_m):
    got, want = dict(got_m.named_buffers()), dict(want_m.named_buffers())
    assert sorted(got) == sorted(want)
    for name in want:
        _same(got[name], want[name])


@pytest.mark.parametrize("cls", _CLASSES)
@pytest.mark.parametrize(
    "casts",
    [
        ("half",),
        ("bfloat16",),
        ("double",),
        ("double", "half"),
        ("half", "double"),
        ("bfloat16", "float"),
    ],
    ids=str,
)
@pytest.mark.parametrize("settings", [_eva_settings(), dict()], ids=["eva", "pixel"])
def test_cached_tables_after_casts_and_new_grids_equal_timms(cls, casts, settings):
    got_m, want_m = _both(cls, 32, feat_shape=[8, 8], **settings)
    for cast in casts:
        got_m, want_m = getattr(got_m, cast)(), getattr(want_m, cast)()
    _same_buffers(got_m, want_m)
    cache = want_m.get_embed()
    dtype = (cache[0] if isinstance(cache, tuple) else cache).dtype  # x in the model's dtype
    for shape in ([6, 7], [6, 7], [9, 5]):  # a new grid: timm's cache keeps its (cast) dtype
        got_m.update_feat_shape(shape)
        want_m.update_feat_shape(shape)
        _same_buffers(got_m, want_m)
        _same(got_m.get_embed(), want_m.get_embed())
        x = torch.randn(2, 32, *shape).to(dtype)
        _same(got_m(x), want_m(x))


@pytest.mark.parametrize("cls", _CLASSES)
@pytest.mark.parametrize("build", ["dtype=float64", ".double()", "default float64"])
@pytest.mark.parametrize(
    "settings",
    [_eva_settings(), dict(), dict(grid_type="centered")],
    ids=["eva", "pixel", "centered"],
)
def test_float64_bands_give_timms_tables(cls, build, settings):
    if build == "default float64":
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            got_m, want_m = _both(cls, 32, **settings)
        finally:
            torch.set_default_dtype(previous)
    elif build == "dtype=float64":
        got_m, want_m = _both(cls, 32, dtype=torch.float64, **settings)
    else:
        got_m, want_m = (m.double() for m in _both(cls, 32, **settings))
    _same_buffers(got_m, want_m)  # bands float64, holding timm's float32 values
    assert got_m.bands.dtype == torch.float64
    # float64 angles (exact float32 grid x float32 band products), sin/cos rounded once
    for dtype in (None, torch.float32, torch.float16, torch.bfloat16):
        _same(got_m.get_embed([7, 9], dtype=dtype), want_m.get_embed([7, 9], dtype=dtype))
    x = torch.randn(2, 32, 7, 9, dtype=torch.float64)
    _same(got_m(x), want_m(x))
    _same(
        posenc.timm_layers.build_rotary_pos_embed([5, 6], bands=want_m.bands),
        pos_embed_sincos.build_rotary_pos_embed([5, 6], bands=want_m.bands),
    )
    # float64 tables kept float64 by timm: not posenc's (its float64-band tables are float32)
    with pytest.raises(RuntimeError, match="float64 tables from float64 bands"):
        got_m.get_embed([7, 9], dtype=torch.float64)
    with pytest.raises(RuntimeError, match="float64 tables from float64 bands"):
        posenc.timm_layers.build_rotary_pos_embed([5, 6], bands=want_m.bands, dtype=torch.float64)
    # cached at construction and on a new grid: from fresh float32 bands, cast to float64
    kwargs = dict(dtype=torch.float64) if build == "dtype=float64" else {}
    got_m, want_m = _both(cls, 32, feat_shape=[8, 8], **kwargs, **settings)
    if build != "dtype=float64":
        got_m, want_m = got_m.double(), want_m.double()
    _same_buffers(got_m, want_m)
    got_m.update_feat_shape([6, 7])
    want_m.update_feat_shape([6, 7])
    _same_buffers(got_m, want_m)


def test_given_bands_keep_timms_output_dtype():
    bands = pos_embed_sincos.pixel_freq_bands(8, 224.0, linear_bands=False)
    for b in (bands, bands.half(), bands.bfloat16(), bands.double()):
        for dtype in (None, torch.float32, torch.bfloat16):
            if b.dtype == torch.float64 and dtype is None:  # timm: dtype=None -> the bands' dtype
                with pytest.raises(RuntimeError, match="float64 tables from float64 bands"):
                    posenc.timm_layers.build_rotary_pos_embed([4, 5], bands=b, dtype=None)
                continue
            _same(
                posenc.timm_layers.build_rotary_pos_embed([4, 5], bands=b, dtype=dtype),
                pos_embed_sincos.build_rotary_pos_embed([4, 5], bands=b, dtype=dtype),
            )


@pytest.mark.parametrize("cls", _CLASSES)
@pytest.mark.parametrize("casts", [(), ("half",), ("double",), ("bfloat16",)], ids=str)
@pytest.mark.parametrize("cached", [False, True])
def test_from_timm_takes_a_cast_modules_state(cls, casts, cached):
    timm_m = getattr(pos_embed_sincos, cls)(
        32, feat_shape=[8, 8] if cached else None, **_eva_settings()
    )
    for cast in casts:
        timm_m = getattr(timm_m, cast)()
    got_m = getattr(posenc.timm_layers, cls).from_timm(timm_m)
    _same_buffers(got_m, timm_m)
    if cached:
        got_m.update_feat_shape([5, 6])
        timm_m.update_feat_shape([5, 6])
        _same_buffers(got_m, timm_m)
    else:
        _same(got_m.get_embed([5, 6]), timm_m.get_embed([5, 6]))


def test_from_timm_refuses_a_cache_it_would_not_give():
    # .half().float(): timm's float32 cache holds float16-rounded values; posenc's would not
    timm_m = (
        pos_embed_sincos.RotaryEmbeddingCat(32, feat_shape=[8, 8], in_pixels=False).half().float()
    )
    with pytest.raises(ValueError, match="cached table is not the one its settings give"):
        posenc.timm_layers.RotaryEmbeddingCat.from_timm(timm_m)
    # posenc's own module, cast the same way, keeps the same rounded values as timm's
    own = (
        posenc.timm_layers.RotaryEmbeddingCat(32, feat_shape=[8, 8], in_pixels=False).half().float()
    )
    _same_buffers(own, timm_m)


def test_apply_rot_embed_cat_broadcasts_a_3d_emb_as_timm_does():
    # timm's `x * cos + rot(x) * sin` aligns an [E, N, 2D] emb with the heads of a 4-D x and with
    # the batch of a 3-D x; posenc's follows, forward and gradients, and refuses other ranks
    from timm.layers.pos_embed_sincos import apply_rot_embed_cat as timms

    g = torch.Generator().manual_seed(3)
    for half in (False, True):
        for xs, es in [
            ((2, 2, 10, 16), (2, 10, 32)),
            ((1, 3, 10, 16), (3, 10, 32)),
            ((2, 3, 10, 16), (1, 10, 32)),
            ((2, 10, 16), (2, 10, 32)),
            ((2, 3, 10, 16), (2, 1, 10, 32)),
            ((2, 3, 10, 16), (1, 1, 10, 32)),
        ]:
            x = torch.randn(xs, generator=g).bfloat16().requires_grad_()
            emb = torch.randn(es, generator=g).requires_grad_()
            a, b = posenc.timm_layers.apply_rot_embed_cat(x, emb, half), timms(x, emb, half)
            assert a.shape == b.shape and torch.equal(a, b), (xs, es)
            grad = torch.randn(b.shape, generator=g).to(b.dtype)
            for u, w in zip(
                torch.autograd.grad(a, (x, emb), grad), torch.autograd.grad(b, (x, emb), grad)
            ):
                assert torch.equal(u, w), (xs, es)
    with pytest.raises(ValueError, match=r"emb must be \[N, 2D\], \[E, N, 2D\] or \[B, 1, N, 2D\]"):
        posenc.timm_layers.apply_rot_embed_cat(torch.randn(2, 2, 10, 16), torch.randn(1, 2, 10, 32))


AUGMENT = [
    dict(shift_coords=0.5),
    dict(jitter_coords=1.5),
    dict(rescale_coords=2.0),
    dict(shift_coords=1.0, jitter_coords=1.2, rescale_coords=1.5),
]


@pytest.mark.parametrize("augment", AUGMENT, ids=str)
@pytest.mark.parametrize(
    "settings",
    [
        dict(in_pixels=False, ref_feat_shape=[16, 16]),
        dict(in_pixels=True),
        dict(in_pixels=False, grid_indexing="xy", rotate_half=True),
        dict(grid_type="centered", in_pixels=False),
    ],
    ids=str,
)
@pytest.mark.parametrize("cls", ["RotaryEmbeddingCat", "RotaryEmbedding"])
def test_axial_modules_augment_with_timms_draws(cls, settings, augment):
    # timm 1.0.x: shift / jitter / rescale_coords in training mode, one draw per get_embed on the
    # bands' device, in DINOv3's order; the same seed gives the same tables
    for feat_shape in (None, [5, 6]):
        theirs = getattr(pos_embed_sincos, cls)(32, feat_shape=feat_shape, **settings, **augment)
        ours = getattr(posenc.timm_layers, cls).from_timm(theirs)
        built = getattr(posenc.timm_layers, cls)(32, feat_shape=feat_shape, **settings, **augment)
        for train in (True, False):
            for m in (theirs, ours, built):
                m.train(train)
            for shape in [[4, 7]] if feat_shape is None else [None]:
                torch.manual_seed(5)
                want = theirs.get_embed(shape)
                for m in (ours, built):
                    torch.manual_seed(5)
                    got = m.get_embed(shape)
                    for g, w in zip(
                        got if cls == "RotaryEmbedding" else [got],
                        want if cls == "RotaryEmbedding" else [want],
                    ):
                        assert g.dtype == w.dtype and torch.equal(g, w), (train, shape)
        torch.manual_seed(6)  # the comparison can fail: each call draws anew
        theirs.train()
        first, second = theirs.get_embed([4, 7]), theirs.get_embed([4, 7])
        first, second = (first, second) if cls == "RotaryEmbeddingCat" else (first[0], second[0])
        assert not torch.equal(first, second)


def test_build_rotary_pos_embed_augments_as_timm():
    kwargs = dict(dim=32, in_pixels=False, shift_coords=0.5, jitter_coords=1.3, rescale_coords=1.7)
    torch.manual_seed(9)
    want = timm_layers.build_rotary_pos_embed([5, 3], **kwargs)
    torch.manual_seed(9)
    got = posenc.timm_layers.build_rotary_pos_embed([5, 3], **kwargs)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)

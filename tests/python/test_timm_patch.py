"""posenc.integrations.timm.patch on timm's own EVA model: the rotary modules replaced by posenc's,
the logits (and gradients) equal to the unpatched model's to the bit. RoPE-Mixed, DINOv3 and
MRoPE models: test_timm_patch_mixed.py."""

import pytest
import torch

import posenc

timm = pytest.importorskip("timm")
eva = pytest.importorskip("timm.models.eva")


def _eva(**kwargs):
    torch.manual_seed(0)
    args = dict(
        img_size=28,
        patch_size=7,
        in_chans=1,
        num_classes=10,
        embed_dim=64,
        depth=2,
        num_heads=2,
        use_rot_pos_emb=True,
        ref_feat_shape=(16, 16),
        swiglu_mlp=True,
    )
    args.update(kwargs)
    return eva.Eva(**args).eval()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(dynamic_img_size=True),
        dict(rope_rotate_half=True),
        dict(rope_grid_indexing="xy"),
        dict(rope_grid_offset=0.5, ref_feat_shape=None),
    ],
    ids=str,
)
def test_patched_eva_gives_timms_logits_and_gradients(kwargs):
    model = _eva(**kwargs)
    x = torch.randn(3, 1, 28, 28)
    want = model(x)
    want.sum().backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    report = posenc.integrations.timm.patch(model)
    assert report == {"patched": ["rope"], "left": []}
    assert isinstance(model.rope, posenc.timm_layers.RotaryEmbeddingCat)
    got = model(x)
    assert torch.equal(got, want)
    got.sum().backward()
    for n, p in model.named_parameters():
        if n in want_grads:
            assert torch.equal(p.grad, want_grads[n]), n
    if kwargs.get("dynamic_img_size"):  # another image size: the tables follow the grid
        model.zero_grad()
        bigger = torch.randn(2, 1, 42, 42)
        patched = model(bigger)
        assert posenc.integrations.timm.unpatch(model) == ["rope"]
        assert torch.equal(model(bigger), patched)
    assert sorted(model.state_dict()) == sorted(_eva(**kwargs).state_dict())  # no new keys


def test_unpatched_module_kinds_are_reported_or_refused():
    class Subclass(timm.layers.RotaryEmbeddingCat):  # not timm's class itself: not assumed
        pass

    model = _eva()
    model.rope = Subclass(32, in_pixels=False, feat_shape=[4, 4])
    report = posenc.integrations.timm.patch(model)
    assert report["patched"] == [] and report["left"] == ["rope: Subclass (not computed by posenc)"]
    with pytest.raises(ValueError, match="rotary modules posenc does not compute: rope: Subclass"):
        posenc.integrations.timm.patch(model, strict=True)
    # RoPE-Mixed, DINOv3 and MRoPE are computed (tests/python/test_timm_patch_mixed.py)
    mixed = _eva(rope_type="mixed", ref_feat_shape=None)
    assert posenc.integrations.timm.patch(mixed) == {"patched": ["rope"], "left": []}
    augmenting = _eva(rope_shift_coords=1.0).double()  # float64 training tables: not posenc's
    report = posenc.integrations.timm.patch(augmenting)
    assert report["left"] == [
        "rope: float64 bands with coordinate augmentation give float64 "
        "tables in timm's training mode, which posenc's operators round to "
        "float32"
    ]
    with pytest.raises(ValueError, match="expected an nn.Module"):
        posenc.integrations.timm.patch("eva")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(rope_shift_coords=1.0, rope_jitter_coords=1.5, rope_rescale_coords=2.0),
        dict(rope_rescale_coords=1.5, dynamic_img_size=True),
    ],
    ids=str,
)
def test_patched_eva_augmenting_in_training_gives_timms_logits(kwargs):
    reference = _eva(**kwargs).train()
    model = _eva(**kwargs).train()
    assert posenc.integrations.timm.patch(model, strict=True)["patched"] == ["rope"]
    x = torch.randn(3, 1, 28, 28)
    runs = []
    for m in (reference, model):
        torch.manual_seed(4)
        logits = m(x)
        logits.sum().backward()
        runs.append((logits, [p.grad for p in m.parameters()], m(x)))
    (want, want_grads, want_next), (got, got_grads, got_next) = runs
    assert torch.equal(got, want) and torch.equal(got_next, want_next)
    assert all(torch.equal(g, w) for g, w in zip(got_grads, want_grads))
    assert not torch.equal(got, got_next)  # each forward draws new coordinates
    assert torch.equal(model.eval()(x), reference.eval()(x))  # eval: no draws, the same table


def _rope_state(module):
    return {n: (b.dtype, b.device, b.clone()) for n, b in module.named_buffers()}


def _same_state(got, want):
    assert sorted(got) == sorted(want)
    for n in want:
        assert got[n][:2] == want[n][:2], (n, got[n][:2], want[n][:2])
        assert torch.equal(got[n][2], want[n][2]), n


@pytest.mark.parametrize("cast", ["double", "bfloat16", "half"])
@pytest.mark.parametrize("kwargs", [dict(), dict(dynamic_img_size=True)], ids=str)
def test_patched_cast_eva_gives_timms_logits(cast, kwargs):
    model = getattr(_eva(**kwargs), cast)()
    dtype = model.cls_token.dtype
    x = torch.randn(2, 1, 28, 28, dtype=dtype)
    want = model(x)
    want_rope = model.rope
    assert posenc.integrations.timm.patch(model)["patched"] == ["rope"]
    _same_state(_rope_state(model.rope), _rope_state(want_rope))
    got = model(x)
    assert got.dtype == want.dtype and torch.equal(got, want), (got - want).abs().max()
    if kwargs:  # another image size: tables from the cast bands, as timm's
        bigger = torch.randn(2, 1, 42, 42, dtype=dtype)
        patched = model(bigger)
        posenc.integrations.timm.unpatch(model)
        assert torch.equal(model(bigger), patched)


@pytest.mark.parametrize(
    "casts", [("double",), ("bfloat16",), ("half", "float"), ("double", "half")], ids=str
)
@pytest.mark.parametrize("kwargs", [dict(), dict(dynamic_img_size=True)], ids=str)
def test_unpatch_gives_back_the_module_in_the_models_state(casts, kwargs):
    # the same steps on a model never patched: its rope is what unpatch must give back
    reference, model = _eva(**kwargs), _eva(**kwargs)
    posenc.integrations.timm.patch(model)
    for m in (reference, model):
        for cast in casts:
            getattr(m, cast)()
        m.train()
        if not kwargs:
            m.set_input_size(img_size=(35, 35))  # a new grid while patched: update_feat_shape
    _same_state(_rope_state(model.rope), _rope_state(reference.rope))
    dtype = model.cls_token.dtype
    x = torch.randn(2, 1, 35, 35, dtype=dtype)
    model.eval()
    reference.eval()
    patched = model(x)
    assert posenc.integrations.timm.unpatch(model) == ["rope"]
    rope = model.rope
    assert type(rope) is type(reference.rope) and not rope.training
    _same_state(_rope_state(rope), _rope_state(reference.rope))
    assert rope.feat_shape == reference.rope.feat_shape
    assert torch.equal(model(x), patched) and torch.equal(reference(x), patched)
    assert not hasattr(model.rope, "_posenc_timm_original")


def test_a_cache_posenc_would_not_give_is_left_as_it_is():
    model = _eva().half().float()  # the cached table keeps float16 rounding in float32
    report = posenc.integrations.timm.patch(model)
    assert report["patched"] == []
    assert report["left"][0].startswith("rope: RotaryEmbeddingCat's cached table is not the one")
    with pytest.raises(ValueError, match="rotary modules posenc does not compute: rope"):
        posenc.integrations.timm.patch(model, strict=True)


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("vit_small_patch16_rope_224", dict()),
        ("vit_small_patch16_dinov3", dict(dynamic_img_size=False)),
        ("vit_small_patch16_rope_mixed_224", dict()),
        ("vit_small_patch16_dinov3", dict(rope_type="mrope", rope_temperature=10000.0)),
    ],
    ids=["cat", "dinov3", "mixed", "mrope"],
)
def test_a_model_on_the_meta_device_is_left_in_one_line(name, kwargs):
    # built under torch.device("meta") (weights not loaded yet): from_timm compared the module's
    # meta tables with torch.equal and raised NotImplementedError out of patch()
    with torch.device("meta"):
        model = timm.create_model(
            name, pretrained=False, img_size=32, embed_dim=64, depth=1, num_heads=2, **kwargs
        )
    rope = model.rope
    report = posenc.integrations.timm.patch(model)
    assert report["patched"] == [] and model.rope is rope
    assert len(report["left"]) == 1 and "meta device" in report["left"][0], report
    with pytest.raises(ValueError, match="meta device") as e:
        posenc.integrations.timm.patch(model, strict=True)
    assert "\n" not in str(e.value)

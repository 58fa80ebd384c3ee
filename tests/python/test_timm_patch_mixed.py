"""posenc.integrations.timm.patch on timm's RoPE-Mixed, DINOv3 and MRoPE models, run live against
timm 1.0.x (timm/layers/pos_embed_sincos.py RotaryEmbeddingMixed, RotaryEmbeddingDinoV3,
RotaryEmbeddingMRope; timm/models/eva.py): the logits equal to the unpatched model's to the bit, in
eval and in train mode (training-time coordinate augmentation: the same seed gives timm's tables),
at the training resolution and another one; gradients of the input and of every parameter (RoPE-
Mixed's learned frequencies included) equal; state_dict unchanged; posenc.timm_layers's modules on their
own against timm's; bad input in one line.

The models are timm's own registrations (vit_small_patch16_rope_mixed_224,
vit_small_patch16_dinov3; timm 1.0.31 registers no MRoPE model, so the DINOv3 ViT with
rope_type="mrope", as Eva builds it) created with pretrained=False and made small, and NaFlexVit
(timm/models/naflexvit.py) with each rope type on a batch of samples with their own grids."""

import copy

import pytest
import torch

import posenc

timm = pytest.importorskip("timm")
sincos = pytest.importorskip("timm.layers.pos_embed_sincos")

SMALL = dict(
    img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10, init_values=None
)  # no layer scale: gradients of a useful size reach the tables
AUGMENT = dict(rope_shift_coords=0.5, rope_jitter_coords=1.5, rope_rescale_coords=2.0)
MODELS = {
    "mixed": ("vit_small_patch16_rope_mixed_224", {}),
    "mixed_dynamic": ("vit_small_patch16_rope_mixed_224", dict(dynamic_img_size=True)),
    "mixed_augmented": ("vit_small_patch16_rope_mixed_224", dict(dynamic_img_size=True, **AUGMENT)),
    "dinov3": ("vit_small_patch16_dinov3", {}),  # dynamic_img_size=True, timm's registration
    "dinov3_fixed": ("vit_small_patch16_dinov3", dict(dynamic_img_size=False)),  # cached table
    "dinov3_augmented": ("vit_small_patch16_dinov3", AUGMENT),
    "dinov3_periods": ("vit_small_patch16_dinov3", dict(rope_rotate_half=False)),
    "mrope": (
        "vit_small_patch16_dinov3",
        dict(rope_type="mrope", num_heads=2, rope_temperature=10000.0),
    ),
    "mrope_augmented": (
        "vit_small_patch16_dinov3",
        dict(rope_type="mrope", num_heads=2, rope_temperature=10000.0, **AUGMENT),
    ),
}
CLASSES = {
    "mixed": "RotaryEmbeddingMixed",
    "dinov3": "RotaryEmbeddingDinoV3",
    "mrope": "RotaryEmbeddingMRope",
}


def _model(kind):
    name, kwargs = MODELS[kind]
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **dict(SMALL, **kwargs))
    with torch.no_grad():  # attention far from uniform: the positions matter to the logits
        for n, p in model.named_parameters():
            if ".attn." in n and n.endswith("weight"):
                p.normal_(0.0, 0.5)
    return model


def _run(model, x, seed):
    """logits, and the gradients of x and of every parameter, for one seeded forward+backward."""
    model.zero_grad()
    x = x.clone().requires_grad_(True)
    torch.manual_seed(seed)
    logits = model(x)
    (logits.square().sum() + logits.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), x.grad, grads


def _resize(model, size):
    if model.dynamic_img_size:
        return
    model.set_input_size(img_size=(size, size))  # a fixed grid: the rope's update_feat_shape


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_patched_model_gives_timms_logits_and_gradients(kind, mode):
    reference = _model(kind)
    model = copy.deepcopy(reference)
    want_state = reference.state_dict()
    report = posenc.integrations.timm.patch(model, strict=True)
    assert report == {"patched": ["rope"], "left": []}
    assert type(model.rope) is getattr(posenc.timm_layers, CLASSES[kind.split("_")[0]])
    state = model.state_dict()  # the same keys and values (RoPE-Mixed's freqs included)
    assert list(state) == list(want_state)
    assert all(torch.equal(state[k], want_state[k]) for k in state)
    for m in (reference, model):
        m.train(mode == "train")
    for size in (32, 48):  # the training resolution, then 1.5x
        for m in (reference, model):
            _resize(m, size)
        x = torch.randn(3, 3, size, size)
        want, want_x, want_grads = _run(reference, x, seed=size)
        got, got_x, got_grads = _run(model, x, seed=size)
        # the same tables, the same timm attention: the same logits to the bit
        assert torch.equal(got, want), (kind, mode, size, (got - want).abs().max())
        # the same ops under autograd: the gradients are equal too (asked: within rtol 1e-5)
        torch.testing.assert_close(got_x, want_x, rtol=1e-5, atol=0)
        assert sorted(got_grads) == sorted(want_grads)
        for n in want_grads:
            torch.testing.assert_close(got_grads[n], want_grads[n], rtol=1e-5, atol=0, msg=n)
        if kind.startswith("mixed"):  # the learned frequencies learn
            assert got_grads["rope.freqs"].abs().max() > 1e-6
            assert model.rope.freqs is model.rope._posenc_timm_original.freqs


@pytest.mark.parametrize("kind", ["mixed_augmented", "dinov3_augmented", "mrope_augmented"])
def test_augmentation_is_drawn_per_forward_with_timms_random_numbers(kind):
    reference = _model(kind).train()
    model = copy.deepcopy(reference)
    posenc.integrations.timm.patch(model, strict=True)
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(1)
    want = [reference(x) for _ in range(2)]
    torch.manual_seed(1)
    got = [model(x) for _ in range(2)]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    # the comparison can fail: each forward draws new coordinates, and eval mode draws none
    assert not torch.equal(got[0], got[1])
    assert not torch.equal(model.eval()(x), got[0])
    assert torch.equal(model(x), reference.eval()(x))
    torch.manual_seed(1)
    drawn = reference.train().rope.get_embed([4, 4]) if kind.startswith("mrope") else None
    if drawn is not None:  # the tables move by more than rounding
        assert (drawn - reference.eval().rope.get_embed([4, 4])).abs().max() > 0.1


def test_learned_frequencies_train_through_posenc_and_stay_the_models():
    model = _model("mixed_dynamic").train()
    reference = copy.deepcopy(model)
    posenc.integrations.timm.patch(model, strict=True)
    steps = []
    for m in (reference, model):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.5)
        torch.manual_seed(2)
        for _ in range(3):
            optimizer.zero_grad()
            loss = m(torch.randn(2, 3, 32, 32)).logsumexp(-1).mean()
            loss.backward()
            optimizer.step()
        steps.append(m.rope.freqs.detach().clone())
    assert torch.equal(steps[1], steps[0])
    assert not torch.equal(steps[1], _model("mixed_dynamic").rope.freqs.detach())  # they moved
    patched = model.rope
    assert posenc.integrations.timm.unpatch(model) == ["rope"]
    assert model.rope.freqs is patched.freqs and torch.equal(model.rope.freqs, steps[0])


@pytest.mark.parametrize("cast", ["double", "bfloat16"])
@pytest.mark.parametrize("kind", ["mixed", "dinov3", "dinov3_fixed"])
@pytest.mark.parametrize("when", ["before", "after"])
def test_casts_before_or_after_patch_give_timms_logits(kind, cast, when):
    reference = getattr(_model(kind), cast)().eval()
    model = _model(kind).eval()
    if when == "before":
        getattr(model, cast)()
    assert posenc.integrations.timm.patch(model)["patched"] == ["rope"]
    if when == "after":
        getattr(model, cast)()
    x = torch.randn(2, 3, 32, 32, dtype=reference.cls_token.dtype)
    want = reference(x)
    got = model(x)
    assert got.dtype == want.dtype and torch.equal(got, want), (got - want).abs().max()
    # unpatch gives back timm's module in the model's state (dtype, device, train/eval)
    assert posenc.integrations.timm.unpatch(model) == ["rope"]
    assert type(model.rope) is type(reference.rope)
    for (n, a), (_, b) in zip(model.rope.named_buffers(), reference.rope.named_buffers()):
        assert a.dtype == b.dtype and torch.equal(a, b), n
    assert torch.equal(model(x), want)


def test_mrope_in_bfloat16_is_timms_and_in_float64_is_one_line():
    reference = _model("mrope").bfloat16().eval()
    model = _model("mrope").eval()
    posenc.integrations.timm.patch(model, strict=True)
    model.bfloat16()  # inv_freq rebuilt float32, as timm's
    assert model.rope.inv_freq.dtype == torch.float32
    x = torch.randn(2, 3, 32, 32, dtype=torch.bfloat16)
    assert torch.equal(model(x), reference(x))
    # float64: timm's tables are float64 sines, rope_cos_sin's are float32 ones
    model.double()
    with pytest.raises(RuntimeError, match="float64 tables from float64 inv_freq") as info:
        model(x.double())
    _one_line(info)
    cast = _model("mrope").double()
    assert posenc.integrations.timm.patch(cast)["left"] == [
        "rope: float64 inv_freq gives float64 tables in timm, which posenc's rope_cos_sin rounds "
        "to float32"
    ]


def test_unpatch_follows_a_new_grid_and_train_mode():
    reference, model = _model("dinov3_fixed"), _model("dinov3_fixed")
    posenc.integrations.timm.patch(model)
    for m in (reference, model):
        m.set_input_size(img_size=(40, 40))
        m.train()
    assert model.rope.feat_shape == reference.rope.feat_shape == (5, 5)
    assert posenc.integrations.timm.unpatch(model) == ["rope"]
    assert model.rope.training and torch.equal(
        model.rope.pos_embed_cached, reference.rope.pos_embed_cached
    )
    assert not hasattr(model.rope, "_posenc_timm_original")


def _naflex_batch(grids, patch=4, channels=3):
    """NaFlex's collated input: patches [B, N, P*P*C], (y, x) coordinates and validity, each
    sample its own grid, padded to the longest."""
    n = max(h * w for h, w in grids)
    coord = torch.zeros(len(grids), n, 2, dtype=torch.long)
    valid = torch.zeros(len(grids), n, dtype=torch.bool)
    for b, (h, w) in enumerate(grids):
        y, x = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        coord[b, : h * w] = torch.stack([y.flatten(), x.flatten()], -1)
        valid[b, : h * w] = True
    return dict(
        patches=torch.randn(len(grids), n, patch * patch * channels),
        patch_coord=coord,
        patch_valid=valid,
    )


@pytest.mark.parametrize(
    "rope",
    [
        dict(rope_type="axial"),
        dict(rope_type="mixed"),
        dict(rope_type="dinov3", rope_rotate_half=True),
        dict(rope_type="mrope", rope_mrope_section=(4, 6, 6)),
        dict(rope_type="dinov3", rope_rotate_half=True, **AUGMENT),
        dict(rope_type="mixed", **AUGMENT),
    ],
    ids=str,
)
def test_patched_naflexvit_gives_timms_logits_for_variable_grids(rope):
    # NaFlexVit: one batch of samples with their own grids (get_batch_embeds, Mixed's iterator)
    naflexvit = pytest.importorskip("timm.models.naflexvit")
    torch.manual_seed(0)
    cfg = naflexvit.NaFlexVitCfg(patch_size=4, embed_dim=64, depth=2, num_heads=2, **rope)
    reference = naflexvit.NaFlexVit(cfg=cfg, num_classes=10, in_chans=3)
    model = copy.deepcopy(reference)
    assert posenc.integrations.timm.patch(model, strict=True)["patched"] == ["rope"]
    batch = _naflex_batch([(3, 4), (2, 5), (3, 4)])
    image = torch.randn(2, 3, 16, 20)
    for train in (False, True):
        for inputs in (batch, image):
            outputs = []
            for m in (reference, model):
                m.train(train)
                torch.manual_seed(1)
                outputs.append(m(inputs))
            assert torch.equal(outputs[1], outputs[0]), (
                train,
                (outputs[1] - outputs[0]).abs().max(),
            )


# ---- posenc.timm_layers's modules on their own, against timm's ---------------------------------------


def _same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype)
    assert torch.equal(got, want), (got.double() - want.double()).abs().max()


DINO = [
    dict(),
    dict(feat_shape=[6, 5]),
    dict(min_period=0.5, max_period=50.0, feat_shape=[4, 4]),
    dict(rotate_half=False, grid_indexing="xy", grid_offset=0.25, normalize_coords="max"),
    dict(normalize_coords="min", feat_shape=[3, 7]),
    dict(shift_coords=0.3, jitter_coords=1.5, rescale_coords=2.0, feat_shape=[5, 5]),
    dict(rescale_coords=2.0),
]


@pytest.mark.parametrize("kwargs", DINO, ids=str)
def test_dinov3_module_equals_timms(kwargs):
    theirs = sincos.RotaryEmbeddingDinoV3(32, **kwargs)
    ours = posenc.timm_layers.RotaryEmbeddingDinoV3(32, **kwargs)  # timm's signature
    _same(ours.periods, theirs.periods)
    copied = posenc.timm_layers.RotaryEmbeddingDinoV3.from_timm(theirs)
    for train in (False, True):
        for m in (theirs, ours, copied):
            m.train(train)
        for shape in ([7, 3], [4, 4], None):
            if shape is None and theirs.feat_shape is None:
                continue
            torch.manual_seed(11)
            want = theirs.get_embed(shape)
            for m in (ours, copied):
                torch.manual_seed(11)
                _same(m.get_embed(shape), want)
        torch.manual_seed(12)
        want = theirs.get_batch_embeds([(2, 3), (4, 2)], seq_len=9)
        torch.manual_seed(12)
        _same(ours.get_batch_embeds([(2, 3), (4, 2)], seq_len=9), want)
        x = torch.randn(2, 32, 3, 5)
        torch.manual_seed(13)
        want = theirs(x)
        torch.manual_seed(13)
        _same(ours(x), want)


MIXED = [
    dict(),
    dict(feat_shape=[4, 6]),
    dict(grid_indexing="ij", feat_shape=[3, 5]),
    dict(shift_coords=0.5, jitter_coords=1.2, rescale_coords=1.5, feat_shape=[4, 4]),
]


@pytest.mark.parametrize("kwargs", MIXED, ids=str)
def test_mixed_module_equals_timms(kwargs):
    torch.manual_seed(3)
    theirs = sincos.RotaryEmbeddingMixed(64, depth=2, num_heads=4, **kwargs)
    torch.manual_seed(3)
    ours = posenc.timm_layers.RotaryEmbeddingMixed(64, depth=2, num_heads=4, **kwargs)
    _same(ours.freqs.data, theirs.freqs.data)  # timm's initialisation, the same draw
    copied = posenc.timm_layers.RotaryEmbeddingMixed.from_timm(theirs)
    assert copied.freqs is theirs.freqs
    for train in (False, True):
        for m in (theirs, ours, copied):
            m.train(train)
        for shape in ([5, 3], None):
            if shape is None and theirs.feat_shape is None:
                continue
            torch.manual_seed(1)
            want = theirs.get_embed(shape)
            for m in (ours, copied):
                torch.manual_seed(1)
                _same(m.get_embed(shape), want)
        torch.manual_seed(2)
        want = theirs.get_batch_embeds([(2, 3), (4, 2)], seq_len=9)
        torch.manual_seed(2)
        _same(ours.get_batch_embeds([(2, 3), (4, 2)], seq_len=9), want)
        x = torch.randn(2, 64, 3, 4)
        torch.manual_seed(4)
        want = theirs(x, block_index=1)
        torch.manual_seed(4)
        _same(ours(x, block_index=1), want)


@pytest.mark.parametrize(
    "dim,section", [(64, (8, 12, 12)), (72, (8, 12, 12)), (48, (8, 8, 8)), (32, (4, 6, 6))]
)
def test_mrope_module_equals_timms(dim, section):
    kwargs = dict(mrope_section=section, shift_coords=1.0, jitter_coords=1.3)
    theirs = sincos.RotaryEmbeddingMRope(dim, **kwargs)
    ours = posenc.timm_layers.RotaryEmbeddingMRope(dim, **kwargs)
    copied = posenc.timm_layers.RotaryEmbeddingMRope.from_timm(theirs)
    _same(ours.inv_freq, theirs.inv_freq)
    for train in (False, True):
        for m in (theirs, ours, copied):
            m.train(train)
        torch.manual_seed(1)
        want = theirs.get_embed([5, 7])
        for m in (ours, copied):
            torch.manual_seed(1)
            _same(m.get_embed([5, 7]), want)
        torch.manual_seed(2)
        want = theirs.get_embed([5, 7], torch.bfloat16)
        torch.manual_seed(2)
        _same(ours.get_embed([5, 7], dtype=torch.bfloat16), want)


def test_mixed_gradients_equal_timms():
    torch.manual_seed(5)
    theirs = sincos.RotaryEmbeddingMixed(32, depth=3, num_heads=2)
    ours = posenc.timm_layers.RotaryEmbeddingMixed.from_timm(theirs)
    weight = torch.randn(3, 2, 12, 32)
    grads = []
    for m in (theirs, ours):
        theirs.freqs.grad = None
        (m.get_embed([3, 4]) * weight).sum().backward()
        grads.append(theirs.freqs.grad.clone())
    assert grads[0].abs().max() > 0.1
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=0)


# ---- what posenc leaves to timm, and bad input ------------------------------------------------


def test_what_patch_leaves_is_reported_or_refused():
    class Subclass(sincos.RotaryEmbeddingDinoV3):  # not timm's class itself: not assumed
        pass

    model = _model("dinov3")
    model.rope = Subclass(16, temperature=100.0)
    report = posenc.integrations.timm.patch(model)
    assert report == {"patched": [], "left": ["rope: Subclass (not computed by posenc)"]}
    with pytest.raises(ValueError, match="rotary modules posenc does not compute: rope: Subclass"):
        posenc.integrations.timm.patch(model, strict=True)
    edited = _model("dinov3_fixed")
    edited.rope.pos_embed_cached.add_(1e-3)
    assert posenc.integrations.timm.patch(edited)["left"] == [
        "rope: the timm module's cached table is not the one its settings give (cast through a "
        "lower precision and back, or edited); posenc would not give the same tables"
    ]


def _one_line(info) -> str:
    text = str(info.value).split("\nException raised from")[0].strip()
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize(
    "call,error,message",
    [
        (
            lambda: posenc.timm_layers.RotaryEmbeddingMixed(30, depth=2, num_heads=4),
            ValueError,
            "dim / num_heads must be a whole multiple of 4, got dim 30, num_heads 4",
        ),
        (
            lambda: posenc.timm_layers.RotaryEmbeddingDinoV3(32, jitter_coords=0.5),
            ValueError,
            "jitter_coords must be finite and >= 1, got 0.5",
        ),
        (
            lambda: posenc.timm_layers.RotaryEmbeddingDinoV3(32, shift_coords="1"),
            ValueError,
            "shift_coords must be a real number",
        ),
        (
            lambda: posenc.timm_layers.RotaryEmbeddingDinoV3(32, feat_shape=[2, 2, 2]),
            ValueError,
            "feat_shape must be \\[height, width\\]",
        ),
        (
            lambda: posenc.timm_layers.RotaryEmbeddingMRope(64, mrope_section=(20, 2, 12)),
            ValueError,
            "not the interleave of its counts",
        ),
        (
            lambda: posenc.timm_layers.RotaryEmbeddingMRope(64).double().get_embed([2, 2]),
            RuntimeError,
            "float64 tables from float64 inv_freq",
        ),
        (
            lambda: posenc.timm_layers.RotaryEmbeddingMixed(64, 2, 4)(torch.randn(1, 64, 2, 2), 2),
            ValueError,
            "block_index must be in \\[0, 2\\), got 2",
        ),
        (
            lambda: torch.ops.posenc.rope_mixed_cos_sin(
                torch.rand(4, 2), torch.randn(2, 3, 4).double()
            ),
            RuntimeError,
            "freqs must be float32",
        ),
        (
            lambda: torch.ops.posenc.rope_mixed_cos_sin(torch.rand(4, 3), torch.randn(2, 4)),
            RuntimeError,
            "coords must be \\[N, 2\\] \\(x, y\\), got shape \\[4, 3\\]",
        ),
        (
            lambda: torch.ops.posenc.rope_periods_cos_sin(torch.rand(4, 2), torch.ones(3).half()),
            RuntimeError,
            "periods must be float32",
        ),
        (lambda: torch.ops.posenc.dinov3_periods(2), RuntimeError, "dim must be >= 4"),
        (
            lambda: torch.ops.posenc.dinov3_periods(16, None),
            RuntimeError,
            "give min_period and max_period, or temperature",
        ),
        (
            lambda: torch.ops.posenc.patch_grid_coords([3, 0]),
            RuntimeError,
            "feat_shape sizes must be >= 1",
        ),
        (lambda: torch.ops.posenc.patch_grid_coords([3, 4], "centred"), RuntimeError, "centred"),
    ],
)
def test_bad_input_is_one_line(call, error, message):
    with pytest.raises(error, match=message) as info:
        call()
    _one_line(info)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_opcheck_vision_rope_operators(layout):
    coords = torch.rand(6, 2) * 2 - 1
    torch.library.opcheck(
        torch.ops.posenc.rope_periods_cos_sin.default,
        (coords, torch.tensor([1.0, 3.0, 9.0]), layout),
    )
    torch.library.opcheck(
        torch.ops.posenc.rope_mixed_cos_sin.default,
        (coords, torch.randn(2, 3, 4, requires_grad=True), layout),
    )

"""posenc.integrations.diffusers for CogVideoX, LTX-Video, LTX-2, Cosmos, Mochi and Qwen-Image,
against diffusers' own code, live (diffusers 0.42.1): a tiny randomly initialised transformer of
diffusers' own class gives the same output to the bit in float32 with patch() as without, the
rotation running through posenc's operator (counted); gradients (input and parameters, Mochi's
learned frequencies included) within rtol 1e-5; unpatch() puts diffusers' very objects back;
posenc's tables equal diffusers' to the bit at several grids (LTX-2: a video grid with its fps
and an audio track in seconds); CogVideoX's get_3d_rotary_pos_embed equal to diffusers' for both
grid types and crops; what posenc does not compute refused in one line, the model untouched.

Run: POSENC_OPS_LIBRARY=build/libposenc_ops.so \
     python -m pytest tests/python/test_diffusers_families_b.py
"""

import collections
import inspect

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from diffusers.models import attention_processor as dap  # noqa: E402
from diffusers.models import embeddings as demb  # noqa: E402
from diffusers.models.transformers import transformer_cosmos as dcosmos  # noqa: E402
from diffusers.models.transformers import transformer_ltx as dltx  # noqa: E402
from diffusers.models.transformers import transformer_ltx2 as dltx2  # noqa: E402
from diffusers.models.transformers import transformer_mochi as dmochi  # noqa: E402
from diffusers.models.transformers import transformer_qwenimage as dqwen  # noqa: E402
from diffusers.pipelines.cogvideo import pipeline_cogvideox as dcogpipe  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import posenc  # noqa: E402,F401  (loads posenc's operators)
from posenc.integrations import diffusers as pd  # noqa: E402
from posenc.integrations.diffusers import _cogvideox, _cosmos, _ltx, _ltx2, _mochi, _qwenimage  # noqa: E402

# Mochi's rope runs under torch.autocast(..., float32), which CPU autocast warns about (diffusers'
# module and posenc's alike)
pytestmark = pytest.mark.filterwarnings("ignore:In CPU autocast, but the target dtype")

# Gradients: posenc's rotation backward sums its terms in another order than autograd through
# diffusers' formula: equal to float32 rounding, not to the bit.
GRAD_RTOL = 1e-5
GRAD_ATOL = 1e-6  # gradients that cancel to ~0 have no relative precision


class CountOps(TorchDispatchMode):
    """Counts the operators called below autograd (posenc.apply_rotary among them)."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


# -- tiny models: (model, inputs, the input to differentiate, posenc.apply_rotary calls) ---------


def _make_cogvideox(grid_type="linspace"):
    torch.manual_seed(0)
    slice_ = grid_type == "slice"
    model = diffusers.CogVideoXTransformer3DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        time_embed_dim=8,
        text_embed_dim=12,
        num_layers=2,
        sample_width=8,
        sample_height=8,
        sample_frames=9,
        patch_size=2,
        patch_size_t=2 if slice_ else None,
        max_text_seq_length=6,
        use_rotary_positional_embeddings=True,
    )
    frames = 4 if slice_ else 3
    if slice_:  # CogVideoX 1.5's pipeline: slice grids up to the model's base size
        tables = _cogvideox.get_3d_rotary_pos_embed(
            16, None, (4, 4), 2, grid_type="slice", max_size=(4, 4)
        )
    else:  # CogVideoX 1.0's pipeline: the crop of a 4 x 3 grid in the 4 x 4 base
        crops = _cogvideox.get_resize_crop_region_for_grid((4, 3), 4, 4)
        tables = _cogvideox.get_3d_rotary_pos_embed(16, crops, (4, 3), frames)
    width = 8 if slice_ else 6
    inputs = {
        "hidden_states": _randn(1, frames, 4, 8, width),
        "encoder_hidden_states": _randn(1, 6, 12),
        "timestep": torch.tensor([10]),
        "image_rotary_emb": tables,
    }
    return model, inputs, "hidden_states", 2


def _make_cogvideox_slice():
    return _make_cogvideox("slice")


def _make_ltx():
    torch.manual_seed(0)
    model = diffusers.LTXVideoTransformer3DModel(
        in_channels=8,
        out_channels=8,
        num_attention_heads=2,
        attention_head_dim=10,
        cross_attention_dim=20,
        num_layers=2,
        caption_channels=12,
    )  # dim 20: 2 padded channels
    inputs = {
        "hidden_states": _randn(1, 3 * 4 * 4, 8),
        "encoder_hidden_states": _randn(1, 5, 12),
        "timestep": torch.tensor([10]),
        "encoder_attention_mask": torch.ones(1, 5),
        "num_frames": 3,
        "height": 4,
        "width": 4,
        "rope_interpolation_scale": (20 / 24, 32, 32),
    }
    return model, inputs, "hidden_states", 2


def _make_ltx2_config(**extra):
    return dict(
        in_channels=8,
        out_channels=8,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=6,
        audio_cross_attention_dim=12,
        num_layers=2,
        caption_channels=10,
        **extra,
    )


def _make_ltx2(**extra):
    torch.manual_seed(0)
    model = diffusers.LTX2VideoTransformer3DModel(**_make_ltx2_config(**extra))
    inputs = {
        "hidden_states": _randn(1, 2 * 3 * 3, 8),
        "audio_hidden_states": _randn(1, 5, 4),
        "encoder_hidden_states": _randn(1, 4, 10),
        "audio_encoder_hidden_states": _randn(1, 4, 10),
        "timestep": torch.tensor([10.0]),
        "num_frames": 2,
        "height": 3,
        "width": 3,
        "fps": 25.0,
        "audio_num_frames": 5,
    }
    # per layer: video and audio self-attention, a2v and v2a cross attention
    return model, inputs, "hidden_states", 2 * 2 + 2 * 2 * 2


def _make_cosmos():
    torch.manual_seed(0)
    model = diffusers.CosmosTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=12,
        num_layers=2,
        mlp_ratio=2.0,
        text_embed_dim=16,
        adaln_lora_dim=4,
        max_size=(4, 16, 16),
        patch_size=(1, 2, 2),
    )
    inputs = {
        "hidden_states": _randn(1, 4, 3, 8, 8),
        "timestep": torch.tensor([0.5]),
        "encoder_hidden_states": _randn(1, 5, 16),
        "fps": 30,
        "padding_mask": torch.zeros(1, 1, 8, 8),
    }
    return model, inputs, "hidden_states", 2


def _make_mochi():
    torch.manual_seed(0)
    model = diffusers.MochiTransformer3DModel(
        patch_size=2,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=2,
        pooled_projection_dim=8,
        in_channels=4,
        text_embed_dim=16,
        time_embed_dim=4,
        max_sequence_length=8,
    )
    with torch.no_grad():  # diffusers initialises the learned frequencies to 0: no rotation
        model.pos_frequencies.copy_(_randn(*model.pos_frequencies.shape))
    mask = torch.ones(1, 6)
    mask[0, 4:] = 0
    inputs = {
        "hidden_states": _randn(1, 4, 3, 8, 8),
        "encoder_hidden_states": _randn(1, 6, 16),
        "timestep": torch.tensor([10]),
        "encoder_attention_mask": mask,
    }
    return model, inputs, "hidden_states", 2


def _make_qwenimage(layer3d=False):
    torch.manual_seed(0)
    model = diffusers.QwenImageTransformer2DModel(
        patch_size=1,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=12,
        axes_dims_rope=(8, 12, 12),
        use_layer3d_rope=layer3d,
    )
    mask = torch.ones(1, 5)
    mask[0, 4] = 0
    shapes = [[(1, 4, 6), (1, 4, 6)]] if layer3d else [(1, 4, 6)]
    tokens = 48 if layer3d else 24
    inputs = {
        "hidden_states": _randn(1, tokens, 4),
        "encoder_hidden_states": _randn(1, 5, 12),
        "encoder_hidden_states_mask": mask,
        "timestep": torch.tensor([0.5]),
        "img_shapes": shapes,
    }
    return model, inputs, "hidden_states", 0  # a call per stream and per q/k: counted apart


def _make_qwenimage_layer3d():
    return _make_qwenimage(layer3d=True)


MODELS = {
    "cogvideox": _make_cogvideox,
    "cogvideox_slice": _make_cogvideox_slice,
    "ltx": _make_ltx,
    "ltx2": _make_ltx2,
    "cosmos": _make_cosmos,
    "mochi": _make_mochi,
    "qwenimage": _make_qwenimage,
    "qwenimage_layer3d": _make_qwenimage_layer3d,
}
# Qwen-Image rotates img q, img k, txt q, txt k apart: 4 calls a layer
ROTATIONS = {"qwenimage": 8, "qwenimage_layer3d": 8}


def _sample(model, inputs):
    return model(**inputs, return_dict=False)[0]


def _grads(model, inputs, grad_input):
    model.zero_grad(set_to_none=True)
    inputs = dict(inputs)
    x = inputs[grad_input].detach().clone().requires_grad_(True)
    inputs[grad_input] = x
    out = _sample(model, inputs)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weights).sum().backward()
    grads = {"input": x.grad.detach().clone()}
    for name, p in model.named_parameters():
        if p.grad is not None:
            grads[name] = p.grad.detach().clone()
    return grads


def _processors(model):
    return {
        n: m.processor
        for n, m in model.named_modules()
        if hasattr(m, "set_processor") or "processor" in vars(m)
    }


def test_families_are_registered():
    pd.patch(torch.nn.Identity())  # imports the family modules
    names = {f.name for f in pd._registry.FAMILIES}
    assert names >= {
        "cogvideox",
        "ltx",
        "ltx2",
        "ltx2_connector",
        "cosmos",
        "mochi",
        "qwenimage",
        "qwenimage_layer3d",
    }
    assert pd.get_3d_rotary_pos_embed is _cogvideox.get_3d_rotary_pos_embed


@pytest.mark.parametrize("family", sorted(MODELS))
def test_patched_output_equal_to_the_bit(family):
    model, inputs, _, rotating = MODELS[family]()
    model.eval()
    with torch.no_grad():
        want = _sample(model, inputs)
    rotary = {n: m for n, m in model.named_modules() if pd._registry.family_of(m) is not None}
    processors = _processors(model)
    report = pd.patch(model, strict=True)
    assert report["left"] == []
    assert set(rotary) <= set(report["patched"])
    assert any(name.endswith(".processor") for name in report["patched"])
    for name in rotary:
        assert type(model.get_submodule(name)).__module__.startswith("posenc.")
    assert not any(k.startswith("_posenc") for k in model.state_dict())
    with torch.no_grad(), CountOps() as ops:
        got = _sample(model, inputs)
    assert ops.calls["posenc.apply_rotary"] == ROTATIONS.get(family, rotating)
    assert torch.equal(got, want), (got - want).abs().max()

    restored = pd.unpatch(model)
    assert set(restored) == set(report["patched"])
    for name, module in rotary.items():
        assert model.get_submodule(name) is module
    for name, processor in processors.items():
        assert model.get_submodule(name).processor is processor
    with torch.no_grad(), CountOps() as ops:
        again = _sample(model, inputs)
    assert ops.calls["posenc.apply_rotary"] == 0
    assert torch.equal(again, want)


@pytest.mark.parametrize("family", sorted(MODELS))
def test_patched_gradients(family):
    model, inputs, grad_input, _ = MODELS[family]()
    model.train()  # dropout 0 in these configs: deterministic
    want = _grads(model, inputs, grad_input)
    pd.patch(model, strict=True)
    got = _grads(model, inputs, grad_input)
    pd.unpatch(model)
    assert set(got) == set(want)
    if family == "mochi":  # the learned frequencies get their gradient through posenc's backward
        assert want["pos_frequencies"].abs().sum() > 0
    for name in want:
        torch.testing.assert_close(
            got[name],
            want[name],
            rtol=GRAD_RTOL,
            atol=GRAD_ATOL,
            msg=lambda m, n=name: f"{family} gradient {n}: {m}",
        )


# inputs that stay as diffusers' pipelines give them whatever the model's dtype
_KEEP_DTYPE = (
    "image_rotary_emb",
    "timestep",
    "encoder_attention_mask",
    "encoder_hidden_states_mask",
)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("family", sorted(MODELS))
def test_patched_output_in_other_dtypes(family, dtype):
    """diffusers rotates x.float() with float32 tables and casts back: a float64 model's q and k
    are rounded to float32 first, a bfloat16 model's products are computed in float32."""
    if family == "cosmos" and dtype == torch.float64:
        pytest.skip("diffusers' Cosmos does not run in float64 (its RMSNorm refuses double)")
    model, inputs, _, _ = MODELS[family]()
    model.to(dtype).eval()
    inputs = {
        k: v.to(dtype)
        if isinstance(v, torch.Tensor) and v.is_floating_point() and k not in _KEEP_DTYPE
        else v
        for k, v in inputs.items()
    }
    with torch.no_grad():
        want = _sample(model, inputs)
    pd.patch(model, strict=True)
    with torch.no_grad():
        got = _sample(model, inputs)
    pd.unpatch(model)
    assert got.dtype == want.dtype == dtype
    assert torch.equal(got, want), (got.double() - want.double()).abs().max()


@pytest.mark.parametrize(
    "ours,theirs",
    [
        (_cogvideox.CogVideoXAttnProcessor2_0, dap.CogVideoXAttnProcessor2_0),
        (_cogvideox.FusedCogVideoXAttnProcessor2_0, dap.FusedCogVideoXAttnProcessor2_0),
        (_ltx.LTXVideoAttnProcessor, dltx.LTXVideoAttnProcessor),
        (_ltx2.LTX2AudioVideoAttnProcessor, dltx2.LTX2AudioVideoAttnProcessor),
        (_ltx2.LTX2PerturbedAttnProcessor, dltx2.LTX2PerturbedAttnProcessor),
        (_cosmos.CosmosAttnProcessor2_0, dcosmos.CosmosAttnProcessor2_0),
        (_cosmos.CosmosAttnProcessor2_5, dcosmos.CosmosAttnProcessor2_5),
        (_mochi.MochiAttnProcessor2_0, dap.MochiAttnProcessor2_0),
        (_qwenimage.QwenDoubleStreamAttnProcessor2_0, dqwen.QwenDoubleStreamAttnProcessor2_0),
    ],
)
def test_processors_name_every_parameter_diffusers_names(ours, theirs):
    """diffusers' attention modules drop keyword arguments a processor's __call__ does not name
    (image_rotary_emb among them): posenc's take the same names, in the same order. They are
    subclasses of diffusers' (isinstance checks of user code hold)."""
    assert issubclass(ours, theirs)
    assert list(inspect.signature(ours.__call__).parameters) == list(
        inspect.signature(theirs.__call__).parameters
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cogvideox_given_tables_in_the_models_dtype_equal_to_the_bit(dtype):
    # the pipeline's tables cast to the model's dtype: diffusers rotates in float32 (x.float() *
    # cos); patched, the products were rounded to bfloat16 / float16 (191 of 576 outputs apart)
    model, inputs, _, _ = _make_cogvideox()
    model = model.to(dtype).eval()
    inputs = dict(
        inputs,
        hidden_states=inputs["hidden_states"].to(dtype),
        encoder_hidden_states=inputs["encoder_hidden_states"].to(dtype),
        image_rotary_emb=tuple(t.to(dtype) for t in inputs["image_rotary_emb"]),
    )
    with torch.no_grad():
        want = _sample(model, inputs)
        pd.patch(model, strict=True)
        got = _sample(model, inputs)
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    pd.unpatch(model)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ltx_and_mochi_rotations_with_half_tables_equal_to_the_bit(dtype):
    # LTX's, LTX-2's and Mochi's rotations compute x.float() * cos: float32 products whatever the
    # tables' dtype (their rotary modules give float32 tables; these are the rotations alone)
    q, k = _randn(2, 7, 24).to(dtype), (_randn(2, 7, 24) * 2).to(dtype)
    cos, sin = _randn(2, 7, 24).to(dtype), (_randn(2, 7, 24) + 1).to(dtype)
    assert torch.equal(_ltx._rotate_one(q, (cos, sin)), dltx.apply_rotary_emb(q, (cos, sin)))
    got_q, got_k = _ltx.rotate_across_heads(q, k, (cos, sin))
    assert torch.equal(got_q, dltx2.apply_interleaved_rotary_emb(q, (cos, sin)))
    assert torch.equal(got_k, dltx2.apply_interleaved_rotary_emb(k, (cos, sin)))
    model, inputs, _, _ = _make_mochi()
    attention = model.transformer_blocks[0].attn1.to(dtype)
    x = _randn(2, 6, attention.to_q.in_features).to(dtype)
    context = _randn(2, 3, attention.add_q_proj.in_features).to(dtype)
    tables = (_randn(6, 2, 4).to(dtype), (_randn(6, 2, 4) + 1).to(dtype))  # [S, heads, Dh/2]
    mask = torch.ones(2, 3)
    processor = attention.processor
    with torch.no_grad():
        want = processor(attention, x, context, mask, tables)
        got = _mochi.MochiAttnProcessor2_0.from_diffusers(processor)(
            attention, x, context, mask, tables
        )
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_fused_cogvideox_processor_equal_to_the_bit():
    model, inputs, _, _ = _make_cogvideox()
    model.fuse_qkv_projections()
    model.eval()
    assert (
        type(model.transformer_blocks[0].attn1.processor).__name__
        == "FusedCogVideoXAttnProcessor2_0"
    )
    with torch.no_grad():
        want = _sample(model, inputs)
    pd.patch(model, strict=True)
    with torch.no_grad(), CountOps() as ops:
        got = _sample(model, inputs)
    assert ops.calls["posenc.apply_rotary"] == 2 and torch.equal(got, want)


def _outputs(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [
        t for item in (out.to_tuple() if hasattr(out, "to_tuple") else out) for t in _outputs(item)
    ]


def _make_consisid():
    torch.manual_seed(0)
    model = diffusers.ConsisIDTransformer3DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        time_embed_dim=8,
        text_embed_dim=12,
        num_layers=2,
        sample_width=8,
        sample_height=8,
        sample_frames=9,
        patch_size=2,
        max_text_seq_length=6,
        use_rotary_positional_embeddings=True,
        is_train_face=False,
    )
    tables = _cogvideox.get_3d_rotary_pos_embed(16, ((0, 0), (4, 4)), (4, 4), 3)
    inputs = {
        "hidden_states": _randn(1, 3, 4, 8, 8),
        "encoder_hidden_states": _randn(1, 6, 12),
        "timestep": torch.tensor([10]),
        "image_rotary_emb": tables,
    }
    return model, inputs, 2


def _make_cogview3plus():  # CogVideoX's processor without a rotary table: nothing rotates
    torch.manual_seed(0)
    model = diffusers.CogView3PlusTransformer2DModel(
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        out_channels=4,
        text_embed_dim=12,
        time_embed_dim=8,
        condition_dim=4,
        pos_embed_max_size=16,
        sample_size=8,
    )
    return (
        model,
        {
            "hidden_states": _randn(1, 4, 8, 8),
            "encoder_hidden_states": _randn(1, 5, 12),
            "timestep": torch.tensor([10]),
            "original_size": torch.tensor([[8, 8]]),
            "target_size": torch.tensor([[8, 8]]),
            "crop_coords": torch.tensor([[0, 0]]),
        },
        0,
    )


def _make_qwenimage_controlnet():
    torch.manual_seed(0)
    model = diffusers.QwenImageControlNetModel(
        patch_size=1,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=32,
        num_attention_heads=2,
        joint_attention_dim=12,
        axes_dims_rope=(8, 12, 12),
    )
    return (
        model,
        {
            "hidden_states": _randn(1, 24, 4),
            "controlnet_cond": _randn(1, 24, 4),
            "encoder_hidden_states": _randn(1, 5, 12),
            "encoder_hidden_states_mask": torch.ones(1, 5),
            "timestep": torch.tensor([0.5]),
            "img_shapes": [(1, 4, 6)],
        },
        8,
    )


def _make_cosmos_controlnet():
    torch.manual_seed(0)
    model = diffusers.CosmosControlNetModel(
        n_controlnet_blocks=2,
        in_channels=6,
        latent_channels=6,
        model_channels=24,
        num_attention_heads=2,
        attention_head_dim=12,
        mlp_ratio=2.0,
        text_embed_dim=16,
        adaln_lora_dim=4,
        max_size=(4, 16, 16),
    )
    return (
        model,
        {
            "controls_latents": _randn(1, 4, 3, 8, 8),
            "latents": _randn(1, 4, 3, 8, 8),
            "timestep": torch.tensor([0.5]),
            "encoder_hidden_states": _randn(1, 5, 16),
            "condition_mask": torch.ones(1, 1, 3, 8, 8),
            "padding_mask": torch.zeros(1, 1, 8, 8),
            "fps": 24,
        },
        2,
    )


@pytest.mark.parametrize(
    "make",
    [_make_consisid, _make_cogview3plus, _make_qwenimage_controlnet, _make_cosmos_controlnet],
)
def test_other_models_with_these_families_modules(make):
    """Models that reuse these families' rotary modules or processors (ConsisID and CogView3Plus:
    CogVideoX's processor; the Qwen-Image and Cosmos controlnets) are patched by the same table."""
    model, inputs, rotating = make()
    model.eval()
    with torch.no_grad():
        want = _outputs(model(**inputs, return_dict=False))
    report = pd.patch(model, strict=True)
    assert report["patched"] and report["left"] == []
    with torch.no_grad(), CountOps() as ops:
        got = _outputs(model(**inputs, return_dict=False))
    assert ops.calls["posenc.apply_rotary"] == rotating
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    pd.unpatch(model)


def test_cosmos25_image_context_processor_equal_to_the_bit():
    """Cosmos 2.5: the cross attention takes (text, image) context (CosmosAttnProcessor2_5)."""
    torch.manual_seed(0)
    model = diffusers.CosmosTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=12,
        num_layers=2,
        mlp_ratio=2.0,
        text_embed_dim=16,
        adaln_lora_dim=4,
        max_size=(4, 16, 16),
        patch_size=(1, 2, 2),
        img_context_dim_in=8,
        img_context_dim_out=24,
    )
    model.eval()
    assert type(model.transformer_blocks[0].attn2.processor).__name__ == "CosmosAttnProcessor2_5"
    inputs = {
        "hidden_states": _randn(1, 4, 3, 8, 8),
        "timestep": torch.tensor([0.5]),
        "encoder_hidden_states": (_randn(1, 5, 16), _randn(1, 3, 8)),
        "fps": 24,
        "padding_mask": torch.zeros(1, 1, 8, 8),
    }
    with torch.no_grad():
        want = _sample(model, inputs)
    report = pd.patch(model, strict=True)
    assert "transformer_blocks.0.attn2.processor" in report["patched"]
    with torch.no_grad():
        assert torch.equal(_sample(model, inputs), want)


def test_ltx2_perturbed_processor_equal_to_the_bit():
    model, inputs, _, _ = _make_ltx2(perturbed_attn=True)
    model.eval()
    assert any(
        type(p).__name__ == "LTX2PerturbedAttnProcessor" for p in _processors(model).values()
    )
    with torch.no_grad():
        want = _sample(model, inputs)
    assert pd.patch(model, strict=True)["left"] == []
    with torch.no_grad():
        assert torch.equal(_sample(model, inputs), want)


# -- tables ---------------------------------------------------------------------------------------


def _tables_equal(ours, theirs):
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
        assert torch.equal(a, b)


@pytest.mark.parametrize("embed_dim", [16, 48, 64, 128])
@pytest.mark.parametrize("grid,frames", [((1, 1), 1), ((4, 6), 3), ((30, 45), 13), ((17, 9), 7)])
def test_cogvideox_tables_both_grid_types(embed_dim, grid, frames):
    base = (30, 45)  # CogVideoX's 480 x 720 latent grid in patches
    crops = dcogpipe.get_resize_crop_region_for_grid(grid, base[1], base[0])
    assert _cogvideox.get_resize_crop_region_for_grid(grid, base[1], base[0]) == crops
    cases = [
        dict(crops_coords=crops),  # CogVideoX 1.0: the crop, fractional positions
        dict(crops_coords=((0.5, 1.25), (11, 7.5)), theta=500),  # any crop, another theta
        dict(crops_coords=None, grid_type="slice", max_size=base),
    ]  # CogVideoX 1.5
    for case in cases:
        args = dict(embed_dim=embed_dim, grid_size=grid, temporal_size=frames, **case)
        _tables_equal(
            _cogvideox.get_3d_rotary_pos_embed(**args), demb.get_3d_rotary_pos_embed(**args)
        )


def test_cogvideox_signature_is_diffusers():
    ours = inspect.signature(_cogvideox.get_3d_rotary_pos_embed).parameters
    theirs = inspect.signature(demb.get_3d_rotary_pos_embed).parameters
    assert list(ours) == list(theirs)
    assert [p.default for p in ours.values()] == [p.default for p in theirs.values()]


def test_cogvideox_bad_arguments_are_one_line():
    f = _cogvideox.get_3d_rotary_pos_embed
    crops = ((0, 0), (4, 4))
    cases = [
        lambda: f(64, crops, (4, 4), 3, use_real=False),
        lambda: f(64, crops, (4, 4), 3, grid_type="grid"),
        lambda: f(40, crops, (4, 4), 3),  # h axis 15 channels
        lambda: f(0, crops, (4, 4), 3),
        lambda: f(64, crops, (4, 0), 3),
        lambda: f(64, crops, (4, 4), -1),
        lambda: f(64, crops, (4,), 3),
        lambda: f(64, ((0, 0), (4, float("nan"))), (4, 4), 3),
        lambda: f(64, (0, 4), (4, 4), 3),
        lambda: f(64, crops, (4, 4), 3, theta=-5),
        lambda: f(64, None, (4, 4), 3, grid_type="slice"),
        lambda: f(64, None, (8, 4), 3, grid_type="slice", max_size=(4, 4)),
        lambda: _cogvideox.get_resize_crop_region_for_grid((4, 0), 8, 8),
        lambda: _cogvideox.get_resize_crop_region_for_grid(4, 8, 8),
    ]
    for case in cases:
        with pytest.raises(ValueError) as e:
            case()
        assert "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("dim", [6, 20, 64, 100, 2048])
def test_ltx_tables_at_several_grids(dim):
    theirs = dltx.LTXVideoRotaryPosEmbed(dim, patch_size=2, patch_size_t=1)
    ours = _ltx.LTXVideoRotaryPosEmbed.from_diffusers(theirs)
    x = torch.zeros(2, 3)
    for kw in (
        dict(num_frames=1, height=1, width=1),
        dict(num_frames=3, height=4, width=5, rope_interpolation_scale=(20 / 24, 32, 32)),
        dict(num_frames=9, height=16, width=22, rope_interpolation_scale=(0.5, 8.0, 8.0)),
        dict(
            num_frames=2, height=3, width=3, rope_interpolation_scale=(torch.tensor(0.75), 32, 32)
        ),
        dict(video_coords=_randn(2, 3, 37) * 100),
    ):
        _tables_equal(ours(x, **kw), theirs(x, **kw))


@pytest.mark.parametrize("double_precision", [True, False])
@pytest.mark.parametrize("dim", [12, 50, 64, 4096])
def test_ltx2_video_and_audio_tables_on_one_clock(double_precision, dim):
    """A video grid with its fps and an audio track in seconds, self and cross tables."""
    video = dltx2.LTX2AudioVideoRotaryPosEmbed(
        dim, modality="video", double_precision=double_precision
    )
    audio = dltx2.LTX2AudioVideoRotaryPosEmbed(
        dim, scale_factors=[4], modality="audio", double_precision=double_precision
    )
    ours_video = _ltx2.LTX2AudioVideoRotaryPosEmbed.from_diffusers(video)
    ours_audio = _ltx2.LTX2AudioVideoRotaryPosEmbed.from_diffusers(audio)
    for frames, h, w, fps, audio_frames, shift in (
        (1, 1, 1, 24.0, 1, 0),
        (3, 4, 5, 25.0, 7, 2),
        (5, 8, 6, 30000 / 1001, 26, 0),
    ):
        video_coords = video.prepare_video_coords(2, frames, h, w, "cpu", fps=fps)
        audio_coords = audio.prepare_audio_coords(2, audio_frames, "cpu", shift=shift)
        assert torch.equal(
            ours_video.prepare_video_coords(2, frames, h, w, "cpu", fps=fps), video_coords
        )
        assert torch.equal(
            ours_audio.prepare_audio_coords(2, audio_frames, "cpu", shift=shift), audio_coords
        )
        assert torch.equal(
            ours_audio.prepare_coords(2, audio_frames, "cpu"),
            audio.prepare_coords(2, audio_frames, "cpu"),
        )
        for ours, theirs, coords in (
            (ours_video, video, video_coords),
            (ours_audio, audio, audio_coords),
            (ours_video, video, video_coords[:, 0:1]),  # cross: time
            (ours_audio, audio, audio_coords[:, 0:1]),
            (ours_audio, audio, audio_coords[..., 0]),
        ):  # [B, A, N]
            _tables_equal(ours(coords), theirs(coords))


@pytest.mark.parametrize("double_precision", [True, False])
@pytest.mark.parametrize("dim", [7, 64, 3840])
def test_ltx2_connector_tables(double_precision, dim):
    from diffusers.pipelines.ltx2 import connectors

    theirs = connectors.LTX2RotaryPosEmbed1d(dim, double_precision=double_precision)
    ours = _ltx2.LTX2RotaryPosEmbed1d.from_diffusers(theirs)
    for batch, length in ((1, 1), (2, 300), (1, 1024)):
        _tables_equal(ours(batch, length, "cpu"), theirs(batch, length, "cpu"))


@pytest.mark.parametrize("dim", [6, 20, 64, 100])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16, torch.int64])
def test_ltx_and_ltx2_tables_from_coordinates_of_every_dtype(dtype, dim):
    """Given coordinates keep their dtype in diffusers: grid * 2 - 1 in it, angles in its promotion
    with the float32 ladder (float64: float64 tables; bfloat16/float16 rounded there, float32
    angles; integers divided to float32). posenc refused all but float32 and integers."""
    coords = _randn(2, 3, 37, 2) * 60 + 0.3  # not exact in float32
    ltx = dltx.LTXVideoRotaryPosEmbed(dim, patch_size=2, patch_size_t=1)
    x = torch.zeros(2, 3)
    given = coords[..., 0].to(dtype)
    _tables_equal(
        _ltx.LTXVideoRotaryPosEmbed.from_diffusers(ltx)(x, video_coords=given),
        ltx(x, video_coords=given),
    )
    for double_precision in (True, False):
        video = dltx2.LTX2AudioVideoRotaryPosEmbed(dim, double_precision=double_precision)
        audio = dltx2.LTX2AudioVideoRotaryPosEmbed(
            dim, scale_factors=[4], modality="audio", double_precision=double_precision
        )
        for theirs, given in (
            (video, coords.to(dtype)),  # [start, end) bounds
            (video, coords[..., 0].to(dtype)),  # positions
            (video, coords[:, 0:1].to(dtype)),  # cross attention: time
            (audio, coords[:, 0:1].to(dtype)),
        ):
            ours = _ltx2.LTX2AudioVideoRotaryPosEmbed.from_diffusers(theirs)
            _tables_equal(ours(given), theirs(given))


@pytest.mark.parametrize("coords_dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_ltx_models_with_given_coordinates_of_another_dtype_equal_to_the_bit(dtype, coords_dtype):
    """LTX-Video and LTX-2 called with video_coords (and LTX-2's audio_coords) in float64 or
    bfloat16: diffusers' tables are float64 (resp. float32 from rounded positions) and its
    rotation x.float() * cos promotes to them; patched, the same output to the bit, the rotation
    through posenc's operator."""
    if dtype == torch.float64 and coords_dtype == torch.bfloat16:
        pytest.skip("covered by the other rows (float64 models take float32 tables)")
    for make in (_make_ltx, _make_ltx2):
        model, inputs, _, rotating = make()
        model.to(dtype).eval()
        inputs = {
            k: v.to(dtype)
            if isinstance(v, torch.Tensor) and v.is_floating_point() and k not in _KEEP_DTYPE
            else v
            for k, v in inputs.items()
        }
        if make is _make_ltx:
            n = inputs["hidden_states"].shape[1]
            inputs["video_coords"] = (_randn(1, 3, n) * 40 + 0.3).to(coords_dtype)
        else:
            rope = model.rope
            video = rope.prepare_video_coords(1, 2, 3, 3, "cpu", fps=25.0)
            audio = model.audio_rope.prepare_audio_coords(1, 5, "cpu")
            inputs["video_coords"] = (video.double() + 0.3 * _randn(*video.shape)).to(coords_dtype)
            inputs["audio_coords"] = (audio.double() + 0.3 * _randn(*audio.shape)).to(coords_dtype)
        with torch.no_grad():
            want = _sample(model, inputs)
        pd.patch(model, strict=True)
        with torch.no_grad(), CountOps() as ops:
            got = _sample(model, inputs)
        pd.unpatch(model)
        assert ops.calls["posenc.apply_rotary"] == rotating
        assert got.dtype == want.dtype == dtype
        assert torch.equal(got, want), (make.__name__, (got.double() - want.double()).abs().max())


def test_ltx2_text_connectors_patched_to_the_bit():
    """LTX-2's pipeline model that turns the text encoder's states into the DiT's text tokens:
    a 1D rope and the LTX-2 processor."""
    from diffusers.pipelines.ltx2 import connectors

    torch.manual_seed(0)
    model = connectors.LTX2TextConnectors(
        caption_channels=16,
        text_proj_in_factor=3,
        video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=8,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=4,
        audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=4,
    )
    model.eval()
    mask = torch.ones(1, 8)
    mask[0, :2] = 0
    inputs = (_randn(1, 8, 16, 3), mask)
    with torch.no_grad():
        want = model(*inputs)
    report = pd.patch(model, strict=True)
    assert {"video_connector.rope", "audio_connector.rope"} <= set(report["patched"])
    with torch.no_grad(), CountOps() as ops:
        got = model(*inputs)
    assert ops.calls["posenc.apply_rotary"] == 2
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    pd.unpatch(model)


@pytest.mark.parametrize("head_dim", [12, 16, 24, 128])
def test_cosmos_tables_at_several_grids(head_dim):
    for rope_scale in ((2.0, 1.0, 1.0), (1.0, 3.0, 3.0)):
        theirs = dcosmos.CosmosRotaryPosEmbed(
            head_dim, max_size=(16, 64, 64), patch_size=(1, 2, 2), rope_scale=rope_scale
        )
        ours = _cosmos.CosmosRotaryPosEmbed.from_diffusers(theirs)
        for shape, fps in (
            ((1, 2, 1, 2, 2), None),
            ((1, 2, 3, 4, 6), None),
            ((1, 1, 5, 8, 10), 30),
            ((1, 1, 16, 64, 62), 12.5),
        ):
            x = torch.zeros(shape)
            _tables_equal(ours(x, fps=fps), theirs(x, fps=fps))


@pytest.mark.parametrize("grid", [(1, 1, 1), (3, 4, 6), (7, 30, 20)])
def test_mochi_tables_and_their_gradient(grid):
    theirs = dmochi.MochiRoPE()
    ours = _mochi.MochiRoPE.from_diffusers(theirs)
    freqs = _randn(3, 4, 8).requires_grad_(True)
    want = theirs(freqs, *grid, device=torch.device("cpu"), dtype=torch.float32)
    got = ours(freqs, *grid, device=torch.device("cpu"), dtype=torch.float32)
    _tables_equal(got, want)
    (g_want,) = torch.autograd.grad(want[0].sum() + 2 * want[1].sum(), freqs)
    (g_got,) = torch.autograd.grad(got[0].sum() + 2 * got[1].sum(), freqs)
    assert torch.equal(g_got, g_want)


@pytest.mark.parametrize("axes_dim", [[8, 12, 12], [16, 56, 56], [4, 14, 14]])
@pytest.mark.parametrize("scale_rope", [True, False])
def test_qwenimage_tables_at_several_grids(axes_dim, scale_rope):
    cpu = torch.device("cpu")
    theirs = dqwen.QwenEmbedRope(10000, axes_dim, scale_rope=scale_rope)
    ours = _qwenimage.QwenEmbedRope.from_diffusers(theirs)
    for shapes, text in (((1, 1, 1), 1), ([(1, 4, 6)], 7), ([(2, 5, 3)], 30), ((1, 64, 48), 5)):
        _tables_equal(
            ours(shapes, device=cpu, max_txt_seq_len=text),
            theirs(shapes, device=cpu, max_txt_seq_len=text),
        )
    theirs = dqwen.QwenEmbedLayer3DRope(10000, axes_dim, scale_rope=scale_rope)
    ours = _qwenimage.QwenEmbedLayer3DRope.from_diffusers(theirs)
    for shapes, text in (([[(1, 4, 6), (1, 4, 6), (1, 4, 6)]], 7), ([[(1, 2, 2)]], 3)):
        _tables_equal(ours(shapes, text, device=cpu), theirs(shapes, text, device=cpu))


@pytest.mark.parametrize("pairs", [16, 32, 64])
@pytest.mark.parametrize("shape", [(1, 5, 1), (2, 7, 3), (1, 33, 4)])
def test_qwenimage_complex_rotation_equal_to_the_bit(pairs, shape):
    """On the CPU with a multiple of 16 pairs: ATen's complex product runs its vector kernel."""
    x = _randn(*shape, 2 * pairs) * 3
    angles = _randn(shape[1], pairs) * 50
    freqs = torch.polar(torch.ones_like(angles), angles)
    want = dqwen.apply_rotary_emb_qwen(x, freqs, use_real=False)
    assert torch.equal(_qwenimage.rotate_complex(x, freqs), want)


@pytest.mark.parametrize("threads", [1, 2, 3, 5, 7])
def test_qwenimage_rotation_follows_the_thread_split(threads):
    """diffusers' complex product rounds the pairs at a thread chunk's cut inside a row with a
    fused multiply-add (ATen's scalar tail): posenc rotates only where no cut falls off the
    16-pair step, else the processor hands the rotation to diffusers' function; either way the
    result is diffusers'."""
    x = _randn(1, 1024, 24, 128)  # 1.6M complex elements: split among the threads
    angles = _randn(1024, 64) * 30
    freqs = torch.polar(torch.ones_like(angles), angles)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        want = dqwen.apply_rotary_emb_qwen(x, freqs, use_real=False)
        if _qwenimage._posenc_rotates(x):
            assert torch.equal(_qwenimage.rotate_complex(x, freqs), want)
        with CountOps() as ops:
            got = _qwenimage._rotate(x, freqs)
        assert torch.equal(got, want)
        assert ops.calls["posenc.apply_rotary"] == int(_qwenimage._posenc_rotates(x))
    finally:
        torch.set_num_threads(before)


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("coords_dtype", [None, torch.float64, torch.bfloat16])
def test_ltx2_split_rope_patched_to_the_bit(coords_dtype):
    """LTX-2.3's rope_type "split" (refused before): posenc's per-head tables, diffusers' own
    split rotation (addcmul_: a fused multiply-add on the CPU); the output equal to the bit,
    with the model's own coordinates and given float64 / bfloat16 ones."""
    model, inputs, _, _ = _make_ltx2(rope_type="split")
    model.eval()
    if coords_dtype is not None:
        video = model.rope.prepare_video_coords(1, 2, 3, 3, "cpu", fps=25.0)
        audio = model.audio_rope.prepare_audio_coords(1, 5, "cpu")
        inputs["video_coords"] = (video.double() + 0.3 * _randn(*video.shape)).to(coords_dtype)
        inputs["audio_coords"] = (audio.double() + 0.3 * _randn(*audio.shape)).to(coords_dtype)
    ropes = {
        n: m for n, m in model.named_modules() if type(m) is dltx2.LTX2AudioVideoRotaryPosEmbed
    }
    with torch.no_grad():
        want = _sample(model, inputs)
    report = pd.patch(model, strict=True)
    assert report["left"] == [] and set(ropes) <= set(report["patched"])
    with torch.no_grad(), CountOps() as ops:
        got = _sample(model, inputs)
    assert ops.calls["posenc.rope_cos_sin"] == (0 if coords_dtype == torch.float64 else 4)
    assert torch.equal(got, want), (got - want).abs().max()
    pd.unpatch(model)
    assert all(model.get_submodule(n) is m for n, m in ropes.items())


@pytest.mark.parametrize("double_precision", [True, False])
@pytest.mark.parametrize("dim,heads", [(12, 2), (64, 4), (50, 5), (96, 1), (4096, 32)])
def test_ltx2_split_tables(dim, heads, double_precision):
    """The split layout's tables [B, H, N, dim // 2 H], video, audio and cross, the connector's
    1D module too: equal to diffusers' to the bit, the same strides (diffusers' rotation reads
    them as they are)."""
    from diffusers.pipelines.ltx2 import connectors

    kw = dict(rope_type="split", num_attention_heads=heads, double_precision=double_precision)
    video = dltx2.LTX2AudioVideoRotaryPosEmbed(dim, **kw)
    audio = dltx2.LTX2AudioVideoRotaryPosEmbed(dim, scale_factors=[4], modality="audio", **kw)
    video_coords = video.prepare_video_coords(2, 3, 4, 5, "cpu", fps=25.0)
    audio_coords = audio.prepare_audio_coords(2, 7, "cpu", shift=2)
    for theirs, coords in (
        (video, video_coords),
        (video, video_coords[:, 0:1]),
        (audio, audio_coords),
        (video, video_coords.double() + 0.3),
    ):
        ours = _ltx2.LTX2AudioVideoRotaryPosEmbed.from_diffusers(theirs)
        got, want = ours(coords), theirs(coords)
        _tables_equal(got, want)
        assert got[0].stride() == want[0].stride() and got[1].stride() == want[1].stride()
    theirs = connectors.LTX2RotaryPosEmbed1d(dim, **kw)
    ours = _ltx2.LTX2RotaryPosEmbed1d.from_diffusers(theirs)
    for batch, length in ((1, 1), (2, 300)):
        got, want = ours(batch, length, "cpu"), theirs(batch, length, "cpu")
        _tables_equal(got, want)
        assert got[0].stride() == want[0].stride()


def test_qwenimage_head_posenc_does_not_rotate_exactly_is_refused():
    torch.manual_seed(0)
    model = diffusers.QwenImageTransformer2DModel(
        patch_size=1,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=12,
        axes_dims_rope=(4, 6, 6),
    )
    model.eval()
    pos_embed = model.pos_embed
    with pytest.raises(ValueError, match="8 pairs") as e:
        pd.patch(model, strict=True)
    assert "\n" not in str(e.value) and model.pos_embed is pos_embed
    inputs = {
        "hidden_states": _randn(1, 12, 4),
        "encoder_hidden_states": _randn(1, 3, 12),
        "encoder_hidden_states_mask": torch.ones(1, 3),
        "timestep": torch.tensor([0.5]),
        "img_shapes": [(1, 3, 4)],
    }
    with torch.no_grad():
        want = _sample(model, inputs)
    pd.patch(model)  # the processor keeps diffusers' complex product for this head
    with torch.no_grad(), CountOps() as ops:
        got = _sample(model, inputs)
    assert ops.calls["posenc.apply_rotary"] == 0 and torch.equal(got, want)
    pd.unpatch(model)


def test_qwenimage_built_on_the_meta_device_is_left_in_one_line():
    # QwenEmbedRope keeps its tables as plain attributes (not buffers): built under
    # torch.device("meta") they stay meta; patch() compared them and raised NotImplementedError
    with torch.device("meta"):
        model = diffusers.QwenImageTransformer2DModel(
            patch_size=1,
            in_channels=4,
            out_channels=4,
            num_layers=1,
            attention_head_dim=32,
            num_attention_heads=2,
            joint_attention_dim=12,
            axes_dims_rope=(8, 12, 12),
        )
    pos_embed = model.pos_embed
    report = pd.patch(model)
    assert model.pos_embed is pos_embed
    assert len(report["left"]) == 1 and "meta device" in report["left"][0], report
    with pytest.raises(ValueError, match="meta device") as e:
        pd.patch(model, strict=True)
    assert "\n" not in str(e.value)


def test_a_module_posenc_would_compute_otherwise_is_left():
    holder = torch.nn.Module()
    holder.pos_embed = dqwen.QwenEmbedRope(10000, [8, 12, 12], scale_rope=True)
    holder.pos_embed.pos_freqs = holder.pos_embed.pos_freqs * 1.0001  # not what settings give
    report = pd.patch(holder)
    assert report["patched"] == [] and "not what its settings give" in report["left"][0]


def test_bad_inputs_are_one_line():
    ltx = _ltx.LTXVideoRotaryPosEmbed(64)
    ltx2 = _ltx2.LTX2AudioVideoRotaryPosEmbed(64, modality="audio")
    cosmos = _cosmos.CosmosRotaryPosEmbed(12, max_size=(4, 8, 8))
    mochi = _mochi.MochiRoPE()
    cases = [
        lambda: _ltx.LTXVideoRotaryPosEmbed(4),
        lambda: _ltx.LTXVideoRotaryPosEmbed(64, theta=1.0),
        lambda: ltx(torch.zeros(1, 2)),  # no grid and no coordinates
        lambda: ltx(torch.zeros(1, 2), 2, None, 4),
        lambda: _ltx2.LTX2AudioVideoRotaryPosEmbed(64, rope_type="half"),
        lambda: _ltx2.LTX2RotaryPosEmbed1d(64, rope_type="half"),
        lambda: _ltx2.LTX2AudioVideoRotaryPosEmbed(64, modality="text"),
        lambda: ltx2(torch.zeros(1, 3, 5, 2)),  # three axes for audio
        lambda: ltx2(torch.zeros(1, 1, 5, 3)),
        lambda: _cosmos.CosmosRotaryPosEmbed(13),
        lambda: cosmos(torch.zeros(1, 2, 3, 4)),
        lambda: cosmos(torch.zeros(1, 2, 3, 40, 4)),  # beyond max_size
        lambda: mochi(torch.zeros(2, 2, 4), 1, 2, 2),
        lambda: _qwenimage.QwenEmbedRope(10000, [8, 12, 13]),
        lambda: _qwenimage.QwenEmbedRope(10000, [8, 12, 12])((1, 2, 2), None, None),
    ]
    for case in cases:
        with pytest.raises(ValueError) as e:
            case()
        assert "\n" not in str(e.value), str(e.value)

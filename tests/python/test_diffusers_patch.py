"""posenc.integrations.diffusers against diffusers' own code, live (diffusers 0.42.1, pinned in
python/requirements-test.txt): for every family posenc registers (Wan, SkyReels-V2, HunyuanVideo,
HunyuanVideo 1.5, Flux, Flux 2) a tiny randomly initialised transformer of diffusers' own class
gives the same output to the bit in float32 with patch() as without, gradients within rtol 1e-5,
and unpatch() puts diffusers' very objects back; posenc's rotary modules give diffusers' tables to
the bit at several grid sizes (and on diffusers' float32 fallback path); the rotation runs through
posenc's operator (counted); what posenc does not compute is refused in one line.

Run: POSENC_OPS_LIBRARY=build/libposenc_ops.so python -m pytest tests/python/test_diffusers_patch.py
"""

import collections
import warnings

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from diffusers.models import embeddings as demb  # noqa: E402
from diffusers.models.transformers import transformer_flux2 as dflux2  # noqa: E402
from diffusers.models.transformers import transformer_wan as dwan  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import posenc  # noqa: E402,F401  (loads posenc's operators)
from posenc.integrations import diffusers as pd  # noqa: E402
from posenc.integrations.diffusers import _registry  # noqa: E402

# Gradients: the rotation's backward is posenc's (dq = dy cos + rot(dy) (-swap sin)), not autograd's
# through diffusers' formula; measured equal to the bit on an AVX-512 EPYC for every model here,
# held to the contract's bound.
GRAD_RTOL = 1e-5
GRAD_ATOL = 1e-6  # gradients that cancel to ~0 have no relative precision


class CountOps(TorchDispatchMode):
    """Counts the ATen/custom operators called below autograd (posenc.apply_rotary among them)."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _rotations(ops: CountOps) -> int:
    """Calls of posenc's rotation operators (apply_rotary; rope_rotate_qk, the fused kernel the
    processors take where it gives the same results)."""
    return ops.calls["posenc.apply_rotary"] + ops.calls["posenc.rope_rotate_qk"]


def _generator():
    return torch.Generator().manual_seed(0)


def _randn(*shape):
    return torch.randn(*shape, generator=_generator())


def _wan_like(cls, **extra):
    torch.manual_seed(0)
    model = cls(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=16,
        ffn_dim=32,
        num_layers=2,
        rope_max_seq_len=32,
        **extra,
    )
    inputs = {
        "hidden_states": _randn(1, 4, 3, 8, 6),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": _randn(1, 5, 16),
    }
    return model, inputs, "hidden_states", 2  # 2 self-attentions rotate


def _wan():
    return _wan_like(diffusers.WanTransformer3DModel)


def _wan_i2v():
    """Wan's image-to-video attention: image tokens before 512 text tokens, the added k/v."""
    model, inputs, grad_input, rotating = _wan_like(
        diffusers.WanTransformer3DModel, image_dim=8, added_kv_proj_dim=24
    )
    inputs = dict(
        inputs,
        encoder_hidden_states=_randn(1, 512, 16),
        encoder_hidden_states_image=_randn(1, 3, 8),
    )
    return model, inputs, grad_input, rotating


def _skyreels_v2():
    return _wan_like(diffusers.SkyReelsV2Transformer3DModel)


def _hunyuan_video():
    torch.manual_seed(0)
    model = diffusers.HunyuanVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=10,
        num_layers=1,
        num_single_layers=2,
        num_refiner_layers=1,
        patch_size=1,
        patch_size_t=1,
        guidance_embeds=True,
        text_embed_dim=16,
        pooled_projection_dim=8,
        rope_axes_dim=(2, 4, 4),
    )
    inputs = {
        "hidden_states": _randn(1, 4, 2, 4, 6),
        "timestep": torch.tensor([300.0]),
        "encoder_hidden_states": _randn(1, 6, 16),
        "pooled_projections": _randn(1, 8),
        "encoder_attention_mask": torch.ones(1, 6),
        "guidance": torch.tensor([600.0]),
    }
    return model, inputs, "hidden_states", 3  # 1 double-stream, 2 single-stream blocks


def _hunyuan_video_framepack():
    """FramePack: the latents' frames and the clean, 2x and 4x history at their own indices."""
    torch.manual_seed(0)
    model = diffusers.HunyuanVideoFramepackTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=10,
        num_layers=1,
        num_single_layers=1,
        num_refiner_layers=1,
        patch_size=2,
        patch_size_t=1,
        guidance_embeds=True,
        text_embed_dim=16,
        pooled_projection_dim=8,
        rope_axes_dim=(2, 4, 4),
        has_image_proj=True,
        image_proj_dim=16,
        has_clean_x_embedder=True,
    )
    inputs = {
        "hidden_states": _randn(1, 4, 3, 4, 4),
        "timestep": torch.tensor([300]),
        "encoder_hidden_states": _randn(1, 6, 16),
        "pooled_projections": _randn(1, 8),
        "encoder_attention_mask": torch.ones(1, 6),
        "guidance": torch.tensor([600]),
        "image_embeds": _randn(1, 6, 16),
        "indices_latents": torch.tensor([9.0, 10, 11]),
        "latents_clean": _randn(1, 4, 2, 4, 4),
        "indices_latents_clean": torch.tensor([0.0, 12]),
        "latents_history_2x": _randn(1, 4, 2, 4, 4),
        "indices_latents_history_2x": torch.tensor([13.0, 14]),
        "latents_history_4x": _randn(1, 4, 8, 4, 4),
        "indices_latents_history_4x": torch.arange(15, 23).float(),
    }
    return model, inputs, "hidden_states", 2


def _hunyuanimage():
    """HunyuanImage 2.1: HunyuanVideo's tables on a 2D grid, its attention."""
    torch.manual_seed(0)
    model = diffusers.HunyuanImageTransformer2DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=1,
        num_single_layers=2,
        num_refiner_layers=1,
        patch_size=(1, 1),
        text_embed_dim=16,
        rope_axes_dim=(4, 4),
    )
    inputs = {
        "hidden_states": _randn(1, 4, 4, 6),
        "timestep": torch.tensor([300.0]),
        "encoder_hidden_states": _randn(1, 6, 16),
        "encoder_attention_mask": torch.ones(1, 6),
    }
    return model, inputs, "hidden_states", 3


def _motif_video():
    """Motif-Video: HunyuanVideo's grid with float64 frequencies; a text cross-attention that
    rotates the queries only."""
    torch.manual_seed(0)
    model = diffusers.MotifVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=10,
        num_layers=1,
        num_single_layers=1,
        num_decoder_layers=1,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=16,
        rope_axes_dim=(2, 4, 4),
        enable_text_cross_attention_dual=True,
        enable_text_cross_attention_single=True,
    )
    inputs = {
        "hidden_states": _randn(1, 4, 2, 4, 6),
        "timestep": torch.tensor([300.0]),
        "encoder_hidden_states": _randn(1, 6, 16),
        "encoder_attention_mask": torch.ones(1, 6),
    }
    return model, inputs, "hidden_states", 3


def _hunyuan_video15():
    torch.manual_seed(0)
    model = diffusers.HunyuanVideo15Transformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=2,
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=16,
        text_embed_2_dim=8,
        image_embed_dim=12,
        rope_axes_dim=(2, 2, 4),
        target_size=16,
        task_type="t2v",
    )
    inputs = {
        "hidden_states": _randn(1, 4, 2, 4, 6),
        "timestep": torch.tensor([1.0]),
        "encoder_hidden_states": _randn(1, 6, 16),
        "encoder_hidden_states_2": _randn(1, 4, 8),
        "encoder_attention_mask": torch.ones(1, 6),
        "encoder_attention_mask_2": torch.ones(1, 4),
        "image_embeds": torch.zeros(1, 3, 12),
    }
    return model, inputs, "hidden_states", 2


def _wan_vace():
    """Wan VACE: transformer_wan's rotary module and processor, plus the control blocks."""
    torch.manual_seed(0)
    model = diffusers.WanVACETransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=16,
        ffn_dim=32,
        num_layers=2,
        rope_max_seq_len=32,
        vace_layers=[0],
        vace_in_channels=12,
    )
    inputs = {
        "hidden_states": _randn(1, 4, 3, 8, 6),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": _randn(1, 5, 16),
        "control_hidden_states": _randn(1, 12, 3, 8, 6),
    }
    return model, inputs, "hidden_states", 3  # 2 blocks and 1 control block


def _chronoedit():
    """ChronoEdit: head dim 40, where its forward's split (14, 13, 13) is not its __init__'s
    (16, 12, 12), and two frames (its temporal skip)."""
    torch.manual_seed(0)
    model = diffusers.ChronoEditTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=40,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=16,
        ffn_dim=32,
        num_layers=2,
        rope_max_seq_len=32,
        rope_temporal_skip_len=5,
    )
    inputs = {
        "hidden_states": _randn(1, 4, 2, 8, 6),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": _randn(1, 5, 16),
    }
    return model, inputs, "hidden_states", 2


def _wan_animate():
    """Wan 2.2 Animate: its own copies of Wan's rotary module and processor; pose latents and
    face frames through the motion and face encoders."""
    torch.manual_seed(0)
    model = diffusers.WanAnimateTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=12,
        latent_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=16,
        ffn_dim=32,
        num_layers=2,
        image_dim=16,
        rope_max_seq_len=32,
        motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16},
        motion_encoder_size=16,
        motion_style_dim=8,
        motion_dim=4,
        motion_encoder_dim=16,
        face_encoder_hidden_dim=16,
        face_encoder_num_heads=2,
        inject_face_latents_blocks=2,
    )
    inputs = {
        "hidden_states": _randn(1, 12, 5, 4, 6),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": _randn(1, 5, 16),
        "encoder_hidden_states_image": _randn(1, 3, 16),
        "pose_hidden_states": _randn(1, 4, 4, 4, 6),
        "face_pixel_values": _randn(1, 3, 13, 16, 16),
    }
    return model, inputs, "hidden_states", 2


def _sana_video():
    torch.manual_seed(0)
    model = diffusers.SanaVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=12,
        num_layers=2,
        num_cross_attention_heads=2,
        cross_attention_head_dim=12,
        cross_attention_dim=24,
        caption_channels=16,
        mlp_ratio=2.5,
        dropout=0.0,
        attention_bias=False,
        sample_size=8,
        patch_size=(1, 2, 2),
        norm_elementwise_affine=False,
        norm_eps=1e-6,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    inputs = {
        "hidden_states": _randn(1, 4, 3, 8, 6),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": _randn(1, 5, 16),
    }
    return model, inputs, "hidden_states", 2


def _grid_ids(*sizes):
    return torch.cartesian_prod(*[torch.arange(s) for s in sizes])


def _flux():
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
    )
    img_ids = torch.cat([torch.ones(20, 1, dtype=torch.long), _grid_ids(4, 5)], dim=1).float()
    txt_ids = torch.zeros(7, 3)
    txt_ids[:, 0] = torch.arange(7) * 0.5  # fractional ids: the float path
    inputs = {
        "hidden_states": _randn(1, 20, 4),
        "encoder_hidden_states": _randn(1, 7, 32),
        "pooled_projections": _randn(1, 32),
        "timestep": torch.tensor([0.4]),
        "img_ids": img_ids,
        "txt_ids": txt_ids,
    }
    return model, inputs, "hidden_states", 3


def _flux_fused():
    """Flux with fused QKV projections (fuse_qkv_projections: the processors read to_qkv)."""
    model, inputs, grad_input, rotating = _flux()
    model.fuse_qkv_projections()
    return model, inputs, grad_input, rotating


def _chroma():
    """Chroma: Flux's rotary module and processor (FluxPosEmbed through embeddings' alias)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():  # embeddings.FluxPosEmbed's deprecation
        warnings.simplefilter("ignore", FutureWarning)
        model = diffusers.ChromaTransformer2DModel(
            patch_size=1,
            in_channels=4,
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            axes_dims_rope=(4, 4, 8),
            approximator_num_channels=8,
            approximator_hidden_dim=16,
            approximator_layers=1,
        )
    _, inputs, grad_input, rotating = _flux()
    inputs = {k: v for k, v in inputs.items() if k != "pooled_projections"}
    return model, inputs, grad_input, rotating


def _longcat_image():
    """LongCat-Image: its own copies of Flux's rotary module and processor."""
    torch.manual_seed(0)
    model = diffusers.LongCatImageTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
    )
    _, inputs, grad_input, rotating = _flux()
    return (
        model,
        {k: v for k, v in inputs.items() if k != "pooled_projections"},
        grad_input,
        rotating,
    )


def _ovis_image():
    """Ovis-Image: its own copies of Flux's rotary module and processor."""
    torch.manual_seed(0)
    model = diffusers.OvisImageTransformer2DModel(
        patch_size=1,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(4, 4, 8),
    )
    _, inputs, grad_input, rotating = _flux()
    return (
        model,
        {k: v for k, v in inputs.items() if k != "pooled_projections"},
        grad_input,
        rotating,
    )


def _flux2():
    torch.manual_seed(0)
    model = diffusers.Flux2Transformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        timestep_guidance_channels=256,
        axes_dims_rope=[4, 4, 4, 4],
    )
    img_ids = _grid_ids(1, 4, 5, 1)
    txt_ids = _grid_ids(1, 1, 1, 9)
    inputs = {
        "hidden_states": _randn(1, 20, 4),
        "encoder_hidden_states": _randn(1, 9, 32),
        "img_ids": img_ids,
        "txt_ids": txt_ids,
        "timestep": torch.tensor([0.7]),
        "guidance": torch.tensor([3.5]),
    }
    return model, inputs, "hidden_states", 3


# family (the registry's name) or family_variant -> a tiny model of diffusers' own class
def _flux3():
    """Flux 3: per-mode blocks (text, image, reference image) and joint ones; q, k rotated in
    float32."""
    torch.manual_seed(0)
    model = diffusers.Flux3Transformer2DModel(
        in_channels=4,
        cond_in_channels=4,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        timestep_channels=32,
        axes_dims_rope=(4, 4, 4, 4),
    )
    inputs = {
        "hidden_states": _randn(1, 20, 4),
        "encoder_hidden_states": _randn(1, 9, 32),
        "timestep": torch.tensor([0.7]),
        "img_ids": _grid_ids(1, 4, 5, 1),
        "txt_ids": _grid_ids(1, 1, 1, 9),
        "image_cond_hidden_states": _randn(1, 6, 4),
        "image_cond_ids": _grid_ids(1, 2, 3, 1) + 10,
    }
    return model, inputs, "hidden_states", 5


def _krea2():
    """Krea 2: grouped-query attention (4 q heads, 2 k/v heads), theta 1000, a padded text."""
    torch.manual_seed(0)
    model = diffusers.Krea2Transformer2DModel(
        in_channels=16,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        timestep_embed_dim=8,
        text_hidden_dim=16,
        num_text_layers=3,
        text_num_attention_heads=2,
        text_num_key_value_heads=1,
        text_intermediate_size=16,
        num_layerwise_text_blocks=1,
        num_refiner_text_blocks=1,
        axes_dims_rope=(4, 2, 2),
        rope_theta=1000.0,
    )
    n_txt, h, w = 4, 3, 4
    position_ids = torch.zeros(n_txt + h * w, 3)
    position_ids[n_txt:, 1] = torch.arange(h).repeat_interleave(w)
    position_ids[n_txt:, 2] = torch.arange(w).repeat(h)
    mask = torch.ones(1, n_txt, dtype=torch.bool)
    mask[:, -1] = False
    inputs = {
        "hidden_states": _randn(1, h * w, 16),
        "encoder_hidden_states": _randn(1, n_txt, 3, 16),
        "timestep": torch.tensor([0.5]),
        "position_ids": position_ids,
        "encoder_attention_mask": mask,
    }
    return model, inputs, "hidden_states", 2


MODELS = {
    "wan": _wan,
    "wan_i2v": _wan_i2v,
    "wan_vace": _wan_vace,
    "wan_animate": _wan_animate,
    "sana_video": _sana_video,
    "chronoedit": _chronoedit,
    "skyreels_v2": _skyreels_v2,
    "hunyuan_video": _hunyuan_video,
    "hunyuan_video15": _hunyuan_video15,
    "hunyuan_video_framepack": _hunyuan_video_framepack,
    "hunyuanimage": _hunyuanimage,
    "motif_video": _motif_video,
    "flux": _flux,
    "flux_fused": _flux_fused,
    "chroma": _chroma,
    "flux2": _flux2,
    "flux3": _flux3,
    "krea2": _krea2,
    "longcat_image": _longcat_image,
    "ovis_image": _ovis_image,
}
FAMILIES = (
    "wan",
    "wan_animate",
    "sana_video",
    "chronoedit",
    "skyreels_v2",
    "hunyuan_video",
    "hunyuan_video15",
    "hunyuan_video_framepack",
    "hunyuanimage",
    "motif_video",
    "flux",
    "flux2",
    "flux3",
    "krea2",
    "longcat_image",
    "ovis_image",
)


def _sample(model, inputs):
    out = model(**inputs, return_dict=False)
    return out[0]


def _grads(model, inputs, grad_input):
    model.zero_grad(set_to_none=True)
    inputs = dict(inputs)
    x = inputs[grad_input].detach().clone().requires_grad_(True)
    inputs[grad_input] = x
    out = _sample(model, inputs)
    weights = torch.randn(out.shape, generator=_generator())
    (out * weights).sum().backward()
    grads = {"input": x.grad.detach().clone()}
    for name, p in model.named_parameters():
        if p.grad is not None:
            grads[name] = p.grad.detach().clone()
    return grads


def test_every_family_module_is_registered():
    pd.patch(torch.nn.Identity())  # imports the family modules
    assert {f.name for f in _registry.FAMILIES} >= set(FAMILIES)


@pytest.mark.parametrize("family", sorted(MODELS))
def test_patched_output_equal_to_the_bit(family):
    model, inputs, _, rotating = MODELS[family]()
    model.eval()
    with torch.no_grad():
        want = _sample(model, inputs)
    pd._load_families()
    rotary = {n: m for n, m in model.named_modules() if _registry.family_of(m) is not None}
    processors = {n: m.processor for n, m in model.named_modules() if hasattr(m, "set_processor")}
    report = pd.patch(model, strict=True)
    assert report["left"] == []
    assert set(rotary) <= set(report["patched"])
    for name in rotary:  # posenc's module in, diffusers' kept (not as a submodule)
        assert type(model.get_submodule(name)).__module__.startswith("posenc.")
    assert not any(k.startswith("_posenc") for k in model.state_dict())
    with torch.no_grad(), CountOps() as ops:
        got = _sample(model, inputs)
    # the rotation ran, through posenc's operator, once per rotating attention (q and k together)
    assert _rotations(ops) == rotating
    assert torch.equal(got, want), (got - want).abs().max()

    restored = pd.unpatch(model)
    assert set(restored) == set(report["patched"])
    for name, module in rotary.items():
        assert model.get_submodule(name) is module
    for name, processor in processors.items():
        assert model.get_submodule(name).processor is processor
    with torch.no_grad(), CountOps() as ops:
        again = _sample(model, inputs)
    assert _rotations(ops) == 0
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
    for name in want:
        torch.testing.assert_close(
            got[name],
            want[name],
            rtol=GRAD_RTOL,
            atol=GRAD_ATOL,
            msg=lambda m, n=name: f"{family} gradient {n}: {m}",
        )


def _tables_equal(ours, theirs):
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)


@pytest.mark.parametrize("grid", [(1, 2, 2), (3, 8, 6), (5, 14, 18), (13, 32, 20)])
@pytest.mark.parametrize("head_dim", [12, 64, 128])
def test_wan_tables_at_several_grids(grid, head_dim):
    from diffusers.models.transformers import transformer_sana_video as dsana
    from diffusers.models.transformers import transformer_skyreels_v2 as dsky
    from diffusers.models.transformers import transformer_wan_animate as danimate

    from posenc.integrations.diffusers import _sana_video, _skyreels_v2, _wan, _wan_animate

    for theirs_cls, ours_cls in (
        (dwan.WanRotaryPosEmbed, _wan.WanRotaryPosEmbed),
        (dsky.SkyReelsV2RotaryPosEmbed, _skyreels_v2.SkyReelsV2RotaryPosEmbed),
        (danimate.WanRotaryPosEmbed, _wan_animate.WanAnimateRotaryPosEmbed),
        (dsana.WanRotaryPosEmbed, _sana_video.SanaVideoRotaryPosEmbed),
    ):
        theirs = theirs_cls(head_dim, (1, 2, 2), 64)
        ours = ours_cls.from_diffusers(theirs)
        assert ours.freqs_dtype == torch.float64  # diffusers' path on a CPU without MPS
        _tables_equal((ours.freqs_cos, ours.freqs_sin), (theirs.freqs_cos, theirs.freqs_sin))
        x = torch.zeros(1, 1, grid[0], 2 * grid[1], 2 * grid[2])
        _tables_equal(ours(x), theirs(x))


@pytest.mark.parametrize("frames", [1, 2, 3, 7])
@pytest.mark.parametrize("head_dim,skip", [(12, 8), (40, 5), (128, 8), (64, 40)])
def test_chronoedit_tables(frames, head_dim, skip):
    """ChronoEdit's forward splits Wan's buffers with its own sizes and skips frames at two."""
    from diffusers.models.transformers import transformer_chronoedit as dce

    from posenc.integrations.diffusers import _chronoedit

    theirs = dce.ChronoEditRotaryPosEmbed(head_dim, (1, 2, 2), 32, temporal_skip_len=skip)
    ours = _chronoedit.ChronoEditRotaryPosEmbed.from_diffusers(theirs)
    x = torch.zeros(1, 1, frames, 6, 10)
    _tables_equal(ours(x), theirs(x))


def test_wan_tables_on_the_float32_path(monkeypatch):
    """Where MPS is available diffusers computes Wan's tables from float32 frequencies."""
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    from posenc.integrations.diffusers import _wan

    theirs = dwan.WanRotaryPosEmbed(128, (1, 2, 2), 1024)
    ours = _wan.WanRotaryPosEmbed.from_diffusers(theirs)
    assert ours.freqs_dtype == torch.float32
    _tables_equal((ours.freqs_cos, ours.freqs_sin), (theirs.freqs_cos, theirs.freqs_sin))


@pytest.mark.parametrize("grid", [(1, 1, 1), (2, 4, 6), (7, 9, 11), (16, 30, 24)])
@pytest.mark.parametrize("rope_dim", [(2, 4, 4), (16, 56, 56)])
def test_hunyuan_tables_at_several_grids(grid, rope_dim):
    from diffusers.models.transformers import transformer_hunyuan_video as dh
    from diffusers.models.transformers import transformer_hunyuan_video15 as dh15

    from posenc.integrations.diffusers import _hunyuan_video, _hunyuan_video15

    for theirs, ours_cls in (
        (
            dh.HunyuanVideoRotaryPosEmbed(2, 1, list(rope_dim), 256.0),
            _hunyuan_video.HunyuanVideoRotaryPosEmbed,
        ),
        (
            dh15.HunyuanVideo15RotaryPosEmbed(2, 1, list(rope_dim), 256.0),
            _hunyuan_video15.HunyuanVideo15RotaryPosEmbed,
        ),
    ):
        ours = ours_cls.from_diffusers(theirs)
        x = torch.zeros(1, 1, grid[0], 2 * grid[1], 2 * grid[2])
        _tables_equal(ours(x), theirs(x))


@pytest.mark.parametrize(
    "theta,axes_dim,flux2",
    [
        (10000, [16, 56, 56], False),
        (10000, [4, 4, 8], False),
        (2000, [32, 32, 32, 32], True),
        (2000, [4, 4, 4, 4], True),
    ],
)
def test_flux_tables_at_several_ids(theta, axes_dim, flux2):
    from diffusers.models.transformers import transformer_flux as dflux

    from posenc.integrations.diffusers import _flux, _flux2

    theirs = (dflux2.Flux2PosEmbed if flux2 else dflux.FluxPosEmbed)(theta, axes_dim)
    ours = (_flux2.Flux2PosEmbed if flux2 else _flux.FluxPosEmbed).from_diffusers(theirs)
    n = len(axes_dim)
    for sizes in ((1,) * n, (2, 3, 4, 5)[:n], (1, 37, 29, 3)[:n]):
        ids = _grid_ids(*sizes)
        _tables_equal(ours(ids), theirs(ids))
        _tables_equal(ours(ids.float() * 1.25 + 3), theirs(ids.float() * 1.25 + 3))
    big = torch.randint(0, 4096, (300, n))  # large positions: the float64 angles matter
    _tables_equal(ours(big), theirs(big))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("unbind", [-1, -2])
@pytest.mark.parametrize("sequence_dim", [1, 2])
def test_apply_rotary_emb_equals_diffusers(dtype, unbind, sequence_dim):
    from posenc.integrations.diffusers import _common

    x = _randn(2, 5, 3, 8).to(dtype) if sequence_dim == 1 else _randn(2, 3, 5, 8).to(dtype)
    cos, sin = demb.get_1d_rotary_pos_embed(
        8,
        torch.arange(5).float() * 3.5,
        10000.0,
        use_real=True,
        repeat_interleave_real=unbind == -1,
    )
    want = demb.apply_rotary_emb(
        x, (cos, sin), use_real_unbind_dim=unbind, sequence_dim=sequence_dim
    )
    got = pd.apply_rotary_emb(x, (cos, sin), use_real_unbind_dim=unbind, sequence_dim=sequence_dim)
    assert got.dtype == want.dtype and torch.equal(got, want)
    q, k = _common.apply_rotary_emb_qk(
        x, x * 2, (cos, sin), use_real_unbind_dim=unbind, sequence_dim=sequence_dim
    )
    assert torch.equal(q, want)
    assert torch.equal(
        k,
        demb.apply_rotary_emb(
            x * 2, (cos, sin), use_real_unbind_dim=unbind, sequence_dim=sequence_dim
        ),
    )


@pytest.mark.parametrize("table_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("unbind", [-1, -2])
def test_apply_rotary_emb_with_half_tables_equals_diffusers(dtype, table_dtype, unbind):
    # diffusers computes x.float() * cos: float32 products whatever the tables' dtype; posenc's
    # operator promoted bfloat16 x with bfloat16 tables to bfloat16 products (1 ulp off in about
    # a third of the values, CogVideoX given tables in the model's dtype)
    from posenc.integrations.diffusers import _common

    x = _randn(2, 3, 5, 8).to(dtype)
    cos, sin = demb.get_1d_rotary_pos_embed(
        8,
        torch.arange(5).float() * 3.5,
        10000.0,
        use_real=True,
        repeat_interleave_real=unbind == -1,
    )
    tables = (cos.to(table_dtype), sin.to(table_dtype))
    want = demb.apply_rotary_emb(x, tables, use_real_unbind_dim=unbind)
    got = pd.apply_rotary_emb(x, tables, use_real_unbind_dim=unbind)
    assert got.dtype == want.dtype and torch.equal(got, want)
    q, k = _common.apply_rotary_emb_qk(x, x * 2, tables, use_real_unbind_dim=unbind)
    assert torch.equal(q, want)
    assert torch.equal(k, demb.apply_rotary_emb(x * 2, tables, use_real_unbind_dim=unbind))


def test_float32_ladders_equal_diffusers_float32_path():
    """Flux's tables where ids' device has no float64 (mps, npu, neuron): float32 frequencies."""
    from posenc.integrations.diffusers import _common

    pos = torch.arange(0, 700).float() * 0.75
    for dim, theta in ((16, 10000), (56, 10000), (32, 2000), (16, 256.0)):
        want = demb.get_1d_rotary_pos_embed(
            dim, pos, theta, use_real=True, freqs_dtype=torch.float32
        )
        got = _common.axes_tables(pos[:, None], [_common.frequencies(dim, theta, torch.float32)])
        _tables_equal(got, want)
    assert _common.adjusted_float64(torch.device("cpu")) == torch.float64
    assert _common.adjusted_float64(torch.device("meta")) == torch.float64


def test_unpatch_follows_casts_and_mode():
    model, inputs, _, _ = _wan()
    rope = model.rope
    model.eval()
    pd.patch(model)
    model.double()
    model.train()
    assert model.rope.freqs_cos.dtype == torch.float64
    assert rope.freqs_cos.dtype == torch.float64  # the kept module followed the cast
    pd.unpatch(model)
    assert model.rope is rope and rope.training
    model.float()
    pd.patch(model)
    processor = model.blocks[0].attn1.processor
    processor._attention_backend = "native"  # as set_attention_backend sets it
    pd.unpatch(model)
    assert model.blocks[0].attn1.processor._attention_backend == "native"


def test_patch_twice_and_unpatch_twice():
    model, inputs, _, _ = _flux()
    model.eval()
    with torch.no_grad():
        want = _sample(model, inputs)
    first = pd.patch(model)
    second = pd.patch(model)
    assert first["patched"] and second == {"patched": [], "left": []}
    with torch.no_grad():
        assert torch.equal(_sample(model, inputs), want)
    assert pd.unpatch(model)
    assert pd.unpatch(model) == []


def test_refused_in_one_line():
    with pytest.raises(ValueError, match="expected an nn.Module"):
        pd.patch("not a model")
    with pytest.raises(ValueError, match="expected an nn.Module"):
        pd.unpatch(42)
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2))
    report = pd.patch(plain)
    assert report["patched"] == [] and "no rotary module" in report["left"][0]
    with pytest.raises(ValueError) as e:
        pd.patch(plain, strict=True)
    assert "\n" not in str(e.value)


def test_a_module_posenc_would_compute_otherwise_is_left():
    """Wan's module does not keep theta: one built with another theta is refused, not guessed."""
    holder = torch.nn.Module()
    holder.rope = dwan.WanRotaryPosEmbed(12, (1, 2, 2), 32, theta=500.0)
    rope = holder.rope
    report = pd.patch(holder)
    assert report["patched"] == [] and "not what its settings give" in report["left"][0]
    with pytest.raises(ValueError, match="posenc does not compute") as e:
        pd.patch(holder, strict=True)
    assert "\n" not in str(e.value) and holder.rope is rope
    with torch.device("meta"):  # built without weights (init_empty_weights)
        holder.rope = dwan.WanRotaryPosEmbed(12, (1, 2, 2), 32)
    assert "meta device" in pd.patch(holder)["left"][0]
    holder.rope = dwan.WanRotaryPosEmbed(12, (1, 2, 2), 32)
    holder.rope.half()  # a cast buffer: diffusers' tables are no longer what the settings give
    holder.rope.float()
    assert "not what its settings give" in pd.patch(holder)["left"][0]


class UnlistedProcessor:
    """A processor of the user's that rotates (its __call__ takes image_rotary_emb) and that no
    family lists: diffusers' own Flux processor inside."""

    def __init__(self):
        from diffusers.models.transformers import transformer_flux as dflux

        self.inner = dflux.FluxAttnProcessor()

    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        attention_mask=None,
        image_rotary_emb=None,
    ):
        return self.inner(
            attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb
        )


def test_unlisted_rotating_processor_refuses_strict_and_nothing_changes():
    model, inputs, _, _ = _flux()
    model.transformer_blocks[0].attn.set_processor(UnlistedProcessor())
    rope = model.pos_embed
    single = model.single_transformer_blocks[0].attn.processor
    with pytest.raises(ValueError, match="UnlistedProcessor") as e:
        pd.patch(model, strict=True)
    assert "\n" not in str(e.value)
    assert model.pos_embed is rope and model.single_transformer_blocks[0].attn.processor is single
    report = pd.patch(model)
    assert any("UnlistedProcessor" in line for line in report["left"])
    model.eval()
    with torch.no_grad():  # the unlisted processor rotates with posenc's tables: diffusers' output
        got = _sample(model, inputs)
    pd.unpatch(model)
    with torch.no_grad():
        assert torch.equal(got, _sample(model, inputs))


def test_flux_ip_adapter_processor():
    """load_ip_adapter's processor (an nn.Module with weights): posenc's shares its modules; the
    output with IP-Adapter tokens equal to the bit, state_dict unchanged, unpatch restores it."""
    from diffusers.models.transformers import transformer_flux as dflux

    model, inputs, _, _ = _flux()
    torch.manual_seed(1)
    for block in model.transformer_blocks:
        block.attn.set_processor(
            dflux.FluxIPAdapterAttnProcessor(32, 32, num_tokens=(4, 2), scale=[0.7, 0.3])
        )
    ip = model.transformer_blocks[0].attn.processor
    keys = list(model.state_dict())
    inputs = dict(
        inputs,
        joint_attention_kwargs={"ip_hidden_states": [_randn(1, 4, 32), _randn(1, 2, 32) * 2]},
    )
    model.eval()
    with torch.no_grad():
        want = _sample(model, inputs)
    report = pd.patch(model, strict=True)
    assert "transformer_blocks.0.attn.processor" in report["patched"]
    ours = model.transformer_blocks[0].attn.processor
    assert ours is not ip and ours.to_k_ip[0] is ip.to_k_ip[0]
    assert list(model.state_dict()) == keys
    with torch.no_grad(), CountOps() as ops:
        got = _sample(model, inputs)
    assert _rotations(ops) == 3
    assert torch.equal(got, want)
    model.double()
    assert ip.to_k_ip[0].weight.dtype == torch.float64  # shared: the kept one follows
    model.float().train()
    assert pd.unpatch(model).count("transformer_blocks.0.attn.processor") == 1
    assert model.transformer_blocks[0].attn.processor is ip and ip.training
    assert list(model.state_dict()) == keys


def test_flux2_kv_cache_processors():
    """The Klein KV pipeline's processors: reference tokens' rotated keys and values extracted on
    the first step, attended to from the cache on the next; both steps equal to the bit."""
    model, inputs, _, _ = _flux2()
    for block in model.transformer_blocks:
        block.attn.set_processor(dflux2.Flux2KVAttnProcessor())
    for block in model.single_transformer_blocks:
        block.attn.set_processor(dflux2.Flux2KVParallelSelfAttnProcessor())
    model.eval()
    refs = 6
    extract = dict(
        inputs,
        hidden_states=_randn(1, refs + 20, 4),
        img_ids=torch.cat([_grid_ids(1, 2, 3, 1) + 10, inputs["img_ids"]]),
    )

    def run():
        with torch.no_grad(), CountOps() as ops:
            first, cache = model(
                **extract, kv_cache_mode="extract", num_ref_tokens=refs, return_dict=False
            )
            second = _sample_kv(model, inputs, cache)
        return first, second, _rotations(ops)

    want_first, want_second, calls = run()
    assert calls == 0
    report = pd.patch(model, strict=True)
    assert sum(p.endswith(".processor") for p in report["patched"]) == 3
    got_first, got_second, calls = run()
    assert calls == 6  # 3 attentions, two steps
    assert torch.equal(got_first, want_first) and torch.equal(got_second, want_second)


def _sample_kv(model, inputs, cache):
    return model(**inputs, kv_cache=cache, kv_cache_mode="cached", return_dict=False)[0]


def test_bad_inputs_are_one_line():
    from posenc.integrations.diffusers import _common, _flux, _hunyuan_video, _wan

    x = torch.zeros(1, 2, 3, 8)
    cos = torch.ones(3, 8)
    cases = [
        lambda: _common.apply_rotary_emb(x, cos),  # not a (cos, sin) pair
        lambda: _common.apply_rotary_emb(x, (cos, cos), sequence_dim=3),
        lambda: _common.apply_rotary_emb(x, (cos, cos), use_real_unbind_dim=0),
        lambda: _common.apply_rotary_emb(x, (cos, cos), use_real=False),
        lambda: _common.apply_rotary_emb(torch.zeros(2, 3, 8), (cos, cos)),
        lambda: _common.apply_rotary_emb(x, (cos, cos[:, :4])),
        lambda: _common.apply_rotary_emb(x.long(), (cos, cos)),  # diffusers rounds back to int
        lambda: _common.apply_rotary_emb(x, (cos.int(), cos.int())),
        lambda: _common.apply_rotary_emb_qk(x, torch.zeros(2, 3, 8), (cos, cos)),
        lambda: _common.apply_rotary_emb_qk(x, x.to("meta"), (cos, cos)),
        lambda: _common.frequencies(7, 10000.0, torch.float64),
        lambda: _wan.WanRotaryPosEmbed(5, (1, 2, 2), 32),
        lambda: _wan.WanRotaryPosEmbed(12, (1, 2, 2), 4)(torch.zeros(1, 1, 5, 2, 2)),
        lambda: _wan.WanRotaryPosEmbed(12, (1, 2, 2), 4)(torch.zeros(1, 5, 2, 2)),
        lambda: _wan.rotate_wan(x, x, cos, cos),
        lambda: _hunyuan_video.HunyuanVideoRotaryPosEmbed(1, 1, [2, 3, 4]),
        lambda: _hunyuan_video.HunyuanVideoRotaryPosEmbed(1, 1, [2, 4, 4])(torch.zeros(2, 2)),
        lambda: _flux.FluxPosEmbed(10000, [4, 4])(torch.zeros(5, 3)),
        lambda: _flux.FluxPosEmbed(10000, [4, 4])(torch.zeros(5)),
        lambda: _flux.FluxPosEmbed(10000, [4, 5]),
    ]
    for case in cases:
        with pytest.raises(ValueError) as e:
            case()
        assert "\n" not in str(e.value), str(e.value)


def test_tables_on_another_device_than_x_are_moved_as_diffusers_moves_them():
    """diffusers' apply_rotary_emb moves cos/sin to x's device; a dtype of x other than the
    table's is taken as there (x.float() * cos)."""
    from posenc.integrations.diffusers import _common

    x = _randn(1, 4, 2, 8)
    cos, sin = demb.get_1d_rotary_pos_embed(8, 4, 10000.0, use_real=True)
    want = demb.apply_rotary_emb(x, (cos.double(), sin.double()), sequence_dim=1)
    got = _common.apply_rotary_emb(x, (cos.double(), sin.double()), sequence_dim=1)
    assert got.dtype == want.dtype and torch.equal(got, want)


def _cast_inputs(inputs, dtype):
    # ids stay float32/int as the pipelines give them; the latents and embeddings take the dtype
    return {
        k: (v.to(dtype) if v.is_floating_point() and not k.endswith("_ids") else v)
        for k, v in inputs.items()
    }


# what diffusers' own model (unpatched) fails to run: no output to compare with
DIFFUSERS_CANNOT = {
    ("motif_video", torch.float64): "diffusers' Motif-Video fails in float64 itself (a float32 "
    "tensor meets float64 weights in a linear layer)",
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("family", sorted(MODELS))
def test_patched_output_equal_in_other_dtypes(family, dtype):
    """A model cast whole (.to(dtype), the rotary buffers too) before patch(): diffusers' output
    to the bit (its rotation promotes to the tables' float32, or rounds float64 x to float32
    first, and posenc's does the same)."""
    if (family, dtype) in DIFFUSERS_CANNOT:
        pytest.skip(DIFFUSERS_CANNOT[family, dtype])
    model, inputs, _, _ = MODELS[family]()
    model.eval().to(dtype)
    inputs = _cast_inputs(inputs, dtype)
    with torch.no_grad():
        want = _sample(model, inputs)
    pd.patch(model, strict=True)
    with torch.no_grad():
        got = _sample(model, inputs)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_cast_after_patch_gives_the_cast_models_output():
    patched, inputs, _, _ = _wan()
    plain, _, _, _ = _wan()
    pd.patch(patched.eval(), strict=True)
    patched.to(torch.bfloat16)
    plain.eval().to(torch.bfloat16)
    inputs = _cast_inputs(inputs, torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(_sample(patched, inputs), _sample(plain, inputs))


@pytest.mark.parametrize("family", ["wan", "hunyuan_video", "flux"])
def test_fused_kernel_for_inference_apply_rotary_for_half_precision_training(family):
    """The processors rotate with posenc's fused rope_rotate_qk where it gives diffusers' results
    and gradients (inference in any dtype; float32 training), with apply_rotary where eager's
    per-product rounding of bfloat16 gradients must be followed (bfloat16 training): outputs and
    bfloat16 gradients equal to the bit either way."""
    model, inputs, grad_input, rotating = MODELS[family]()
    for name, child in model.named_children():  # as from_pretrained(torch_dtype=bfloat16) does:
        if name != "rope":  # Wan's rope is one of its _keep_in_fp32_modules: float32 tables
            child.to(torch.bfloat16)
    for _name, parameter in model.named_parameters(recurse=False):
        parameter.data = parameter.data.to(torch.bfloat16)
    inputs = _cast_inputs(inputs, torch.bfloat16)
    want_grads = _grads(model, inputs, grad_input)
    model.eval()
    with torch.no_grad():
        want = _sample(model, inputs)
    pd.patch(model, strict=True)
    with torch.no_grad(), CountOps() as ops:
        got = _sample(model, inputs)
    assert ops.calls["posenc.rope_rotate_qk"] == rotating and torch.equal(got, want)
    model.train()
    with CountOps() as ops:
        got_grads = _grads(model, inputs, grad_input)
    assert ops.calls["posenc.apply_rotary"] == rotating
    assert ops.calls["posenc.rope_rotate_qk"] == 0
    assert set(got_grads) == set(want_grads)
    for name in want_grads:
        assert torch.equal(got_grads[name], want_grads[name]), name


@pytest.mark.parametrize("family", ["wan", "hunyuan_video", "flux"])
def test_patched_model_traces_whole(family):
    """torch.compile(fullgraph=True) traces a patched model without a graph break (the operators'
    fake kernels; the processors' fused-path check stays out of compiled code); with dynamo's
    eager backend the compiled output is diffusers' to the bit."""
    model, inputs, _, _ = MODELS[family]()
    model.eval()
    with torch.no_grad():
        want = _sample(model, inputs)
    pd.patch(model, strict=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        got = compiled(**inputs, return_dict=False)[0]
    assert torch.equal(got, want)

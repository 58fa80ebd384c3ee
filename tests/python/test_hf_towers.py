"""Vision towers from transformers' config.json against their own rotary classes, live.

posenc.RotaryEmbedding built from a tower's config resolves its axes the class's way
(src/config/hf_architectures.cpp, HfAxial): Pixtral's one ladder dealt to rows (even frequencies)
and columns (odd), Step 3.7's and Inkling 2's columns first, Kimi-K2.5's columns and rows pair by
pair, MiniMax-M3's (t, h, w) runs with the rest of the head passing through, the SAM 2/3 and
EdgeTAM trackers' memory attention (its own head size, (2i, 2i + 1) pairs), DINOv3's patch centres
in [-1, 1] turned by 2 pi theta^(-4i/Dh), and Llama 4's fixed vision table. Each class's forward is
run here on a patch grid larger than the fixtures' (and on configs other than the defaults), and
posenc's float32 tables must equal it to the bit: both run torch's float32 ops in this process.
Refusals stay one line.
"""

import importlib

import pytest
import torch

import posenc

transformers = pytest.importorskip("transformers")

ROWS, COLS = 6, 9


def _grid(axes):
    """[N, A] position ids: (row, column), or (t, row, column) over two frames."""
    r, c = torch.meshgrid(torch.arange(ROWS), torch.arange(COLS), indexing="ij")
    hw = torch.stack([r.flatten(), c.flatten()], dim=-1)
    if axes == 2:
        return hw
    t = torch.arange(2).repeat_interleave(hw.shape[0])[:, None]
    return torch.cat([t, hw.repeat(2, 1) * 3], dim=-1)


def _rotary_class(model_type, name):
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    return getattr(module, name), module


# (model type of the config, its package, the rotary class, config overrides, axes)
TOWERS = [
    ("pixtral", "pixtral", "PixtralVisionRotaryEmbedding", {}, 2),
    (
        "pixtral",
        "pixtral",
        "PixtralVisionRotaryEmbedding",
        dict(
            hidden_size=1536,
            num_attention_heads=12,
            head_dim=128,
            rope_parameters={"rope_type": "axial", "rope_theta": 1e4},
        ),
        2,
    ),
    ("step3p5_vision", "step3p7", "Step3p7VisionRotaryEmbedding", {}, 2),
    ("inkling2_vision", "inkling2", "Inkling2VisionRotaryEmbedding", {}, 2),
    ("kimi_k25_vision", "kimi_k25", "Kimi_K25VisionRotaryEmbedding", {}, 2),
    ("minimax_m3_vl_vision", "minimax_m3_vl", "MiniMaxM3VLVisionRotaryEmbedding", {}, 3),
    (
        "minimax_m3_vl_vision",
        "minimax_m3_vl",
        "MiniMaxM3VLVisionRotaryEmbedding",
        dict(hidden_size=512, num_attention_heads=8),
        3,
    ),
    ("sam2_video", "sam2_video", "Sam2VideoVisionRotaryEmbedding", {}, 2),
    ("sam3_tracker_video", "sam3_tracker_video", "Sam3TrackerVideoVisionRotaryEmbedding", {}, 2),
    ("edgetam_video", "edgetam_video", "EdgeTamVideoVisionRotaryEmbedding", {}, 2),
]


@pytest.mark.parametrize(
    "model_type,package,name,overrides,axes",
    TOWERS,
    ids=[f"{t[0]}-{i}" for i, t in enumerate(TOWERS)],
)
def test_tower_tables_equal_the_class(model_type, package, name, overrides, axes):
    config = transformers.AutoConfig.for_model(model_type, **overrides)
    cls, _ = _rotary_class(package, name)
    theirs = cls(config=config)
    ids = _grid(axes)
    cos, sin = theirs(torch.zeros(1, dtype=torch.float32), ids)
    cos, sin = cos.reshape(ids.shape[0], -1), sin.reshape(ids.shape[0], -1)
    ours = posenc.RotaryEmbedding.from_hf_config(config)
    c2, s2 = ours(torch.zeros(1, dtype=torch.float32), ids.T[:, None])  # [A, 1, N]
    assert c2.shape[1:] == cos.shape, (c2.shape, cos.shape)
    assert torch.equal(c2[0], cos) and torch.equal(s2[0], sin), (cos - c2[0]).abs().max().item()


# DINOv3 and its kin: forward(pixel_values) builds the table from the image's patch grid
PATCH_TOWERS = [
    ("dinov3_vit", "DINOv3ViTRopePositionEmbedding", {}),
    (
        "dinov3_vit",
        "DINOv3ViTRopePositionEmbedding",
        dict(hidden_size=768, num_attention_heads=6, rope_theta=1000.0),
    ),
    ("eomt_dinov3", "EomtDinov3RotaryEmbedding", {}),
    ("sapiens2", "Sapiens2RopePositionEmbedding", {}),
]


@pytest.mark.parametrize(
    "model_type,name,overrides",
    PATCH_TOWERS,
    ids=[f"{t[0]}-{i}" for i, t in enumerate(PATCH_TOWERS)],
)
@pytest.mark.parametrize("angle_dtype", ["float32", "float64"])
def test_patch_centre_tables_equal_the_class(model_type, name, overrides, angle_dtype):
    config = transformers.AutoConfig.for_model(model_type, **overrides)
    cls, module = _rotary_class(model_type, name)
    theirs = cls(config=config).eval()  # the coordinate augmentations are training-only
    p = config.patch_size
    cos, sin = theirs(torch.zeros(1, 3, ROWS * p, COLS * p))
    coords = module.get_patches_center_coordinates(
        ROWS, COLS, dtype=torch.float32, device=torch.device("cpu")
    )
    ours = posenc.RotaryEmbedding.from_hf_config(config, angle_dtype=angle_dtype)
    c2, s2 = ours(torch.zeros(1, dtype=torch.float32), coords.T[:, None])  # [2, 1, N]
    if angle_dtype == "float32":  # transformers' arithmetic: to the bit
        assert torch.equal(c2[0], cos) and torch.equal(s2[0], sin), (cos - c2[0]).abs().max().item()
    else:  # exact angles: transformers' float32 rounding apart (|angle| < 2 pi here)
        assert (c2[0] - cos).abs().max().item() < 1e-5 and (s2[0] - sin).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    "overrides", [{}, dict(image_size=112, hidden_size=512, num_attention_heads=8)]
)
def test_llama4_vision_fixed_table_equals_the_class(overrides):
    # a fixed e^(i angle) table over (image_size // patch_size)^2 patches and a class token:
    # positions (row + 1, column + 1), the class token (0, 0); pairs (2i, 2i + 1)
    config = transformers.AutoConfig.for_model("llama4_vision_model", **overrides)
    cls, _ = _rotary_class("llama4", "Llama4VisionRotaryEmbedding")
    table = cls(config=config)(torch.zeros(1))
    table = table.reshape(table.shape[0], -1)
    idx = config.image_size // config.patch_size
    n = torch.arange(idx * idx)
    ids = torch.cat(
        [torch.stack([n // idx + 1, n % idx + 1], dim=-1), torch.zeros(1, 2, dtype=torch.long)]
    )
    ours = posenc.RotaryEmbedding.from_hf_config(config)
    cos, sin = ours(torch.zeros(1, dtype=torch.float32), ids.T[:, None])
    assert ours._table(None).layout == "interleaved"
    assert torch.equal(cos[0, :, 0::2], table.real) and torch.equal(sin[0, :, 0::2], table.imag)


def test_towers_that_stay_refused_say_why_in_one_line():
    # Gemma 4's vision rotary rotates each half of the head by its own rotate_half; ERNIE 4.5 VL
    # alternates rows and columns over one ladder and gives time the tail
    for model_type, words in [
        ("gemma4_vision", "a rows half and a columns half"),
        ("ernie4_5_vl_moe_text", "alternates rows and columns"),
    ]:
        config = transformers.AutoConfig.for_model(model_type)
        with pytest.raises((RuntimeError, ValueError)) as info:
            posenc.RotaryEmbedding.from_hf_config(config)
        line = str(info.value).splitlines()[0]
        assert words in line and "refused" in line, line

#!/usr/bin/env python3
"""Fixtures for posenc's C++ rope_dinov3 encoder from timm's RotaryEmbeddingDinoV3 (tests/fixtures/rope_dinov3.json).

What timm 1.0.31 computes (layers/pos_embed_sincos.py; the module is run, nothing is re-derived):
  coords   _build_grid(feat_shape, grid_type 'centered', normalize_coords): patch centres 2 (j + 0.5) / d - 1 per
           axis, d = each axis' size ('separate'), their max or their min; [H W, 2] (row, column), float32 on the CPU
  augment  in training mode only, DINOv3's order on the CPU generator: shift U(-s, s) per axis, jitter
           exp(U(-log J, log J)) per axis, rescale exp(U(-log R, log R)) shared (_apply_coord_augs)
  periods  temperature ** (2 arange(dim // 4) / (dim // 2)) or min_period (max_period / min_period) ** linspace(0, 1)
  tables   angles 2 pi c / period flattened [H W, dim / 2] (row periods, then column periods); sin, cos float32,
           rotate_half: cat(t, t) (pair (i, i + dim / 2)); interleaved: repeat_interleave
The fixture keeps one copy per pair ([H W, dim / 2]) after checking the copies are equal. Training cases record the
seed given to torch.manual_seed right before get_embed: posenc's module draws from the same generator.

The tables are torch's vectorized float32 pow/cos/sin, so they record torch.backends.cpu.get_cpu_capability();
generate them at the capability every CPU of ours has:

    ATEN_CPU_CAPABILITY=avx2 ~/.cache/posenc/venv/bin/python tools/gen_fixtures_dinov3.py

(tests/test_rope_dinov3.cpp holds them to the bit at that capability, within a stated ulp bound elsewhere.)
"""

import json
import os
import platform
import sys

import timm
import torch
from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO_ROOT, "tests", "fixtures", "rope_dinov3.json")


def floats(tensor):
    """A tensor as nested lists of Python floats (float32 values are exact in float64; repr round-trips)."""
    return tensor.detach().to(torch.float64).tolist()


def per_pair(expanded, rotate_half):
    """[N, dim] in the module's layout -> [N, dim / 2], after checking the two copies are equal."""
    half = expanded.shape[-1] // 2
    if rotate_half:
        first, second = expanded[..., :half], expanded[..., half:]
    else:
        first, second = expanded[..., 0::2], expanded[..., 1::2]
    assert torch.equal(first, second)
    return first


def case(dim, shape, training=False, seed=None, **kwargs):
    rotate_half = kwargs.get("rotate_half", True)
    module = RotaryEmbeddingDinoV3(dim, **kwargs)
    module.train(training)
    if seed is not None:
        torch.manual_seed(seed)
    embed = module.get_embed(list(shape))  # [H W, 2 dim]: cat(sin, cos)
    sin, cos = embed[:, :dim], embed[:, dim:]
    config = {k: v for k, v in kwargs.items() if k != "rotate_half"}
    return {
        "head_dim": dim,
        "grid": list(shape),
        "training": training,
        "seed": seed,
        "layout": "half" if rotate_half else "interleaved",
        "options": config,
        "periods": floats(module.periods),
        "cos": floats(per_pair(cos, rotate_half)),
        "sin": floats(per_pair(sin, rotate_half)),
    }


def main():
    torch.set_num_threads(1)
    evaluation = [
        case(32, (4, 4)),  # the experiment's head dim and training grid (28 px, 7 px patches)
        case(32, (6, 6)),  # 1.5x
        case(32, (8, 8)),  # 2x
        case(64, (7, 7)),  # DINOv3 ViT-S/16 head dim
        case(64, (3, 5), normalize_coords="separate"),
        case(64, (3, 5), normalize_coords="max"),
        case(64, (3, 5), normalize_coords="min"),
        case(32, (4, 6), rotate_half=False),
        case(32, (5, 4), temperature=10000.0),
        case(64, (4, 4), min_period=0.5, max_period=40.0),
        # augmentation options in eval mode: no effect
        case(32, (4, 4), shift_coords=0.5, jitter_coords=1.5, rescale_coords=2.0),
    ]
    training = [
        case(32, (4, 4), True, 0, rescale_coords=2.0),  # DINOv3's default augmentation
        case(32, (4, 4), True, 1, rescale_coords=2.0),
        case(32, (6, 3), True, 7, shift_coords=0.5),
        case(32, (6, 3), True, 8, jitter_coords=1.5),
        case(64, (5, 7), True, 11, shift_coords=0.25, jitter_coords=1.25, rescale_coords=2.0),
        case(
            64, (5, 7), True, 12, shift_coords=0.0, jitter_coords=1.0, rescale_coords=1.0
        ),  # draws, no change
        case(32, (4, 4), True, 3, rotate_half=False, normalize_coords="max", rescale_coords=3.0),
    ]
    out = {
        "generator": {
            "script": "tools/gen_fixtures_dinov3.py",
            "command": "ATEN_CPU_CAPABILITY=avx2 ~/.cache/posenc/venv/bin/python tools/gen_fixtures_dinov3.py",
            "timm": timm.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        },
        "notes": [
            "cos/sin are per rotary pair [H W, dim / 2] (the module's two copies checked equal and dropped)",
            "training cases: torch.manual_seed(seed) right before get_embed, module in training mode",
        ],
        "eval": evaluation,
        "train": training,
    }
    with open(OUT, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(
        f"wrote {OUT} ({os.path.getsize(OUT)} bytes) at ATen capability {out['generator']['aten_cpu_capability']}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

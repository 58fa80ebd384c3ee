#!/usr/bin/env python3
"""Fixtures for posenc's C++ video RoPEs, from diffusers' own modules (tests/fixtures/diffusers_video.json).

What each family computes (diffusers 0.42.1, models/transformers/; the module is run, nothing is re-derived):

  wan        WanRotaryPosEmbed (transformer_wan.py; SkyReelsV2RotaryPosEmbed is its copy): per-axis dims
             h = w = 2 (D // 6), t = D - h - w; each axis its own ladder 1.0 / (theta ** (arange(0, d, 2, float64) / d))
             (get_1d_rotary_pos_embed, freqs_dtype float64 on CPU/CUDA, float32 only where MPS is present); angles
             p * f in float64 at integer positions p of the patch grid (frame, row, col); cos/sin in float64, then
             .float(); repeat_interleave'd (pairs (2i, 2i+1)).
  hunyuan    HunyuanVideoRotaryPosEmbed (transformer_hunyuan_video.py; HunyuanVideo15RotaryPosEmbed the same):
             rope_dim (16, 56, 56), theta 256, the same machinery in float32 throughout (float32 grid, float32
             ladder, float32 products, float32 cos/sin).
  ltx2       LTX2AudioVideoRotaryPosEmbed (transformer_ltx2.py): video and audio on one clock in seconds.
             prepare_video_coords: [start, end) per patch in pixels, the time axis shifted by causal_offset -
             scale_factors[0], clamped at 0, divided by fps; prepare_audio_coords: mel frames * hop / sampling_rate.
             forward: midpoints (start + end) / 2, as fractions of max_positions, angle (2 g - 1) * f_j with
             f_j = float32(theta ** linspace(0, 1, F) * pi / 2) (pow in float64 with double_precision, else float32),
             F = dim // (2 A); pairs interleaved over the A axes per frequency (pair j A + a), dim mod 2A identity
             elements first; rope_type "interleaved" ([B, N, dim]) or "split" ([B, H, N, dim / 2H], half layout per
             head). Everything from the coordinates on is float32.

The float64 tables (wan) do not depend on the CPU: their float32 values are float64 cos/sin rounded once. The
float32 ones (hunyuan, ltx2: torch's vectorized float32 cos/sin, and pow) are recorded with
torch.backends.cpu.get_cpu_capability(); generate them at the capability every CPU of ours has:

    ATEN_CPU_CAPABILITY=avx2 ~/.cache/posenc/venv/bin/python tools/gen_fixtures_diffusers_video.py

(tests/test_diffusers_video.cpp holds them to the bit at that capability, within a stated ulp bound elsewhere.)
"""

import json
import os
import platform
import sys

import diffusers
import torch
from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoRotaryPosEmbed
from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15RotaryPosEmbed
from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed
from diffusers.models.transformers.transformer_skyreels_v2 import SkyReelsV2RotaryPosEmbed
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO_ROOT, "tests", "fixtures", "diffusers_video.json")


def floats(tensor):
    """A tensor as nested lists of Python floats (float32 values are exact in float64; repr round-trips)."""
    return tensor.detach().to(torch.float64).tolist()


def pairs_of(expanded):
    """[..., 2F] repeat_interleave'd -> [..., F], after checking the two copies are equal."""
    assert torch.equal(expanded[..., 0::2], expanded[..., 1::2])
    return expanded[..., 0::2]


def wan_cases():
    cases = []
    # (attention_head_dim, patch_size, latent (frames, height, width), theta)
    for cls, head_dim, patch, latent, theta in [
        (WanRotaryPosEmbed, 128, (1, 2, 2), (3, 4, 6), 10000.0),  # Wan 2.1/2.2 1.3B/14B head dim
        (WanRotaryPosEmbed, 40, (1, 2, 2), (3, 4, 6), 10000.0),  # D // 6 = 6: h = w = 12, t = 16
        (WanRotaryPosEmbed, 64, (1, 1, 1), (1, 2, 70), 10000.0),  # positions up to 69 on w
        (
            SkyReelsV2RotaryPosEmbed,
            128,
            (1, 2, 2),
            (2, 4, 6),
            10000.0,
        ),  # Wan's rotary, SkyReels-V2's copy
    ]:
        module = cls(head_dim, patch, max_seq_len=1024, theta=theta)
        hidden = torch.zeros(1, 1, *latent)
        cos, sin = module(hidden)  # [1, N, 1, D]
        assert cos.dtype == torch.float32 and module.freqs_cos.dtype == torch.float32
        grid = [latent[i] // patch[i] for i in range(3)]
        cases.append(
            {
                "module": cls.__name__,
                "head_dim": head_dim,
                "theta": theta,
                "patch_size": list(patch),
                "latent": list(latent),
                "grid": grid,
                "dims": [module.t_dim, module.h_dim, module.w_dim],
                "cos": floats(pairs_of(cos[0, :, 0])),
                "sin": floats(pairs_of(sin[0, :, 0])),
            }
        )
    return cases


def hunyuan_cases():
    cases = []
    for cls, rope_dim, theta, patch, patch_t, latent in [
        (HunyuanVideoRotaryPosEmbed, (16, 56, 56), 256.0, 2, 1, (2, 4, 6)),  # HunyuanVideo
        (HunyuanVideoRotaryPosEmbed, (8, 12, 12), 256.0, 1, 1, (1, 2, 40)),
        (HunyuanVideo15RotaryPosEmbed, (16, 56, 56), 256.0, 1, 1, (2, 2, 3)),  # HunyuanVideo 1.5
    ]:
        module = cls(patch, patch_t, list(rope_dim), theta)
        cos, sin = module(torch.zeros(1, 1, *latent))  # [N, D]
        grid = [latent[0] // patch_t, latent[1] // patch, latent[2] // patch]
        cases.append(
            {
                "module": cls.__name__,
                "rope_dim": list(rope_dim),
                "theta": theta,
                "grid": grid,
                "cos": floats(pairs_of(cos)),
                "sin": floats(pairs_of(sin)),
            }
        )
    return cases


def ltx2_cases():
    cases = []
    # one video and one audio track per case; (heads, head_dim) of each side's self-attention
    for video, audio, rope_type, double_precision in [
        (
            {"frames": 3, "height": 2, "width": 3, "fps": 24.0, "heads": 2, "head_dim": 10},
            {"frames": 6, "heads": 2, "head_dim": 4},
            "interleaved",
            True,
        ),
        (
            {"frames": 4, "height": 2, "width": 2, "fps": 25.0, "heads": 3, "head_dim": 6},
            {"frames": 7, "heads": 1, "head_dim": 8},
            "split",
            True,
        ),
        (
            {"frames": 2, "height": 3, "width": 2, "fps": 23.976, "heads": 2, "head_dim": 10},
            {"frames": 5, "heads": 2, "head_dim": 6},
            "split",
            False,
        ),
        (
            {"frames": 3, "height": 1, "width": 2, "fps": 30.0, "heads": 1, "head_dim": 14},
            {"frames": 4, "heads": 1, "head_dim": 6},
            "interleaved",
            False,
        ),
    ]:
        common = {
            "theta": 10000.0,
            "causal_offset": 1,
            "double_precision": double_precision,
            "rope_type": rope_type,
        }
        video_dim = video["heads"] * video["head_dim"]
        audio_dim = audio["heads"] * audio["head_dim"]
        cross_dim = (
            8  # the audio-video cross-attention's table: time only (dim audio_cross_attention_dim)
        )
        video_rope = LTX2AudioVideoRotaryPosEmbed(
            dim=video_dim,
            base_num_frames=20,
            base_height=2048,
            base_width=2048,
            scale_factors=(8, 32, 32),
            modality="video",
            num_attention_heads=video["heads"],
            **common,
        )
        audio_rope = LTX2AudioVideoRotaryPosEmbed(
            dim=audio_dim,
            base_num_frames=20,
            sampling_rate=16000,
            hop_length=160,
            scale_factors=[4],
            modality="audio",
            num_attention_heads=audio["heads"],
            **common,
        )
        cross_video = LTX2AudioVideoRotaryPosEmbed(
            dim=cross_dim, base_num_frames=20, modality="video", num_attention_heads=1, **common
        )
        cross_audio = LTX2AudioVideoRotaryPosEmbed(
            dim=cross_dim,
            base_num_frames=20,
            sampling_rate=16000,
            hop_length=160,
            scale_factors=[4],
            modality="audio",
            num_attention_heads=1,
            **common,
        )
        video_coords = video_rope.prepare_video_coords(
            1,
            video["frames"],
            video["height"],
            video["width"],
            torch.device("cpu"),
            fps=video["fps"],
        )
        audio_coords = audio_rope.prepare_audio_coords(1, audio["frames"], torch.device("cpu"))
        tables = {}
        for name, module, coords in [
            ("video", video_rope, video_coords),
            ("audio", audio_rope, audio_coords),
            ("cross_video", cross_video, video_coords[:, 0:1, :]),
            ("cross_audio", cross_audio, audio_coords[:, 0:1, :]),
        ]:
            cos, sin = module(coords)
            if rope_type == "interleaved":  # [1, N, dim] -> per pair [N, dim / 2]
                cos, sin = pairs_of(cos[0]), pairs_of(sin[0])
            else:  # [1, H, N, dim / 2H] -> [N, H, dim / 2H]
                cos, sin = cos[0].transpose(0, 1), sin[0].transpose(0, 1)
            assert cos.dtype == torch.float32
            tables[name] = {"cos": floats(cos), "sin": floats(sin)}

        def midpoints(c):
            return ((c[..., 0] + c[..., 1]) / 2.0)[0].transpose(0, 1)  # [N, A]

        cases.append(
            {
                **common,
                "video": video,
                "audio": audio,
                "cross_dim": cross_dim,
                "video_bounds": floats(
                    video_coords[0].permute(1, 0, 2)
                ),  # [N, 3, 2]: [start, end) per axis
                "audio_bounds": floats(audio_coords[0].permute(1, 0, 2)),  # [N, 1, 2]
                "video_positions": floats(
                    midpoints(video_coords)
                ),  # [N, 3]: t seconds, h and w pixels
                "audio_positions": floats(midpoints(audio_coords)),  # [N, 1]: t seconds
                "tables": tables,
            }
        )
    return cases


def main():
    torch.set_num_threads(1)
    out = {
        "generator": {
            "script": "tools/gen_fixtures_diffusers_video.py",
            "command": "ATEN_CPU_CAPABILITY=avx2 ~/.cache/posenc/venv/bin/python tools/gen_fixtures_diffusers_video.py",
            "diffusers": diffusers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        },
        "notes": [
            (
                "cos/sin are per rotary pair (diffusers' repeat_interleave'd copies checked equal and dropped); "
                "ltx2 split tables are [N, heads, pairs per head]"
            ),
            "wan: float64 arithmetic (CPU/CUDA path); hunyuan, ltx2: float32 cos/sin at aten_cpu_capability",
        ],
        "wan": wan_cases(),
        "hunyuan": hunyuan_cases(),
        "ltx2": ltx2_cases(),
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

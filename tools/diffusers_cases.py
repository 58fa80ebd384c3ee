"""The cases tools/gen_diffusers_fixtures.py records, per diffusers family posenc patches.

CASES maps a Family name of posenc.integrations.diffusers' registry (_registry.FAMILIES) to a
FamilyCases: what docs/diffusers.md's table says of the family (axes, theta, layout, dtype path;
the verdict column is measured by the generator) and small configurations whose tables diffusers'
own rotary module computes. Each Case builds diffusers' module (`build`), gives the arguments of
its forward (`inputs`) and, where the forward does not return (cos, sin), how to read the two
tables from what it returns (`tables`). The generator runs diffusers' module and posenc's
replacement (the family's `replace(module)`) on each case; tests/python/test_diffusers_fixtures.py
checks posenc's tables against the committed ones.

`float64` says how diffusers computes the family's tables on the CPU: True where the angles and
cos/sin are float64, rounded once to float32 (they hold to the bit on every CPU: a float64 cos
that differs by an ulp between ATen's AVX2 and AVX-512 kernels changes its float32 rounding only
when it lies within 2^-29 of a float32 rounding boundary), False where they are float32 (torch's
vectorized float32 pow/cos/sin: the fixture holds to the bit at the ATen capability it was
generated at, AVX2, and within FLOAT32_ATOL elsewhere).

A new family adds one entry here (the same Family name it registers), then regenerates:
    ATEN_CPU_CAPABILITY=avx2 PYTHONPATH=python ~/.cache/posenc/venv/bin/python \\
        tools/gen_diffusers_fixtures.py
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

# float32 tables at another ATen capability than the fixture's: torch's vectorized float32 pow and
# cos/sin round differently per capability; an ulp of a float32 angle below 64 rad (every float32
# case here) is at most 3.8e-6 and moves cos/sin by as much, plus an ulp of the result
FLOAT32_ATOL = 1e-5


@dataclasses.dataclass(frozen=True)
class Summary:
    axes: str  # the positions' axes and how the head dim is split among them
    theta: str
    layout: str  # which pairs rotate, where the tables' values sit, what is not rotated
    dtype_path: str  # the dtypes diffusers computes in, on which devices


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], torch.nn.Module]  # diffusers' rotary module
    inputs: Callable[[], tuple]  # the arguments of its forward
    # the two tables from what the forward returns (default: it returns (cos, sin))
    tables: Callable[[object], tuple[torch.Tensor, torch.Tensor]] | None = None


@dataclasses.dataclass(frozen=True)
class FamilyCases:
    summary: Summary
    float64: bool
    cases: list[Case]


def _wan_cases(module_name: str, class_name: str) -> list[Case]:
    def build(head_dim, patch, max_seq_len):
        def make():
            import importlib

            module = importlib.import_module(module_name)
            return getattr(module, class_name)(head_dim, patch, max_seq_len)

        return make

    return [
        Case("D12_grid2x3x4", build(12, (1, 2, 2), 32), lambda: (torch.zeros(1, 1, 2, 6, 8),)),
        Case("D40_grid3x2x2", build(40, (1, 2, 2), 64), lambda: (torch.zeros(1, 1, 3, 4, 4),)),
        Case(
            "D128_grid2x2x2_max1024",
            build(128, (1, 2, 2), 1024),
            lambda: (torch.zeros(1, 1, 2, 4, 4),),
        ),
        Case(
            "D64_grid1x1x9_patch111",
            build(64, (1, 1, 1), 16),
            lambda: (torch.zeros(1, 1, 1, 1, 9),),
        ),
    ]


def _chronoedit_build(head_dim, skip):
    def make():
        from diffusers.models.transformers import transformer_chronoedit

        return transformer_chronoedit.ChronoEditRotaryPosEmbed(
            head_dim, (1, 2, 2), 32, temporal_skip_len=skip
        )

    return make


def _hunyuan_cases(module_name: str, class_name: str) -> list[Case]:
    def build(patch, patch_t, rope_dim, theta=256.0):
        def make():
            import importlib

            module = importlib.import_module(module_name)
            return getattr(module, class_name)(patch, patch_t, list(rope_dim), theta)

        return make

    return [
        Case(
            "rope16-56-56_grid2x2x3",
            build(2, 1, (16, 56, 56)),
            lambda: (torch.zeros(1, 1, 2, 4, 6),),
        ),
        Case("rope2-4-4_grid2x3x4", build(1, 1, (2, 4, 4)), lambda: (torch.zeros(1, 1, 2, 3, 4),)),
        Case(
            "rope8-12-12_grid1x1x21_theta1e4",
            build(1, 1, (8, 12, 12), 10000.0),
            lambda: (torch.zeros(1, 1, 1, 1, 21),),
        ),
    ]


def _framepack_build(rope_dim, theta=256.0):
    def make():
        from diffusers.models.transformers import transformer_hunyuan_video_framepack as m

        return m.HunyuanVideoFramepackRotaryPosEmbed(2, 1, list(rope_dim), theta)

    return make


def _hunyuanimage_build(patch, rope_dim):
    def make():
        from diffusers.models.transformers import transformer_hunyuanimage as m

        return m.HunyuanImageRotaryPosEmbed(list(patch), list(rope_dim), 256.0)

    return make


def _motif_build(rope_dim):
    def make():
        from diffusers.models.transformers import transformer_motif_video as m

        return m.MotifVideoRotaryPosEmbed(2, 1, list(rope_dim), 256.0)

    return make


def _grid_ids(*sizes):
    return torch.cartesian_prod(*[torch.arange(s) for s in sizes])


def _flux_ids():
    img = torch.cat([torch.zeros(6, 1, dtype=torch.long), _grid_ids(2, 3)], dim=1)
    txt = torch.zeros(3, 3, dtype=torch.long)
    return (torch.cat([txt, img]).float(),)


def _flux_fractional_ids():
    ids = _grid_ids(2, 3, 4).float() * 0.75
    ids[:, 0] += 1000.0  # large positions: where float64 angles matter
    return (ids,)


def _flux2_ids():
    return (torch.cat([_grid_ids(1, 1, 1, 3), _grid_ids(1, 2, 3, 1) + 7]),)


def _flux_build(flux2: bool, theta, axes_dim, module="transformer_flux", name="FluxPosEmbed"):
    def make():
        import importlib

        if flux2:
            return _flux_build(False, theta, axes_dim, "transformer_flux2", "Flux2PosEmbed")()
        cls = getattr(importlib.import_module(f"diffusers.models.transformers.{module}"), name)
        return cls(theta, list(axes_dim))

    return make


_WAN_SUMMARY = Summary(
    axes="t, h, w: h = w = 2·(D//6), t = D − h − w (split sizes set in `__init__`, used by "
    "`forward`)",
    theta="1e4 (the module does not keep it: posenc checks its tables)",
    layout="interleaved pairs (2i, 2i+1), cos/sin t0 t0 t1 t1 … per axis block (t, h, w); "
    "the processor reads cos at even, sin at odd columns; q, k [B, N, H, D]",
    dtype_path="float64 angles and cos/sin, rounded to float32 buffers [max_seq_len, D] at "
    "construction; float32 angles where `torch.backends.mps.is_available()`",
)

_HUNYUAN_SUMMARY = Summary(
    axes="t, h, w with `rope_axes_dim` (16, 56, 56); grid `meshgrid(ij)` of the patched latent",
    theta="256 (`rope_theta`)",
    layout="interleaved pairs, t0 t0 t1 t1 … per axis block; q, k [B, N, H, D]; text tokens "
    "are not rotated",
    dtype_path="float32 grid, frequencies, angles and cos/sin, per forward, on the latents' "
    "device (every device)",
)

_FLUX_SUMMARY = Summary(
    axes="the ids' axes (text ids, then image ids (0, h, w)), `axes_dims_rope` (16, 56, 56)",
    theta="1e4",
    layout="interleaved pairs, t0 t0 t1 t1 … per axis block; the joint text + image sequence",
    dtype_path="ids.float(); float64 frequencies, angles and cos/sin → float32; float32 where "
    "the ids are on mps, npu or neuron",
)

CASES: dict[str, FamilyCases] = {
    "wan": FamilyCases(
        _WAN_SUMMARY,
        True,
        _wan_cases("diffusers.models.transformers.transformer_wan", "WanRotaryPosEmbed"),
    ),
    "skyreels_v2": FamilyCases(
        _WAN_SUMMARY,
        True,
        _wan_cases(
            "diffusers.models.transformers.transformer_skyreels_v2", "SkyReelsV2RotaryPosEmbed"
        ),
    ),
    "wan_animate": FamilyCases(
        _WAN_SUMMARY,
        True,
        _wan_cases("diffusers.models.transformers.transformer_wan_animate", "WanRotaryPosEmbed"),
    ),
    "sana_video": FamilyCases(
        dataclasses.replace(
            _WAN_SUMMARY,
            layout=(
                "interleaved pairs (2i, 2i+1), cos/sin t0 t0 t1 t1 … per axis block (t, h, w); "
                "relu'd q, k rotated inside a linear attention (the normaliser reads them unrotated)"
            ),
        ),
        True,
        _wan_cases("diffusers.models.transformers.transformer_sana_video", "WanRotaryPosEmbed"),
    ),
    "chronoedit": FamilyCases(
        dataclasses.replace(
            _WAN_SUMMARY,
            axes=(
                "t, h, w: buffers built with h = w = 2·(D//6), t = D − h − w, read by `forward` with "
                "[D − 2·(D//3), D//3, D//3] (the same where 6 divides D); two frames take rows 0 and "
                "`temporal_skip_len` − 1 of t"
            ),
        ),
        True,
        [
            Case(
                "D40_frames2_skip5", _chronoedit_build(40, 5), lambda: (torch.zeros(1, 1, 2, 4, 6),)
            ),
            Case("D40_frames3", _chronoedit_build(40, 8), lambda: (torch.zeros(1, 1, 3, 4, 4),)),
            Case(
                "D128_frames2_skip8",
                _chronoedit_build(128, 8),
                lambda: (torch.zeros(1, 1, 2, 2, 4),),
            ),
        ],
    ),
    "hunyuan_video": FamilyCases(
        _HUNYUAN_SUMMARY,
        False,
        _hunyuan_cases(
            "diffusers.models.transformers.transformer_hunyuan_video", "HunyuanVideoRotaryPosEmbed"
        ),
    ),
    "hunyuan_video15": FamilyCases(
        dataclasses.replace(
            _HUNYUAN_SUMMARY,
            layout=(
                "interleaved pairs, t0 t0 t1 t1 … per axis block; q, k [B, N, H, D] of the latent "
                "stream, the text stream appended after the rotation"
            ),
        ),
        False,
        _hunyuan_cases(
            "diffusers.models.transformers.transformer_hunyuan_video15",
            "HunyuanVideo15RotaryPosEmbed",
        ),
    ),
    "hunyuan_video_framepack": FamilyCases(
        dataclasses.replace(
            _HUNYUAN_SUMMARY,
            axes=(
                "t, h, w with `rope_axes_dim` (16, 56, 56): the given frame indices (latents, clean "
                "latents, 2x/4x history) × the patched height and width"
            ),
        ),
        False,
        [
            Case(
                "rope16-56-56_frames0-5-6-7_4x3",
                _framepack_build((16, 56, 56)),
                lambda: (torch.tensor([0.0, 5, 6, 7]), 8, 6, torch.device("cpu")),
            ),
            Case(
                "rope2-4-4_frames_fractional",
                _framepack_build((2, 4, 4)),
                lambda: (torch.tensor([0.5, 13.25, 40.0]), 10, 4, torch.device("cpu")),
            ),
        ],
    ),
    "hunyuanimage": FamilyCases(
        dataclasses.replace(
            _HUNYUAN_SUMMARY,
            axes=(
                "h, w (or t, h, w) with `rope_axes_dim` (64, 64); grid `meshgrid(ij)` of the patched "
                "latent"
            ),
        ),
        False,
        [
            Case(
                "rope64-64_grid5x7",
                _hunyuanimage_build((1, 1), (64, 64)),
                lambda: (torch.zeros(1, 1, 5, 7),),
            ),
            Case(
                "rope4-6-6_grid2x3x4",
                _hunyuanimage_build((1, 2, 2), (4, 6, 6)),
                lambda: (torch.zeros(1, 1, 2, 6, 8),),
            ),
        ],
    ),
    "motif_video": FamilyCases(
        dataclasses.replace(
            _HUNYUAN_SUMMARY,
            dtype_path=(
                "float32 grid; float64 frequencies, angles and cos/sin rounded to float32 (float32 on "
                "mps, npu, neuron), per forward"
            ),
            layout=(
                "interleaved pairs, t0 t0 t1 t1 … per axis block; self-attention as HunyuanVideo's, "
                "the text cross-attention rotates the latents' queries only"
            ),
        ),
        True,
        [
            Case(
                "rope16-56-56_grid2x2x3",
                _motif_build((16, 56, 56)),
                lambda: (torch.zeros(1, 1, 2, 4, 6),),
            ),
            Case(
                "rope2-4-4_grid3x5x2",
                _motif_build((2, 4, 4)),
                lambda: (torch.zeros(1, 1, 3, 10, 4),),
            ),
        ],
    ),
    "flux": FamilyCases(
        _FLUX_SUMMARY,
        True,
        [
            Case("axes16-56-56_text3_image2x3", _flux_build(False, 10000, (16, 56, 56)), _flux_ids),
            Case(
                "axes4-4-8_fractional_large",
                _flux_build(False, 10000, (4, 4, 8)),
                _flux_fractional_ids,
            ),
        ],
    ),
    "longcat_image": FamilyCases(
        _FLUX_SUMMARY,
        True,
        [
            Case(
                "axes16-56-56_text3_image2x3",
                _flux_build(
                    False, 10000, (16, 56, 56), "transformer_longcat_image", "LongCatImagePosEmbed"
                ),
                _flux_ids,
            ),
        ],
    ),
    "ovis_image": FamilyCases(
        _FLUX_SUMMARY,
        True,
        [
            Case(
                "axes16-56-56_text3_image2x3",
                _flux_build(
                    False, 10000, (16, 56, 56), "transformer_ovis_image", "OvisImagePosEmbed"
                ),
                _flux_ids,
            ),
        ],
    ),
    "flux2": FamilyCases(
        Summary(
            axes="the 4 axes of `axes_dims_rope` (32, 32, 32, 32): (t, h, w, l); tables for "
            "txt_ids and img_ids apart, text first",
            theta="2000 (`rope_theta`)",
            layout="interleaved pairs, t0 t0 t1 t1 … per axis block; double-stream and "
            "parallel single-stream attention",
            dtype_path=_FLUX_SUMMARY.dtype_path,
        ),
        True,
        [
            Case("axes32x4_theta2000", _flux_build(True, 2000, (32, 32, 32, 32)), _flux2_ids),
            Case(
                "axes4x4_theta2000_large",
                _flux_build(True, 2000, (4, 4, 4, 4)),
                lambda: (_grid_ids(2, 2, 2, 2) * 517,),
            ),
        ],
    ),
}


# -- CogVideoX, LTX-Video, LTX-2, Cosmos, Mochi, Qwen-Image (part B of issue 46) -----------------


def _cogvideox_build():
    from diffusers.models import embeddings

    from posenc.integrations.diffusers._cogvideox import Rotary3DTable

    return Rotary3DTable(embeddings.get_3d_rotary_pos_embed)


def _cogvideox_crop_inputs():
    from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

    crops = get_resize_crop_region_for_grid((4, 3), 45, 30)  # a 4 x 3 grid in the 30 x 45 base
    return (64, crops, (4, 3), 3)


def _module_build(module_name: str, class_name: str, *args, **kwargs):
    def make():
        import importlib

        return getattr(importlib.import_module(module_name), class_name)(*args, **kwargs)

    return make


_LTX = "diffusers.models.transformers.transformer_ltx"
_LTX2 = "diffusers.models.transformers.transformer_ltx2"
_COSMOS = "diffusers.models.transformers.transformer_cosmos"
_MOCHI = "diffusers.models.transformers.transformer_mochi"
_QWEN = "diffusers.models.transformers.transformer_qwenimage"


def _ltx2_video_coords(dim, frames, height, width, fps):
    def inputs():
        module = _module_build(_LTX2, "LTX2AudioVideoRotaryPosEmbed", dim, modality="video")()
        return (module.prepare_video_coords(1, frames, height, width, "cpu", fps=fps),)

    return inputs


def _ltx2_audio_coords(dim, frames, shift=0, first_axis_only=False):
    def inputs():
        module = _module_build(
            _LTX2, "LTX2AudioVideoRotaryPosEmbed", dim, scale_factors=[4], modality="audio"
        )()
        coords = module.prepare_audio_coords(1, frames, "cpu", shift=shift)
        return (coords[:, 0:1] if first_axis_only else coords,)

    return inputs


def _qwen_tables(out):
    freqs = torch.cat(list(out))  # the image rows, then the text rows
    return freqs.real, freqs.imag


def _mochi_inputs(grid):
    def inputs():
        freqs = torch.randn(3, 2, 8, generator=torch.Generator().manual_seed(0)) * 0.1
        return (freqs, *grid, torch.device("cpu"), torch.float32)

    return inputs


CASES.update(
    {
        "cogvideox": FamilyCases(
            Summary(
                axes="t, h, w: t = D//4, h = w = D//8·3 channels; the pipeline's grid (crop of "
                "the base grid in 1.0, slice of it in 1.5)",
                theta="1e4",
                layout="interleaved pairs, t0 t0 t1 t1 … per axis block; video tokens after the "
                "text in q, k [B, H, N, D] (text not rotated); no rotary module: the "
                "pipeline calls `get_3d_rotary_pos_embed` (posenc offers it, same name)",
                dtype_path="float32 positions (fractional with `linspace`), frequencies, angles "
                "and cos/sin, on the pipeline's device",
            ),
            False,
            [
                Case("linspace_D64_crop4x3_in30x45_T3", _cogvideox_build, _cogvideox_crop_inputs),
                Case(
                    "linspace_D48_fractional_crop_theta500",
                    _cogvideox_build,
                    lambda: (48, ((0.5, 1.25), (11, 7.5)), (3, 5), 2, 500),
                ),
                Case(
                    "slice_D64_grid4x6_max30x45_T2",
                    _cogvideox_build,
                    lambda: (64, None, (4, 6), 2, 10000, True, "slice", (30, 45)),
                ),
            ],
        ),
        "ltx": FamilyCases(
            Summary(
                axes="t, h, w fractions of the base sizes (20 frames, 2048², scaled by "
                "`rope_interpolation_scale` · patch); F = dim//6 per axis, dim = heads·Dh",
                theta="1e4 (log-spaced: θ^linspace(0, 1, F) · π/2, applied to 2p − 1)",
                layout="interleaved per frequency (t h w t h w …), t0 t0 t1 t1 …, dim mod 6 "
                "pass-through channels first; across the heads: q, k [B, N, heads·Dh]",
                dtype_path="float32 positions, frequencies, angles and cos/sin per forward, on "
                "every device; given `video_coords` keep their dtype (float64: float64 angles and "
                "cos/sin, as diffusers promotes them)",
            ),
            False,
            [
                Case(
                    "dim64_grid3x4x5_scaled",
                    _module_build(_LTX, "LTXVideoRotaryPosEmbed", 64),
                    lambda: (torch.zeros(1, 2), 3, 4, 5, (20 / 24, 32, 32)),
                ),
                Case(
                    "dim100_pad4_video_coords",
                    _module_build(_LTX, "LTXVideoRotaryPosEmbed", 100, patch_size=2),
                    lambda: (
                        torch.zeros(1, 2),
                        None,
                        None,
                        None,
                        None,
                        torch.arange(3 * 7).float().reshape(1, 3, 7) * 3.5,
                    ),
                ),
            ],
        ),
        "ltx2": FamilyCases(
            Summary(
                axes="video t (seconds: frame bounds / fps), h, w (pixels), audio t (seconds: "
                "mel hop / sampling rate); midpoints of [start, end) over the axis max; "
                "cross attention: time only",
                theta="1e4 (θ^linspace(0, 1, F) · π/2, applied to 2p − 1)",
                layout="interleaved per frequency, t0 t0 t1 t1 …, dim mod 2A pass-through "
                "channels first; across the heads; `rope_type='split'`: the same angles "
                "unrepeated, per head [B, H, N, dim/2H] (rotated by diffusers' own addcmul_, a "
                "fused multiply-add)",
                dtype_path="float64 frequency ladder (`double_precision`) rounded to float32; "
                "float32 positions, angles and cos/sin, every device; given float64 coordinates: "
                "float64 angles and cos/sin",
            ),
            False,
            [
                Case(
                    "video_dim64_grid3x4x5_fps25",
                    _module_build(_LTX2, "LTX2AudioVideoRotaryPosEmbed", 64, modality="video"),
                    _ltx2_video_coords(64, 3, 4, 5, 25.0),
                ),
                Case(
                    "audio_dim48_frames9_shift2",
                    _module_build(
                        _LTX2,
                        "LTX2AudioVideoRotaryPosEmbed",
                        48,
                        scale_factors=[4],
                        modality="audio",
                    ),
                    _ltx2_audio_coords(48, 9, shift=2),
                ),
                Case(
                    "cross_video_time_dim50_fps29.97",
                    _module_build(_LTX2, "LTX2AudioVideoRotaryPosEmbed", 50, modality="video"),
                    lambda: (_ltx2_video_coords(50, 5, 2, 2, 30000 / 1001)()[0][:, 0:1],),
                ),
                Case(
                    "cross_audio_time_dim50_float32_ladder",
                    _module_build(
                        _LTX2,
                        "LTX2AudioVideoRotaryPosEmbed",
                        50,
                        scale_factors=[4],
                        modality="audio",
                        double_precision=False,
                    ),
                    _ltx2_audio_coords(50, 7, first_axis_only=True),
                ),
            ],
        ),
        "ltx2_connector": FamilyCases(
            Summary(
                axes="text token index / base_seq_len (4096) of LTX-2's text connectors "
                "(pipelines/ltx2/connectors.py)",
                theta="1e4 (θ^linspace(0, 1, dim//2) · π/2, applied to 2p − 1)",
                layout="interleaved pairs t0 t0 t1 t1 …, dim mod 2 pass-through channel first; "
                "across the heads (LTX-2's processor)",
                dtype_path="float64 frequency ladder (`double_precision`) rounded to float32; "
                "float32 positions, angles and cos/sin, every device",
            ),
            False,
            [
                Case(
                    "dim64_batch2_tokens300",
                    _module_build(
                        "diffusers.pipelines.ltx2.connectors", "LTX2RotaryPosEmbed1d", 64
                    ),
                    lambda: (2, 300, "cpu"),
                ),
                Case(
                    "dim7_tokens33_float32_ladder",
                    _module_build(
                        "diffusers.pipelines.ltx2.connectors",
                        "LTX2RotaryPosEmbed1d",
                        7,
                        double_precision=False,
                    ),
                    lambda: (1, 33, "cpu"),
                ),
            ],
        ),
        "cosmos": FamilyCases(
            Summary(
                axes="t, h, w: h = w = D//6·2, t = D − h − w; the patch grid's indices, t "
                "rescaled by 24/fps for videos",
                theta="1e4 per axis times NTK rope_scale^(d/(d−2)) ((2, 1, 1) by default)",
                layout="rotate-half over the whole head: cat(t h w, t h w); q, k [B, H, N, D]",
                dtype_path="float32 positions, frequencies, angles and cos/sin per forward, on "
                "every device",
            ),
            False,
            [
                Case(
                    "D128_grid3x4x6_fps30",
                    _module_build(_COSMOS, "CosmosRotaryPosEmbed", 128, max_size=(16, 64, 64)),
                    lambda: (torch.zeros(1, 1, 3, 8, 12), 30),
                ),
                Case(
                    "D12_grid2x2x3_image_scale1x3x3",
                    _module_build(
                        _COSMOS,
                        "CosmosRotaryPosEmbed",
                        12,
                        max_size=(8, 16, 16),
                        rope_scale=(1.0, 3.0, 3.0),
                    ),
                    lambda: (torch.zeros(1, 1, 2, 4, 6), None),
                ),
            ],
        ),
        "mochi": FamilyCases(
            Summary(
                axes="t, h, w: frame index, h and w cell centres scaled to the 192² area; every "
                "pair mixes the three axes",
                theta="— (learned frequencies: the transformer's `pos_frequencies` [3, heads, "
                "Dh/2])",
                layout="interleaved pairs, one table per head [N, heads, Dh/2]; q, k [B, N, "
                "heads, Dh]; gradients reach `pos_frequencies`",
                dtype_path="float32 einsum of positions and learned frequencies, cos/sin, every "
                "device",
            ),
            False,
            [
                Case(
                    "heads2_pairs8_grid2x3x4",
                    _module_build(_MOCHI, "MochiRoPE"),
                    _mochi_inputs((2, 3, 4)),
                ),
            ],
        ),
        "qwenimage": FamilyCases(
            Summary(
                axes="t, h, w `axes_dims_rope` (16, 56, 56); h, w centred (negative indices) "
                "with `scale_rope`; text rows after the image's largest index",
                theta="1e4",
                layout="complex tables (Re = cos, Im = sin per pair (2i, 2i+1)); q, k [B, N, "
                "heads, Dh]; to the bit on the CPU for heads of 32k channels, refused "
                "for others",
                dtype_path="float32 frequencies, torch.polar complex64 rows built once (4096 "
                "positions each sign), every device",
            ),
            False,
            [
                Case(
                    "axes16-56-56_image1x4x6_text7",
                    _module_build(_QWEN, "QwenEmbedRope", 10000, [16, 56, 56], scale_rope=True),
                    lambda: ([(1, 4, 6)], torch.device("cpu"), 7),
                    _qwen_tables,
                ),
                Case(
                    "axes8-12-12_image2x5x3_text3_unscaled",
                    _module_build(_QWEN, "QwenEmbedRope", 10000, [8, 12, 12]),
                    lambda: ([(2, 5, 3)], torch.device("cpu"), 3),
                    _qwen_tables,
                ),
            ],
        ),
        "qwenimage_layer3d": FamilyCases(
            Summary(
                axes="as qwenimage, one frame index per layer; the condition layer at frame −1",
                theta="1e4",
                layout="as qwenimage",
                dtype_path="as qwenimage",
            ),
            False,
            [
                Case(
                    "axes16-56-56_layers3_4x6_text5",
                    _module_build(
                        _QWEN, "QwenEmbedLayer3DRope", 10000, [16, 56, 56], scale_rope=True
                    ),
                    lambda: ([[(1, 4, 6), (1, 4, 6), (1, 4, 6)]], 5, torch.device("cpu")),
                    _qwen_tables,
                ),
            ],
        ),
        "flux3": FamilyCases(
            Summary(
                axes="the 4 axes of `axes_dims_rope` (32, 32, 32, 32); text, image and reference "
                "image ids apart",
                theta="1e4 (`rope_theta`)",
                layout="interleaved pairs, t0 t0 t1 t1 … per axis block; q, k normalised and "
                "rotated in float32, then cast to v's dtype",
                dtype_path=_FLUX_SUMMARY.dtype_path,
            ),
            True,
            [
                Case(
                    "axes32x4_theta1e4",
                    _flux_build(
                        False, 10000, (32, 32, 32, 32), "transformer_flux3", "Flux3PosEmbed"
                    ),
                    _flux2_ids,
                ),
            ],
        ),
        "krea2": FamilyCases(
            Summary(
                axes="the ids' 3 axes (`position_ids`: text tokens at 0, image (0, h, w)), "
                "`axes_dims_rope` (32, 48, 48)",
                theta="1000 (`rope_theta`)",
                layout="interleaved pairs, t0 t0 t1 t1 … per axis block; grouped-query q, k",
                dtype_path=_FLUX_SUMMARY.dtype_path,
            ),
            True,
            [
                Case(
                    "axes32-48-48_theta1000",
                    _flux_build(
                        False, 1000.0, (32, 48, 48), "transformer_krea2", "Krea2RotaryPosEmbed"
                    ),
                    _flux_ids,
                ),
                Case(
                    "axes4-2-2_theta1000_large",
                    _flux_build(
                        False, 1000.0, (4, 2, 2), "transformer_krea2", "Krea2RotaryPosEmbed"
                    ),
                    _flux_fractional_ids,
                ),
            ],
        ),
    }
)

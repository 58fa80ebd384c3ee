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
from typing import Callable, Dict, List, Optional, Tuple

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
    tables: Optional[Callable[[object], Tuple[torch.Tensor, torch.Tensor]]] = None


@dataclasses.dataclass(frozen=True)
class FamilyCases:
    summary: Summary
    float64: bool
    cases: List[Case]


def _wan_cases(module_name: str, class_name: str) -> List[Case]:
    def build(head_dim, patch, max_seq_len):
        def make():
            import importlib
            module = importlib.import_module(module_name)
            return getattr(module, class_name)(head_dim, patch, max_seq_len)
        return make

    return [
        Case("D12_grid2x3x4", build(12, (1, 2, 2), 32), lambda: (torch.zeros(1, 1, 2, 6, 8),)),
        Case("D40_grid3x2x2", build(40, (1, 2, 2), 64), lambda: (torch.zeros(1, 1, 3, 4, 4),)),
        Case("D128_grid2x2x2_max1024", build(128, (1, 2, 2), 1024),
             lambda: (torch.zeros(1, 1, 2, 4, 4),)),
        Case("D64_grid1x1x9_patch111", build(64, (1, 1, 1), 16),
             lambda: (torch.zeros(1, 1, 1, 1, 9),)),
    ]


def _hunyuan_cases(module_name: str, class_name: str) -> List[Case]:
    def build(patch, patch_t, rope_dim, theta=256.0):
        def make():
            import importlib
            module = importlib.import_module(module_name)
            return getattr(module, class_name)(patch, patch_t, list(rope_dim), theta)
        return make

    return [
        Case("rope16-56-56_grid2x2x3", build(2, 1, (16, 56, 56)),
             lambda: (torch.zeros(1, 1, 2, 4, 6),)),
        Case("rope2-4-4_grid2x3x4", build(1, 1, (2, 4, 4)), lambda: (torch.zeros(1, 1, 2, 3, 4),)),
        Case("rope8-12-12_grid1x1x21_theta1e4", build(1, 1, (8, 12, 12), 10000.0),
             lambda: (torch.zeros(1, 1, 1, 1, 21),)),
    ]


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


def _flux_build(flux2: bool, theta, axes_dim):
    def make():
        from diffusers.models.transformers import transformer_flux, transformer_flux2
        cls = transformer_flux2.Flux2PosEmbed if flux2 else transformer_flux.FluxPosEmbed
        return cls(theta, list(axes_dim))
    return make


_WAN_SUMMARY = Summary(
    axes="t, h, w: h = w = 2·(D//6), t = D − h − w (split sizes set in `__init__`, used by "
         "`forward`)",
    theta="1e4 (the module does not keep it: posenc checks its tables)",
    layout="interleaved pairs (2i, 2i+1), cos/sin t0 t0 t1 t1 … per axis block (t, h, w); "
           "the processor reads cos at even, sin at odd columns; q, k [B, N, H, D]",
    dtype_path="float64 angles and cos/sin, rounded to float32 buffers [max_seq_len, D] at "
               "construction; float32 angles where `torch.backends.mps.is_available()`")

_HUNYUAN_SUMMARY = Summary(
    axes="t, h, w with `rope_axes_dim` (16, 56, 56); grid `meshgrid(ij)` of the patched latent",
    theta="256 (`rope_theta`)",
    layout="interleaved pairs, t0 t0 t1 t1 … per axis block; q, k [B, N, H, D]; text tokens "
           "are not rotated",
    dtype_path="float32 grid, frequencies, angles and cos/sin, per forward, on the latents' "
               "device (every device)")

_FLUX_SUMMARY = Summary(
    axes="the ids' axes (text ids, then image ids (0, h, w)), `axes_dims_rope` (16, 56, 56)",
    theta="1e4",
    layout="interleaved pairs, t0 t0 t1 t1 … per axis block; the joint text + image sequence",
    dtype_path="ids.float(); float64 frequencies, angles and cos/sin → float32; float32 where "
               "the ids are on mps, npu or neuron")

CASES: Dict[str, FamilyCases] = {
    "wan": FamilyCases(
        _WAN_SUMMARY, True,
        _wan_cases("diffusers.models.transformers.transformer_wan", "WanRotaryPosEmbed")),
    "skyreels_v2": FamilyCases(
        _WAN_SUMMARY, True,
        _wan_cases("diffusers.models.transformers.transformer_skyreels_v2",
                   "SkyReelsV2RotaryPosEmbed")),
    "hunyuan_video": FamilyCases(
        _HUNYUAN_SUMMARY, False,
        _hunyuan_cases("diffusers.models.transformers.transformer_hunyuan_video",
                       "HunyuanVideoRotaryPosEmbed")),
    "hunyuan_video15": FamilyCases(
        dataclasses.replace(_HUNYUAN_SUMMARY, layout=(
            "interleaved pairs, t0 t0 t1 t1 … per axis block; q, k [B, N, H, D] of the latent "
            "stream, the text stream appended after the rotation")), False,
        _hunyuan_cases("diffusers.models.transformers.transformer_hunyuan_video15",
                       "HunyuanVideo15RotaryPosEmbed")),
    "flux": FamilyCases(_FLUX_SUMMARY, True, [
        Case("axes16-56-56_text3_image2x3", _flux_build(False, 10000, (16, 56, 56)), _flux_ids),
        Case("axes4-4-8_fractional_large", _flux_build(False, 10000, (4, 4, 8)),
             _flux_fractional_ids),
    ]),
    "flux2": FamilyCases(
        Summary(axes="the 4 axes of `axes_dims_rope` (32, 32, 32, 32): (t, h, w, l); tables for "
                     "txt_ids and img_ids apart, text first",
                theta="2000 (`rope_theta`)",
                layout="interleaved pairs, t0 t0 t1 t1 … per axis block; double-stream and "
                       "parallel single-stream attention",
                dtype_path=_FLUX_SUMMARY.dtype_path), True, [
            Case("axes32x4_theta2000", _flux_build(True, 2000, (32, 32, 32, 32)), _flux2_ids),
            Case("axes4x4_theta2000_large", _flux_build(True, 2000, (4, 4, 4, 4)),
                 lambda: (_grid_ids(2, 2, 2, 2) * 517,)),
        ]),
}

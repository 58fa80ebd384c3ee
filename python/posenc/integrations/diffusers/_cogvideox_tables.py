"""CogVideoX (diffusers 0.42.1, embeddings.py and pipelines/cogvideo): the 3D RoPE table its
pipeline builds, computed by posenc (no diffusers import: posenc.integrations.diffusers exports
these functions; the processors are in _cogvideox.py).

CogVideoX's transformer has no rotary module: the pipeline builds the table once per call with
diffusers.models.embeddings.get_3d_rotary_pos_embed and hands it to every block
(image_rotary_emb). This module offers that function under diffusers' name, signature and
defaults, equal to diffusers' to the bit, and get_resize_crop_region_for_grid, the crop region
CogVideoX 1.0's pipeline computes for it:

  get_3d_rotary_pos_embed(embed_dim, crops_coords, grid_size, temporal_size, theta=10000,
                          use_real=True, grid_type="linspace", max_size=None, device=None)
      axes: dim_t = embed_dim // 4, dim_h = dim_w = embed_dim // 8 * 3 (channels, each even)
      positions, float32:
        "linspace" (CogVideoX 1.0): h = linspace(top, bottom (gh-1)/gh, gh),
            w = linspace(left, right (gw-1)/gw, gw), t = linspace(0, T (T-1)/T, T) — fractional
            positions of the crop (crops_coords = ((top, left), (bottom, right)))
        "slice" (CogVideoX 1.5): arange(max_h)[:gh], arange(max_w)[:gw], arange(T)
      per axis: freqs_i = 1 / theta^(2i/dim) (float32, diffusers' ladder, _common.frequencies),
            cos/sin(pos * freqs_i) repeated per pair (t0 t0 t1 t1 ..) by posenc's operator
            torch.ops.posenc.rope_cos_sin (float32 angles and cos/sin, diffusers' arithmetic)
      table[(t, h, w)] = cat(table_t[t], table_h[h], table_w[w])   -> cos, sin [T gh gw, embed_dim']
      where embed_dim' = dim_t + 2 dim_h (= embed_dim when embed_dim % 8 == 0).
  All float32, on `device` (diffusers computes this table in float32 on every device).

Rotary3DTable wraps such a function as a module (forward(*args) -> (cos, sin)): the form in
which tools/gen_diffusers_fixtures.py runs diffusers' function and posenc's side by side.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from . import _common

__all__ = ["get_3d_rotary_pos_embed", "get_resize_crop_region_for_grid", "Rotary3DTable"]

_NAME = "posenc.integrations.diffusers.get_3d_rotary_pos_embed"


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{_NAME}: {name} must be a positive integer, got {value!r}")
    return int(value)


def _pair(name: str, value) -> tuple:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{_NAME}: {name} must be a pair, got {value!r}")
    return tuple(value)


def _axis_table(dim: int, positions: torch.Tensor, theta) -> tuple[torch.Tensor, torch.Tensor]:
    """diffusers' get_1d_rotary_pos_embed(dim, positions, theta, use_real=True): [S, dim]."""
    ladder = _common.frequencies(dim, theta, torch.float32, device=positions.device)
    return torch.ops.posenc.rope_cos_sin(positions, ladder, 1.0, [], "contiguous", "interleaved")


def get_3d_rotary_pos_embed(
    embed_dim,
    crops_coords,
    grid_size,
    temporal_size,
    theta: int = 10000,
    use_real: bool = True,
    grid_type: str = "linspace",
    max_size: tuple[int, int] | None = None,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """diffusers.models.embeddings.get_3d_rotary_pos_embed: (cos, sin) [T gh gw, D] float32,
    equal to diffusers' to the bit for grid_type "linspace" (crops) and "slice"."""
    if use_real is not True:
        raise ValueError(
            f"{_NAME}: use_real=False (complex tables) is not supported, as in "
            f"diffusers; got use_real={use_real!r}"
        )
    if grid_type not in ("linspace", "slice"):
        raise ValueError(f"{_NAME}: grid_type must be 'linspace' or 'slice', got {grid_type!r}")
    embed_dim = _positive_int("embed_dim", embed_dim)
    grid_size_h, grid_size_w = _pair("grid_size", grid_size)
    grid_size_h = _positive_int("grid_size[0]", grid_size_h)
    grid_size_w = _positive_int("grid_size[1]", grid_size_w)
    temporal_size = _positive_int("temporal_size", temporal_size)
    if (
        isinstance(theta, bool)
        or not isinstance(theta, numbers.Real)
        or not theta > 0
        or theta == float("inf")
    ):
        raise ValueError(f"{_NAME}: theta must be a finite number > 0, got {theta!r}")
    dim_t = embed_dim // 4
    dim_h = embed_dim // 8 * 3
    dim_w = embed_dim // 8 * 3
    for axis, dim in (("t", dim_t), ("h", dim_h), ("w", dim_w)):
        if dim % 2 != 0:  # diffusers: an AssertionError in get_1d_rotary_pos_embed
            raise ValueError(
                f"{_NAME}: embed_dim {embed_dim} gives the {axis} axis {dim} "
                f"channels (t: embed_dim // 4, h and w: embed_dim // 8 * 3); each "
                f"must be even"
            )

    if grid_type == "linspace":
        start, stop = _pair("crops_coords", crops_coords)
        start, stop = _pair("crops_coords[0]", start), _pair("crops_coords[1]", stop)
        for value in (*start, *stop):
            if (
                isinstance(value, bool)
                or not isinstance(value, numbers.Real)
                or value != value
                or abs(value) == float("inf")
            ):
                raise ValueError(
                    f"{_NAME}: crops_coords must be finite numbers "
                    f"((top, left), (bottom, right)), got {crops_coords!r}"
                )
        # diffusers' position builders, the same expressions (the end computed in Python)
        grid_h = torch.linspace(
            start[0],
            stop[0] * (grid_size_h - 1) / grid_size_h,
            grid_size_h,
            device=device,
            dtype=torch.float32,
        )
        grid_w = torch.linspace(
            start[1],
            stop[1] * (grid_size_w - 1) / grid_size_w,
            grid_size_w,
            device=device,
            dtype=torch.float32,
        )
        grid_t = torch.linspace(
            0,
            temporal_size * (temporal_size - 1) / temporal_size,
            temporal_size,
            device=device,
            dtype=torch.float32,
        )
    else:
        if max_size is None:
            raise ValueError(f"{_NAME}: grid_type 'slice' needs max_size (max_h, max_w)")
        max_h, max_w = _pair("max_size", max_size)
        max_h, max_w = _positive_int("max_size[0]", max_h), _positive_int("max_size[1]", max_w)
        if grid_size_h > max_h or grid_size_w > max_w:
            raise ValueError(
                f"{_NAME}: grid_size ({grid_size_h}, {grid_size_w}) exceeds max_size "
                f"({max_h}, {max_w}) for grid_type 'slice'"
            )
        # diffusers slices the tables of arange(max) to the grid: the same rows
        grid_h = torch.arange(max_h, device=device, dtype=torch.float32)[:grid_size_h]
        grid_w = torch.arange(max_w, device=device, dtype=torch.float32)[:grid_size_w]
        grid_t = torch.arange(temporal_size, device=device, dtype=torch.float32)

    t_cos, t_sin = _axis_table(dim_t, grid_t, theta)
    h_cos, h_sin = _axis_table(dim_h, grid_h, theta)
    w_cos, w_sin = _axis_table(dim_w, grid_w, theta)

    def combine(table_t, table_h, table_w):  # [T, gh, gw, dim_t + dim_h + dim_w] -> [T gh gw, D]
        table_t = table_t[:, None, None, :].expand(-1, grid_size_h, grid_size_w, -1)
        table_h = table_h[None, :, None, :].expand(temporal_size, -1, grid_size_w, -1)
        table_w = table_w[None, None, :, :].expand(temporal_size, grid_size_h, -1, -1)
        table = torch.cat([table_t, table_h, table_w], dim=-1)
        return table.view(temporal_size * grid_size_h * grid_size_w, -1)

    return combine(t_cos, h_cos, w_cos), combine(t_sin, h_sin, w_sin)


def get_resize_crop_region_for_grid(src: Sequence[int], tgt_width: int, tgt_height: int):
    """diffusers' pipelines.cogvideo get_resize_crop_region_for_grid: the crop ((top, left),
    (bottom, right)) of a (h, w) grid resized into tgt_height x tgt_width, aspect kept."""
    name = "posenc.integrations.diffusers.get_resize_crop_region_for_grid"
    if not isinstance(src, (tuple, list)) or len(src) != 2:
        raise ValueError(f"{name}: src must be (height, width), got {src!r}")
    for what, value in (
        ("src[0]", src[0]),
        ("src[1]", src[1]),
        ("tgt_width", tgt_width),
        ("tgt_height", tgt_height),
    ):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
            raise ValueError(f"{name}: {what} must be a positive integer, got {value!r}")
    tw = tgt_width
    th = tgt_height
    h, w = src
    r = h / w
    if r > (th / tw):
        resize_height = th
        resize_width = int(round(th / h * w))
    else:
        resize_width = tw
        resize_height = int(round(tw / w * h))
    crop_top = int(round((th - resize_height) / 2.0))
    crop_left = int(round((tw - resize_width) / 2.0))
    return (crop_top, crop_left), (crop_top + resize_height, crop_left + resize_width)


class Rotary3DTable(torch.nn.Module):
    """A get_3d_rotary_pos_embed function as a module: forward(*args, **kwargs) -> (cos, sin).
    The form in which tools/gen_diffusers_fixtures.py runs diffusers' function and posenc's side
    by side (the family's `replace` turns diffusers' into posenc's); patch() never meets one."""

    def __init__(self, function) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args, **kwargs):
        return self.function(*args, **kwargs)

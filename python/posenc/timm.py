"""timm's position-embedding functions with timm's signatures, computed by posenc's operators.

resample_abs_pos_embed(posemb, new_size, old_size=None, num_prefix_tokens=1,
                       interpolation="bicubic", antialias=True, verbose=False, align_corners=None)
    timm.layers.resample_abs_pos_embed: a learned [1, prefix + H*W, D] table moved to a new patch
    grid (prefix rows kept, the grid interpolated as an image in float32, cast back), through
    torch.ops.posenc.resample_grid_table. Where timm returns the table unchanged (the size already
    matches), so does this.

build_sincos2d_pos_embed(feat_shape, dim=64, temperature=10000.0, reverse_coord=False,
                         interleave_sin_cos=False, device=None, dtype=torch.float32)
    timm.layers.build_sincos2d_pos_embed: the fixed 2D sin-cos table [H*W, dim], through
    torch.ops.posenc.axial_sincos_table. Its angles are float64 and rounded once (timm's are
    float32 products): the two agree to 2e-6 on a 14 x 14 grid (4e-6 at 64 x 64: timm's rounding
    grows with the positions); posenc's is the exact one.

apply_rot_embed_cat(x, emb, half=False)
    timm.layers.apply_rot_embed_cat (EVA, ViT-RoPE, Naver's RoPE-ViT): x [..., N, D] rotated by
    emb = cat([sin, cos], -1) [N, 2D] from timm's RotaryEmbeddingCat (interleaved pairs
    [f0, f0, f1, f1, ...], or half=True for its rotate_half layout), through
    torch.ops.posenc.apply_rotary: the rotation in the promoted dtype, cast to x's, as timm's;
    equal to it to the bit. apply_rot_embed_cat_qk(q, k, emb, half=False) rotates both in one pass.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from . import _library

_library.load()

__all__ = ["resample_abs_pos_embed", "build_sincos2d_pos_embed", "apply_rot_embed_cat",
           "apply_rot_embed_cat_qk"]


def resample_abs_pos_embed(posemb: torch.Tensor, new_size: Sequence[int],
                           old_size: Optional[Sequence[int]] = None, num_prefix_tokens: int = 1,
                           interpolation: str = "bicubic", antialias: bool = True,
                           verbose: bool = False, align_corners: Optional[bool] = None
                           ) -> torch.Tensor:
    """posemb [1, prefix + H*W, D] -> [1, prefix + H'*W', D] (new_size = (H', W'))."""
    if posemb.dim() != 3 or posemb.shape[0] != 1:
        raise ValueError(f"posenc.timm.resample_abs_pos_embed: posemb must be [1, tokens, dim], "
                         f"got shape {tuple(posemb.shape)}")
    if interpolation not in ("bicubic", "bilinear"):
        raise ValueError(f"posenc.timm.resample_abs_pos_embed: interpolation must be 'bicubic' or "
                         f"'bilinear', got {interpolation!r}")
    new_size = [int(s) for s in new_size]
    num_pos_tokens = posemb.shape[1]
    if new_size[0] * new_size[1] + num_prefix_tokens == num_pos_tokens:  # timm's early-outs
        if old_size is not None and list(old_size) == new_size:
            return posemb
        if old_size is None and new_size[0] == new_size[1]:
            return posemb
    if old_size is None:  # square, as timm assumes
        hw = int(math.sqrt(num_pos_tokens - num_prefix_tokens))
        old_size = (hw, hw)
    table = torch.ops.posenc.resample_grid_table(
        posemb[0].float(), [int(s) for s in old_size], new_size, int(num_prefix_tokens),
        interpolation, bool(antialias), bool(align_corners))
    # timm interpolates the grid in float32 and keeps the prefix rows as they were (a float64
    # CLS row is not rounded through float32)
    n = int(num_prefix_tokens)
    return torch.cat([posemb[0, :n], table[n:].to(posemb.dtype)]).unsqueeze(0)


def build_sincos2d_pos_embed(feat_shape: Sequence[int], dim: int = 64, temperature: float = 10000.0,
                             reverse_coord: bool = False, interleave_sin_cos: bool = False,
                             device: Optional[torch.device] = None,
                             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[H*W, dim]: timm's order of tokens (row-major over feat_shape, reversed with
    reverse_coord) and of features (sin, sin, cos, cos; sin, cos, sin, cos interleaved)."""
    if len(feat_shape) != 2:
        raise ValueError(f"posenc.timm.build_sincos2d_pos_embed: feat_shape must be [height, width], "
                         f"got {list(feat_shape)}")
    if dim % 4 != 0:
        raise ValueError(f"posenc.timm.build_sincos2d_pos_embed: dim must be divisible by 4, "
                         f"got {dim}")
    shape = list(feat_shape)[::-1] if reverse_coord else list(feat_shape)
    coords = torch.stack(torch.meshgrid(*[torch.arange(s, dtype=torch.float64) for s in shape],
                                        indexing="ij")).flatten(1).transpose(0, 1)  # [N, 2]
    if interleave_sin_cos:  # per axis (sin, cos): posenc's "mae" layout lists the axes reversed
        table = torch.ops.posenc.axial_sincos_table(coords.flip(-1), dim, float(temperature), "mae")
    else:
        table = torch.ops.posenc.axial_sincos_table(coords, dim, float(temperature), "timm")
    return table.to(device=device, dtype=dtype)


def _split_emb(emb: torch.Tensor, x: torch.Tensor, name: str):
    if emb.shape[-1] != 2 * x.shape[-1]:
        raise ValueError(f"posenc.timm.{name}: emb must be [..., N, 2D] = [..., "
                         f"{x.shape[-2] if x.dim() > 1 else '?'}, {2 * x.shape[-1]}] for x of "
                         f"shape {tuple(x.shape)}, got {tuple(emb.shape)}")
    sin, cos = emb.chunk(2, -1)
    if cos.dim() == 2:  # [N, D] -> [1, N, D], the tables' batch dim
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    return cos, sin


def apply_rot_embed_cat_qk(q: torch.Tensor, k: torch.Tensor, emb: torch.Tensor,
                           half: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's apply_rot_embed_cat on q and k [B, H, N, D] in one pass, each in its own dtype."""
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"posenc.timm.apply_rot_embed_cat_qk: q and k must be [B, H, N, D], got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    cos, sin = _split_emb(emb, q, "apply_rot_embed_cat_qk")
    yq, yk = torch.ops.posenc.apply_rotary(q, k, cos, sin, 1,
                                           "half" if half else "interleaved")
    return yq.to(q.dtype), yk.to(k.dtype)


def apply_rot_embed_cat(x: torch.Tensor, emb: torch.Tensor, half: bool = False) -> torch.Tensor:
    """timm's apply_rot_embed_cat: x [B, H, N, D] (or [B, N, D]) rotated by emb [N, 2D]."""
    if x.dim() == 3:  # [B, N, D]: one head
        return apply_rot_embed_cat(x.unsqueeze(1), emb, half).squeeze(1)
    if x.dim() != 4:
        raise ValueError(f"posenc.timm.apply_rot_embed_cat: x must be [B, H, N, D] or [B, N, D], "
                         f"got {tuple(x.shape)}")
    cos, sin = _split_emb(emb, x, "apply_rot_embed_cat")
    none = x.new_empty((x.shape[0], 0, x.shape[2], x.shape[3]))
    y, _ = torch.ops.posenc.apply_rotary(x, none, cos, sin, 1, "half" if half else "interleaved")
    return y.to(x.dtype)

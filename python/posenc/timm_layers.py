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

build_rotary_pos_embed(feat_shape, bands=None, dim=64, max_res=224, temperature=10000.0,
                       linear_bands=False, in_pixels=True, ref_feat_shape=None, grid_offset=0.0,
                       grid_indexing="ij", rotate_half=False, device=None, dtype=torch.float32,
                       grid_type=None, normalize_coords="separate")
    timm.layers.build_rotary_pos_embed: axial RoPE (sin, cos) [N, A * dim / 4 * 2] over a patch
    grid (index, pixel or centered coordinates; EVA's ref_feat_shape rescaling; "xy" indexing),
    through torch.ops.posenc.patch_grid_bands and torch.ops.posenc.patch_grid_rope: float32
    products as timm's (float64 bands: float64 angles, as timm's grid * bands promotes), equal
    to timm's tables to the bit. Given bands and dtype=None, the tables are in the bands' dtype,
    as timm's. timm's float64 tables from float64 bands keep float64 sin/cos, which posenc's
    operator does not give: asked for, they are refused with one line.

RotaryEmbeddingCat(dim, ...), RotaryEmbedding(dim, ...)
    timm's modules with timm's arguments and methods (get_embed, get_batch_embeds,
    update_feat_shape, forward on channels-first maps): cat([sin, cos]) [N, 2 dim] or (sin, cos),
    cached for a fixed feat_shape or built per shape (in training mode with shift_coords,
    jitter_coords or rescale_coords: the coordinates augmented with timm's draws, as below);
    RotaryEmbeddingCat.from_timm(module) takes a timm module's settings and state (bands and cache
    dtypes, device; a cache its settings do not give, e.g. after timm's .half().float(), is refused
    with one line). The dtypes follow timm's _RotaryEmbeddingBase (timm 1.0.x
    layers/pos_embed_sincos.py) through every cast: the bands buffer stays >= float32 (.half() /
    .bfloat16() rebuild it float32, .double() and a float64 dtype or default dtype make it float64),
    the cache is computed from fresh float32 bands and cast to its dtype of the moment (at
    construction, and on update_feat_shape after .half() or .double()), per-shape tables come from
    the bands buffer as it is.

RotaryEmbeddingMixed(dim, depth, num_heads, temperature=10.0, feat_shape=None, grid_indexing="xy",
                     device=None, dtype=None, shift_coords=None, jitter_coords=None,
                     rescale_coords=None)
    timm's RoPE-Mixed (Heo et al. 2024; naver-ai/rope-vit): learned frequencies freqs
    [2, depth, heads, head_dim / 2] (a trainable parameter), angle = x f_x + y f_y per block and
    head, get_embed -> [depth, heads, N, 2 head_dim]. The angles and sin/cos are
    torch.ops.posenc.rope_mixed_cos_sin (float32, timm's products and sum: its tables to the bit,
    gradients through ATen's derivatives of the same ops); from_timm shares the module's freqs.

RotaryEmbeddingDinoV3(dim, temperature=100.0, min_period=None, max_period=None, feat_shape=None,
                      normalize_coords="separate", grid_offset=0.0, grid_indexing="ij",
                      rotate_half=True, shift_coords=None, jitter_coords=None,
                      rescale_coords=None, device=None, dtype=None)
    timm's DINOv3 RoPE (facebookresearch/dinov3 RopePositionEmbedding): patch-centre coordinates
    in [-1, 1] (torch.ops.posenc.patch_grid_coords), periods (torch.ops.posenc.dinov3_periods),
    angle = 2 pi c / period and sin/cos by torch.ops.posenc.rope_periods_cos_sin in the periods'
    dtype: timm's tables to the bit, float64 ones included.

RotaryEmbeddingMRope(dim, mrope_section=(8, 12, 12), temperature=10000.0, grid_indexing="ij",
                     device=None, dtype=None, shift_coords=None, jitter_coords=None,
                     rescale_coords=None)
    timm's interleaved MRoPE for images (GenLIP; Qwen3-VL's T,H,W interleave, t = 0):
    torch.ops.posenc.rope_cos_sin with interleaved sections, timm's tables to the bit; float64
    tables (from a float64 inv_freq) are refused with one line.

Every module here (and build_rotary_pos_embed, when given them) computes timm's training-time
coordinate augmentation (shift_coords: a per-axis shift in the grid's units; jitter_coords: a
per-axis log-uniform factor in [1/J, J]; rescale_coords: one log-uniform factor in [1/R, R]; one
draw per get_embed call in training mode) with timm's random draws in timm's order
(_augment_coords): the same seed gives timm's tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import _library

_library.load()

__all__ = [
    "resample_abs_pos_embed",
    "build_sincos2d_pos_embed",
    "apply_rot_embed_cat",
    "apply_rot_embed_cat_qk",
    "build_rotary_pos_embed",
    "RotaryEmbeddingCat",
    "RotaryEmbedding",
    "RotaryEmbeddingMixed",
    "RotaryEmbeddingDinoV3",
    "RotaryEmbeddingMRope",
]


def resample_abs_pos_embed(
    posemb: torch.Tensor,
    new_size: Sequence[int],
    old_size: Sequence[int] | None = None,
    num_prefix_tokens: int = 1,
    interpolation: str = "bicubic",
    antialias: bool = True,
    verbose: bool = False,
    align_corners: bool | None = None,
) -> torch.Tensor:
    """posemb [1, prefix + H*W, D] -> [1, prefix + H'*W', D] (new_size = (H', W'))."""
    if posemb.dim() != 3 or posemb.shape[0] != 1:
        raise ValueError(
            f"posenc.timm_layers.resample_abs_pos_embed: posemb must be [1, tokens, dim], "
            f"got shape {tuple(posemb.shape)}"
        )
    if interpolation not in ("bicubic", "bilinear"):
        raise ValueError(
            f"posenc.timm_layers.resample_abs_pos_embed: interpolation must be 'bicubic' or "
            f"'bilinear', got {interpolation!r}"
        )
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
        posemb[0].float(),
        [int(s) for s in old_size],
        new_size,
        int(num_prefix_tokens),
        interpolation,
        bool(antialias),
        bool(align_corners),
    )
    # timm interpolates the grid in float32 and keeps the prefix rows as they were (a float64
    # CLS row is not rounded through float32)
    n = int(num_prefix_tokens)
    return torch.cat([posemb[0, :n], table[n:].to(posemb.dtype)]).unsqueeze(0)


def build_sincos2d_pos_embed(
    feat_shape: Sequence[int],
    dim: int = 64,
    temperature: float = 10000.0,
    reverse_coord: bool = False,
    interleave_sin_cos: bool = False,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """[H*W, dim]: timm's order of tokens (row-major over feat_shape, reversed with
    reverse_coord) and of features (sin, sin, cos, cos; sin, cos, sin, cos interleaved)."""
    if len(feat_shape) != 2:
        raise ValueError(
            f"posenc.timm_layers.build_sincos2d_pos_embed: feat_shape must be [height, width], "
            f"got {list(feat_shape)}"
        )
    if dim % 4 != 0:
        raise ValueError(
            f"posenc.timm_layers.build_sincos2d_pos_embed: dim must be divisible by 4, got {dim}"
        )
    shape = list(feat_shape)[::-1] if reverse_coord else list(feat_shape)
    coords = (
        torch.stack(
            torch.meshgrid(*[torch.arange(s, dtype=torch.float64) for s in shape], indexing="ij")
        )
        .flatten(1)
        .transpose(0, 1)
    )  # [N, 2]
    if interleave_sin_cos:  # per axis (sin, cos): posenc's "mae" layout lists the axes reversed
        table = torch.ops.posenc.axial_sincos_table(coords.flip(-1), dim, float(temperature), "mae")
    else:
        table = torch.ops.posenc.axial_sincos_table(coords, dim, float(temperature), "timm")
    return table.to(device=device, dtype=dtype)


def _split_emb(emb: torch.Tensor, x: torch.Tensor, name: str, lead: str = "heads"):
    """(cos, sin, unsqueeze_dim) for the operator, broadcasting emb against x as timm's
    `x * cos + rot(x) * sin` does: [N, 2D] for every row; [E, N, 2D] against x [B, H, N, D] aligns
    E with the heads (lead "heads"), against x [B, N, D] with the batch (lead "batch")."""
    if emb.shape[-1] != 2 * x.shape[-1]:
        raise ValueError(
            f"posenc.timm_layers.{name}: emb must be [..., N, 2D] = [..., "
            f"{x.shape[-2] if x.dim() > 1 else '?'}, {2 * x.shape[-1]}] for x of "
            f"shape {tuple(x.shape)}, got {tuple(emb.shape)}"
        )
    if emb.dim() == 4 and lead == "heads" and emb.shape[1] == 1:  # [B or 1, 1, N, 2D]: per batch
        sin, cos = emb.squeeze(1).chunk(2, -1)  # (EVA's patch-dropout path)
        return cos, sin, 1
    if emb.dim() not in (2, 3):
        raise ValueError(
            f"posenc.timm_layers.{name}: emb must be [N, 2D], [E, N, 2D] or [B, 1, N, 2D] "
            f"(4-D x), got {tuple(emb.shape)}"
        )
    sin, cos = emb.chunk(2, -1)
    if cos.dim() == 2:  # [N, D] -> [1, N, D], the tables' batch dim
        return cos.unsqueeze(0), sin.unsqueeze(0), 1
    return cos, sin, (0 if lead == "heads" else 1)  # [E, N, D] -> [1, E, N, D] or [E, 1, N, D]


def apply_rot_embed_cat_qk(
    q: torch.Tensor, k: torch.Tensor, emb: torch.Tensor, half: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's apply_rot_embed_cat on q and k [B, H, N, D] in one pass, each in its own dtype."""
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"posenc.timm_layers.apply_rot_embed_cat_qk: q and k must be [B, H, N, D], got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
    cos, sin, dim = _split_emb(emb, q, "apply_rot_embed_cat_qk")
    yq, yk = torch.ops.posenc.apply_rotary(q, k, cos, sin, dim, "half" if half else "interleaved")
    return yq.to(q.dtype), yk.to(k.dtype)


def apply_rot_embed_cat(x: torch.Tensor, emb: torch.Tensor, half: bool = False) -> torch.Tensor:
    """timm's apply_rot_embed_cat: x [B, H, N, D] (or [B, N, D]) rotated by emb [N, 2D] (or
    [E, N, 2D], broadcast as timm's formula broadcasts it: E against H, or against B for 3-D x;
    or [B, 1, N, 2D] per batch). Other shapes (per-batch-and-head emb, 2-D or 5-D x), which timm's
    formula broadcasts too, are refused in one line."""
    three = x.dim() == 3
    if three:  # [B, N, D]: one head
        x = x.unsqueeze(1)
    if x.dim() != 4:
        raise ValueError(
            f"posenc.timm_layers.apply_rot_embed_cat: x must be [B, H, N, D] or [B, N, D], "
            f"got {tuple(x.shape)}"
        )
    cos, sin, dim = _split_emb(emb, x, "apply_rot_embed_cat", "batch" if three else "heads")
    none = x.new_empty((x.shape[0], 0, x.shape[2], x.shape[3]))
    if dim == 0:  # tables per head: the second member (unused) must broadcast with them too
        none = x.narrow(1, 0, 1)
    y, _ = torch.ops.posenc.apply_rotary(x, none, cos, sin, dim, "half" if half else "interleaved")
    y = y.to(x.dtype)
    return y.squeeze(1) if three else y


def _grid_type(grid_type: str | None, in_pixels: bool) -> str:
    return grid_type if grid_type is not None else ("pixel" if in_pixels else "index")


def _freq_dtype(dtype: torch.dtype | None) -> torch.dtype:
    """timm's _freq_buffer_dtype: the bands' dtype, at least float32 (None: the default dtype)."""
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if dtype.is_floating_point and torch.finfo(dtype).bits < 32:
        return torch.float32
    return dtype


def _rope_tables(
    feat_shape: Sequence[int],
    bands: torch.Tensor,
    grid_type: str,
    ref_feat_shape: Sequence[int] | None,
    grid_offset: float,
    grid_indexing: str,
    normalize_coords: str,
    rotate_half: bool,
    dtype: torch.dtype,
    where: str,
    augment=(None, None, None),
):
    """(sin, cos) [N, A * 2F] in dtype, on bands' device, as timm's build_fourier_pos_embed:
    float32 grid times the bands (float16 / bfloat16 bands promote to float32 products, float64
    bands give float64 angles), sin and cos cast once to dtype. posenc's float64-band tables are
    float32 (sin/cos rounded once): timm's cast of them to float32, float16 or bfloat16 goes
    through float32 too, so those are the same bits; float64 tables from float64 bands are not.

    augment (shift, jitter, rescale), any not None: the grid's coordinates
    (torch.ops.posenc.patch_grid_coords, on the bands' device as timm builds them) augmented with
    timm's draws (_augment_coords), the tables from them by torch.ops.posenc.rope_cos_sin with one
    contiguous section of F bands per axis (timm's grid[..., a] * bands[f], axis-major)."""
    if bands.dtype == torch.float64 and dtype == torch.float64:
        raise RuntimeError(
            f"posenc.timm_layers.{where}: float64 tables from float64 bands: timm keeps "
            f"their float64 sin/cos, posenc's patch_grid_rope rounds them to "
            f"float32; ask for dtype=torch.float32 tables or use float32 bands"
        )
    if bands.dtype in (torch.float16, torch.bfloat16):  # timm's grid * bands promotes to float32
        bands = bands.float()
    layout = "half" if rotate_half else "interleaved"
    if any(a is not None for a in augment):
        if bands.dim() != 1 or bands.numel() < 1:
            raise ValueError(
                f"posenc.timm_layers.{where}: bands must be [F] with F >= 1, got shape "
                f"{tuple(bands.shape)}"
            )
        coords = torch.ops.posenc.patch_grid_coords(
            [int(s) for s in feat_shape],
            grid_type,
            None if ref_feat_shape is None else [int(s) for s in ref_feat_shape],
            float(grid_offset),
            grid_indexing,
            normalize_coords,
        ).to(bands.device)
        coords = _augment_coords(coords, *augment)
        axes = coords.shape[-1]
        cos, sin = torch.ops.posenc.rope_cos_sin(
            coords, bands.repeat(axes), 1.0, [bands.numel()] * axes, "contiguous", layout
        )
        return sin.to(dtype), cos.to(dtype)
    cos, sin = torch.ops.posenc.patch_grid_rope(
        [int(s) for s in feat_shape],
        bands,
        grid_type,
        None if ref_feat_shape is None else [int(s) for s in ref_feat_shape],
        float(grid_offset),
        grid_indexing,
        normalize_coords,
        layout,
    )
    return sin.to(dtype), cos.to(dtype)


def build_rotary_pos_embed(
    feat_shape: Sequence[int],
    bands: torch.Tensor | None = None,
    dim: int = 64,
    max_res: int = 224,
    temperature: float = 10000.0,
    linear_bands: bool = False,
    in_pixels: bool = True,
    ref_feat_shape: Sequence[int] | None = None,
    grid_offset: float = 0.0,
    grid_indexing: str = "ij",
    rotate_half: bool = False,
    device: torch.device | None = None,
    dtype: torch.dtype | None = torch.float32,
    grid_type: str | None = None,
    normalize_coords: str = "separate",
    shift_coords=None,
    jitter_coords=None,
    rescale_coords=None,
):
    """(sin, cos), each [prod(feat_shape), len(feat_shape) * 2 * (dim // 4)] in dtype (given
    bands and dtype=None: the bands' dtype, as timm's); shift / jitter / rescale_coords given: the
    coordinates augmented with timm's draws first (as timm's, whatever the training mode)."""
    augment = _coord_aug_config(
        "build_rotary_pos_embed", shift_coords, jitter_coords, rescale_coords
    )[:3]
    if bands is None:
        bands = torch.ops.posenc.patch_grid_bands(
            dim // 4, bool(in_pixels), float(max_res), float(temperature), bool(linear_bands)
        )
        if device is not None:
            bands = bands.to(device)
        if dtype is None:  # timm: the float32 tables, uncast
            dtype = torch.float32
    elif dtype is None:
        dtype = bands.dtype
    return _rope_tables(
        feat_shape,
        bands,
        _grid_type(grid_type, in_pixels),
        ref_feat_shape,
        grid_offset,
        grid_indexing,
        normalize_coords,
        rotate_half,
        dtype,
        "build_rotary_pos_embed",
        augment,
    )


# posenc.integrations.timm.patch keeps the timm module it replaced here (outside the module
# tree: no state_dict keys, not found again by named_modules); it follows every cast and move
# (_apply) and grid change (update_feat_shape) made to posenc's, so unpatch gives it back in the
# model's state.
_ORIGINAL = "_posenc_timm_original"


class _AxialRotaryBase(torch.nn.Module):
    """timm's _RotaryEmbeddingBase: the settings, the bands buffer and the cache's life.

    As timm's: the bands buffer is at least float32 (the module's dtype, or the default dtype;
    .half() / .bfloat16() rebuild it float32, .double() casts it); the cache (feat_shape given)
    is computed from fresh float32 bands, at construction on the CPU, on update_feat_shape on the
    bands' device, and cast to the cache's dtype of the moment (.half() and .double() cast it as
    a buffer); tables for a given shape are computed from the bands buffer as it is (float64
    bands: float64 angles)."""

    def __init__(
        self,
        dim: int,
        max_res: int = 224,
        temperature: float = 10000,
        in_pixels: bool = True,
        linear_bands: bool = False,
        feat_shape: Sequence[int] | None = None,
        ref_feat_shape: Sequence[int] | None = None,
        grid_offset: float = 0.0,
        grid_indexing: str = "ij",
        rotate_half: bool = False,
        grid_type: str | None = None,
        normalize_coords: str = "separate",
        device=None,
        dtype=None,
        shift_coords=None,
        jitter_coords=None,
        rescale_coords=None,
    ):
        super().__init__()
        name = type(self).__name__
        (self.shift_coords, self.jitter_coords, self.rescale_coords, self.aug_active) = (
            _coord_aug_config(name, shift_coords, jitter_coords, rescale_coords)
        )
        if dim < 4:
            raise ValueError(
                f"posenc.timm_layers.{name}: dim must be >= 4 (dim // 4 bands), got {dim}"
            )
        self.dim = dim
        self.max_res = max_res
        self.temperature = temperature
        self.in_pixels = in_pixels
        self.linear_bands = linear_bands
        self.feat_shape = feat_shape  # as given: timm compares update_feat_shape's with !=
        self.ref_feat_shape = None if ref_feat_shape is None else list(ref_feat_shape)
        self.grid_offset = grid_offset
        self.grid_indexing = grid_indexing
        self.rotate_half = rotate_half
        self.grid_type = _grid_type(grid_type, in_pixels)
        self.normalize_coords = normalize_coords
        bands = self._fresh_bands()  # float32, on the CPU
        self.register_buffer(
            "bands", bands.to(device=device, dtype=_freq_dtype(dtype)), persistent=False
        )
        if feat_shape is None:
            self._set_cache(None, None)
        else:
            cache_dtype = torch.get_default_dtype() if dtype is None else dtype
            sin, cos = self._tables(feat_shape, torch.float32, bands)
            self._set_cache(
                sin.to(device=device, dtype=cache_dtype), cos.to(device=device, dtype=cache_dtype)
            )

    def _fresh_bands(self, device=None) -> torch.Tensor:
        """timm's _compute_bands: float32 bands, computed on the CPU."""
        bands = torch.ops.posenc.patch_grid_bands(
            self.dim // 4,
            bool(self.in_pixels),
            float(self.max_res),
            float(self.temperature),
            bool(self.linear_bands),
        )
        return bands if device is None else bands.to(device)

    @classmethod
    def from_timm(cls, module: torch.nn.Module):
        """The same tables as a timm RotaryEmbeddingCat / RotaryEmbedding in its present state
        (settings, training-time coordinate augmentation, bands dtype, cache dtype, device,
        train/eval). A module whose cache is not what its settings give (cast through a lower
        precision and back, e.g. .half().float(), or edited), or that augments its coordinates
        with float64 bands (timm's float64 training tables), is refused with one line."""
        name = f"posenc.timm_layers.{cls.__name__}.from_timm"
        if getattr(module, "aug_active", False) and module.bands.dtype == torch.float64:
            raise ValueError(
                f"{name}: float64 bands with coordinate augmentation give float64 "
                f"tables in timm's training mode, which posenc's operators round "
                f"to float32"
            )
        cached = getattr(module, "pos_embed", None)
        if not isinstance(cached, torch.Tensor):
            cached = getattr(module, "pos_embed_sin", None)
        new = cls(
            module.dim,
            max_res=module.max_res,
            temperature=module.temperature,
            in_pixels=module.in_pixels,
            linear_bands=module.linear_bands,
            feat_shape=module.feat_shape,
            ref_feat_shape=module.ref_feat_shape,
            grid_offset=module.grid_offset,
            grid_indexing=module.grid_indexing,
            rotate_half=getattr(module, "rotate_half", False),
            grid_type=module.grid_type,
            normalize_coords=getattr(module, "normalize_coords", "separate"),
            shift_coords=getattr(module, "shift_coords", None),
            jitter_coords=getattr(module, "jitter_coords", None),
            rescale_coords=getattr(module, "rescale_coords", None),
            device=module.bands.device,
            dtype=cached.dtype if isinstance(cached, torch.Tensor) else module.bands.dtype,
        )
        if new.bands.dtype != module.bands.dtype:  # a buffer cast by hand: take its dtype
            new.register_buffer("bands", new.bands.to(module.bands.dtype), persistent=False)
        if not torch.equal(new.bands, module.bands):
            raise ValueError(
                f"{name}: the timm module's bands are not the ones its settings "
                f"give (changed by hand?); posenc would not give its tables"
            )
        if isinstance(cached, torch.Tensor) and not new._cache_is(module):
            # computed on the bands' device, as timm's update_feat_shape does there
            new._update_cache(module.feat_shape)
            if not new._cache_is(module):
                theirs = new._timm_cache(module)
                diff = max(
                    (a.double() - b.double()).abs().max().item()
                    for a, b in zip(new._cache(), theirs)
                )
                raise ValueError(
                    f"{name}: {type(module).__name__}'s cached table is not the one "
                    f"its settings give (max difference {diff:.3g}: cast through a "
                    f"lower precision and back, e.g. .half().float(), or edited); "
                    f"posenc would not give the same tables"
                )
        new.train(module.training)
        return new

    def _cache_is(self, module) -> bool:
        return all(
            a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
            for a, b in zip(self._cache(), self._timm_cache(module))
        )

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        # .half() / .bfloat16() cast every floating buffer; timm rebuilds its bands float32
        if _freq_dtype(self.bands.dtype) != self.bands.dtype:
            self.register_buffer("bands", self._fresh_bands(self.bands.device), persistent=False)
        original = self.__dict__.get(_ORIGINAL)
        if original is not None:  # the timm module patch() replaced follows the casts and moves
            original._apply(fn, *args, **kwargs)
        return module

    def _tables(
        self,
        feat_shape: Sequence[int],
        dtype: torch.dtype | None = None,
        bands: torch.Tensor | None = None,
        augment: bool = False,
    ):
        """timm's _build_embed: (sin, cos) in dtype (None: float32; augmented: the bands' dtype)
        from the bands buffer (or the bands given), the coordinates augmented with timm's draws
        when augment."""
        bands = self.bands if bands is None else bands
        if dtype is None:
            dtype = bands.dtype if augment else torch.float32
        draws = (
            (self.shift_coords, self.jitter_coords, self.rescale_coords)
            if augment
            else (None, None, None)
        )
        return _rope_tables(
            feat_shape,
            bands,
            self.grid_type,
            self.ref_feat_shape,
            self.grid_offset,
            self.grid_indexing,
            self.normalize_coords,
            self.rotate_half,
            dtype,
            f"{type(self).__name__}.get_embed",
            draws,
        )

    def _augmenting(self) -> bool:
        return self.training and self.aug_active

    def _update_cache(self, feat_shape) -> None:
        """timm's update: fresh float32 bands on the bands' device, cast to the cache's dtype."""
        bands = self._fresh_bands(self.bands.device)
        self.bands.copy_(bands)
        self._set_cache(*self._tables(feat_shape, self._cache()[0].dtype, bands))

    def update_feat_shape(self, feat_shape: Sequence[int]) -> None:
        if self.feat_shape is not None and feat_shape != self.feat_shape:
            self._update_cache(feat_shape)
            self.feat_shape = feat_shape
        original = self.__dict__.get(_ORIGINAL)
        if original is not None:  # the timm module patch() replaced follows the grid
            original.update_feat_shape(feat_shape)

    def get_batch_embeds(
        self, shapes, seq_len: int | None = None, dtype: torch.dtype | None = None
    ):
        """One embedding per (H, W) in shapes; with seq_len, zero-padded and stacked."""
        if not shapes:
            return []
        if self.feat_shape is not None:
            raise RuntimeError(
                "Batch embedding generation requires cached bands, not pre-computed embeddings"
            )
        embeds = [self.get_embed((h, w), dtype=dtype) for h, w in shapes]
        if seq_len is None:
            return embeds
        first = embeds[0] if isinstance(embeds[0], torch.Tensor) else embeds[0][0]
        if any((e if isinstance(e, torch.Tensor) else e[0]).shape[-2] > seq_len for e in embeds):
            raise ValueError("seq_len must be at least the number of positions in each embedding")
        if isinstance(embeds[0], torch.Tensor):
            padded = first.new_zeros((len(embeds), seq_len, first.shape[-1]))
            for i, e in enumerate(embeds):
                padded[i, : e.shape[0]] = e
            return padded
        raise RuntimeError(
            f"posenc.timm_layers.{type(self).__name__}: get_batch_embeds with seq_len "
            f"returns one tensor; it is RotaryEmbeddingCat's"
        )


class RotaryEmbeddingCat(_AxialRotaryBase):
    """timm's RotaryEmbeddingCat: get_embed(shape) -> cat([sin, cos], -1) [N, 2 dim]."""

    def _set_cache(self, sin, cos) -> None:
        if sin is None:
            self.pos_embed = None
            return
        self.register_buffer("pos_embed", torch.cat([sin, cos], -1), persistent=False)

    def _cache(self):
        return (self.pos_embed,)

    @staticmethod
    def _timm_cache(module):
        return (module.pos_embed,)

    def get_embed(
        self, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        if self.feat_shape is None and shape is not None:
            sin, cos = self._tables(shape, dtype, augment=self._augmenting())
            return torch.cat([sin, cos], -1)
        if self.pos_embed is not None:
            if self._augmenting():  # the cached grid, augmented anew
                return torch.cat(self._tables(self.feat_shape, dtype, augment=True), -1)
            return self.pos_embed if dtype is None else self.pos_embed.to(dtype=dtype)
        raise RuntimeError(
            "posenc.timm_layers.RotaryEmbeddingCat.get_embed: give a shape (no feat_shape "
            "was set at construction)"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, C = dim, *spatial] rotated over its spatial grid."""
        shape = x.shape
        emb = self.get_embed(list(shape[2:]))
        y = apply_rot_embed_cat(x.flatten(2).transpose(1, 2), emb, half=self.rotate_half)
        return y.transpose(1, 2).reshape(shape)


class RotaryEmbedding(_AxialRotaryBase):
    """timm's RotaryEmbedding: get_embed(shape) -> (sin, cos), each [N, dim]."""

    def _set_cache(self, sin, cos) -> None:
        if sin is None:
            self.pos_embed_sin = self.pos_embed_cos = None
            return
        self.register_buffer("pos_embed_sin", sin, persistent=False)
        self.register_buffer("pos_embed_cos", cos, persistent=False)

    def _cache(self):
        return (self.pos_embed_sin, self.pos_embed_cos)

    @staticmethod
    def _timm_cache(module):
        return (module.pos_embed_sin, module.pos_embed_cos)

    def get_embed(self, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None):
        if self.feat_shape is None and shape is not None:
            return self._tables(shape, dtype, augment=self._augmenting())
        if self.pos_embed_sin is not None:
            if self._augmenting():  # the cached grid, augmented anew
                return self._tables(self.feat_shape, dtype, augment=True)
            if dtype is not None:
                return self.pos_embed_sin.to(dtype=dtype), self.pos_embed_cos.to(dtype=dtype)
            return self.pos_embed_sin, self.pos_embed_cos
        raise RuntimeError(
            "posenc.timm_layers.RotaryEmbedding.get_embed: give a shape (no feat_shape "
            "was set at construction)"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, C = dim, *spatial] rotated over its spatial grid."""
        shape = x.shape
        sin, cos = self.get_embed(list(shape[2:]))
        emb = torch.cat([sin, cos], -1)
        y = apply_rot_embed_cat(x.flatten(2).transpose(1, 2), emb, half=self.rotate_half)
        return y.transpose(1, 2).reshape(shape)


# ---- RoPE-Mixed, DINOv3 and MRoPE (timm 1.0.x layers/pos_embed_sincos.py) ----------------------


def _coord_aug_config(name: str, shift_coords, jitter_coords, rescale_coords):
    """timm's _coord_aug_config: (shift, jitter, rescale, active), each a float or None; a value
    timm refuses is one line here too (shift finite >= 0, jitter and rescale finite >= 1)."""
    out = []
    for key, value, least in (
        ("shift_coords", shift_coords, 0.0),
        ("jitter_coords", jitter_coords, 1.0),
        ("rescale_coords", rescale_coords, 1.0),
    ):
        if value is None:
            out.append(None)
            continue
        scalar = (
            isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype != torch.bool
        )
        if isinstance(value, bool) or not (isinstance(value, (int, float)) or scalar):
            raise ValueError(
                f"posenc.timm_layers.{name}: {key} must be a real number or a one-element "
                f"tensor, got {value!r}"
            )
        value = float(value)
        if not math.isfinite(value) or value < least:
            raise ValueError(
                f"posenc.timm_layers.{name}: {key} must be finite and >= {least:g}, got {value!r}"
            )
        out.append(value)
    return out[0], out[1], out[2], any(v is not None for v in out)


def _augment_coords(
    coords: torch.Tensor, shift: float | None, jitter: float | None, rescale: float | None
) -> torch.Tensor:
    """timm's _apply_coord_augs (DINOv3's RopePositionEmbedding augmentation): one transform for
    every position, c [N, A] -> (c + s) * j * r with s ~ U(-shift, shift) per axis, log j ~
    U(-log jitter, log jitter) per axis, log r ~ U(-log rescale, log rescale) shared. The draws are
    timm's, call for call (uniform_ on tensors of the coordinates' device and dtype, in the order
    shift, jitter, rescale), so the same seed gives timm's coordinates; plain torch ops."""
    axes = coords.shape[-1]
    if shift is not None:
        draw = torch.empty(axes, device=coords.device, dtype=coords.dtype).uniform_(-shift, shift)
        coords = coords + draw[None, :]
    if jitter is not None:
        most = math.log(jitter)
        draw = torch.empty(axes, device=coords.device, dtype=coords.dtype).uniform_(-most, most)
        coords = coords * draw.exp()[None, :]
    if rescale is not None:
        most = math.log(rescale)
        draw = torch.empty(1, device=coords.device, dtype=coords.dtype).uniform_(-most, most)
        coords = coords * draw.exp()
    return coords


def _grid(
    shape: Sequence[int],
    grid_type: str = "index",
    grid_indexing: str = "ij",
    grid_offset: float = 0.0,
    normalize_coords: str = "separate",
) -> torch.Tensor:
    """[prod(shape), A] float32 on the CPU: torch.ops.posenc.patch_grid_coords (timm's
    _build_grid, flattened)."""
    return torch.ops.posenc.patch_grid_coords(
        [int(s) for s in shape],
        grid_type,
        None,
        float(grid_offset),
        grid_indexing,
        normalize_coords,
    )


def _pad_embeds(embeds, seq_len: int) -> torch.Tensor:
    """timm's _pad_rope_embeds: [..., N_i, D] each -> [len, ..., seq_len, D], zero-padded."""
    shape = (len(embeds),) + tuple(embeds[0].shape[:-2]) + (seq_len, embeds[0].shape[-1])
    padded = embeds[0].new_zeros(shape)
    for i, embed in enumerate(embeds):
        if embed.shape[-2] > seq_len:
            raise ValueError("seq_len must be at least the number of positions in each embedding")
        padded[i, ..., : embed.shape[-2], :] = embed
    return padded


class _FollowsOriginal:
    """The timm module patch() replaced (kept in _ORIGINAL) follows every cast, move and grid
    change made to posenc's, as _AxialRotaryBase does."""

    def _follow_apply(self, fn, *args, **kwargs) -> None:
        original = self.__dict__.get(_ORIGINAL)
        if original is not None:
            original._apply(fn, *args, **kwargs)

    def _follow_feat_shape(self, feat_shape) -> None:
        original = self.__dict__.get(_ORIGINAL)
        if original is not None:
            original.update_feat_shape(feat_shape)


def _same_tensor(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)


def _init_random_2d_freqs(
    head_dim: int, depth: int, num_heads: int, temperature: float, device=None, dtype=None
) -> torch.Tensor:
    """timm's init_random_2d_freqs (naver-ai/rope-vit init_random_2d_freqs) with rotate=True, op
    for op (one torch.rand draw [depth, heads, 1], as timm's): [2, depth, heads, head_dim / 2]."""
    dtype = torch.float32 if dtype is None else dtype
    mag = 1.0 / (
        temperature ** (torch.arange(0, head_dim, 4, device=device, dtype=dtype) / head_dim)
    )
    mag = mag.unsqueeze(0).unsqueeze(0)
    angles = torch.rand(depth, num_heads, 1, device=device, dtype=dtype) * 2 * torch.pi
    fx = torch.cat([mag * torch.cos(angles), mag * torch.cos(angles + torch.pi / 2)], dim=-1)
    fy = torch.cat([mag * torch.sin(angles), mag * torch.sin(angles + torch.pi / 2)], dim=-1)
    return torch.stack([fx, fy], dim=0)


def _mixed_embed(
    freqs: torch.Tensor, coords: torch.Tensor, dtype: torch.dtype | None
) -> torch.Tensor:
    """timm's get_mixed_freqs: cat([sin, cos]) [..., N, 2 head_dim] from freqs [2, ..., F] and
    coords [N, 2] (x, y), angles and sin/cos in float32 by torch.ops.posenc.rope_mixed_cos_sin,
    cast to dtype (None: the frequencies' dtype). The frequencies' .float() is torch's (a
    float64 or bfloat16 parameter gets its gradient through the cast, as in timm)."""
    dtype = freqs.dtype if dtype is None else dtype
    cos, sin = torch.ops.posenc.rope_mixed_cos_sin(coords.float(), freqs.float(), "interleaved")
    return torch.cat([sin, cos], dim=-1).to(dtype)


class RotaryEmbeddingMixed(_FollowsOriginal, torch.nn.Module):
    """timm's RotaryEmbeddingMixed (RoPE-Mixed, Heo et al. 2024): learned frequencies freqs
    [2, depth, heads, head_dim / 2] (a trainable parameter, as timm's), per block and head
    angle = x f_x + y f_y over the patch grid (x the column, y the row with grid_indexing "xy").

    What computes what: the grid is torch.ops.posenc.patch_grid_coords, the angles and their
    sin/cos torch.ops.posenc.rope_mixed_cos_sin (timm's float32 products and sum, op for op: its
    tables to the bit; its gradients reach freqs through ATen's derivatives of the same ops), the
    training-time coordinate augmentation (shift / jitter / rescale_coords) _augment_coords with
    timm's draws, the random initialisation timm's init_random_2d_freqs op for op. get_embed
    returns [depth, heads, N, 2 head_dim]; from_timm(module) shares the timm module's freqs
    parameter (the same object: state_dict keys and values unchanged, gradients reach it)."""

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        temperature: float = 10.0,
        feat_shape: Sequence[int] | None = None,
        grid_indexing: str = "xy",
        device=None,
        dtype=None,
        shift_coords=None,
        jitter_coords=None,
        rescale_coords=None,
    ):
        super().__init__()
        self._setup(
            dim,
            depth,
            num_heads,
            temperature,
            feat_shape,
            grid_indexing,
            device,
            dtype,
            shift_coords,
            jitter_coords,
            rescale_coords,
            None,
        )

    def _setup(
        self,
        dim,
        depth,
        num_heads,
        temperature,
        feat_shape,
        grid_indexing,
        device,
        dtype,
        shift_coords,
        jitter_coords,
        rescale_coords,
        freqs,
    ) -> None:
        name = "RotaryEmbeddingMixed"
        if feat_shape is not None and len(feat_shape) != 2:
            raise ValueError(
                f"posenc.timm_layers.{name}: feat_shape must be [height, width], got {list(feat_shape)}"
            )
        if num_heads < 1 or dim % num_heads != 0 or (dim // num_heads) % 4 != 0:
            raise ValueError(
                f"posenc.timm_layers.{name}: dim / num_heads must be a whole multiple of 4, "
                f"got dim {dim}, num_heads {num_heads}"
            )
        if grid_indexing not in ("ij", "xy"):
            raise ValueError(
                f"posenc.timm_layers.{name}: grid_indexing must be 'ij' or 'xy', got {grid_indexing!r}"
            )
        self.dim, self.depth, self.num_heads = dim, depth, num_heads
        self.temperature = temperature
        self.feat_shape = feat_shape
        self.grid_indexing = grid_indexing
        (self.shift_coords, self.jitter_coords, self.rescale_coords, self.aug_active) = (
            _coord_aug_config(name, shift_coords, jitter_coords, rescale_coords)
        )
        if freqs is None:
            freqs = torch.nn.Parameter(
                _init_random_2d_freqs(
                    dim // num_heads, depth, num_heads, temperature, device, dtype
                )
            )
        self.freqs = freqs
        if feat_shape is not None:
            t_x, t_y = self._grid_values(feat_shape)
            grid_dtype = _freq_dtype(dtype)
            self.register_buffer("t_x", t_x.to(grid_dtype), persistent=False)
            self.register_buffer("t_y", t_y.to(grid_dtype), persistent=False)
        else:
            self.t_x = self.t_y = None

    @classmethod
    def from_timm(cls, module: torch.nn.Module) -> RotaryEmbeddingMixed:
        """posenc's module with a timm RotaryEmbeddingMixed's settings, grid, train/eval mode and
        its freqs parameter itself (shared). A cached grid that is not what its settings give
        (edited) is refused with one line."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new._setup(
            module.dim,
            module.depth,
            module.num_heads,
            module.temperature,
            module.feat_shape,
            module.grid_indexing,
            module.freqs.device,
            None if module.t_x is None else module.t_x.dtype,
            module.shift_coords,
            module.jitter_coords,
            module.rescale_coords,
            module.freqs,
        )
        if not (_same_tensor(new.t_x, module.t_x) and _same_tensor(new.t_y, module.t_y)):
            raise ValueError(
                f"posenc.timm_layers.{cls.__name__}.from_timm: the timm module's cached "
                f"grid (t_x, t_y) is not the one its feat_shape gives; posenc would "
                f"not give the same tables"
            )
        new.train(module.training)
        return new

    def _grid_values(self, feat_shape):
        """(t_x, t_y) [N] float32 on the frequencies' device (timm's get_mixed_grid)."""
        grid = _grid(feat_shape, "index", self.grid_indexing).to(self.freqs.device)
        return grid[:, 0].contiguous(), grid[:, 1].contiguous()

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        # .half() / .bfloat16() cast every floating buffer; timm rebuilds the grid float32
        if self.t_x is not None and _freq_dtype(self.t_x.dtype) != self.t_x.dtype:
            t_x, t_y = self._grid_values(self.feat_shape)
            self.register_buffer("t_x", t_x.to(self.t_x.device), persistent=False)
            self.register_buffer("t_y", t_y.to(self.t_y.device), persistent=False)
        self._follow_apply(fn, *args, **kwargs)
        return module

    def update_feat_shape(self, feat_shape) -> None:
        if self.feat_shape is not None and feat_shape != self.feat_shape:
            t_x, t_y = self._grid_values(feat_shape)
            self.t_x = t_x.to(self.t_x.device, self.t_x.dtype)
            self.t_y = t_y.to(self.t_y.device, self.t_y.dtype)
            self.feat_shape = feat_shape
        self._follow_feat_shape(feat_shape)

    def get_embed(
        self, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """[depth, heads, H*W, 2 head_dim]; dtype None: the frequencies' dtype (at least float32
        while augmenting in training, as timm's)."""
        if shape is not None:
            coords = _grid(shape, "index", self.grid_indexing).to(self.freqs.device)
        elif self.t_x is not None:
            coords = torch.stack([self.t_x, self.t_y], dim=-1)
        else:
            raise RuntimeError(
                "posenc.timm_layers.RotaryEmbeddingMixed.get_embed: give a shape (no "
                "feat_shape was set at construction)"
            )
        if self.training and self.aug_active:
            coords = _augment_coords(
                coords.float(), self.shift_coords, self.jitter_coords, self.rescale_coords
            )
            if dtype is None:
                dtype = _freq_dtype(self.freqs.dtype)
        return _mixed_embed(self.freqs, coords, dtype)

    def get_batch_embeds(
        self, shapes, seq_len: int | None = None, dtype: torch.dtype | None = None
    ):
        """One [depth, heads, h*w, 2 head_dim] per (h, w): the largest grid's tables sliced (one
        augmentation draw per shape while augmenting, as timm's); with seq_len, padded and
        stacked."""
        if not shapes:
            return []
        if self.training and self.aug_active:
            embeds = [self.get_embed((h, w), dtype=dtype) for h, w in shapes]
        else:
            max_h, max_w = max(h for h, _ in shapes), max(w for _, w in shapes)
            coords = _grid((max_h, max_w), "index", self.grid_indexing).to(self.freqs.device)
            full = _mixed_embed(self.freqs, coords, dtype)
            depth, heads, _, width = full.shape
            full = full.view(depth, heads, max_h, max_w, width)
            embeds = [full[:, :, :h, :w].reshape(depth, heads, h * w, width) for h, w in shapes]
        return embeds if seq_len is None else _pad_embeds(embeds, seq_len)

    def forward(self, x: torch.Tensor, block_index: int = 0) -> torch.Tensor:
        """x [B, dim, H, W] rotated by block block_index's tables, channels split into heads."""
        if x.dim() != 4 or x.shape[1] != self.dim:
            raise ValueError(
                f"posenc.timm_layers.RotaryEmbeddingMixed: x must be [B, dim={self.dim}, H, "
                f"W], got {tuple(x.shape)}"
            )
        if not 0 <= block_index < self.depth:
            raise ValueError(
                f"posenc.timm_layers.RotaryEmbeddingMixed: block_index must be in [0, "
                f"{self.depth}), got {block_index}"
            )
        shape = x.shape
        emb = self.get_embed(list(shape[2:]))[block_index]
        heads = x.reshape(shape[0], self.num_heads, self.dim // self.num_heads, -1).transpose(
            -2, -1
        )
        return apply_rot_embed_cat(heads, emb).transpose(-2, -1).reshape(shape)

    def no_weight_decay(self):
        return {"freqs"}


class RotaryEmbeddingDinoV3(_FollowsOriginal, torch.nn.Module):
    """timm's RotaryEmbeddingDinoV3 (facebookresearch/dinov3 RopePositionEmbedding): patch-centre
    coordinates in [-1, 1] (0.5-centred, divided by H and W, or both by min / max), periods
    temperature^(2i / (dim/2)) or log-spaced in [min_period, max_period], angle = 2 pi c / period,
    get_embed -> cat([sin, cos]) [H*W, 2 dim], rotate_half layout by default.

    What computes what: periods torch.ops.posenc.dinov3_periods, coordinates
    torch.ops.posenc.patch_grid_coords, the training-time augmentation (shift / jitter /
    rescale_coords, on the CPU coordinates as timm's) _augment_coords with timm's draws, angles and
    sin/cos torch.ops.posenc.rope_periods_cos_sin in the periods' dtype (float32, or float64 after
    .double()): timm's tables to the bit, augmented ones included for the same seed."""

    def __init__(
        self,
        dim: int,
        temperature: float | None = 100.0,
        min_period: float | None = None,
        max_period: float | None = None,
        feat_shape: Sequence[int] | None = None,
        normalize_coords: str = "separate",
        grid_offset: float = 0.0,
        grid_indexing: str = "ij",
        rotate_half: bool = True,
        shift_coords=None,
        jitter_coords=None,
        rescale_coords=None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        name = type(self).__name__
        if feat_shape is not None and len(feat_shape) != 2:
            raise ValueError(
                f"posenc.timm_layers.{name}: feat_shape must be [height, width], got {list(feat_shape)}"
            )
        if normalize_coords not in ("separate", "min", "max"):
            raise ValueError(
                f"posenc.timm_layers.{name}: normalize_coords must be 'separate', 'min' or "
                f"'max', got {normalize_coords!r}"
            )
        if grid_indexing not in ("ij", "xy"):
            raise ValueError(
                f"posenc.timm_layers.{name}: grid_indexing must be 'ij' or 'xy', got {grid_indexing!r}"
            )
        self.dim = dim
        self.rotate_half = rotate_half
        self.temperature = float(temperature) if temperature is not None else None
        self.min_period = min_period
        self.max_period = max_period
        self.normalize_coords = normalize_coords
        (self.shift_coords, self.jitter_coords, self.rescale_coords, self.aug_active) = (
            _coord_aug_config(name, shift_coords, jitter_coords, rescale_coords)
        )
        self.feat_shape = feat_shape
        self.grid_offset = grid_offset
        self.grid_indexing = grid_indexing
        periods = self._fresh_periods().to(device=device, dtype=_freq_dtype(dtype))
        self.register_buffer("periods", periods, persistent=False)
        if feat_shape is not None:
            cache_dtype = torch.get_default_dtype() if dtype is None else dtype
            self.register_buffer(
                "pos_embed_cached",
                self._create_embed(feat_shape, no_aug=True).to(cache_dtype),
                persistent=False,
            )
        else:
            self.register_buffer("pos_embed_cached", None, persistent=False)

    def _fresh_periods(self, device=None) -> torch.Tensor:
        """timm's _compute_periods: float32, computed on the CPU."""
        periods = torch.ops.posenc.dinov3_periods(
            int(self.dim), self.temperature, self.min_period, self.max_period
        )
        return periods if device is None else periods.to(device)

    @classmethod
    def from_timm(cls, module: torch.nn.Module) -> RotaryEmbeddingDinoV3:
        """posenc's module with a timm RotaryEmbeddingDinoV3's settings, periods and cache dtypes,
        device and train/eval mode. Periods or a cache that are not what its settings give
        (edited, or cast through a lower precision and back) are refused with one line."""
        name = f"posenc.timm_layers.{cls.__name__}.from_timm"
        cached = module.pos_embed_cached
        new = cls(
            module.dim,
            temperature=module.temperature,
            min_period=module.min_period,
            max_period=module.max_period,
            feat_shape=None,
            normalize_coords=module.normalize_coords,
            grid_offset=module.grid_offset,
            grid_indexing=module.grid_indexing,
            rotate_half=module.rotate_half,
            shift_coords=module.shift_coords,
            jitter_coords=module.jitter_coords,
            rescale_coords=module.rescale_coords,
            device=module.periods.device,
        )
        if new.periods.dtype != module.periods.dtype:  # .double(): timm casts its periods
            new.register_buffer("periods", new.periods.to(module.periods.dtype), persistent=False)
        if not _same_tensor(new.periods, module.periods):
            raise ValueError(
                f"{name}: the timm module's periods are not the ones its settings "
                f"give (changed by hand?); posenc would not give its tables"
            )
        new.feat_shape = module.feat_shape
        if cached is not None:
            # from the periods as they are, or (cast after it was built: .double()) from float32
            # ones, as timm built it
            candidates = [new._create_embed(module.feat_shape, no_aug=True)]
            if new.periods.dtype != torch.float32:
                candidates.append(
                    new._create_embed(
                        module.feat_shape, no_aug=True, periods=new._fresh_periods(cached.device)
                    )
                )
            match = [
                c.to(cached.dtype) for c in candidates if _same_tensor(c.to(cached.dtype), cached)
            ]
            new.register_buffer("pos_embed_cached", match[0] if match else None, persistent=False)
            if not match:
                raise ValueError(
                    f"{name}: the timm module's cached table is not the one its "
                    f"settings give (cast through a lower precision and back, or "
                    f"edited); posenc would not give the same tables"
                )
        new.train(module.training)
        return new

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        if _freq_dtype(self.periods.dtype) != self.periods.dtype:  # timm rebuilds them float32
            self.register_buffer(
                "periods", self._fresh_periods(self.periods.device), persistent=False
            )
        self._follow_apply(fn, *args, **kwargs)
        return module

    def _create_embed(
        self, feat_shape: Sequence[int], no_aug: bool = False, periods: torch.Tensor | None = None
    ) -> torch.Tensor:
        """cat([sin, cos]) [H*W, 2 dim] in the periods' dtype, on their device (the buffer's, or
        the periods given)."""
        periods = self.periods if periods is None else periods
        if len(feat_shape) != 2:
            raise ValueError(
                f"posenc.timm_layers.RotaryEmbeddingDinoV3: the grid must be [height, "
                f"width], got {list(feat_shape)}"
            )
        coords = _grid(
            feat_shape, "centered", self.grid_indexing, self.grid_offset, self.normalize_coords
        )  # on the CPU, as timm's (its draws too)
        if not no_aug and self.training and self.aug_active:
            coords = _augment_coords(
                coords, self.shift_coords, self.jitter_coords, self.rescale_coords
            )
        cos, sin = torch.ops.posenc.rope_periods_cos_sin(
            coords.to(periods.device), periods, "half" if self.rotate_half else "interleaved"
        )
        return torch.cat([sin, cos], dim=-1)

    def _cache_embed(self, feat_shape) -> None:
        embed = self._create_embed(feat_shape, no_aug=True)
        if self.pos_embed_cached is not None:
            embed = embed.to(dtype=self.pos_embed_cached.dtype)
        self.register_buffer("pos_embed_cached", embed, persistent=False)
        self.feat_shape = feat_shape

    def update_feat_shape(self, feat_shape) -> None:
        if self.feat_shape is not None and feat_shape != self.feat_shape:
            self._cache_embed(feat_shape)
        self._follow_feat_shape(feat_shape)

    def get_embed(
        self, shape: Sequence[int] | None = None, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """[H*W, 2 dim]: for shape, or the cached feat_shape (recomputed while augmenting)."""
        if shape is not None:
            embed = self._create_embed(shape)
        elif self.pos_embed_cached is None or (self.training and self.aug_active):
            if self.feat_shape is None:
                raise RuntimeError(
                    "posenc.timm_layers.RotaryEmbeddingDinoV3.get_embed: give a shape (no "
                    "feat_shape was set at construction)"
                )
            embed = self._create_embed(self.feat_shape)
        else:
            embed = self.pos_embed_cached
        return embed if dtype is None else embed.to(dtype=dtype)

    def get_batch_embeds(
        self, shapes, seq_len: int | None = None, dtype: torch.dtype | None = None
    ):
        """One [h*w, 2 dim] per (h, w), each computed on its own grid; with seq_len, padded."""
        if not shapes:
            return []
        embeds = [self.get_embed((h, w), dtype=dtype) for h, w in shapes]
        return embeds if seq_len is None else _pad_embeds(embeds, seq_len)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, C = dim, H, W] rotated over its grid."""
        shape = x.shape
        emb = self.get_embed(list(shape[2:]))
        y = apply_rot_embed_cat(x.flatten(2).transpose(1, 2), emb, half=self.rotate_half)
        return y.transpose(1, 2).reshape(shape)


def _mrope_axes(dim: int, mrope_section: Sequence[int]) -> torch.Tensor:
    """timm's channel -> axis map over dim / 2 (0 t, 1 h, 2 w): h at 1, 4, 7, .. below
    3 section_h, w at 2, 5, 8, .. below 3 section_w, the rest t (the reference
    apply_interleaved_mrope's clamped slices)."""
    axis = torch.zeros(dim // 2, dtype=torch.long)
    axis[1 : mrope_section[1] * 3 : 3] = 1
    axis[2 : mrope_section[2] * 3 : 3] = 2
    return axis


class RotaryEmbeddingMRope(_FollowsOriginal, torch.nn.Module):
    """timm's RotaryEmbeddingMRope (Qwen2-VL-style interleaved multimodal RoPE for images, as
    GenLIP): inv_freq = temperature^(-2i/dim), i < dim / 2, each channel rotating by one axis'
    patch index (t = 0 for images, h, w in the T,H,W,T,H,W,.. interleave), get_embed(shape) ->
    cat([sin, cos]) [H*W, 2 dim] in the half layout.

    What computes what: inv_freq torch.ops.posenc.patch_grid_bands (temperature^(-i/(dim/2)), the
    same float32 division and power as timm's freq_bands(dim, step=2)), the patch indices
    torch.ops.posenc.patch_grid_coords, the training-time augmentation _augment_coords with
    timm's draws, the tables torch.ops.posenc.rope_cos_sin with Qwen3-VL's interleaved sections
    (t, h, w counts of timm's clamped stride): timm's to the bit. A section whose clamped stride
    is not an interleave of its counts (timm's rule differs from the round-robin there) is refused
    with one line at construction; so are float64 tables (timm's from float64 inv_freq keep
    float64 sines, posenc's operator rounds them to float32)."""

    def __init__(
        self,
        dim: int,
        mrope_section: Sequence[int] = (8, 12, 12),
        temperature: float = 10000.0,
        grid_indexing: str = "ij",
        device=None,
        dtype=None,
        shift_coords=None,
        jitter_coords=None,
        rescale_coords=None,
    ):
        super().__init__()
        name = type(self).__name__
        if dim < 2 or dim % 2 != 0:
            raise ValueError(
                f"posenc.timm_layers.{name}: dim (head_dim) must be even and >= 2, got {dim}"
            )
        if len(mrope_section) != 3 or any(s < 0 for s in mrope_section):
            raise ValueError(
                f"posenc.timm_layers.{name}: mrope_section must be three counts >= 0 (t, h, "
                f"w), got {tuple(mrope_section)}"
            )
        if grid_indexing != "ij":
            raise ValueError(
                f"posenc.timm_layers.{name}: grid_indexing must be 'ij' (as timm's), got {grid_indexing!r}"
            )
        self.dim = dim
        self.mrope_section = mrope_section
        self.temperature = temperature
        self.grid_indexing = grid_indexing
        (self.shift_coords, self.jitter_coords, self.rescale_coords, self.aug_active) = (
            _coord_aug_config(name, shift_coords, jitter_coords, rescale_coords)
        )
        axis = _mrope_axes(dim, mrope_section)
        self._sections = [int((axis == a).sum()) for a in range(3)]
        round_robin = [a for k in range(dim // 2) for a in range(3) if self._sections[a] > k]
        if round_robin != axis.tolist():
            raise ValueError(
                f"posenc.timm_layers.{name}: mrope_section {tuple(mrope_section)} with dim "
                f"{dim} assigns channels {axis.tolist()} (timm's clamped stride), "
                f"which is not the interleave of its counts {self._sections} that "
                f"posenc's rope_cos_sin computes"
            )
        inv_freq = self._fresh_inv_freq().to(device=device, dtype=_freq_dtype(dtype))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("axis", axis.to(device), persistent=False)

    def _fresh_inv_freq(self, device=None) -> torch.Tensor:
        bands = torch.ops.posenc.patch_grid_bands(
            self.dim // 2, False, 224.0, float(self.temperature), False
        )
        return bands if device is None else bands.to(device)

    @classmethod
    def from_timm(cls, module: torch.nn.Module) -> RotaryEmbeddingMRope:
        """posenc's module with a timm RotaryEmbeddingMRope's settings, inv_freq dtype, device and
        train/eval mode; frequencies that are not what its settings give are refused."""
        name = f"posenc.timm_layers.{cls.__name__}.from_timm"
        new = cls(
            module.dim,
            mrope_section=module.mrope_section,
            temperature=module.temperature,
            grid_indexing=module.grid_indexing,
            device=module.inv_freq.device,
            dtype=module.inv_freq.dtype,
            shift_coords=module.shift_coords,
            jitter_coords=module.jitter_coords,
            rescale_coords=module.rescale_coords,
        )
        if module.inv_freq.dtype == torch.float64:
            raise ValueError(
                f"{name}: float64 inv_freq gives float64 tables in timm, which "
                f"posenc's rope_cos_sin rounds to float32"
            )
        if not _same_tensor(new.inv_freq, module.inv_freq):
            raise ValueError(
                f"{name}: the timm module's inv_freq is not the one its settings "
                f"give (changed by hand?); posenc would not give its tables"
            )
        if not torch.equal(new.axis.cpu(), module.axis.cpu()):
            raise ValueError(
                f"{name}: the timm module's channel axes are not the ones its "
                f"mrope_section gives; posenc would not give its tables"
            )
        new.train(module.training)
        return new

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        if _freq_dtype(self.inv_freq.dtype) != self.inv_freq.dtype:  # timm rebuilds it float32
            self.register_buffer(
                "inv_freq", self._fresh_inv_freq(self.inv_freq.device), persistent=False
            )
        self._follow_apply(fn, *args, **kwargs)
        return module

    def get_embed(self, shape: Sequence[int], dtype: torch.dtype | None = None) -> torch.Tensor:
        """[H*W, 2 dim] for the (H, W) patch grid; dtype None: inv_freq's (float32)."""
        if shape is None or len(shape) != 2:
            raise ValueError(
                f"posenc.timm_layers.RotaryEmbeddingMRope.get_embed: shape must be [height, "
                f"width], got {shape!r}"
            )
        if self.inv_freq.dtype == torch.float64 and dtype in (None, torch.float64):
            raise RuntimeError(
                "posenc.timm_layers.RotaryEmbeddingMRope.get_embed: float64 tables from "
                "float64 inv_freq: timm keeps their float64 sin/cos, posenc's "
                "rope_cos_sin rounds them to float32; ask for dtype=torch.float32"
            )
        grid = _grid(shape, "index", self.grid_indexing).to(self.inv_freq.device)
        if self.training and self.aug_active:
            grid = _augment_coords(grid, self.shift_coords, self.jitter_coords, self.rescale_coords)
        positions = torch.cat([torch.zeros_like(grid[:, :1]), grid], dim=-1)  # [N, (t, h, w)]
        cos, sin = torch.ops.posenc.rope_cos_sin(
            positions, self.inv_freq, 1.0, self._sections, "interleaved", "half"
        )
        return torch.cat([sin, cos], dim=-1).to(dtype=dtype)

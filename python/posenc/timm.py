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
    cached for a fixed feat_shape or built per shape; RotaryEmbeddingCat.from_timm(module) takes
    a timm module's settings and state (bands and cache dtypes, device; a cache its settings do
    not give, e.g. after timm's .half().float(), is refused with one line). The dtypes follow
    timm's _RotaryEmbeddingBase (timm 1.0.x layers/pos_embed_sincos.py) through every cast: the
    bands buffer stays >= float32 (.half() / .bfloat16() rebuild it float32, .double() and a
    float64 dtype or default dtype make it float64), the cache is computed from fresh float32
    bands and cast to its dtype of the moment (at construction, and on update_feat_shape after
    .half() or .double()), per-shape tables come from the bands buffer as it is. timm's
    training-time coordinate augmentation (shift_coords, jitter_coords, rescale_coords) is not
    computed here: given, it is refused with one line.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from . import _library

_library.load()

__all__ = ["resample_abs_pos_embed", "build_sincos2d_pos_embed", "apply_rot_embed_cat",
           "apply_rot_embed_cat_qk", "build_rotary_pos_embed", "RotaryEmbeddingCat",
           "RotaryEmbedding"]


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


def _split_emb(emb: torch.Tensor, x: torch.Tensor, name: str, lead: str = "heads"):
    """(cos, sin, unsqueeze_dim) for the operator, broadcasting emb against x as timm's
    `x * cos + rot(x) * sin` does: [N, 2D] for every row; [E, N, 2D] against x [B, H, N, D] aligns
    E with the heads (lead "heads"), against x [B, N, D] with the batch (lead "batch")."""
    if emb.shape[-1] != 2 * x.shape[-1]:
        raise ValueError(f"posenc.timm.{name}: emb must be [..., N, 2D] = [..., "
                         f"{x.shape[-2] if x.dim() > 1 else '?'}, {2 * x.shape[-1]}] for x of "
                         f"shape {tuple(x.shape)}, got {tuple(emb.shape)}")
    if emb.dim() == 4 and lead == "heads" and emb.shape[1] == 1:  # [B or 1, 1, N, 2D]: per batch
        sin, cos = emb.squeeze(1).chunk(2, -1)                    # (EVA's patch-dropout path)
        return cos, sin, 1
    if emb.dim() not in (2, 3):
        raise ValueError(f"posenc.timm.{name}: emb must be [N, 2D], [E, N, 2D] or [B, 1, N, 2D] "
                         f"(4-D x), got {tuple(emb.shape)}")
    sin, cos = emb.chunk(2, -1)
    if cos.dim() == 2:  # [N, D] -> [1, N, D], the tables' batch dim
        return cos.unsqueeze(0), sin.unsqueeze(0), 1
    return cos, sin, (0 if lead == "heads" else 1)  # [E, N, D] -> [1, E, N, D] or [E, 1, N, D]


def apply_rot_embed_cat_qk(q: torch.Tensor, k: torch.Tensor, emb: torch.Tensor,
                           half: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's apply_rot_embed_cat on q and k [B, H, N, D] in one pass, each in its own dtype."""
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"posenc.timm.apply_rot_embed_cat_qk: q and k must be [B, H, N, D], got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    cos, sin, dim = _split_emb(emb, q, "apply_rot_embed_cat_qk")
    yq, yk = torch.ops.posenc.apply_rotary(q, k, cos, sin, dim,
                                           "half" if half else "interleaved")
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
        raise ValueError(f"posenc.timm.apply_rot_embed_cat: x must be [B, H, N, D] or [B, N, D], "
                         f"got {tuple(x.shape)}")
    cos, sin, dim = _split_emb(emb, x, "apply_rot_embed_cat", "batch" if three else "heads")
    none = x.new_empty((x.shape[0], 0, x.shape[2], x.shape[3]))
    if dim == 0:  # tables per head: the second member (unused) must broadcast with them too
        none = x.narrow(1, 0, 1)
    y, _ = torch.ops.posenc.apply_rotary(x, none, cos, sin, dim, "half" if half else "interleaved")
    y = y.to(x.dtype)
    return y.squeeze(1) if three else y


def _no_augmentation(name: str, shift_coords, jitter_coords, rescale_coords) -> None:
    for key, value in (("shift_coords", shift_coords), ("jitter_coords", jitter_coords),
                       ("rescale_coords", rescale_coords)):
        if value is not None:
            raise ValueError(f"posenc.timm.{name}: {key}={value!r}: timm's training-time coordinate "
                             f"augmentation is not computed by posenc; leave it None (or use "
                             f"timm's module for augmented training)")


def _grid_type(grid_type: Optional[str], in_pixels: bool) -> str:
    return grid_type if grid_type is not None else ("pixel" if in_pixels else "index")


def _freq_dtype(dtype: Optional[torch.dtype]) -> torch.dtype:
    """timm's _freq_buffer_dtype: the bands' dtype, at least float32 (None: the default dtype)."""
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if dtype.is_floating_point and torch.finfo(dtype).bits < 32:
        return torch.float32
    return dtype


def _rope_tables(feat_shape: Sequence[int], bands: torch.Tensor, grid_type: str,
                 ref_feat_shape: Optional[Sequence[int]], grid_offset: float, grid_indexing: str,
                 normalize_coords: str, rotate_half: bool, dtype: torch.dtype, where: str):
    """(sin, cos) [N, A * 2F] in dtype, on bands' device, as timm's build_fourier_pos_embed:
    float32 grid times the bands (float16 / bfloat16 bands promote to float32 products, float64
    bands give float64 angles), sin and cos cast once to dtype. posenc's float64-band tables are
    float32 (sin/cos rounded once): timm's cast of them to float32, float16 or bfloat16 goes
    through float32 too, so those are the same bits; float64 tables from float64 bands are not."""
    if bands.dtype == torch.float64 and dtype == torch.float64:
        raise RuntimeError(f"posenc.timm.{where}: float64 tables from float64 bands: timm keeps "
                           f"their float64 sin/cos, posenc's patch_grid_rope rounds them to "
                           f"float32; ask for dtype=torch.float32 tables or use float32 bands")
    if bands.dtype in (torch.float16, torch.bfloat16):  # timm's grid * bands promotes to float32
        bands = bands.float()
    cos, sin = torch.ops.posenc.patch_grid_rope(
        [int(s) for s in feat_shape], bands, grid_type,
        None if ref_feat_shape is None else [int(s) for s in ref_feat_shape], float(grid_offset),
        grid_indexing, normalize_coords, "half" if rotate_half else "interleaved")
    return sin.to(dtype), cos.to(dtype)


def build_rotary_pos_embed(feat_shape: Sequence[int], bands: Optional[torch.Tensor] = None,
                           dim: int = 64, max_res: int = 224, temperature: float = 10000.0,
                           linear_bands: bool = False, in_pixels: bool = True,
                           ref_feat_shape: Optional[Sequence[int]] = None,
                           grid_offset: float = 0.0, grid_indexing: str = "ij",
                           rotate_half: bool = False, device: Optional[torch.device] = None,
                           dtype: Optional[torch.dtype] = torch.float32,
                           grid_type: Optional[str] = None,
                           normalize_coords: str = "separate", shift_coords=None,
                           jitter_coords=None, rescale_coords=None):
    """(sin, cos), each [prod(feat_shape), len(feat_shape) * 2 * (dim // 4)] in dtype (given
    bands and dtype=None: the bands' dtype, as timm's)."""
    _no_augmentation("build_rotary_pos_embed", shift_coords, jitter_coords, rescale_coords)
    if bands is None:
        bands = torch.ops.posenc.patch_grid_bands(dim // 4, bool(in_pixels), float(max_res),
                                                  float(temperature), bool(linear_bands))
        if device is not None:
            bands = bands.to(device)
        if dtype is None:  # timm: the float32 tables, uncast
            dtype = torch.float32
    elif dtype is None:
        dtype = bands.dtype
    return _rope_tables(feat_shape, bands, _grid_type(grid_type, in_pixels), ref_feat_shape,
                        grid_offset, grid_indexing, normalize_coords, rotate_half, dtype,
                        "build_rotary_pos_embed")


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

    def __init__(self, dim: int, max_res: int = 224, temperature: float = 10000,
                 in_pixels: bool = True, linear_bands: bool = False,
                 feat_shape: Optional[Sequence[int]] = None,
                 ref_feat_shape: Optional[Sequence[int]] = None, grid_offset: float = 0.0,
                 grid_indexing: str = "ij", rotate_half: bool = False,
                 grid_type: Optional[str] = None, normalize_coords: str = "separate",
                 device=None, dtype=None, shift_coords=None, jitter_coords=None,
                 rescale_coords=None):
        super().__init__()
        name = type(self).__name__
        _no_augmentation(name, shift_coords, jitter_coords, rescale_coords)
        if dim < 4:
            raise ValueError(f"posenc.timm.{name}: dim must be >= 4 (dim // 4 bands), got {dim}")
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
        self.register_buffer("bands", bands.to(device=device, dtype=_freq_dtype(dtype)),
                             persistent=False)
        if feat_shape is None:
            self._set_cache(None, None)
        else:
            cache_dtype = torch.get_default_dtype() if dtype is None else dtype
            sin, cos = self._tables(feat_shape, torch.float32, bands)
            self._set_cache(sin.to(device=device, dtype=cache_dtype),
                            cos.to(device=device, dtype=cache_dtype))

    def _fresh_bands(self, device=None) -> torch.Tensor:
        """timm's _compute_bands: float32 bands, computed on the CPU."""
        bands = torch.ops.posenc.patch_grid_bands(self.dim // 4, bool(self.in_pixels),
                                                  float(self.max_res), float(self.temperature),
                                                  bool(self.linear_bands))
        return bands if device is None else bands.to(device)

    @classmethod
    def from_timm(cls, module: torch.nn.Module):
        """The same tables as a timm RotaryEmbeddingCat / RotaryEmbedding in its present state
        (settings, bands dtype, cache dtype, device, train/eval). A module that augments its
        coordinates, or whose cache is not what its settings give (cast through a lower
        precision and back, e.g. .half().float(), or edited), is refused with one line."""
        name = f"posenc.timm.{cls.__name__}.from_timm"
        if getattr(module, "aug_active", False):
            raise ValueError(f"{name}: the timm module augments its coordinates "
                             f"(shift/jitter/rescale_coords); posenc does not")
        cached = getattr(module, "pos_embed", None)
        if not isinstance(cached, torch.Tensor):
            cached = getattr(module, "pos_embed_sin", None)
        new = cls(module.dim, max_res=module.max_res, temperature=module.temperature,
                  in_pixels=module.in_pixels, linear_bands=module.linear_bands,
                  feat_shape=module.feat_shape, ref_feat_shape=module.ref_feat_shape,
                  grid_offset=module.grid_offset, grid_indexing=module.grid_indexing,
                  rotate_half=getattr(module, "rotate_half", False), grid_type=module.grid_type,
                  normalize_coords=getattr(module, "normalize_coords", "separate"),
                  device=module.bands.device,
                  dtype=cached.dtype if isinstance(cached, torch.Tensor) else module.bands.dtype)
        if new.bands.dtype != module.bands.dtype:  # a buffer cast by hand: take its dtype
            new.register_buffer("bands", new.bands.to(module.bands.dtype), persistent=False)
        if not torch.equal(new.bands, module.bands):
            raise ValueError(f"{name}: the timm module's bands are not the ones its settings "
                             f"give (changed by hand?); posenc would not give its tables")
        if isinstance(cached, torch.Tensor) and not new._cache_is(module):
            # computed on the bands' device, as timm's update_feat_shape does there
            new._update_cache(module.feat_shape)
            if not new._cache_is(module):
                theirs = new._timm_cache(module)
                diff = max((a.double() - b.double()).abs().max().item()
                           for a, b in zip(new._cache(), theirs))
                raise ValueError(f"{name}: {type(module).__name__}'s cached table is not the one "
                                 f"its settings give (max difference {diff:.3g}: cast through a "
                                 f"lower precision and back, e.g. .half().float(), or edited); "
                                 f"posenc would not give the same tables")
        new.train(module.training)
        return new

    def _cache_is(self, module) -> bool:
        return all(a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
                   for a, b in zip(self._cache(), self._timm_cache(module)))

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        # .half() / .bfloat16() cast every floating buffer; timm rebuilds its bands float32
        if _freq_dtype(self.bands.dtype) != self.bands.dtype:
            self.register_buffer("bands", self._fresh_bands(self.bands.device), persistent=False)
        original = self.__dict__.get(_ORIGINAL)
        if original is not None:  # the timm module patch() replaced follows the casts and moves
            original._apply(fn, *args, **kwargs)
        return module

    def _tables(self, feat_shape: Sequence[int], dtype: Optional[torch.dtype] = None,
                bands: Optional[torch.Tensor] = None):
        """timm's _build_embed: (sin, cos) in dtype (None: float32) from the bands buffer (or
        the bands given)."""
        return _rope_tables(feat_shape, self.bands if bands is None else bands, self.grid_type,
                            self.ref_feat_shape, self.grid_offset, self.grid_indexing,
                            self.normalize_coords, self.rotate_half,
                            torch.float32 if dtype is None else dtype,
                            f"{type(self).__name__}.get_embed")

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

    def get_batch_embeds(self, shapes, seq_len: Optional[int] = None,
                         dtype: Optional[torch.dtype] = None):
        """One embedding per (H, W) in shapes; with seq_len, zero-padded and stacked."""
        if not shapes:
            return []
        if self.feat_shape is not None:
            raise RuntimeError("Batch embedding generation requires cached bands, not "
                               "pre-computed embeddings")
        embeds = [self.get_embed((h, w), dtype=dtype) for h, w in shapes]
        if seq_len is None:
            return embeds
        first = embeds[0] if isinstance(embeds[0], torch.Tensor) else embeds[0][0]
        if any((e if isinstance(e, torch.Tensor) else e[0]).shape[-2] > seq_len for e in embeds):
            raise ValueError("seq_len must be at least the number of positions in each embedding")
        if isinstance(embeds[0], torch.Tensor):
            padded = first.new_zeros((len(embeds), seq_len, first.shape[-1]))
            for i, e in enumerate(embeds):
                padded[i, :e.shape[0]] = e
            return padded
        raise RuntimeError(f"posenc.timm.{type(self).__name__}: get_batch_embeds with seq_len "
                           f"returns one tensor; it is RotaryEmbeddingCat's")


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

    def get_embed(self, shape: Optional[Sequence[int]] = None,
                  dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        if self.feat_shape is None and shape is not None:
            sin, cos = self._tables(shape, dtype)
            return torch.cat([sin, cos], -1)
        if self.pos_embed is not None:
            return self.pos_embed if dtype is None else self.pos_embed.to(dtype=dtype)
        raise RuntimeError("posenc.timm.RotaryEmbeddingCat.get_embed: give a shape (no feat_shape "
                           "was set at construction)")

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

    def get_embed(self, shape: Optional[Sequence[int]] = None,
                  dtype: Optional[torch.dtype] = None):
        if self.feat_shape is None and shape is not None:
            return self._tables(shape, dtype)
        if self.pos_embed_sin is not None:
            if dtype is not None:
                return self.pos_embed_sin.to(dtype=dtype), self.pos_embed_cos.to(dtype=dtype)
            return self.pos_embed_sin, self.pos_embed_cos
        raise RuntimeError("posenc.timm.RotaryEmbedding.get_embed: give a shape (no feat_shape "
                           "was set at construction)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, C = dim, *spatial] rotated over its spatial grid."""
        shape = x.shape
        sin, cos = self.get_embed(list(shape[2:]))
        emb = torch.cat([sin, cos], -1)
        y = apply_rot_embed_cat(x.flatten(2).transpose(1, 2), emb, half=self.rotate_half)
        return y.transpose(1, 2).reshape(shape)

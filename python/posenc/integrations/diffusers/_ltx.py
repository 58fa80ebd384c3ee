"""LTX-Video (diffusers 0.42.1, transformers/transformer_ltx.py): LTXVideoRotaryPosEmbed and
LTXVideoAttnProcessor, the table and the rotation computed by posenc.

diffusers' table (LTXVideoRotaryPosEmbed.forward), reproduced here:
  positions   grid [B, N, 3] (t, h, w), float32 when built: either the latent grid (f, h, w) of
              _prepare_video_coords, each axis times rope_interpolation_scale[a] * patch / base
              (base: base_num_frames, base_height, base_width), or the given video_coords [B, 3, N]
              divided by the base sizes
  frequencies F = dim // 6 per axis: f_i = theta ** linspace(log_theta 1, log_theta theta, F)
              (float32, torch's pow), then f_i * pi / 2 (two roundings, diffusers' order)
  angles      a[n, 3 i + axis] = f_i * (2 grid[n, axis] - 1)     (interleaved per frequency:
              t h w t h w ..., one pair each)
  tables      cos/sin(a) repeated per pair (t0 t0 t1 t1 ..), after dim % 6 pass-through channels
              (cos 1, sin 0) laid first: cos, sin [B, N, dim] float32
The positions and the frequency ladder are diffusers' own expressions (plain torch ops, the same
order); the angles and cos/sin come from posenc's operator torch.ops.posenc.rope_cos_sin with
sections (F, F, F) in the interleaved section layout and each frequency repeated for its three
axes (the angle is the same float32 product f_i * c, cos/sin the same elementwise torch kernels),
so the tables are equal to diffusers' to the bit. The grid diffusers builds is float32, on every
device ("Always compute rope in fp32"); given video_coords keep their dtype (below).

The rotation (LTXVideoAttnProcessor, module-level apply_rotary_emb of transformer_ltx.py) acts on
the projected q and k before the heads are split: x [B, S, H Dh] with the table [B, S, H Dh],
pairs (2i, 2i+1) over the whole width, (x.float() * cos + rot(x).float() * sin).to(x.dtype).
posenc's processor computes it with torch.ops.posenc.apply_rotary, interleaved layout, x viewed
as one head [B, S, 1, H Dh] (the same products, the same roundings: equal to the bit).
Coordinates of another dtype (video_coords given so): diffusers computes grid * 2 - 1 in their
dtype and the angles in the promoted dtype of that and the float32 ladder. bfloat16/float16
coordinates give float32 angles: grid * 2 - 1 rounded as diffusers rounds it, then exactly
float32 (the operator's input), the same table. float64 coordinates give float64 angles and float64
tables, which posenc's operator (float32 tables) does not compute: that table comes from
float64_tables below, diffusers' expression in plain ATen (the same products, the same cos/sin
kernels on the same [B, N, 3F] layout: equal to the bit), and the processor's rotation of float32
q, k by it is posenc's operator's float64 path (the products and the sum in float64, then x's
dtype, as diffusers' x.float() * cos promotes them).
"""

from __future__ import annotations

import math

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers import transformer_ltx as _dltx

from . import _common
from ._registry import Family, qualified_name, register

__all__ = ["LTXVideoRotaryPosEmbed", "LTXVideoAttnProcessor", "rotate_across_heads"]

_NAME = "posenc.integrations.diffusers.LTXVideoRotaryPosEmbed"


def rotate_across_heads(
    query: torch.Tensor, key: torch.Tensor, query_tables, key_tables=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """diffusers' LTX apply_rotary_emb(query, tables), apply_rotary_emb(key, tables) (LTX-2:
    apply_interleaved_rotary_emb with the key's own tables) through posenc's operator.

    query [B, Sq, C], key [B, Sk, C'], tables (cos, sin) [B, S, C] interleaved over the whole
    projected width. One operator call where q and k share the tables, else one each."""
    if key_tables is None or key_tables is query_tables:
        cos, sin = _float_tables(query_tables)
        q, k = torch.ops.posenc.apply_rotary(
            _as_float(query).unsqueeze(2), _as_float(key).unsqueeze(2), cos, sin, 2, "interleaved"
        )
        return q.squeeze(2).to(query.dtype), k.squeeze(2).to(key.dtype)
    return _rotate_one(query, query_tables), _rotate_one(key, key_tables)


def _as_float(x: torch.Tensor) -> torch.Tensor:
    """diffusers' x.float(): a rounding for float64 x (done here, the product then in float32 as
    diffusers computes it); bfloat16/float16 x is taken as it is (the operator promotes each
    product to the float32 table's dtype, as x.float() * cos does)."""
    return x.float() if x.dtype == torch.float64 else x


def _float_tables(tables):
    """diffusers' x.float() * cos gives float32 products for bfloat16/float16 tables too: such
    tables go to the operator as float32 (exact), else it would promote x and them to x's dtype."""
    return tuple(t.float() if t.dtype in (torch.bfloat16, torch.float16) else t for t in tables)


def _rotate_one(x: torch.Tensor, tables) -> torch.Tensor:
    cos, sin = _float_tables(tables)
    head = _as_float(x).unsqueeze(2)
    # the operator rotates a pair; the second is the same tensor (no extra input)
    return (
        torch.ops.posenc.apply_rotary(head, head, cos, sin, 2, "interleaved")[0]
        .squeeze(2)
        .to(x.dtype)
    )


class LTXVideoRotaryPosEmbed(_common.DiffusersRotary):
    """diffusers' LTXVideoRotaryPosEmbed (same settings, same forward) computed by posenc."""

    def __init__(
        self,
        dim: int,
        base_num_frames: int = 20,
        base_height: int = 2048,
        base_width: int = 2048,
        patch_size: int = 1,
        patch_size_t: int = 1,
        theta: float = 10000.0,
    ) -> None:
        super().__init__()
        if not isinstance(dim, int) or dim < 6:
            raise ValueError(
                f"{_NAME}: dim must be an integer >= 6 (one frequency per axis), got {dim!r}"
            )
        if not (
            isinstance(theta, (int, float)) and theta > 0 and theta != 1 and math.isfinite(theta)
        ):
            raise ValueError(
                f"{_NAME}: theta must be a finite number > 0 other than 1 "
                f"(diffusers takes log base theta), got {theta!r}"
            )
        self.dim = dim
        self.base_num_frames = base_num_frames
        self.base_height = base_height
        self.base_width = base_width
        self.patch_size = patch_size
        self.patch_size_t = patch_size_t
        self.theta = theta

    @classmethod
    def from_diffusers(cls, module: torch.nn.Module) -> LTXVideoRotaryPosEmbed:
        return cls(
            dim=module.dim,
            base_num_frames=module.base_num_frames,
            base_height=module.base_height,
            base_width=module.base_width,
            patch_size=module.patch_size,
            patch_size_t=module.patch_size_t,
            theta=module.theta,
        )

    def _prepare_video_coords(
        self,
        batch_size: int,
        num_frames: int,
        height: int,
        width: int,
        rope_interpolation_scale,
        device: torch.device,
    ) -> torch.Tensor:
        # diffusers' position builder, line by line
        grid_h = torch.arange(height, dtype=torch.float32, device=device)
        grid_w = torch.arange(width, dtype=torch.float32, device=device)
        grid_f = torch.arange(num_frames, dtype=torch.float32, device=device)
        grid = torch.meshgrid(grid_f, grid_h, grid_w, indexing="ij")
        grid = torch.stack(grid, dim=0)
        grid = grid.unsqueeze(0).repeat(batch_size, 1, 1, 1, 1)
        if rope_interpolation_scale is not None:
            grid[:, 0:1] = (
                grid[:, 0:1]
                * rope_interpolation_scale[0]
                * self.patch_size_t
                / self.base_num_frames
            )
            grid[:, 1:2] = (
                grid[:, 1:2] * rope_interpolation_scale[1] * self.patch_size / self.base_height
            )
            grid[:, 2:3] = (
                grid[:, 2:3] * rope_interpolation_scale[2] * self.patch_size / self.base_width
            )
        return grid.flatten(2, 4).transpose(1, 2)

    def frequencies(self, device) -> torch.Tensor:
        """diffusers' ladder theta ** linspace(0, 1, dim // 6) * pi / 2, float32."""
        freqs = self.theta ** torch.linspace(
            math.log(1.0, self.theta),
            math.log(self.theta, self.theta),
            self.dim // 6,
            device=device,
            dtype=torch.float32,
        )
        return freqs * math.pi / 2.0

    def forward(
        self,
        hidden_states: torch.Tensor,
        num_frames: int | None = None,
        height: int | None = None,
        width: int | None = None,
        rope_interpolation_scale=None,
        video_coords: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch_size = hidden_states.size(0)
        if video_coords is None:
            if num_frames is None or height is None or width is None:
                raise ValueError(
                    f"{_NAME}: without video_coords, num_frames, height and width "
                    f"are needed, got {num_frames!r}, {height!r}, {width!r}"
                )
            grid = self._prepare_video_coords(
                batch_size,
                num_frames,
                height,
                width,
                rope_interpolation_scale,
                hidden_states.device,
            )
        else:
            grid = torch.stack(
                [
                    video_coords[:, 0] / self.base_num_frames,
                    video_coords[:, 1] / self.base_height,
                    video_coords[:, 2] / self.base_width,
                ],
                dim=-1,
            )
        freqs = self.frequencies(hidden_states.device)
        count = freqs.numel()
        coords = angle_positions(grid).contiguous()  # [B, N, 3], diffusers' grid * 2 - 1
        if coords.dtype == torch.float64:  # float64 angles and tables, as diffusers computes
            return float64_tables(coords, freqs, self.dim)
        cos, sin = torch.ops.posenc.rope_cos_sin(
            coords, freqs.repeat_interleave(3), 1.0, [count] * 3, "interleaved", "interleaved"
        )
        if self.dim % 6 != 0:
            cos_padding = torch.ones_like(cos[:, :, : self.dim % 6])
            sin_padding = torch.zeros_like(cos[:, :, : self.dim % 6])
            cos = torch.cat([cos_padding, cos], dim=-1)
            sin = torch.cat([sin_padding, sin], dim=-1)
        return cos, sin


def angle_positions(grid: torch.Tensor) -> torch.Tensor:
    """diffusers' grid * 2 - 1 in the grid's dtype (a rounding there for bfloat16/float16), as
    the angles' operand: float32 where diffusers' angles are float32, float64 kept."""
    coords = grid * 2 - 1
    return coords if coords.dtype == torch.float64 else coords.float()


def float64_angles(coords: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """diffusers' angles for float64 positions: coords [B, N, A] (grid * 2 - 1) times the float32
    ladder freqs [F], promoted to float64, laid out frequency-major: [B, N, F A] contiguous."""
    return (coords.unsqueeze(-1) * freqs).transpose(-1, -2).flatten(2)


def float64_tables(
    coords: torch.Tensor, freqs: torch.Tensor, dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """LTX's and LTX-2's tables for float64 positions, diffusers' expression op for op.

    coords [B, N, A] float64 (grid * 2 - 1), freqs [F] float32 (the ladder): angles
    coords[..., None] * freqs promoted to float64 [B, N, A, F], laid out frequency-major
    [B, N, F A] (t h w t h w ...), cos/sin in float64 on that contiguous layout (ATen's kernels
    round a vector's lanes and its tail apart, so the layout is diffusers'), each repeated for its
    pair, after dim % (2 A) pass-through channels (cos 1, sin 0): [B, N, dim] float64."""
    angles = float64_angles(coords, freqs)
    cos = angles.cos().repeat_interleave(2, dim=-1)
    sin = angles.sin().repeat_interleave(2, dim=-1)
    pad = dim % (2 * coords.shape[-1])
    if pad != 0:
        cos = torch.cat([torch.ones_like(cos[:, :, :pad]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(cos[:, :, :pad]), sin], dim=-1)
    return cos, sin


def _carry_settings(new, processor):
    for setting in ("_attention_backend", "_parallel_config"):
        if setting in vars(processor):
            setattr(new, setting, getattr(processor, setting))
    return new


class LTXVideoAttnProcessor(_dltx.LTXVideoAttnProcessor):
    """diffusers' LTXVideoAttnProcessor with the rotation computed by posenc."""

    @classmethod
    def from_diffusers(cls, processor) -> LTXVideoAttnProcessor:
        return _carry_settings(cls(), processor)

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
        )
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(
                attention_mask, sequence_length, batch_size
            )
            attention_mask = attention_mask.view(
                batch_size, attn.heads, -1, attention_mask.shape[-1]
            )
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states

        query = attn.to_q(hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        query = attn.norm_q(query)
        key = attn.norm_k(key)
        if image_rotary_emb is not None:
            query, key = rotate_across_heads(query, key, image_rotary_emb)

        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        hidden_states = dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=0.0,
            is_causal=False,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.to(query.dtype)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states


FAMILY = register(
    Family(
        name="ltx",
        rotary_class=qualified_name(_dltx.LTXVideoRotaryPosEmbed),
        replace=LTXVideoRotaryPosEmbed.from_diffusers,
        processors={
            qualified_name(_dltx.LTXVideoAttnProcessor): LTXVideoAttnProcessor.from_diffusers
        },
    )
)

"""HunyuanImage 2.1 (diffusers transformer_hunyuanimage.py, 0.42.1): HunyuanVideo's rotary tables
on a 2D (or 3D) grid and HunyuanVideo's attention.

HunyuanImageRotaryPosEmbed(patch_size (2 or 3 sizes), rope_dim (64, 64), theta 256):
  forward(hidden_states [B, C, H, W] or [B, C, F, H, W]): grid sizes input // patch per axis;
  arange(size) float32 on the input's device per axis, meshgrid "ij"; per axis
  get_1d_rotary_pos_embed(rope_dim[a], grid[a].flatten(), theta, use_real=True): float32
  frequencies, angles and cos/sin, each value twice (t0 t0 t1 t1 ...); the axes side by side:
  cos, sin [N, sum(rope_dim)] float32, on every device.
posenc's module: that grid as [N, A] positions and posenc's rope_cos_sin with diffusers' float32
ladders (_common.py). HunyuanImageAttnProcessor is HunyuanVideoAttnProcessor2_0's code (the text
tokens of single-stream blocks not rotated); posenc's is _hunyuan_video.hunyuan_attention.
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_hunyuanimage as _dhi

from ._common import DiffusersRotary, axes_tables, frequencies
from ._hunyuan_video import hunyuan_attention, hunyuan_grid
from ._registry import Family, qualified_name, register
from ._wan import carry_settings

__all__ = ["HunyuanImageRotaryPosEmbed", "HunyuanImageAttnProcessor"]


class HunyuanImageRotaryPosEmbed(DiffusersRotary):
    """diffusers' HunyuanImageRotaryPosEmbed, tables by posenc's operator."""

    def __init__(self, patch_size, rope_dim, theta: float = 256.0):
        super().__init__()
        patch_size, rope_dim = list(patch_size), list(rope_dim)
        if len(patch_size) not in (2, 3) or len(rope_dim) != len(patch_size):
            raise ValueError(
                f"posenc HunyuanImageRotaryPosEmbed: patch_size and rope_dim must "
                f"have 2 or 3 entries each, got {patch_size} and {rope_dim}"
            )
        if any(int(d) != d or d < 0 or d % 2 for d in rope_dim):
            raise ValueError(
                f"posenc HunyuanImageRotaryPosEmbed: rope_dim must be even sizes, got {rope_dim}"
            )
        self.patch_size = patch_size
        self.rope_dim = rope_dim
        self.theta = theta

    @classmethod
    def from_diffusers(cls, module: torch.nn.Module) -> HunyuanImageRotaryPosEmbed:
        return cls(module.patch_size, module.rope_dim, module.theta)

    def forward(self, hidden_states: torch.Tensor):
        axes = len(self.patch_size)
        if hidden_states.dim() != axes + 2:
            raise ValueError(
                f"posenc HunyuanImageRotaryPosEmbed: hidden_states must be "
                f"{axes + 2}-D for patch_size {self.patch_size}, got shape "
                f"{tuple(hidden_states.shape)}"
            )
        sizes = [n // p for n, p in zip(hidden_states.shape[2:], self.patch_size)]
        device = hidden_states.device
        ladders = [frequencies(d, self.theta, torch.float32, device) for d in self.rope_dim]
        return axes_tables(hunyuan_grid(sizes, device), ladders)


class HunyuanImageAttnProcessor(_dhi.HunyuanImageAttnProcessor):
    """diffusers' HunyuanImageAttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _dhi.Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return hunyuan_attention(
            self,
            _dhi.dispatch_attention_fn,
            attn,
            hidden_states,
            encoder_hidden_states,
            attention_mask,
            image_rotary_emb,
        )

    @classmethod
    def from_diffusers(cls, processor) -> HunyuanImageAttnProcessor:
        return carry_settings(cls(), processor)


FAMILY = register(
    Family(
        name="hunyuanimage",
        rotary_class=qualified_name(_dhi.HunyuanImageRotaryPosEmbed),
        replace=HunyuanImageRotaryPosEmbed.from_diffusers,
        processors={
            qualified_name(_dhi.HunyuanImageAttnProcessor): HunyuanImageAttnProcessor.from_diffusers
        },
    )
)

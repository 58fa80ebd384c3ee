"""HunyuanVideo FramePack (diffusers transformer_hunyuan_video_framepack.py, 0.42.1): HunyuanVideo's
tables at given frame indices; HunyuanVideo's blocks and processor.

HunyuanVideoFramepackRotaryPosEmbed(patch_size, patch_size_t, rope_dim (16, 56, 56), theta 256):
  forward(frame_indices [T], height, width, device): the grid meshgrid "ij" of
  frame_indices.to(device, float32) (the latents' frames and the history's, as the pipeline
  numbers them), arange(height // patch_size) and arange(width // patch_size) in float32; per axis
  get_1d_rotary_pos_embed(rope_dim[a], grid[a].flatten(), theta, use_real=True): float32
  frequencies, angles and cos/sin, each value twice (t0 t0 t1 t1 ...); the axes side by side:
  cos, sin [T H W, sum(rope_dim)] float32. The transformer calls it for the latents, the clean
  latents and the 2x/4x history (whose tables it then average-pools itself).
posenc's module: the same grid as [N, 3] positions and posenc's rope_cos_sin with diffusers'
three float32 ladders (_common.py). The blocks are HunyuanVideo's, with its processor
(HunyuanVideoAttnProcessor2_0), which the hunyuan_video family replaces (_hunyuan_video.py).
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_hunyuan_video as _dh
from diffusers.models.transformers import transformer_hunyuan_video_framepack as _dhf

from ._common import axes_tables, frequencies
from ._hunyuan_video import HunyuanVideoAttnProcessor2_0, HunyuanVideoRotaryPosEmbed
from ._registry import Family, qualified_name, register

__all__ = ["HunyuanVideoFramepackRotaryPosEmbed"]


class HunyuanVideoFramepackRotaryPosEmbed(HunyuanVideoRotaryPosEmbed):
    """diffusers' HunyuanVideoFramepackRotaryPosEmbed, tables by posenc's operator."""

    def forward(self, frame_indices: torch.Tensor, height: int, width: int, device: torch.device):
        if not isinstance(frame_indices, torch.Tensor) or frame_indices.dim() != 1:
            raise ValueError(
                f"posenc HunyuanVideoFramepackRotaryPosEmbed: frame_indices must be a "
                f"1-D tensor, got {getattr(frame_indices, 'shape', frame_indices)}"
            )
        axes = [
            frame_indices.to(device=device, dtype=torch.float32),
            torch.arange(0, height // self.patch_size, device=device, dtype=torch.float32),
            torch.arange(0, width // self.patch_size, device=device, dtype=torch.float32),
        ]
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=0)  # [3, T, H, W]
        positions = grid.reshape(3, -1).t()
        ladders = [frequencies(d, self.theta, torch.float32, device) for d in self.rope_dim]
        return axes_tables(positions, ladders)


FAMILY = register(
    Family(
        name="hunyuan_video_framepack",
        rotary_class=qualified_name(_dhf.HunyuanVideoFramepackRotaryPosEmbed),
        replace=HunyuanVideoFramepackRotaryPosEmbed.from_diffusers,
        processors={
            qualified_name(
                _dh.HunyuanVideoAttnProcessor2_0
            ): HunyuanVideoAttnProcessor2_0.from_diffusers
        },
    )
)

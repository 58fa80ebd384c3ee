"""Wan 2.2 Animate (diffusers transformer_wan_animate.py, 0.42.1): Wan's 3D rotary tables and
rotation, in the module's own copies of Wan's classes.

transformer_wan_animate.py defines its own WanRotaryPosEmbed and WanAttnProcessor ("Copied from"
transformer_wan.py, line for line: axes t, h, w with h = w = 2 (D // 6), t = D - h - w; theta 1e4;
float64 angles and cos/sin rounded to float32 buffers, float32 where MPS is available; the
rotation reading cos at even and sin at odd columns). They are other classes than transformer_wan's,
so they are a family of their own here, computed by _wan.py's module and processor (see there).
The face-block cross-attention (WanAnimateFaceBlockAttnProcessor) does not rotate and is kept.
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_wan_animate as _dwa

from ._registry import Family, qualified_name, register
from ._wan import WanRotaryPosEmbed, _wan_call, carry_settings

__all__ = ["WanAnimateRotaryPosEmbed", "WanAnimateAttnProcessor"]


class WanAnimateRotaryPosEmbed(WanRotaryPosEmbed):
    """transformer_wan_animate.WanRotaryPosEmbed: _wan.WanRotaryPosEmbed's tables and gather."""


class WanAnimateAttnProcessor(_dwa.WanAttnProcessor):
    """transformer_wan_animate.WanAttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _dwa.WanAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        return _wan_call(
            self,
            _dwa,
            attn,
            hidden_states,
            encoder_hidden_states,
            attention_mask,
            rotary_emb,
            skyreels=False,
        )

    @classmethod
    def from_diffusers(cls, processor) -> WanAnimateAttnProcessor:
        return carry_settings(cls(), processor)


FAMILY = register(
    Family(
        name="wan_animate",
        rotary_class=qualified_name(_dwa.WanRotaryPosEmbed),
        replace=WanAnimateRotaryPosEmbed.from_diffusers,
        processors={qualified_name(_dwa.WanAttnProcessor): WanAnimateAttnProcessor.from_diffusers},
    )
)

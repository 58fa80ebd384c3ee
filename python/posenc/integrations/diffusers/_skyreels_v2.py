"""SkyReels-V2 (diffusers transformer_skyreels_v2.py, 0.42.1): Wan's 3D rotary tables and rotation.

SkyReelsV2RotaryPosEmbed is WanRotaryPosEmbed line for line (axes t, h, w with h = w = 2 (D // 6),
t = D - h - w; theta 1e4; float64 angles and cos/sin, float32 where MPS is available; tables
[max_seq_len, D] float32, each frequency's value twice), and SkyReelsV2AttnProcessor rotates as
WanAttnProcessor does (the cos at even columns, the sin at odd ones); its only differences are the
context-parallel settings it passes to both attentions. posenc's module and processor are _wan.py's
(see there for the math), the processor with SkyReels' parallel settings.
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_skyreels_v2 as _ds

from ._registry import Family, qualified_name, register
from ._wan import WanRotaryPosEmbed, _wan_call, carry_settings

__all__ = ["SkyReelsV2RotaryPosEmbed", "SkyReelsV2AttnProcessor"]


class SkyReelsV2RotaryPosEmbed(WanRotaryPosEmbed):
    """diffusers' SkyReelsV2RotaryPosEmbed: _wan.WanRotaryPosEmbed's tables and gather."""


class SkyReelsV2AttnProcessor(_ds.SkyReelsV2AttnProcessor):
    """diffusers' SkyReelsV2AttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _ds.SkyReelsV2Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        return _wan_call(
            self,
            _ds,
            attn,
            hidden_states,
            encoder_hidden_states,
            attention_mask,
            rotary_emb,
            skyreels=True,
        )

    @classmethod
    def from_diffusers(cls, processor) -> SkyReelsV2AttnProcessor:
        return carry_settings(cls(), processor)


FAMILY = register(
    Family(
        name="skyreels_v2",
        rotary_class=qualified_name(_ds.SkyReelsV2RotaryPosEmbed),
        replace=SkyReelsV2RotaryPosEmbed.from_diffusers,
        processors={
            qualified_name(_ds.SkyReelsV2AttnProcessor): SkyReelsV2AttnProcessor.from_diffusers
        },
    )
)

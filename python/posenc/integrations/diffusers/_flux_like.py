"""LongCat-Image and Ovis-Image (diffusers transformer_longcat_image.py, transformer_ovis_image.py,
0.42.1): Flux's rotary module and attention, in their own copies.

LongCatImagePosEmbed and OvisImagePosEmbed are FluxPosEmbed line for line (the ids' axes;
ids.float(); float64 frequencies, angles and cos/sin rounded to float32, float32 on mps, npu,
neuron; theta 1e4, axes_dims_rope (16, 56, 56)); posenc's module is _flux.py's. Their attention
processors are FluxAttnProcessor's code with the heads split by attn.heads (Flux: by
attn.head_dim; the same shapes) and no .contiguous() before the output projections; posenc's
processors are those, with the rotation by _common.apply_rotary_emb_qk (posenc's operators).
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_longcat_image as _dlc
from diffusers.models.transformers import transformer_ovis_image as _dov

from ._flux import AxesIdsPosEmbed, flux_attention
from ._registry import Family, qualified_name, register
from ._wan import carry_settings

__all__ = [
    "LongCatImagePosEmbed",
    "LongCatImageAttnProcessor",
    "OvisImagePosEmbed",
    "OvisImageAttnProcessor",
]


def _flux_like_call(
    processor, module, attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb
):
    """The two processors' __call__ (their code is one): Flux's, heads split by attn.heads, the
    output projections on the split views as they are."""
    hidden_states = flux_attention(
        processor,
        module,
        attn,
        hidden_states,
        encoder_hidden_states,
        attention_mask,
        image_rotary_emb,
        by_heads=True,
    )
    if encoder_hidden_states is not None:
        encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
            [
                encoder_hidden_states.shape[1],
                hidden_states.shape[1] - encoder_hidden_states.shape[1],
            ],
            dim=1,
        )
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states
    return hidden_states


class LongCatImagePosEmbed(AxesIdsPosEmbed):
    """diffusers' LongCatImagePosEmbed (FluxPosEmbed's code), tables by posenc's operator."""

    name = "LongCatImagePosEmbed"


class OvisImagePosEmbed(AxesIdsPosEmbed):
    """diffusers' OvisImagePosEmbed (FluxPosEmbed's code), tables by posenc's operator."""

    name = "OvisImagePosEmbed"


class LongCatImageAttnProcessor(_dlc.LongCatImageAttnProcessor):
    """diffusers' LongCatImageAttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _dlc.LongCatImageAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return _flux_like_call(
            self, _dlc, attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb
        )

    @classmethod
    def from_diffusers(cls, processor) -> LongCatImageAttnProcessor:
        return carry_settings(cls(), processor)


class OvisImageAttnProcessor(_dov.OvisImageAttnProcessor):
    """diffusers' OvisImageAttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _dov.OvisImageAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return _flux_like_call(
            self, _dov, attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb
        )

    @classmethod
    def from_diffusers(cls, processor) -> OvisImageAttnProcessor:
        return carry_settings(cls(), processor)


FAMILIES = (
    register(
        Family(
            name="longcat_image",
            rotary_class=qualified_name(_dlc.LongCatImagePosEmbed),
            replace=LongCatImagePosEmbed.from_diffusers,
            processors={
                qualified_name(
                    _dlc.LongCatImageAttnProcessor
                ): LongCatImageAttnProcessor.from_diffusers
            },
        )
    ),
    register(
        Family(
            name="ovis_image",
            rotary_class=qualified_name(_dov.OvisImagePosEmbed),
            replace=OvisImagePosEmbed.from_diffusers,
            processors={
                qualified_name(_dov.OvisImageAttnProcessor): OvisImageAttnProcessor.from_diffusers
            },
        )
    ),
)

"""Flux 3 (diffusers transformer_flux3.py, 0.42.1): Flux 2's n-axis ids, self-attention with q and k
normalised and rotated in float32.

Flux3PosEmbed(theta = rope_theta (1e4), axes_dim = axes_dims_rope (32, 32, 32, 32)) is
Flux2PosEmbed's code (the axes of axes_dim; ids.float(); float64 frequencies, angles and cos/sin
rounded to float32; float32 on mps, npu, neuron); the transformer calls it for the text ids, the
image ids and the reference image ids apart. posenc's module: _flux.AxesIdsPosEmbed with the axes
of axes_dim (tables by rope_cos_sin).
Flux3AttnProcessor: q, k [B, S, H, D] normalised from float32 (norm_q(q.float())), rotated with
embeddings.apply_rotary_emb(x, (cos, sin), sequence_dim=1) (interleaved pairs) in float32, then
cast to v's dtype. posenc's processor: that attention with the rotation by
_common.apply_rotary_emb_qk (torch.ops.posenc.apply_rotary).
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_flux3 as _df3

from ._common import apply_rotary_emb_qk
from ._flux import AxesIdsPosEmbed
from ._registry import Family, qualified_name, register
from ._wan import carry_settings

__all__ = ["Flux3PosEmbed", "Flux3AttnProcessor"]


class Flux3PosEmbed(AxesIdsPosEmbed):
    """diffusers' Flux3PosEmbed, tables by posenc's operator (the axes of axes_dim)."""

    axes_from_ids = False
    name = "Flux3PosEmbed"


class Flux3AttnProcessor(_df3.Flux3AttnProcessor):
    """diffusers' Flux3AttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _df3.Flux3Attention,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        query, key, value = _df3._get_qkv_projections(attn, hidden_states)
        query = query.unflatten(-1, (attn.heads, -1))
        key = key.unflatten(-1, (attn.heads, -1))
        value = value.unflatten(-1, (attn.heads, -1))
        query = attn.norm_q(query.float())
        key = attn.norm_k(key.float())
        if image_rotary_emb is not None:  # posenc's rotation
            query, key = apply_rotary_emb_qk(
                query, key, image_rotary_emb, sequence_dim=1, fused=True
            )
        query, key = query.to(value.dtype), key.to(value.dtype)
        hidden_states = _df3.dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=attention_mask,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.to(query.dtype)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states

    @classmethod
    def from_diffusers(cls, processor) -> Flux3AttnProcessor:
        return carry_settings(cls(), processor)


FAMILY = register(
    Family(
        name="flux3",
        rotary_class=qualified_name(_df3.Flux3PosEmbed),
        replace=Flux3PosEmbed.from_diffusers,
        processors={qualified_name(_df3.Flux3AttnProcessor): Flux3AttnProcessor.from_diffusers},
    )
)

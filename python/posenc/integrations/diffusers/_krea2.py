"""Krea 2 (diffusers transformer_krea2.py, 0.42.1): Flux's n-axis ids with theta 1000, grouped-query
self-attention with a sigmoid gate.

Krea2RotaryPosEmbed(theta = rope_theta (1000), axes_dim = axes_dims_rope (32, 48, 48)) is
FluxPosEmbed's code (the ids' axes; ids.float(); float64 frequencies, angles and cos/sin rounded to
float32; float32 on mps, npu, neuron) over position_ids [text + image tokens, 3]. posenc's module:
_flux.AxesIdsPosEmbed with the ids' axes (tables by rope_cos_sin).
Krea2AttnProcessor: q [B, S, H, D] and k [B, S, H_kv, D] (grouped-query) normalised and rotated
with embeddings.apply_rotary_emb(x, (cos, sin), sequence_dim=1) (interleaved pairs), k and v heads
repeated to H, attention, output times sigmoid(gate). posenc's processor: that attention with the
rotation by _common.apply_rotary_emb_qk (torch.ops.posenc.apply_rotary takes q and k of different
head counts).
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_krea2 as _dk2

from ._common import apply_rotary_emb_qk
from ._flux import AxesIdsPosEmbed
from ._registry import Family, qualified_name, register
from ._wan import carry_settings

__all__ = ["Krea2RotaryPosEmbed", "Krea2AttnProcessor"]


class Krea2RotaryPosEmbed(AxesIdsPosEmbed):
    """diffusers' Krea2RotaryPosEmbed, tables by posenc's operator (the ids' axes)."""

    name = "Krea2RotaryPosEmbed"


class Krea2AttnProcessor(_dk2.Krea2AttnProcessor):
    """diffusers' Krea2AttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _dk2.Krea2Attention,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        query = attn.to_q(hidden_states).unflatten(-1, (attn.num_heads, attn.head_dim))
        key = attn.to_k(hidden_states).unflatten(-1, (attn.num_kv_heads, attn.head_dim))
        value = attn.to_v(hidden_states).unflatten(-1, (attn.num_kv_heads, attn.head_dim))
        gate = attn.to_gate(hidden_states)
        query = attn.norm_q(query)
        key = attn.norm_k(key)
        if image_rotary_emb is not None:  # posenc's rotation
            query, key = apply_rotary_emb_qk(
                query, key, image_rotary_emb, sequence_dim=1, fused=True
            )
        num_key_value_groups = attn.num_heads // attn.num_kv_heads
        if num_key_value_groups > 1:
            key = key.repeat_interleave(num_key_value_groups, dim=2)
            value = value.repeat_interleave(num_key_value_groups, dim=2)
        hidden_states = _dk2.dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=attention_mask,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states * torch.sigmoid(gate)
        return attn.to_out[0](hidden_states)

    @classmethod
    def from_diffusers(cls, processor) -> Krea2AttnProcessor:
        return carry_settings(cls(), processor)


FAMILY = register(
    Family(
        name="krea2",
        rotary_class=qualified_name(_dk2.Krea2RotaryPosEmbed),
        replace=Krea2RotaryPosEmbed.from_diffusers,
        processors={qualified_name(_dk2.Krea2AttnProcessor): Krea2AttnProcessor.from_diffusers},
    )
)

"""HunyuanVideo 1.5 (diffusers transformer_hunyuan_video15.py, 0.42.1): HunyuanVideo's rotary
tables, the rotation of every latent token.

HunyuanVideo15RotaryPosEmbed is HunyuanVideoRotaryPosEmbed's code (3D grid "ij", axes rope_dim
(16, 56, 56), theta 256, float32 frequencies, angles and cos/sin, each value twice; tables
[N, sum(rope_dim)] per forward); posenc's module is _hunyuan_video.py's (see there).
HunyuanVideo15AttnProcessor2_0 rotates q and k of the latent stream ([B, N, H, D],
embeddings.apply_rotary_emb with sequence_dim=1: interleaved pairs, x.float() * cos +
x_rot.float() * sin in x's dtype) before the text stream's q, k, v are appended (never rotated),
then builds the joint attention mask from attention_mask. posenc's processor: that attention with
the rotation by _common.apply_rotary_emb_qk (torch.ops.posenc.apply_rotary, interleaved).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.transformers import transformer_hunyuan_video15 as _dh15

from ._common import apply_rotary_emb_qk
from ._hunyuan_video import HunyuanVideoRotaryPosEmbed
from ._registry import Family, qualified_name, register
from ._wan import carry_settings

__all__ = ["HunyuanVideo15RotaryPosEmbed", "HunyuanVideo15AttnProcessor2_0"]


class HunyuanVideo15RotaryPosEmbed(HunyuanVideoRotaryPosEmbed):
    """diffusers' HunyuanVideo15RotaryPosEmbed: _hunyuan_video's grid and tables."""


class HunyuanVideo15AttnProcessor2_0(_dh15.HunyuanVideo15AttnProcessor2_0):
    """diffusers' HunyuanVideo15AttnProcessor2_0 with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _dh15.Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # 1. QKV projections
        query = attn.to_q(hidden_states)
        key = attn.to_k(hidden_states)
        value = attn.to_v(hidden_states)
        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))

        # 2. QK normalization
        query = attn.norm_q(query)
        key = attn.norm_k(key)

        # 3. Rotary embeddings on the latent stream (posenc's rotation)
        if image_rotary_emb is not None:
            query, key = apply_rotary_emb_qk(
                query, key, image_rotary_emb, sequence_dim=1, fused=True
            )

        # 4. Encoder condition QKV projection and normalization
        if encoder_hidden_states is not None:
            encoder_query = attn.add_q_proj(encoder_hidden_states)
            encoder_key = attn.add_k_proj(encoder_hidden_states)
            encoder_value = attn.add_v_proj(encoder_hidden_states)
            encoder_query = encoder_query.unflatten(2, (attn.heads, -1))
            encoder_key = encoder_key.unflatten(2, (attn.heads, -1))
            encoder_value = encoder_value.unflatten(2, (attn.heads, -1))
            if attn.norm_added_q is not None:
                encoder_query = attn.norm_added_q(encoder_query)
            if attn.norm_added_k is not None:
                encoder_key = attn.norm_added_k(encoder_key)
            query = torch.cat([query, encoder_query], dim=1)
            key = torch.cat([key, encoder_key], dim=1)
            value = torch.cat([value, encoder_value], dim=1)

        batch_size, seq_len, heads, dim = query.shape
        attention_mask = F.pad(attention_mask, (seq_len - attention_mask.shape[1], 0), value=True)
        attention_mask = attention_mask.bool()
        self_attn_mask_1 = attention_mask.view(batch_size, 1, 1, seq_len).repeat(1, 1, seq_len, 1)
        self_attn_mask_2 = self_attn_mask_1.transpose(2, 3)
        attention_mask = (self_attn_mask_1 & self_attn_mask_2).bool()

        # 5. Attention
        hidden_states = _dh15.dispatch_attention_fn(
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

        # 6. Output projection
        if encoder_hidden_states is not None:
            hidden_states, encoder_hidden_states = (
                hidden_states[:, : -encoder_hidden_states.shape[1]],
                hidden_states[:, -encoder_hidden_states.shape[1] :],
            )
            if getattr(attn, "to_out", None) is not None:
                hidden_states = attn.to_out[0](hidden_states)
                hidden_states = attn.to_out[1](hidden_states)
            if getattr(attn, "to_add_out", None) is not None:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)

        return hidden_states, encoder_hidden_states

    @classmethod
    def from_diffusers(cls, processor) -> HunyuanVideo15AttnProcessor2_0:
        return carry_settings(cls(), processor)


FAMILY = register(
    Family(
        name="hunyuan_video15",
        rotary_class=qualified_name(_dh15.HunyuanVideo15RotaryPosEmbed),
        replace=HunyuanVideo15RotaryPosEmbed.from_diffusers,
        processors={
            qualified_name(
                _dh15.HunyuanVideo15AttnProcessor2_0
            ): HunyuanVideo15AttnProcessor2_0.from_diffusers
        },
    )
)

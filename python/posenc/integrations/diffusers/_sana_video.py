"""Sana-Video (diffusers transformer_sana_video.py, 0.42.1): Wan's 3D rotary tables, rotated keys
and queries inside a linear attention.

transformer_sana_video.py's WanRotaryPosEmbed is transformer_wan's line for line (axes t, h, w with
h = w = 2 (D // 6), t = D - h - w; theta 1e4; float64 angles and cos/sin rounded to float32
buffers, float32 where MPS is available); posenc's module is _wan.py's.
SanaLinearAttnProcessor3_0 (the self-attention): q, k, v [B, N, H, C]; q = relu(q), k = relu(k);
q_rot, k_rot with Wan's rotation (cos at even, sin at odd columns, in q's dtype); then, in float32,
  z = 1 / (sum_n k[n] . q + 1e-15)              (the unrotated relu'd q and k)
  out = (v k_rot^T) q_rot * z                   per head, [C, N]
posenc's processor: that attention with q_rot, k_rot from _wan.rotate_wan (posenc's apply_rotary).
diffusers' processor without rotary_emb fails (q_rot undefined); posenc's refuses in one line.
The cross-attention (SanaAttnProcessor2_0) does not rotate and is kept.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.transformers import transformer_sana_video as _dsv

from ._registry import Family, qualified_name, register
from ._wan import WanRotaryPosEmbed, carry_settings, rotate_wan

__all__ = ["SanaVideoRotaryPosEmbed", "SanaLinearAttnProcessor3_0"]


class SanaVideoRotaryPosEmbed(WanRotaryPosEmbed):
    """transformer_sana_video.WanRotaryPosEmbed: _wan.WanRotaryPosEmbed's tables and gather."""


class SanaLinearAttnProcessor3_0(_dsv.SanaLinearAttnProcessor3_0):
    """diffusers' SanaLinearAttnProcessor3_0 with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _dsv.Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if rotary_emb is None:
            raise ValueError(
                "posenc SanaLinearAttnProcessor3_0: rotary_emb is required "
                "(diffusers' processor fails without it)"
            )
        original_dtype = hidden_states.dtype
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        query = attn.to_q(hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        query = query.unflatten(2, (attn.heads, -1))  # [B, N, H, C]
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        query = F.relu(query)
        key = F.relu(key)

        query_rotate, key_rotate = rotate_wan(query, key, *rotary_emb)  # posenc's rotation

        query = query.permute(0, 2, 3, 1)  # [B, H, C, N]
        key = key.permute(0, 2, 3, 1)
        query_rotate = query_rotate.permute(0, 2, 3, 1)
        key_rotate = key_rotate.permute(0, 2, 3, 1)
        value = value.permute(0, 2, 3, 1)
        query_rotate, key_rotate, value = query_rotate.float(), key_rotate.float(), value.float()
        z = 1 / (key.sum(dim=-1, keepdim=True).transpose(-2, -1) @ query + 1e-15)
        scores = torch.matmul(value, key_rotate.transpose(-1, -2))
        hidden_states = torch.matmul(scores, query_rotate)
        hidden_states = hidden_states * z
        hidden_states = hidden_states.flatten(1, 2).transpose(1, 2)
        hidden_states = hidden_states.to(original_dtype)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states

    @classmethod
    def from_diffusers(cls, processor) -> SanaLinearAttnProcessor3_0:
        return carry_settings(cls(), processor)


FAMILY = register(
    Family(
        name="sana_video",
        rotary_class=qualified_name(_dsv.WanRotaryPosEmbed),
        replace=SanaVideoRotaryPosEmbed.from_diffusers,
        processors={
            qualified_name(
                _dsv.SanaLinearAttnProcessor3_0
            ): SanaLinearAttnProcessor3_0.from_diffusers
        },
    )
)

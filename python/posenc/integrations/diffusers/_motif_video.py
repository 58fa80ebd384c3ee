"""Motif-Video (diffusers transformer_motif_video.py, 0.42.1): HunyuanVideo's grid with float64
frequencies; joint self-attention and a text cross-attention that rotates the queries only.

MotifVideoRotaryPosEmbed(patch_size, patch_size_t, rope_dim (16, 56, 56), theta 256):
  forward(hidden_states [B, C, F, H, W]): HunyuanVideo's grid (arange per axis in float32 on the
  input's device, meshgrid "ij"), but per axis get_1d_rotary_pos_embed(..., freqs_dtype=float64
  where the device has float64, float32 on mps, npu, neuron): float64 frequencies, angles
  p * f of the float32 positions and cos/sin in float64, rounded to float32; each value twice
  (t0 t0 t1 t1 ...); the axes side by side: cos, sin [N, sum(rope_dim)].
posenc's module: that grid and posenc's rope_cos_sin with diffusers' ladders in that dtype
(_common.py).
MotifVideoAttnProcessor2_0 (self-attention, the text appended in single-stream blocks and not
rotated there) and MotifVideoCrossAttnProcessor2_0 (queries of the latents rotated, keys of the
text not) rotate with embeddings.apply_rotary_emb(x, (cos, sin), sequence_dim=1) (interleaved
pairs). posenc's processors: those attentions with the rotation by _common.apply_rotary_emb_qk
(q and k) and _common.apply_rotary_emb (the cross-attention's q alone).
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_motif_video as _dmv

from ._common import (
    adjusted_float64,
    apply_rotary_emb,
    apply_rotary_emb_qk,
    axes_tables,
    frequencies,
)
from ._hunyuan_video import HunyuanVideoRotaryPosEmbed, hunyuan_grid
from ._registry import Family, qualified_name, register
from ._wan import carry_settings

__all__ = [
    "MotifVideoRotaryPosEmbed",
    "MotifVideoAttnProcessor2_0",
    "MotifVideoCrossAttnProcessor2_0",
]


class MotifVideoRotaryPosEmbed(HunyuanVideoRotaryPosEmbed):
    """diffusers' MotifVideoRotaryPosEmbed: HunyuanVideo's grid, float64 frequencies."""

    def forward(self, hidden_states: torch.Tensor):
        if hidden_states.dim() != 5:
            raise ValueError(
                f"posenc MotifVideoRotaryPosEmbed: hidden_states must be "
                f"[B, C, F, H, W], got shape {tuple(hidden_states.shape)}"
            )
        _, _, num_frames, height, width = hidden_states.shape
        sizes = [
            num_frames // self.patch_size_t,
            height // self.patch_size,
            width // self.patch_size,
        ]
        device = hidden_states.device
        freqs_dtype = adjusted_float64(device)
        ladders = [frequencies(d, self.theta, freqs_dtype, device) for d in self.rope_dim]
        return axes_tables(hunyuan_grid(sizes, device), ladders)


class MotifVideoAttnProcessor2_0(_dmv.MotifVideoAttnProcessor2_0):
    """diffusers' MotifVideoAttnProcessor2_0 with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _dmv.MotifVideoAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if attn.add_q_proj is None and encoder_hidden_states is not None:
            hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
        query = attn.to_q(hidden_states)
        key = attn.to_k(hidden_states)
        value = attn.to_v(hidden_states)
        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        if image_rotary_emb is not None:  # posenc's rotation
            if attn.add_q_proj is None and encoder_hidden_states is not None:
                split_idx = -encoder_hidden_states.shape[1]
                q_rot, k_rot = apply_rotary_emb_qk(
                    query[:, :split_idx, :, :],
                    key[:, :split_idx, :, :],
                    image_rotary_emb,
                    sequence_dim=1,
                    fused=True,
                )
                query = torch.cat([q_rot, query[:, split_idx:, :, :]], dim=1)
                key = torch.cat([k_rot, key[:, split_idx:, :, :]], dim=1)
            else:
                query, key = apply_rotary_emb_qk(
                    query, key, image_rotary_emb, sequence_dim=1, fused=True
                )

        if attn.add_q_proj is not None and encoder_hidden_states is not None:
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

        hidden_states = _dmv.dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=attention_mask,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.to(query.dtype)

        if encoder_hidden_states is not None:
            hidden_states, encoder_hidden_states = (
                hidden_states[:, : -encoder_hidden_states.shape[1]],
                hidden_states[:, -encoder_hidden_states.shape[1] :],
            )
            if attn.to_out is not None:
                hidden_states = attn.to_out[0](hidden_states)
                hidden_states = attn.to_out[1](hidden_states)
            if attn.to_add_out is not None:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
            return hidden_states, encoder_hidden_states

        if attn.to_out is not None:
            hidden_states = attn.to_out[0](hidden_states)
            hidden_states = attn.to_out[1](hidden_states)
        return hidden_states

    @classmethod
    def from_diffusers(cls, processor) -> MotifVideoAttnProcessor2_0:
        return carry_settings(cls(), processor)


class MotifVideoCrossAttnProcessor2_0(_dmv.MotifVideoCrossAttnProcessor2_0):
    """diffusers' MotifVideoCrossAttnProcessor2_0 with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _dmv.MotifVideoCrossAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
        image_embed_seq_len: int = 0,
    ) -> torch.Tensor:
        txt_kv = encoder_hidden_states[:, image_embed_seq_len:, :]
        text_mask = None
        if attention_mask is not None:
            start = image_embed_seq_len - encoder_hidden_states.shape[1]
            text_mask = attention_mask[:, :, :, start:]
        query = attn.to_q(hidden_states)
        key = attn.to_k(txt_kv)
        value = attn.to_v(txt_kv)
        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if image_rotary_emb is not None:  # posenc's rotation, of the queries only
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
        hidden_states = _dmv.dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=text_mask,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.to(query.dtype)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states

    @classmethod
    def from_diffusers(cls, processor) -> MotifVideoCrossAttnProcessor2_0:
        return carry_settings(cls(), processor)


FAMILY = register(
    Family(
        name="motif_video",
        rotary_class=qualified_name(_dmv.MotifVideoRotaryPosEmbed),
        replace=MotifVideoRotaryPosEmbed.from_diffusers,
        processors={
            qualified_name(
                _dmv.MotifVideoAttnProcessor2_0
            ): MotifVideoAttnProcessor2_0.from_diffusers,
            qualified_name(
                _dmv.MotifVideoCrossAttnProcessor2_0
            ): MotifVideoCrossAttnProcessor2_0.from_diffusers,
        },
    )
)

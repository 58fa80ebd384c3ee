"""Flux 2 (diffusers transformer_flux2.py, 0.42.1): four-axis position ids with theta 2000, the
rotation in the double-stream and the parallel single-stream attentions.

diffusers' Flux2PosEmbed(theta = rope_theta (2000), axes_dim = axes_dims_rope (32, 32, 32, 32)):
FluxPosEmbed's arithmetic (float64 frequencies and cos/sin rounded to float32; float32 on mps,
npu, neuron), except that it loops over the axes of axes_dim, not of the ids (ids with more axes:
the extra ones are not read). The transformer calls it once for img_ids and once for txt_ids and
concatenates the text's tables before the image's. posenc's module: _flux.AxesIdsPosEmbed with the
axes of axes_dim (tables by rope_cos_sin, see _common.py).

Flux2AttnProcessor (double-stream blocks: the text's q, k, v put before the image's) and
Flux2ParallelSelfAttnProcessor (single-stream blocks: one fused QKV + MLP projection) rotate q and
k [B, S, H, D] with embeddings.apply_rotary_emb(x, (cos, sin), sequence_dim=1) (interleaved
pairs). posenc's processors: those attentions with the rotation by _common.apply_rotary_emb_qk
(torch.ops.posenc.apply_rotary). The KV-cache processors (Flux2KVAttnProcessor,
Flux2KVParallelSelfAttnProcessor) are not replaced: patch() names them as left.
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_flux2 as _df2

from ._common import apply_rotary_emb_qk
from ._flux import AxesIdsPosEmbed, flux_attention
from ._registry import Family, qualified_name, register
from ._wan import carry_settings

__all__ = ["Flux2PosEmbed", "Flux2AttnProcessor", "Flux2ParallelSelfAttnProcessor"]


class Flux2PosEmbed(AxesIdsPosEmbed):
    """diffusers' Flux2PosEmbed, tables by posenc's operator (the axes of axes_dim)."""

    axes_from_ids = False
    name = "Flux2PosEmbed"


class Flux2AttnProcessor(_df2.Flux2AttnProcessor):
    """diffusers' Flux2AttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: "_df2.Flux2Attention",
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden_states = flux_attention(self, _df2, attn, hidden_states, encoder_hidden_states,
                                       attention_mask, image_rotary_emb)
        if encoder_hidden_states is not None:
            encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                [encoder_hidden_states.shape[1],
                 hidden_states.shape[1] - encoder_hidden_states.shape[1]], dim=1)
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        if encoder_hidden_states is not None:
            return hidden_states, encoder_hidden_states
        return hidden_states

    @classmethod
    def from_diffusers(cls, processor) -> "Flux2AttnProcessor":
        return carry_settings(cls(), processor)


class Flux2ParallelSelfAttnProcessor(_df2.Flux2ParallelSelfAttnProcessor):
    """diffusers' Flux2ParallelSelfAttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: "_df2.Flux2ParallelSelfAttention",
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # the fused (QKV + MLP in) projection, split by the global QKV : MLP ratio as diffusers
        hidden_states = attn.to_qkv_mlp_proj(hidden_states)
        qkv_dim = 3 * attn.inner_dim
        mlp_dim = attn.mlp_hidden_dim * attn.mlp_mult_factor
        local_qkv = hidden_states.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
        qkv, mlp_hidden_states = torch.split(
            hidden_states, [local_qkv, hidden_states.shape[-1] - local_qkv], dim=-1)
        query, key, value = qkv.chunk(3, dim=-1)
        query = query.unflatten(-1, (-1, attn.head_dim))
        key = key.unflatten(-1, (-1, attn.head_dim))
        value = value.unflatten(-1, (-1, attn.head_dim))
        query = attn.norm_q(query)
        key = attn.norm_k(key)

        if image_rotary_emb is not None:  # posenc's rotation
            query, key = apply_rotary_emb_qk(query, key, image_rotary_emb, sequence_dim=1)

        hidden_states = _df2.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, backend=self._attention_backend,
            parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.to(query.dtype)
        mlp_hidden_states = attn.mlp_act_fn(mlp_hidden_states)
        hidden_states = torch.cat([hidden_states, mlp_hidden_states], dim=-1)
        return attn.to_out(hidden_states)

    @classmethod
    def from_diffusers(cls, processor) -> "Flux2ParallelSelfAttnProcessor":
        return carry_settings(cls(), processor)


FAMILY = register(Family(
    name="flux2",
    rotary_class=qualified_name(_df2.Flux2PosEmbed),
    replace=Flux2PosEmbed.from_diffusers,
    processors={
        qualified_name(_df2.Flux2AttnProcessor): Flux2AttnProcessor.from_diffusers,
        qualified_name(_df2.Flux2ParallelSelfAttnProcessor):
            Flux2ParallelSelfAttnProcessor.from_diffusers,
    },
))

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
pairs). The KV-cache processors the Klein KV pipeline sets (Flux2KVAttnProcessor,
Flux2KVParallelSelfAttnProcessor) rotate the same way, then store the reference tokens' rotated
keys and values ("extract") or attend to the cached ones ("cached"). posenc's processors: those
four attentions with the rotation by _common.apply_rotary_emb_qk (torch.ops.posenc.apply_rotary).
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_flux2 as _df2

from ._common import apply_rotary_emb_qk
from ._flux import AxesIdsPosEmbed, flux_attention
from ._registry import Family, qualified_name, register
from ._wan import carry_settings

__all__ = [
    "Flux2PosEmbed",
    "Flux2AttnProcessor",
    "Flux2ParallelSelfAttnProcessor",
    "Flux2KVAttnProcessor",
    "Flux2KVParallelSelfAttnProcessor",
]


class Flux2PosEmbed(AxesIdsPosEmbed):
    """diffusers' Flux2PosEmbed, tables by posenc's operator (the axes of axes_dim)."""

    axes_from_ids = False
    name = "Flux2PosEmbed"


class Flux2AttnProcessor(_df2.Flux2AttnProcessor):
    """diffusers' Flux2AttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _df2.Flux2Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden_states = flux_attention(
            self, _df2, attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb
        )
        if encoder_hidden_states is not None:
            encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                [
                    encoder_hidden_states.shape[1],
                    hidden_states.shape[1] - encoder_hidden_states.shape[1],
                ],
                dim=1,
            )
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        if encoder_hidden_states is not None:
            return hidden_states, encoder_hidden_states
        return hidden_states

    @classmethod
    def from_diffusers(cls, processor) -> Flux2AttnProcessor:
        return carry_settings(cls(), processor)


def _parallel_qkv(attn, hidden_states, image_rotary_emb):
    """The single-stream blocks' fused (QKV + MLP in) projection, split by the global QKV : MLP
    ratio as diffusers splits it, q and k normalised and rotated (posenc's rotation)."""
    projected = attn.to_qkv_mlp_proj(hidden_states)
    qkv_dim = 3 * attn.inner_dim
    mlp_dim = attn.mlp_hidden_dim * attn.mlp_mult_factor
    local_qkv = projected.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
    qkv, mlp_hidden_states = torch.split(
        projected, [local_qkv, projected.shape[-1] - local_qkv], dim=-1
    )
    query, key, value = qkv.chunk(3, dim=-1)
    query = query.unflatten(-1, (-1, attn.head_dim))
    key = key.unflatten(-1, (-1, attn.head_dim))
    value = value.unflatten(-1, (-1, attn.head_dim))
    query = attn.norm_q(query)
    key = attn.norm_k(key)
    if image_rotary_emb is not None:  # posenc's rotation
        query, key = apply_rotary_emb_qk(query, key, image_rotary_emb, sequence_dim=1, fused=True)
    return query, key, value, mlp_hidden_states


def _parallel_out(attn, attn_output, query, mlp_hidden_states):
    attn_output = attn_output.flatten(2, 3)
    attn_output = attn_output.to(query.dtype)
    mlp_hidden_states = attn.mlp_act_fn(mlp_hidden_states)
    return attn.to_out(torch.cat([attn_output, mlp_hidden_states], dim=-1))


def _kv_attention(
    processor,
    query,
    key,
    value,
    attention_mask,
    kv_cache,
    kv_cache_mode,
    num_txt_tokens,
    num_ref_tokens,
):
    """The KV processors' attention: store the reference tokens' keys and values ("extract"),
    causal attention over them, or attention with the cached ones ("cached"), as diffusers'."""
    if kv_cache_mode == "extract" and kv_cache is not None and num_ref_tokens > 0:
        ref_start, ref_end = num_txt_tokens, num_txt_tokens + num_ref_tokens
        kv_cache.store(key[:, ref_start:ref_end].clone(), value[:, ref_start:ref_end].clone())
    if kv_cache_mode == "extract" and num_ref_tokens > 0:
        return _df2._flux2_kv_causal_attention(
            query, key, value, num_txt_tokens, num_ref_tokens, backend=processor._attention_backend
        )
    if kv_cache_mode == "cached" and kv_cache is not None:
        return _df2._flux2_kv_causal_attention(
            query,
            key,
            value,
            num_txt_tokens,
            0,
            kv_cache=kv_cache,
            backend=processor._attention_backend,
        )
    return _df2.dispatch_attention_fn(
        query,
        key,
        value,
        attn_mask=attention_mask,
        backend=processor._attention_backend,
        parallel_config=processor._parallel_config,
    )


class Flux2ParallelSelfAttnProcessor(_df2.Flux2ParallelSelfAttnProcessor):
    """diffusers' Flux2ParallelSelfAttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _df2.Flux2ParallelSelfAttention,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        query, key, value, mlp_hidden_states = _parallel_qkv(attn, hidden_states, image_rotary_emb)
        hidden_states = _df2.dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=attention_mask,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        return _parallel_out(attn, hidden_states, query, mlp_hidden_states)

    @classmethod
    def from_diffusers(cls, processor) -> Flux2ParallelSelfAttnProcessor:
        return carry_settings(cls(), processor)


class Flux2KVAttnProcessor(_df2.Flux2KVAttnProcessor):
    """diffusers' Flux2KVAttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _df2.Flux2Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
        kv_cache: _df2.Flux2KVLayerCache | None = None,
        kv_cache_mode: str | None = None,
        num_ref_tokens: int = 0,
    ) -> torch.Tensor:
        query, key, value, encoder_query, encoder_key, encoder_value = _df2._get_qkv_projections(
            attn, hidden_states, encoder_hidden_states
        )
        query = query.unflatten(-1, (-1, attn.head_dim))
        key = key.unflatten(-1, (-1, attn.head_dim))
        value = value.unflatten(-1, (-1, attn.head_dim))
        query = attn.norm_q(query)
        key = attn.norm_k(key)
        if attn.added_kv_proj_dim is not None:
            encoder_query = encoder_query.unflatten(-1, (-1, attn.head_dim))
            encoder_key = encoder_key.unflatten(-1, (-1, attn.head_dim))
            encoder_value = encoder_value.unflatten(-1, (-1, attn.head_dim))
            encoder_query = attn.norm_added_q(encoder_query)
            encoder_key = attn.norm_added_k(encoder_key)
            query = torch.cat([encoder_query, query], dim=1)
            key = torch.cat([encoder_key, key], dim=1)
            value = torch.cat([encoder_value, value], dim=1)
        if image_rotary_emb is not None:  # posenc's rotation
            query, key = apply_rotary_emb_qk(
                query, key, image_rotary_emb, sequence_dim=1, fused=True
            )

        num_txt_tokens = encoder_hidden_states.shape[1] if encoder_hidden_states is not None else 0
        hidden_states = _kv_attention(
            self,
            query,
            key,
            value,
            attention_mask,
            kv_cache,
            kv_cache_mode,
            num_txt_tokens,
            num_ref_tokens,
        )
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.to(query.dtype)
        if encoder_hidden_states is not None:
            encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                [
                    encoder_hidden_states.shape[1],
                    hidden_states.shape[1] - encoder_hidden_states.shape[1],
                ],
                dim=1,
            )
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        if encoder_hidden_states is not None:
            return hidden_states, encoder_hidden_states
        return hidden_states

    @classmethod
    def from_diffusers(cls, processor) -> Flux2KVAttnProcessor:
        return carry_settings(cls(), processor)


class Flux2KVParallelSelfAttnProcessor(_df2.Flux2KVParallelSelfAttnProcessor):
    """diffusers' Flux2KVParallelSelfAttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _df2.Flux2ParallelSelfAttention,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
        kv_cache: _df2.Flux2KVLayerCache | None = None,
        kv_cache_mode: str | None = None,
        num_txt_tokens: int = 0,
        num_ref_tokens: int = 0,
    ) -> torch.Tensor:
        query, key, value, mlp_hidden_states = _parallel_qkv(attn, hidden_states, image_rotary_emb)
        attn_output = _kv_attention(
            self,
            query,
            key,
            value,
            attention_mask,
            kv_cache,
            kv_cache_mode,
            num_txt_tokens,
            num_ref_tokens,
        )
        return _parallel_out(attn, attn_output, query, mlp_hidden_states)

    @classmethod
    def from_diffusers(cls, processor) -> Flux2KVParallelSelfAttnProcessor:
        return carry_settings(cls(), processor)


FAMILY = register(
    Family(
        name="flux2",
        rotary_class=qualified_name(_df2.Flux2PosEmbed),
        replace=Flux2PosEmbed.from_diffusers,
        processors={
            qualified_name(_df2.Flux2AttnProcessor): Flux2AttnProcessor.from_diffusers,
            qualified_name(
                _df2.Flux2ParallelSelfAttnProcessor
            ): Flux2ParallelSelfAttnProcessor.from_diffusers,
            qualified_name(_df2.Flux2KVAttnProcessor): Flux2KVAttnProcessor.from_diffusers,
            qualified_name(
                _df2.Flux2KVParallelSelfAttnProcessor
            ): Flux2KVParallelSelfAttnProcessor.from_diffusers,
        },
    )
)

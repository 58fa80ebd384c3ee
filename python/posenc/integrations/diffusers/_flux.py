"""Flux (diffusers transformer_flux.py, 0.42.1): n-axis position ids, the rotation of the joint
text + image sequence.

diffusers' FluxPosEmbed(theta 1e4, axes_dim (16, 56, 56)):
  forward(ids [S, A]): pos = ids.float(); frequencies in float64 — float32 on devices without
  float64 (maybe_adjust_dtype_for_device: mps, npu, neuron), decided from ids' device at each
  call; for each axis a < A (ids.shape[-1]; A > len(axes_dim) fails there)
  get_1d_rotary_pos_embed(axes_dim[a], pos[:, a], theta, use_real=True,
  repeat_interleave_real=True): angles pos * theta^(-2i/dim) and cos/sin in the frequencies'
  dtype, each value twice (t0 t0 t1 t1 ...), `.float()`; the axes side by side: cos, sin
  [S, sum(axes_dim[:A])] float32. The ids are the text's then the image's (txt_ids, img_ids
  concatenated by the transformer), so every token of the joint sequence is rotated.
posenc's module: the same positions and tables from posenc's rope_cos_sin with diffusers'
per-axis ladders side by side (float64 ladders: float64 angles and cos/sin rounded once to
float32; _common.py), equal to the bit.

FluxAttnProcessor's rotation: embeddings.apply_rotary_emb(x, (cos, sin), sequence_dim=1) of q and
k [B, S, H, D] after the text's q, k are put before the image's (interleaved pairs (2i, 2i+1),
x.float() * cos + x_rot.float() * sin in x's dtype). posenc's processor: the same attention with
that rotation by _common.apply_rotary_emb_qk (torch.ops.posenc.apply_rotary, interleaved).
FluxIPAdapterAttnProcessor (load_ip_adapter's, an nn.Module holding the image projections
to_k_ip / to_v_ip) rotates the same way and adds the attention of the unrotated image queries to
the IP-Adapter tokens; posenc's is its subclass holding the very same submodules (state_dict keys
and weights unchanged, casts and moves shared).
"""

from __future__ import annotations

import copy

import torch
from diffusers.models.transformers import transformer_flux as _df

from ._common import (
    DiffusersRotary,
    adjusted_float64,
    apply_rotary_emb_qk,
    axes_tables,
    frequencies,
)
from ._registry import Family, qualified_name, register
from ._wan import carry_settings

__all__ = ["FluxPosEmbed", "FluxAttnProcessor", "FluxIPAdapterAttnProcessor", "AxesIdsPosEmbed"]


class AxesIdsPosEmbed(DiffusersRotary):
    """Tables for n-axis ids as diffusers' FluxPosEmbed / Flux2PosEmbed compute them: the axes of
    ids (`axes_from_ids`, Flux) or of axes_dim (Flux 2), float64 frequencies where ids' device
    has float64."""

    axes_from_ids = True
    name = "FluxPosEmbed"

    def __init__(self, theta, axes_dim):
        super().__init__()
        axes_dim = list(axes_dim)
        if not axes_dim or any(int(d) != d or d <= 0 or d % 2 for d in axes_dim):
            raise ValueError(
                f"posenc {self.name}: axes_dim must be positive even sizes, got {axes_dim}"
            )
        if not theta > 0:
            raise ValueError(f"posenc {self.name}: theta must be > 0, got {theta}")
        self.theta = theta
        self.axes_dim = axes_dim

    @classmethod
    def from_diffusers(cls, module: torch.nn.Module):
        return cls(module.theta, module.axes_dim)

    def forward(self, ids: torch.Tensor):
        if ids.dim() != 2:
            raise ValueError(
                f"posenc {self.name}: ids must be [S, A], got shape {tuple(ids.shape)}"
            )
        n_axes = ids.shape[-1] if self.axes_from_ids else len(self.axes_dim)
        if n_axes > len(self.axes_dim) or n_axes > ids.shape[-1]:
            raise ValueError(
                f"posenc {self.name}: ids have {ids.shape[-1]} axes, axes_dim "
                f"{self.axes_dim} has {len(self.axes_dim)}"
            )
        pos = ids.float()
        freqs_dtype = adjusted_float64(ids.device)
        ladders = [
            frequencies(self.axes_dim[a], self.theta, freqs_dtype, ids.device)
            for a in range(n_axes)
        ]
        return axes_tables(pos[:, :n_axes], ladders)


class FluxPosEmbed(AxesIdsPosEmbed):
    """diffusers' FluxPosEmbed, tables by posenc's operator."""


def flux_attention(
    processor,
    module,
    attn,
    hidden_states,
    encoder_hidden_states,
    attention_mask,
    image_rotary_emb,
    by_heads: bool = False,
):
    """FluxAttnProcessor.__call__ up to the attention's output (Flux2AttnProcessor's with `module`
    transformer_flux2; LongCat-Image's and Ovis-Image's with `by_heads`: they split the heads by
    attn.heads, Flux by attn.head_dim)."""
    query, key, value, encoder_query, encoder_key, encoder_value = module._get_qkv_projections(
        attn, hidden_states, encoder_hidden_states
    )
    split = (attn.heads, -1) if by_heads else (-1, attn.head_dim)
    query = query.unflatten(-1, split)
    key = key.unflatten(-1, split)
    value = value.unflatten(-1, split)
    query = attn.norm_q(query)
    key = attn.norm_k(key)
    if attn.added_kv_proj_dim is not None:
        encoder_query = encoder_query.unflatten(-1, split)
        encoder_key = encoder_key.unflatten(-1, split)
        encoder_value = encoder_value.unflatten(-1, split)
        encoder_query = attn.norm_added_q(encoder_query)
        encoder_key = attn.norm_added_k(encoder_key)
        query = torch.cat([encoder_query, query], dim=1)
        key = torch.cat([encoder_key, key], dim=1)
        value = torch.cat([encoder_value, value], dim=1)

    if image_rotary_emb is not None:  # posenc's rotation
        query, key = apply_rotary_emb_qk(query, key, image_rotary_emb, sequence_dim=1, fused=True)

    hidden_states = module.dispatch_attention_fn(
        query,
        key,
        value,
        attn_mask=attention_mask,
        backend=processor._attention_backend,
        parallel_config=processor._parallel_config,
    )
    hidden_states = hidden_states.flatten(2, 3)
    hidden_states = hidden_states.to(query.dtype)
    return hidden_states


class FluxAttnProcessor(_df.FluxAttnProcessor):
    """diffusers' FluxAttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _df.FluxAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden_states = flux_attention(
            self, _df, attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb
        )
        if encoder_hidden_states is not None:
            encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                [
                    encoder_hidden_states.shape[1],
                    hidden_states.shape[1] - encoder_hidden_states.shape[1],
                ],
                dim=1,
            )
            hidden_states = attn.to_out[0](hidden_states.contiguous())
            hidden_states = attn.to_out[1](hidden_states)
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states.contiguous())
            return hidden_states, encoder_hidden_states
        return hidden_states

    @classmethod
    def from_diffusers(cls, processor) -> FluxAttnProcessor:
        return carry_settings(cls(), processor)


class FluxIPAdapterAttnProcessor(_df.FluxIPAdapterAttnProcessor):
    """diffusers' FluxIPAdapterAttnProcessor with the rotation computed by posenc; built from a
    loaded one by `from_diffusers`, sharing its to_k_ip / to_v_ip modules."""

    def __call__(
        self,
        attn: _df.FluxAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
        ip_hidden_states: list[torch.Tensor] | None = None,
        ip_adapter_masks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch_size = hidden_states.shape[0]
        query, key, value, encoder_query, encoder_key, encoder_value = _df._get_qkv_projections(
            attn, hidden_states, encoder_hidden_states
        )
        query = query.unflatten(-1, (attn.heads, -1))
        key = key.unflatten(-1, (attn.heads, -1))
        value = value.unflatten(-1, (attn.heads, -1))
        query = attn.norm_q(query)
        key = attn.norm_k(key)
        ip_query = query
        if encoder_hidden_states is not None:
            encoder_query = encoder_query.unflatten(-1, (attn.heads, -1))
            encoder_key = encoder_key.unflatten(-1, (attn.heads, -1))
            encoder_value = encoder_value.unflatten(-1, (attn.heads, -1))
            encoder_query = attn.norm_added_q(encoder_query)
            encoder_key = attn.norm_added_k(encoder_key)
            query = torch.cat([encoder_query, query], dim=1)
            key = torch.cat([encoder_key, key], dim=1)
            value = torch.cat([encoder_value, value], dim=1)

        if image_rotary_emb is not None:  # posenc's rotation
            query, key = apply_rotary_emb_qk(
                query, key, image_rotary_emb, sequence_dim=1, fused=True
            )

        hidden_states = _df.dispatch_attention_fn(
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

        if encoder_hidden_states is None:
            return hidden_states
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

        # IP-Adapter: the image queries (unrotated) against each adapter's tokens
        ip_attn_output = torch.zeros_like(hidden_states)
        for current_ip_hidden_states, scale, to_k_ip, to_v_ip in zip(
            ip_hidden_states, self.scale, self.to_k_ip, self.to_v_ip
        ):
            ip_key = to_k_ip(current_ip_hidden_states)
            ip_value = to_v_ip(current_ip_hidden_states)
            ip_key = ip_key.view(batch_size, -1, attn.heads, attn.head_dim)
            ip_value = ip_value.view(batch_size, -1, attn.heads, attn.head_dim)
            current_ip_hidden_states = _df.dispatch_attention_fn(
                ip_query,
                ip_key,
                ip_value,
                attn_mask=None,
                dropout_p=0.0,
                is_causal=False,
                backend=self._attention_backend,
                parallel_config=self._parallel_config,
            )
            current_ip_hidden_states = current_ip_hidden_states.reshape(
                batch_size, -1, attn.heads * attn.head_dim
            )
            current_ip_hidden_states = current_ip_hidden_states.to(ip_query.dtype)
            ip_attn_output += scale * current_ip_hidden_states
        return hidden_states, encoder_hidden_states, ip_attn_output

    @classmethod
    def from_diffusers(cls, processor) -> FluxIPAdapterAttnProcessor:
        """A shallow copy of the loaded processor as posenc's class: its own registries, the
        same to_k_ip / to_v_ip modules (and so the same weights) and settings."""
        ours = copy.copy(processor)
        for registry in ("_modules", "_parameters", "_buffers"):
            object.__setattr__(ours, registry, dict(getattr(processor, registry)))
        ours.__class__ = cls
        return ours


FAMILY = register(
    Family(
        name="flux",
        rotary_class=qualified_name(_df.FluxPosEmbed),
        replace=FluxPosEmbed.from_diffusers,
        processors={
            qualified_name(_df.FluxAttnProcessor): FluxAttnProcessor.from_diffusers,
            qualified_name(
                _df.FluxIPAdapterAttnProcessor
            ): FluxIPAdapterAttnProcessor.from_diffusers,
        },
    )
)

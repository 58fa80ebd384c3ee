"""HunyuanVideo (diffusers transformer_hunyuan_video.py, 0.42.1): 3D rotary tables computed per
forward, the rotation of the latent tokens only.

diffusers' HunyuanVideoRotaryPosEmbed(patch_size, patch_size_t, rope_dim (16, 56, 56), theta 256)
(HunyuanVideo15RotaryPosEmbed is the same code):
  forward(hidden_states [B, C, F, H, W]): grid sizes (F / p_t, H / p, W / p); per axis
  arange(size) float32 on hidden_states' device; meshgrid "ij" (t slowest, w fastest); per axis
  a get_1d_rotary_pos_embed(rope_dim[a], grid[a].flatten(), theta, use_real=True): float32
  frequencies theta^(-2i/dim), float32 angles p * f, cos/sin each value twice (t0 t0 t1 t1 ...);
  the axes side by side: cos, sin [N, sum(rope_dim)] float32, on every device (no float64 path).
posenc's module: the same grid as [N, 3] positions and the tables from posenc's rope_cos_sin with
diffusers' three float32 ladders side by side (sections rope_dim / 2; _common.py): equal to the
bit (the same float32 products and cos/sin).

HunyuanVideoAttnProcessor2_0's rotation: embeddings.apply_rotary_emb(x, (cos, sin),
sequence_dim=1) (interleaved pairs (2i, 2i+1), x.float() * cos + x_rot.float() * sin, in x's
dtype) of q and k [B, N, H, D]; in the single-stream blocks (no add_q_proj) the text tokens,
appended after the latent ones, are not rotated: q[:, :-N_text] is, q[:, -N_text:] is kept.
posenc's processor: the same attention with that rotation by _common.apply_rotary_emb_qk
(torch.ops.posenc.apply_rotary, interleaved), the text tokens kept as there.
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_hunyuan_video as _dh

from ._common import DiffusersRotary, apply_rotary_emb_qk, axes_tables, frequencies
from ._registry import Family, qualified_name, register
from ._wan import carry_settings

__all__ = ["HunyuanVideoRotaryPosEmbed", "HunyuanVideoAttnProcessor2_0", "hunyuan_grid"]


def hunyuan_grid(sizes, device) -> torch.Tensor:
    """diffusers' grid: meshgrid "ij" of arange(size) float32 per axis -> positions [N, A]."""
    axes = [torch.arange(0, s, device=device, dtype=torch.float32) for s in sizes]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=0)  # [A, *sizes]
    return grid.reshape(len(sizes), -1).t()


class HunyuanVideoRotaryPosEmbed(DiffusersRotary):
    """diffusers' HunyuanVideoRotaryPosEmbed / HunyuanVideo15RotaryPosEmbed, tables by posenc."""

    def __init__(self, patch_size: int, patch_size_t: int, rope_dim, theta: float = 256.0):
        super().__init__()
        rope_dim = list(rope_dim)
        if len(rope_dim) != 3 or any(int(d) != d or d < 0 or d % 2 for d in rope_dim):
            raise ValueError(
                f"posenc HunyuanVideoRotaryPosEmbed: rope_dim must be three even "
                f"sizes (t, h, w), got {rope_dim}"
            )
        if not theta > 0:
            raise ValueError(f"posenc HunyuanVideoRotaryPosEmbed: theta must be > 0, got {theta}")
        self.patch_size = patch_size
        self.patch_size_t = patch_size_t
        self.rope_dim = rope_dim
        self.theta = theta

    @classmethod
    def from_diffusers(cls, module: torch.nn.Module) -> HunyuanVideoRotaryPosEmbed:
        return cls(module.patch_size, module.patch_size_t, module.rope_dim, module.theta)

    def forward(self, hidden_states: torch.Tensor):
        if hidden_states.dim() != 5:
            raise ValueError(
                f"posenc HunyuanVideoRotaryPosEmbed: hidden_states must be "
                f"[B, C, F, H, W], got shape {tuple(hidden_states.shape)}"
            )
        _, _, num_frames, height, width = hidden_states.shape
        sizes = [
            num_frames // self.patch_size_t,
            height // self.patch_size,
            width // self.patch_size,
        ]
        device = hidden_states.device
        positions = hunyuan_grid(sizes, device)
        ladders = [frequencies(d, self.theta, torch.float32, device) for d in self.rope_dim]
        return axes_tables(positions, ladders)


def hunyuan_attention(
    processor,
    dispatch_attention_fn,
    attn,
    hidden_states,
    encoder_hidden_states,
    attention_mask,
    image_rotary_emb,
):
    """HunyuanVideoAttnProcessor2_0.__call__ (HunyuanImageAttnProcessor's is the same code), the
    rotation posenc's; every other line as diffusers'."""
    if attn.add_q_proj is None and encoder_hidden_states is not None:
        hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)

    # 1. QKV projections
    query = attn.to_q(hidden_states)
    key = attn.to_k(hidden_states)
    value = attn.to_v(hidden_states)
    query = query.unflatten(2, (attn.heads, -1))
    key = key.unflatten(2, (attn.heads, -1))
    value = value.unflatten(2, (attn.heads, -1))

    # 2. QK normalization
    if attn.norm_q is not None:
        query = attn.norm_q(query)
    if attn.norm_k is not None:
        key = attn.norm_k(key)

    # 3. Rotary embeddings on the latent stream (posenc's rotation)
    if image_rotary_emb is not None:
        if attn.add_q_proj is None and encoder_hidden_states is not None:
            n_text = encoder_hidden_states.shape[1]
            q_rot, k_rot = apply_rotary_emb_qk(
                query[:, :-n_text], key[:, :-n_text], image_rotary_emb, sequence_dim=1, fused=True
            )
            query = torch.cat([q_rot, query[:, -n_text:]], dim=1)
            key = torch.cat([k_rot, key[:, -n_text:]], dim=1)
        else:
            query, key = apply_rotary_emb_qk(
                query, key, image_rotary_emb, sequence_dim=1, fused=True
            )

    # 4. Encoder condition QKV projection and normalization
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

    # 5. Attention
    hidden_states = dispatch_attention_fn(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=0.0,
        is_causal=False,
        backend=processor._attention_backend,
        parallel_config=processor._parallel_config,
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


class HunyuanVideoAttnProcessor2_0(_dh.HunyuanVideoAttnProcessor2_0):
    """diffusers' HunyuanVideoAttnProcessor2_0 with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _dh.Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return hunyuan_attention(
            self,
            _dh.dispatch_attention_fn,
            attn,
            hidden_states,
            encoder_hidden_states,
            attention_mask,
            image_rotary_emb,
        )

    @classmethod
    def from_diffusers(cls, processor) -> HunyuanVideoAttnProcessor2_0:
        return carry_settings(cls(), processor)


FAMILY = register(
    Family(
        name="hunyuan_video",
        rotary_class=qualified_name(_dh.HunyuanVideoRotaryPosEmbed),
        replace=HunyuanVideoRotaryPosEmbed.from_diffusers,
        processors={
            qualified_name(
                _dh.HunyuanVideoAttnProcessor2_0
            ): HunyuanVideoAttnProcessor2_0.from_diffusers
        },
    )
)

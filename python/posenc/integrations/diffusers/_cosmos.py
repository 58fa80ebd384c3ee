"""Cosmos (diffusers 0.42.1, transformers/transformer_cosmos.py): CosmosRotaryPosEmbed and the
attention processors (Cosmos 1.0's CosmosAttnProcessor2_0, Cosmos 2.5's CosmosAttnProcessor2_5),
the table and the rotation computed by posenc.

diffusers' table (CosmosRotaryPosEmbed.forward(hidden_states [B, C, T, H, W], fps)):
  axes       head dim D: dim_h = dim_w = D // 6 * 2, dim_t = D - dim_h - dim_w
  NTK        per axis theta_a = 10000 * rope_scale[a] ** (dim_a / (dim_a - 2)) (the module's
             h/w/t_ntk_factor), frequencies f_a,i = 1 / theta_a ** (2i / dim_a), i < dim_a / 2
             (float32: arange(0, dim_a, 2)[:dim_a // 2] / dim_a, then the pow)
  positions  the patch grid (T/p_t, H/p_h, W/p_w), indices 0, 1, ... (float32); the time axis
             rescaled to 24 fps when fps is given: t = t / fps * base_fps (two roundings)
  tables     angles [t f_t | h f_h | w f_w] per token (t, h, w), laid twice (cat(x, x): the
             rotate-half layout over the whole head), cos/sin: [T H W, D] float32
The positions and the ladders are diffusers' expressions (plain torch ops, the same order); the
angles and cos/sin come from posenc's operator torch.ops.posenc.rope_cos_sin (contiguous
sections (dim_t/2, dim_h/2, dim_w/2), half layout: the same float32 products and elementwise
cos/sin), equal to diffusers' to the bit. float32 on every device, as diffusers computes it.
The rotation (apply_rotary_emb(x, tables, use_real=True, use_real_unbind_dim=-2) of q and k
[B, H, S, D]) goes through torch.ops.posenc.apply_rotary, half layout (_common.apply_rotary_emb_qk).
"""

from __future__ import annotations

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers import transformer_cosmos as _dcosmos

from . import _common
from ._registry import Family, qualified_name, register

__all__ = ["CosmosRotaryPosEmbed", "CosmosAttnProcessor2_0", "CosmosAttnProcessor2_5"]

_NAME = "posenc.integrations.diffusers.CosmosRotaryPosEmbed"


def _ladder(theta: float, dim: int, device) -> torch.Tensor:
    """diffusers: 1.0 / (theta ** (arange(0, dim, 2)[: dim // 2] / dim)), float32, on the
    latents' device (where diffusers computes it: another device's pow may round otherwise)."""
    dim_range = torch.arange(0, dim, 2, device=device, dtype=torch.float32)[: (dim // 2)] / dim
    return 1.0 / (theta**dim_range)


class CosmosRotaryPosEmbed(_common.DiffusersRotary):
    """diffusers' CosmosRotaryPosEmbed (the same settings and forward) computed by posenc."""

    def __init__(
        self,
        hidden_size: int,
        max_size: tuple[int, int, int] = (128, 240, 240),
        patch_size: tuple[int, int, int] = (1, 2, 2),
        base_fps: int = 24,
        rope_scale: tuple[float, float, float] = (2.0, 1.0, 1.0),
    ) -> None:
        super().__init__()
        if not isinstance(hidden_size, int) or hidden_size < 12 or hidden_size % 2 != 0:
            raise ValueError(
                f"{_NAME}: hidden_size (the head dim) must be an even integer >= 12 "
                f"(each axis at least 4 channels), got {hidden_size!r}"
            )
        self.max_size = [size // patch for size, patch in zip(max_size, patch_size)]
        self.patch_size = patch_size
        self.base_fps = base_fps
        self.dim_h = hidden_size // 6 * 2
        self.dim_w = hidden_size // 6 * 2
        self.dim_t = hidden_size - self.dim_h - self.dim_w
        self.h_ntk_factor = rope_scale[1] ** (self.dim_h / (self.dim_h - 2))
        self.w_ntk_factor = rope_scale[2] ** (self.dim_w / (self.dim_w - 2))
        self.t_ntk_factor = rope_scale[0] ** (self.dim_t / (self.dim_t - 2))

    @classmethod
    def from_diffusers(cls, module: torch.nn.Module) -> CosmosRotaryPosEmbed:
        hidden_size = module.dim_t + module.dim_h + module.dim_w
        new = cls(hidden_size, patch_size=module.patch_size, base_fps=module.base_fps)
        # the module's own settings as it holds them (max_size already in patches, NTK factors)
        new.max_size = list(module.max_size)
        for name in ("h_ntk_factor", "w_ntk_factor", "t_ntk_factor"):
            setattr(new, name, getattr(module, name))
        return new

    def forward(
        self, hidden_states: torch.Tensor, fps: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if hidden_states.dim() != 5:
            raise ValueError(
                f"{_NAME}: hidden_states must be [B, C, T, H, W], got shape "
                f"{tuple(hidden_states.shape)}"
            )
        _, _, num_frames, height, width = hidden_states.shape
        pe_size = [
            num_frames // self.patch_size[0],
            height // self.patch_size[1],
            width // self.patch_size[2],
        ]
        longest = max(self.max_size)
        if max(pe_size) > longest:
            raise ValueError(
                f"{_NAME}: the patch grid {tuple(pe_size)} exceeds the module's "
                f"max_size {tuple(self.max_size)} (in patches)"
            )
        device = hidden_states.device
        seq = torch.arange(longest, device=device, dtype=torch.float32)
        if fps is None:  # images
            pos_t = seq[: pe_size[0]]
        else:  # videos: diffusers' seq / fps * base_fps
            pos_t = seq[: pe_size[0]] / fps * self.base_fps
        positions = torch.stack(
            torch.meshgrid(pos_t, seq[: pe_size[1]], seq[: pe_size[2]], indexing="ij"), dim=-1
        ).reshape(-1, 3)
        ladders = [
            _ladder(10000.0 * self.t_ntk_factor, self.dim_t, device),
            _ladder(10000.0 * self.h_ntk_factor, self.dim_h, device),
            _ladder(10000.0 * self.w_ntk_factor, self.dim_w, device),
        ]
        sections = [int(f.numel()) for f in ladders]
        return torch.ops.posenc.rope_cos_sin(
            positions, torch.cat(ladders), 1.0, sections, "contiguous", "half"
        )


def _rotate(query, key, image_rotary_emb):
    return _common.apply_rotary_emb_qk(
        query, key, image_rotary_emb, use_real=True, use_real_unbind_dim=-2
    )


def _grouped(query, key, value):
    """diffusers' GQA step: key and value repeated to query's head count (dim 3 as diffusers)."""
    if torch.onnx.is_in_onnx_export():
        query_idx = torch.tensor(query.size(3), device=query.device)
        key_idx = torch.tensor(key.size(3), device=key.device)
        value_idx = torch.tensor(value.size(3), device=value.device)
    else:
        query_idx = query.size(3)
        key_idx = key.size(3)
        value_idx = value.size(3)
    key = key.repeat_interleave(query_idx // key_idx, dim=3)
    value = value.repeat_interleave(query_idx // value_idx, dim=3)
    return key, value


class CosmosAttnProcessor2_0(_dcosmos.CosmosAttnProcessor2_0):
    """diffusers' CosmosAttnProcessor2_0 with the rotation computed by posenc."""

    @classmethod
    def from_diffusers(cls, processor) -> CosmosAttnProcessor2_0:
        return cls()

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        query = attn.to_q(hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        query = query.unflatten(2, (attn.heads, -1)).transpose(1, 2)
        key = key.unflatten(2, (attn.heads, -1)).transpose(1, 2)
        value = value.unflatten(2, (attn.heads, -1)).transpose(1, 2)
        query = attn.norm_q(query)
        key = attn.norm_k(key)
        if image_rotary_emb is not None:
            query, key = _rotate(query, key, image_rotary_emb)
        key, value = _grouped(query, key, value)
        hidden_states = dispatch_attention_fn(
            query.transpose(1, 2),
            key.transpose(1, 2),
            value.transpose(1, 2),
            attn_mask=attention_mask,
            dropout_p=0.0,
            is_causal=False,
        )
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states


class CosmosAttnProcessor2_5(_dcosmos.CosmosAttnProcessor2_5):
    """diffusers' CosmosAttnProcessor2_5 (text and image context) with posenc's rotation."""

    @classmethod
    def from_diffusers(cls, processor) -> CosmosAttnProcessor2_5:
        return cls()

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: tuple[torch.Tensor, torch.Tensor],
        attention_mask: tuple[torch.Tensor, torch.Tensor],
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if not isinstance(encoder_hidden_states, tuple):
            raise ValueError("Expected encoder_hidden_states as (text_context, img_context) tuple.")
        text_context, img_context = encoder_hidden_states if encoder_hidden_states else (None, None)
        text_mask, img_mask = attention_mask if attention_mask else (None, None)
        if text_context is None:
            text_context = hidden_states

        query = attn.to_q(hidden_states)
        key = attn.to_k(text_context)
        value = attn.to_v(text_context)
        query = query.unflatten(2, (attn.heads, -1)).transpose(1, 2)
        key = key.unflatten(2, (attn.heads, -1)).transpose(1, 2)
        value = value.unflatten(2, (attn.heads, -1)).transpose(1, 2)
        query = attn.norm_q(query)
        key = attn.norm_k(key)
        if image_rotary_emb is not None:
            query, key = _rotate(query, key, image_rotary_emb)
        key, value = _grouped(query, key, value)
        attn_out = dispatch_attention_fn(
            query.transpose(1, 2),
            key.transpose(1, 2),
            value.transpose(1, 2),
            attn_mask=text_mask,
            dropout_p=0.0,
            is_causal=False,
        )
        attn_out = attn_out.flatten(2, 3).type_as(query)

        if img_context is not None:
            q_img = attn.q_img(hidden_states)
            k_img = attn.k_img(img_context)
            v_img = attn.v_img(img_context)
            batch_size = hidden_states.shape[0]
            dim_head = attn.out_dim // attn.heads
            q_img = q_img.view(batch_size, -1, attn.heads, dim_head).transpose(1, 2)
            k_img = k_img.view(batch_size, -1, attn.heads, dim_head).transpose(1, 2)
            v_img = v_img.view(batch_size, -1, attn.heads, dim_head).transpose(1, 2)
            q_img = attn.q_img_norm(q_img)
            k_img = attn.k_img_norm(k_img)
            q_img_idx = q_img.size(3)
            k_img_idx = k_img.size(3)
            v_img_idx = v_img.size(3)
            k_img = k_img.repeat_interleave(q_img_idx // k_img_idx, dim=3)
            v_img = v_img.repeat_interleave(q_img_idx // v_img_idx, dim=3)
            img_out = dispatch_attention_fn(
                q_img.transpose(1, 2),
                k_img.transpose(1, 2),
                v_img.transpose(1, 2),
                attn_mask=img_mask,
                dropout_p=0.0,
                is_causal=False,
            )
            img_out = img_out.flatten(2, 3).type_as(q_img)
            hidden_states = attn_out + img_out
        else:
            hidden_states = attn_out
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states


FAMILY = register(
    Family(
        name="cosmos",
        rotary_class=qualified_name(_dcosmos.CosmosRotaryPosEmbed),
        replace=CosmosRotaryPosEmbed.from_diffusers,
        processors={
            qualified_name(_dcosmos.CosmosAttnProcessor2_0): CosmosAttnProcessor2_0.from_diffusers,
            qualified_name(_dcosmos.CosmosAttnProcessor2_5): CosmosAttnProcessor2_5.from_diffusers,
        },
    )
)

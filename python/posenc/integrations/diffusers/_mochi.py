"""Mochi (diffusers 0.42.1, transformers/transformer_mochi.py and attention_processor.py):
MochiRoPE's table from the model's learned frequencies, and MochiAttnProcessor2_0 with the
rotation computed by posenc.

diffusers' table (MochiRoPE.forward(pos_frequencies, num_frames, height, width, device, dtype)):
  positions  t = 0 .. T-1; h and w centred and scaled to the base area: scale =
             sqrt(192 * 192 / (H W)), h = centres of H equal cells of [-H scale / 2, H scale / 2]
             (linspace edges, (e[:-1] + e[1:]) / 2), w likewise: pos [T H W, 3]
  angles     a[n, h, i] = sum over axes a of pos[n, a] * F[a, h, i]: the model's learned
             frequencies F = pos_frequencies [3, heads, Dh/2], a parameter of the transformer
             (einsum "nd,dhf->nhf", float32, under autocast to float32)
  tables     cos, sin [T H W, heads, Dh/2] (one value per pair, a table per head)
This module computes the positions and the angles with diffusers' own torch ops in diffusers'
order (an einsum over learned frequencies: no posenc table builder computes a sum over axes per
pair), so the table, and its gradient to pos_frequencies, are diffusers' to the bit; the learned
frequencies stay the transformer's own trainable parameter (posenc's module holds no state).

The rotation (the processor's inner apply_rotary_emb: even = x_e cos - x_o sin, odd = x_e sin +
x_o cos on pairs (2i, 2i+1) of q and k [B, S, heads, Dh]) goes through posenc's operator
torch.ops.posenc.apply_rotary, interleaved layout, with the per-pair tables repeated per pair
(t0 t0 t1 t1 ..): x_o cos + x_e sin is x_e sin + x_o cos to the bit (a sum of the same two
rounded products), so the output is diffusers' to the bit; the gradient reaches pos_frequencies
through posenc's backward (dcos, dsin) and autograd through cos/sin and the einsum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models import attention_processor as _dap
from diffusers.models.transformers import transformer_mochi as _dmochi

from . import _common
from ._registry import Family, qualified_name, register

__all__ = ["MochiRoPE", "MochiAttnProcessor2_0"]

_NAME = "posenc.integrations.diffusers.MochiRoPE"


class MochiRoPE(_common.DiffusersRotary):
    """diffusers' MochiRoPE (same settings, same forward) for posenc's processor."""

    def __init__(self, base_height: int = 192, base_width: int = 192) -> None:
        super().__init__()
        self.target_area = base_height * base_width

    @classmethod
    def from_diffusers(cls, module: torch.nn.Module) -> MochiRoPE:
        new = cls()
        new.target_area = module.target_area
        return new

    def _centers(self, start, stop, num, device, dtype) -> torch.Tensor:
        edges = torch.linspace(start, stop, num + 1, device=device, dtype=dtype)
        return (edges[:-1] + edges[1:]) / 2

    def _get_positions(
        self, num_frames: int, height: int, width: int, device=None, dtype=None
    ) -> torch.Tensor:
        scale = (self.target_area / (height * width)) ** 0.5
        t = torch.arange(num_frames, device=device, dtype=dtype)
        h = self._centers(-height * scale / 2, height * scale / 2, height, device, dtype)
        w = self._centers(-width * scale / 2, width * scale / 2, width, device, dtype)
        grid_t, grid_h, grid_w = torch.meshgrid(t, h, w, indexing="ij")
        return torch.stack([grid_t, grid_h, grid_w], dim=-1).view(-1, 3)

    def _create_rope(self, freqs: torch.Tensor, pos: torch.Tensor):
        with torch.autocast(freqs.device.type, torch.float32):
            freqs = torch.einsum("nd,dhf->nhf", pos.to(torch.float32), freqs.to(torch.float32))
        return torch.cos(freqs), torch.sin(freqs)

    def forward(
        self,
        pos_frequencies: torch.Tensor,
        num_frames: int,
        height: int,
        width: int,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if pos_frequencies.dim() != 3 or pos_frequencies.shape[0] != 3:
            raise ValueError(
                f"{_NAME}: pos_frequencies must be [3, heads, head_dim / 2], got "
                f"shape {tuple(pos_frequencies.shape)}"
            )
        pos = self._get_positions(num_frames, height, width, device, dtype)
        return self._create_rope(pos_frequencies, pos)


def _rotate(query: torch.Tensor, key: torch.Tensor, image_rotary_emb):
    """q, k [B, S, heads, Dh] with diffusers' per-pair tables [S, heads, Dh/2]."""
    # diffusers' x.float() * cos: float32 products for bfloat16/float16 tables too (taken as
    # float32, exact; the operator would promote x of their dtype with them to that dtype)
    cos, sin = (
        t.float() if t.dtype in (torch.bfloat16, torch.float16) else t for t in image_rotary_emb
    )
    cos = cos.repeat_interleave(2, dim=-1)  # [S, heads, Dh], t0 t0 t1 t1 ..
    sin = sin.repeat_interleave(2, dim=-1)
    # unsqueeze_dim 0: the tables [1, S, heads, Dh] broadcast over the batch
    # diffusers' x.float(): float64 q, k rounded to float32 first (bfloat16/float16 are promoted
    # product by product by the operator, as x.float() * cos is)
    q, k = torch.ops.posenc.apply_rotary(
        query.float() if query.dtype == torch.float64 else query,
        key.float() if key.dtype == torch.float64 else key,
        cos,
        sin,
        0,
        "interleaved",
    )
    return q.to(query.dtype), k.to(key.dtype)


class MochiAttnProcessor2_0(_dap.MochiAttnProcessor2_0):
    """diffusers' MochiAttnProcessor2_0 with the rotation computed by posenc."""

    @classmethod
    def from_diffusers(cls, processor) -> MochiAttnProcessor2_0:
        return cls()

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
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

        if image_rotary_emb is not None:
            query, key = _rotate(query, key, image_rotary_emb)

        query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        encoder_query, encoder_key, encoder_value = (
            encoder_query.transpose(1, 2),
            encoder_key.transpose(1, 2),
            encoder_value.transpose(1, 2),
        )
        sequence_length = query.size(2)
        encoder_sequence_length = encoder_query.size(2)
        total_length = sequence_length + encoder_sequence_length
        batch_size, heads, _, dim = query.shape
        attn_outputs = []
        for idx in range(batch_size):
            mask = attention_mask[idx][None, :]
            valid_prompt_token_indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
            valid_encoder_query = encoder_query[idx : idx + 1, :, valid_prompt_token_indices, :]
            valid_encoder_key = encoder_key[idx : idx + 1, :, valid_prompt_token_indices, :]
            valid_encoder_value = encoder_value[idx : idx + 1, :, valid_prompt_token_indices, :]
            valid_query = torch.cat([query[idx : idx + 1], valid_encoder_query], dim=2)
            valid_key = torch.cat([key[idx : idx + 1], valid_encoder_key], dim=2)
            valid_value = torch.cat([value[idx : idx + 1], valid_encoder_value], dim=2)
            attn_output = F.scaled_dot_product_attention(
                valid_query, valid_key, valid_value, dropout_p=0.0, is_causal=False
            )
            valid_sequence_length = attn_output.size(2)
            attn_output = F.pad(attn_output, (0, 0, 0, total_length - valid_sequence_length))
            attn_outputs.append(attn_output)
        hidden_states = torch.cat(attn_outputs, dim=0)
        hidden_states = hidden_states.transpose(1, 2).flatten(2, 3)
        hidden_states, encoder_hidden_states = hidden_states.split_with_sizes(
            (sequence_length, encoder_sequence_length), dim=1
        )
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        if hasattr(attn, "to_add_out"):
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


FAMILY = register(
    Family(
        name="mochi",
        rotary_class=qualified_name(_dmochi.MochiRoPE),
        replace=MochiRoPE.from_diffusers,
        processors={
            qualified_name(_dap.MochiAttnProcessor2_0): MochiAttnProcessor2_0.from_diffusers
        },
    )
)

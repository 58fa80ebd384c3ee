"""CogVideoX (diffusers 0.42.1, cogvideox_transformer_3d.py, attention_processor.py): the
attention processors with the rotation computed by posenc, and the family's registration.

CogVideoX's transformer has no rotary module: the pipeline builds the table once per call with
diffusers.models.embeddings.get_3d_rotary_pos_embed and hands it to every block
(image_rotary_emb); posenc's function of the same name, signature and defaults is in
_cogvideox_tables.py (exported by posenc.integrations.diffusers, re-exported here).

The processors (CogVideoXAttnProcessor2_0 and its fused-QKV sibling, subclasses of diffusers')
are diffusers' own line by line, except the rotation of the video tokens' q and k (the tokens
after the text), which goes through posenc's fused operator torch.ops.posenc.apply_rotary,
interleaved layout (_common.apply_rotary_emb_qk): x * cos + rot(x) * sin with the products
rounded as diffusers' apply_rotary_emb rounds them, so the model's output is the same to the bit.

The Family registered here has no rotary module to replace: its rotary_class names diffusers'
table function (no module's type ever matches it), and patch() replaces only the processors. Its
`replace` takes diffusers' function wrapped as a Rotary3DTable module (how the fixture generator,
tools/gen_diffusers_fixtures.py, runs every family's tables) and gives posenc's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models import attention_processor as _dap

from . import _common
from ._cogvideox_tables import (  # noqa: F401
    Rotary3DTable,
    get_3d_rotary_pos_embed,
    get_resize_crop_region_for_grid,
)
from ._registry import Family, qualified_name, register

__all__ = [
    "get_3d_rotary_pos_embed",
    "get_resize_crop_region_for_grid",
    "CogVideoXAttnProcessor2_0",
    "FusedCogVideoXAttnProcessor2_0",
    "Rotary3DTable",
]


def _rotate_video_tokens(
    attn, query: torch.Tensor, key: torch.Tensor, text_seq_length: int, image_rotary_emb
) -> None:
    """diffusers: query[:, :, text:] = apply_rotary_emb(query[:, :, text:], image_rotary_emb),
    and key's (unless cross attention); here through posenc's operator, q and k in one call.
    The operator's autograd keeps its inputs for the tables' gradient, so it rotates copies of
    the slices: the write into query and key below would otherwise change what it kept (diffusers'
    eager formula keeps only the tables, which need no gradient)."""
    video_query = query[:, :, text_seq_length:].clone()
    if attn.is_cross_attention:
        query[:, :, text_seq_length:] = _common.apply_rotary_emb(video_query, image_rotary_emb)
        return
    video_query, video_key = _common.apply_rotary_emb_qk(
        video_query, key[:, :, text_seq_length:].clone(), image_rotary_emb
    )
    query[:, :, text_seq_length:] = video_query
    key[:, :, text_seq_length:] = video_key


class CogVideoXAttnProcessor2_0(_dap.CogVideoXAttnProcessor2_0):
    """diffusers' CogVideoXAttnProcessor2_0 with the rotation computed by posenc."""

    @classmethod
    def from_diffusers(cls, processor) -> CogVideoXAttnProcessor2_0:
        return cls()

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        text_seq_length = encoder_hidden_states.size(1)
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        batch_size, sequence_length, _ = hidden_states.shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(
                attention_mask, sequence_length, batch_size
            )
            attention_mask = attention_mask.view(
                batch_size, attn.heads, -1, attention_mask.shape[-1]
            )

        query = attn.to_q(hidden_states)
        key = attn.to_k(hidden_states)
        value = attn.to_v(hidden_states)
        return _attend(
            attn, query, key, value, batch_size, text_seq_length, attention_mask, image_rotary_emb
        )


class FusedCogVideoXAttnProcessor2_0(_dap.FusedCogVideoXAttnProcessor2_0):
    """diffusers' FusedCogVideoXAttnProcessor2_0 (fused QKV), the rotation computed by posenc."""

    @classmethod
    def from_diffusers(cls, processor) -> FusedCogVideoXAttnProcessor2_0:
        return cls()

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        text_seq_length = encoder_hidden_states.size(1)
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        # diffusers reads the shape of encoder_hidden_states here (the text length): kept as is
        batch_size, sequence_length, _ = encoder_hidden_states.shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(
                attention_mask, sequence_length, batch_size
            )
            attention_mask = attention_mask.view(
                batch_size, attn.heads, -1, attention_mask.shape[-1]
            )

        qkv = attn.to_qkv(hidden_states)
        split_size = qkv.shape[-1] // 3
        query, key, value = torch.split(qkv, split_size, dim=-1)
        return _attend(
            attn, query, key, value, batch_size, text_seq_length, attention_mask, image_rotary_emb
        )


def _attend(attn, query, key, value, batch_size, text_seq_length, attention_mask, image_rotary_emb):
    """The rest of both CogVideoX processors (diffusers' lines after the projections)."""
    inner_dim = key.shape[-1]
    head_dim = inner_dim // attn.heads
    query = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    key = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
    if attn.norm_q is not None:
        query = attn.norm_q(query)
    if attn.norm_k is not None:
        key = attn.norm_k(key)
    if image_rotary_emb is not None:
        _rotate_video_tokens(attn, query, key, text_seq_length, image_rotary_emb)

    hidden_states = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False
    )
    hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
    hidden_states = attn.to_out[0](hidden_states)
    hidden_states = attn.to_out[1](hidden_states)
    encoder_hidden_states, hidden_states = hidden_states.split(
        [text_seq_length, hidden_states.size(1) - text_seq_length], dim=1
    )
    return hidden_states, encoder_hidden_states


def _replace(module: torch.nn.Module) -> Rotary3DTable:
    """diffusers' table function wrapped as a Rotary3DTable -> posenc's; anything else: refused
    (CogVideoX's transformer has no rotary module: the pipeline builds the table)."""
    function = getattr(module, "function", None)
    if (
        isinstance(module, Rotary3DTable)
        and getattr(function, "__module__", None) == "diffusers.models.embeddings"
        and getattr(function, "__name__", None) == "get_3d_rotary_pos_embed"
    ):
        return Rotary3DTable(get_3d_rotary_pos_embed)
    raise ValueError(
        f"CogVideoX has no rotary module (its pipeline builds the table with "
        f"get_3d_rotary_pos_embed); got {type(module).__name__}"
    )


# rotary_class names diffusers' table function: no module's type matches it, so patch() replaces
# only the processors
FAMILY = register(
    Family(
        name="cogvideox",
        rotary_class="diffusers.models.embeddings.get_3d_rotary_pos_embed",
        replace=_replace,
        processors={
            qualified_name(
                _dap.CogVideoXAttnProcessor2_0
            ): CogVideoXAttnProcessor2_0.from_diffusers,
            qualified_name(
                _dap.FusedCogVideoXAttnProcessor2_0
            ): FusedCogVideoXAttnProcessor2_0.from_diffusers,
        },
    )
)

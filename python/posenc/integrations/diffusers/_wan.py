"""Wan 2.1 / 2.2 (diffusers transformer_wan.py, 0.42.1): the 3D rotary tables and the rotation.

diffusers' WanRotaryPosEmbed(attention_head_dim D, patch_size, max_seq_len, theta=1e4):
  axes t, h, w with dims h = w = 2 (D // 6), t = D - h - w (the split sizes are computed once,
  in __init__, and the forward splits with the same ones);
  per axis get_1d_rotary_pos_embed(dim, max_seq_len, theta, use_real=True,
  repeat_interleave_real=True): positions 0 .. max_seq_len-1 (int64), frequencies
  theta^(-2i/dim), angles and cos/sin in float64 — float32 where torch.backends.mps.is_available()
  at construction (diffusers' choice; NPU: float32 angles' cos) — then `.float()`; each
  frequency's value twice (t0 t0 t1 t1 ...); the axes' tables side by side: buffers
  freqs_cos, freqs_sin [max_seq_len, D] float32;
  forward(hidden_states [B, C, F, H, W]): the grid F/p_t x H/p_h x W/p_w (t slowest), token n at
  (f, h, w) takes t-columns of row f, h-columns of row h, w-columns of row w:
  cos, sin [1, N, 1, D].
posenc's module: the same buffers computed by posenc's operator rope_cos_sin (float64 or float32
frequencies: _common.py) and the same gather; built by `from_diffusers(module)`, which refuses a
module whose buffers are not what its settings give (another theta: diffusers does not keep it;
buffers cast through a lower precision).

WanAttnProcessor's rotation (a function inside its __call__), q, k [B, N, H, D]:
  out[2i] = x[2i] cos[2i] - x[2i+1] sin[2i+1],  out[2i+1] = x[2i] sin[2i+1] + x[2i+1] cos[2i]
  (cos read at even columns, sin at odd ones), stored in x's dtype.
posenc's processor: the same attention with that rotation computed by torch.ops.posenc.apply_rotary
(interleaved pairs, the per-pair tables laid out t0 t0 t1 t1 ...: x cos + rot(x) sin, the same
products and sums: a + (-b) s is a - b s, a s + b c is b c + a s), with its backward.
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_wan as _dw

from ._common import DiffusersRotary, axes_tables, frequencies, fused_takes, same_tables
from ._registry import Family, qualified_name, register

__all__ = ["WanRotaryPosEmbed", "WanAttnProcessor", "rotate_wan", "wan_axes"]


def wan_axes(attention_head_dim: int):
    """Wan's split of the head dim: (t, h, w) = (D - 2 * 2 (D // 6), 2 (D // 6), 2 (D // 6))."""
    h_dim = w_dim = 2 * (attention_head_dim // 6)
    return attention_head_dim - h_dim - w_dim, h_dim, w_dim


class WanRotaryPosEmbed(DiffusersRotary):
    """diffusers' WanRotaryPosEmbed (and SkyReelsV2RotaryPosEmbed), tables by posenc's operator."""

    def __init__(
        self,
        attention_head_dim: int,
        patch_size,
        max_seq_len: int,
        theta: float = 10000.0,
        freqs_dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if attention_head_dim < 6 or attention_head_dim % 2:
            raise ValueError(
                f"posenc WanRotaryPosEmbed: attention_head_dim must be even and >= 6, "
                f"got {attention_head_dim}"
            )
        if max_seq_len < 1:
            raise ValueError(
                f"posenc WanRotaryPosEmbed: max_seq_len must be >= 1, got {max_seq_len}"
            )
        self.attention_head_dim = attention_head_dim
        self.patch_size = patch_size
        self.max_seq_len = max_seq_len
        self.theta = theta
        self.t_dim, self.h_dim, self.w_dim = wan_axes(attention_head_dim)
        if freqs_dtype is None:  # diffusers' choice, at construction
            freqs_dtype = torch.float32 if torch.backends.mps.is_available() else torch.float64
        self.freqs_dtype = freqs_dtype
        positions = torch.arange(max_seq_len).unsqueeze(1).expand(-1, 3)
        ladders = [frequencies(d, theta, freqs_dtype) for d in (self.t_dim, self.h_dim, self.w_dim)]
        cos, sin = axes_tables(positions, ladders)
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

    @classmethod
    def from_diffusers(cls, module: torch.nn.Module) -> WanRotaryPosEmbed:
        """posenc's module for diffusers' one, its tables checked equal to the module's own."""
        ours = cls(module.attention_head_dim, module.patch_size, module.max_seq_len)
        theirs = (module.freqs_cos, module.freqs_sin)
        if theirs[0].device.type == "meta":
            raise ValueError(
                "posenc WanRotaryPosEmbed: its tables are on the meta device (not "
                "materialised); patch the model after loading it"
            )
        ours.to(device=theirs[0].device)
        ours.freqs_cos = ours.freqs_cos.to(theirs[0].dtype)
        ours.freqs_sin = ours.freqs_sin.to(theirs[1].dtype)
        split = tuple(getattr(module, n, None) for n in ("t_dim", "h_dim", "w_dim"))
        if None not in split and split != (ours.t_dim, ours.h_dim, ours.w_dim):
            raise ValueError(
                f"posenc WanRotaryPosEmbed: its split "
                f"{(module.t_dim, module.h_dim, module.w_dim)} is not diffusers' "
                f"{(ours.t_dim, ours.h_dim, ours.w_dim)} for "
                f"D={module.attention_head_dim}"
            )
        why = same_tables((ours.freqs_cos, ours.freqs_sin), theirs)
        if why is not None:
            raise ValueError(
                f"posenc WanRotaryPosEmbed: its tables are not what its settings give "
                f"with theta 1e4 ({why}); another theta or a cast buffer"
            )
        return ours

    def forward(self, hidden_states: torch.Tensor):
        if hidden_states.dim() != 5:
            raise ValueError(
                f"posenc WanRotaryPosEmbed: hidden_states must be [B, C, F, H, W], "
                f"got shape {tuple(hidden_states.shape)}"
            )
        _, _, num_frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.patch_size
        ppf, pph, ppw = num_frames // p_t, height // p_h, width // p_w
        if max(ppf, pph, ppw) > self.max_seq_len:
            raise ValueError(
                f"posenc WanRotaryPosEmbed: the grid {(ppf, pph, ppw)} exceeds "
                f"max_seq_len {self.max_seq_len}"
            )
        split_sizes = [self.t_dim, self.h_dim, self.w_dim]
        out = []
        for table in (self.freqs_cos, self.freqs_sin):  # diffusers' gather, op for op
            t, h, w = table.split(split_sizes, dim=1)
            t = t[:ppf].view(ppf, 1, 1, -1).expand(ppf, pph, ppw, -1)
            h = h[:pph].view(1, pph, 1, -1).expand(ppf, pph, ppw, -1)
            w = w[:ppw].view(1, 1, ppw, -1).expand(ppf, pph, ppw, -1)
            out.append(torch.cat([t, h, w], dim=-1).reshape(1, ppf * pph * ppw, 1, -1))
        return out[0], out[1]


def rotate_wan(
    query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor
):
    """Wan's apply_rotary_emb of q and k ([B, N, H, D]; tables [1, N, 1, D]), posenc's operator."""
    if freqs_cos.dim() != 4 or freqs_cos.shape[2] != 1 or freqs_sin.shape != freqs_cos.shape:
        raise ValueError(
            f"posenc Wan rotation: tables must be [1, N, 1, D] of one shape, got "
            f"{tuple(freqs_cos.shape)} and {tuple(freqs_sin.shape)}"
        )
    cos_pairs = freqs_cos[..., 0::2].squeeze(2)  # [1, N, D/2]: the even columns, as Wan reads
    sin_pairs = freqs_sin[..., 1::2].squeeze(2)  # the odd columns
    if fused_takes(query, key, cos_pairs, sin_pairs):
        return torch.ops.posenc.rope_rotate_qk(
            query, key, cos_pairs, sin_pairs, "interleaved", False
        )
    cos = cos_pairs.repeat_interleave(2, dim=-1)  # [1, N, D]: c0 c0 c1 c1 ...
    sin = sin_pairs.repeat_interleave(2, dim=-1)
    q, k = torch.ops.posenc.apply_rotary(query, key, cos, sin, 2, "interleaved")
    return q.to(query.dtype), k.to(key.dtype)


def _wan_call(
    processor,
    diffusers_module,
    attn,
    hidden_states,
    encoder_hidden_states,
    attention_mask,
    rotary_emb,
    skyreels: bool,
):
    """WanAttnProcessor.__call__ (SkyReelsV2AttnProcessor's with `skyreels`), the rotation
    posenc's; every other line as diffusers' (its helpers and dispatch_attention_fn)."""
    dispatch_attention_fn = diffusers_module.dispatch_attention_fn
    encoder_hidden_states_img = None
    if attn.add_k_proj is not None:
        # 512 is the context length of the text encoder, hardcoded (as diffusers)
        image_context_length = encoder_hidden_states.shape[1] - 512
        encoder_hidden_states_img = encoder_hidden_states[:, :image_context_length]
        encoder_hidden_states = encoder_hidden_states[:, image_context_length:]

    query, key, value = diffusers_module._get_qkv_projections(
        attn, hidden_states, encoder_hidden_states
    )
    query = attn.norm_q(query)
    key = attn.norm_k(key)
    query = query.unflatten(2, (attn.heads, -1))
    key = key.unflatten(2, (attn.heads, -1))
    value = value.unflatten(2, (attn.heads, -1))

    if rotary_emb is not None:
        query, key = rotate_wan(query, key, *rotary_emb)

    hidden_states_img = None
    if encoder_hidden_states_img is not None:  # I2V
        key_img, value_img = diffusers_module._get_added_kv_projections(
            attn, encoder_hidden_states_img
        )
        key_img = attn.norm_added_k(key_img)
        key_img = key_img.unflatten(2, (attn.heads, -1))
        value_img = value_img.unflatten(2, (attn.heads, -1))
        hidden_states_img = dispatch_attention_fn(
            query,
            key_img,
            value_img,
            attn_mask=None,
            dropout_p=0.0,
            is_causal=False,
            backend=processor._attention_backend,
            parallel_config=processor._parallel_config if skyreels else None,
        )
        hidden_states_img = hidden_states_img.flatten(2, 3)
        hidden_states_img = hidden_states_img.type_as(query)

    if skyreels:
        parallel_config = processor._parallel_config
    else:
        parallel_config = processor._parallel_config if encoder_hidden_states is None else None
    hidden_states = dispatch_attention_fn(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=0.0,
        is_causal=False,
        backend=processor._attention_backend,
        parallel_config=parallel_config,
    )
    hidden_states = hidden_states.flatten(2, 3)
    hidden_states = hidden_states.type_as(query)
    if hidden_states_img is not None:
        hidden_states = hidden_states + hidden_states_img
    hidden_states = attn.to_out[0](hidden_states)
    hidden_states = attn.to_out[1](hidden_states)
    return hidden_states


def carry_settings(ours, theirs):
    """The processor settings diffusers set on the instance (attention backend, parallel config)."""
    for setting in ("_attention_backend", "_parallel_config"):
        if setting in vars(theirs):
            setattr(ours, setting, getattr(theirs, setting))
    return ours


class WanAttnProcessor(_dw.WanAttnProcessor):
    """diffusers' WanAttnProcessor with the rotation computed by posenc (a subclass: diffusers'
    isinstance checks and attention-backend settings keep working)."""

    def __call__(
        self,
        attn: _dw.WanAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        return _wan_call(
            self,
            _dw,
            attn,
            hidden_states,
            encoder_hidden_states,
            attention_mask,
            rotary_emb,
            skyreels=False,
        )

    @classmethod
    def from_diffusers(cls, processor) -> WanAttnProcessor:
        return carry_settings(cls(), processor)


FAMILY = register(
    Family(
        name="wan",
        rotary_class=qualified_name(_dw.WanRotaryPosEmbed),
        replace=WanRotaryPosEmbed.from_diffusers,
        processors={qualified_name(_dw.WanAttnProcessor): WanAttnProcessor.from_diffusers},
    )
)

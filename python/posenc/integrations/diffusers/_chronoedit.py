"""ChronoEdit (diffusers transformer_chronoedit.py, 0.42.1): Wan's tables read with other split
sizes, and a temporal skip for two-frame inputs.

ChronoEditRotaryPosEmbed(attention_head_dim D, patch_size, max_seq_len, theta 1e4,
temporal_skip_len 8) builds Wan's buffers in __init__ (axes t, h, w with h = w = 2 (D // 6),
t = D - h - w; float64 angles and cos/sin rounded to float32, float32 where MPS is available) but
its forward splits them with other sizes: [D - 2 (D // 3), D // 3, D // 3]. The two agree where
6 divides D (D = 128: 44, 42, 42 both ways); elsewhere the forward's "h" columns start inside the
t block (D = 40: built 16 | 12 | 12, read 14 | 13 | 13), and that is the model's table. With two
frames (num_frames == 2) the t columns are rows 0 and min(temporal_skip_len, max_seq_len) - 1 of
the t table (the edit's input and output frames set apart), not rows 0 and 1.
posenc's module: _wan.py's buffers (posenc's rope_cos_sin) and this forward, op for op, so the
tables equal diffusers' for every D; the processor is transformer_chronoedit's own copy of
WanAttnProcessor, computed by _wan.py's rotation (posenc's apply_rotary).
"""

from __future__ import annotations

import torch
from diffusers.models.transformers import transformer_chronoedit as _dce

from ._registry import Family, qualified_name, register
from ._wan import WanRotaryPosEmbed, _wan_call, carry_settings

__all__ = ["ChronoEditRotaryPosEmbed", "ChronoEditAttnProcessor"]


class ChronoEditRotaryPosEmbed(WanRotaryPosEmbed):
    """diffusers' ChronoEditRotaryPosEmbed: Wan's buffers by posenc, ChronoEdit's forward."""

    def __init__(
        self,
        attention_head_dim: int,
        patch_size,
        max_seq_len: int,
        theta: float = 10000.0,
        temporal_skip_len: int = 8,
        freqs_dtype: torch.dtype | None = None,
    ):
        super().__init__(attention_head_dim, patch_size, max_seq_len, theta, freqs_dtype)
        if temporal_skip_len < 1:
            raise ValueError(
                f"posenc ChronoEditRotaryPosEmbed: temporal_skip_len must be >= 1, "
                f"got {temporal_skip_len}"
            )
        self.temporal_skip_len = temporal_skip_len

    @classmethod
    def from_diffusers(cls, module: torch.nn.Module) -> ChronoEditRotaryPosEmbed:
        ours = super().from_diffusers(module)  # Wan's buffers, checked against the module's
        ours.temporal_skip_len = module.temporal_skip_len
        return ours

    def forward(self, hidden_states: torch.Tensor):
        if hidden_states.dim() != 5:
            raise ValueError(
                f"posenc ChronoEditRotaryPosEmbed: hidden_states must be "
                f"[B, C, F, H, W], got shape {tuple(hidden_states.shape)}"
            )
        _, _, num_frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.patch_size
        ppf, pph, ppw = num_frames // p_t, height // p_h, width // p_w
        if max(ppf, pph, ppw) > self.max_seq_len:
            raise ValueError(
                f"posenc ChronoEditRotaryPosEmbed: the grid {(ppf, pph, ppw)} "
                f"exceeds max_seq_len {self.max_seq_len}"
            )
        if num_frames == 2 and ppf != 2:
            raise ValueError(
                f"posenc ChronoEditRotaryPosEmbed: two frames take the temporal skip, "
                f"which needs 2 patched frames, got {ppf} (patch_size {p_t})"
            )
        d = self.attention_head_dim
        split_sizes = [d - 2 * (d // 3), d // 3, d // 3]  # the forward's sizes, not __init__'s
        out = []
        for table in (self.freqs_cos, self.freqs_sin):  # diffusers' gather, op for op
            t, h, w = table.split(split_sizes, dim=1)
            if num_frames == 2:
                t = t[: self.temporal_skip_len][[0, -1]].view(ppf, 1, 1, -1)
            else:
                t = t[:ppf].view(ppf, 1, 1, -1)
            t = t.expand(ppf, pph, ppw, -1)
            h = h[:pph].view(1, pph, 1, -1).expand(ppf, pph, ppw, -1)
            w = w[:ppw].view(1, 1, ppw, -1).expand(ppf, pph, ppw, -1)
            out.append(torch.cat([t, h, w], dim=-1).reshape(1, ppf * pph * ppw, 1, -1))
        return out[0], out[1]


class ChronoEditAttnProcessor(_dce.WanAttnProcessor):
    """transformer_chronoedit.WanAttnProcessor with the rotation computed by posenc."""

    def __call__(
        self,
        attn: _dce.WanAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        return _wan_call(
            self,
            _dce,
            attn,
            hidden_states,
            encoder_hidden_states,
            attention_mask,
            rotary_emb,
            skyreels=False,
        )

    @classmethod
    def from_diffusers(cls, processor) -> ChronoEditAttnProcessor:
        return carry_settings(cls(), processor)


FAMILY = register(
    Family(
        name="chronoedit",
        rotary_class=qualified_name(_dce.ChronoEditRotaryPosEmbed),
        replace=ChronoEditRotaryPosEmbed.from_diffusers,
        processors={qualified_name(_dce.WanAttnProcessor): ChronoEditAttnProcessor.from_diffusers},
    )
)

"""LTX-2 (diffusers 0.42.1, transformers/transformer_ltx2.py): video and audio on one clock, the
LTX2AudioVideoRotaryPosEmbed tables and the attention processors' rotation computed by posenc.

diffusers' positions (LTX2AudioVideoRotaryPosEmbed.prepare_*_coords), reproduced line by line:
  video  patch boundaries [start, end) per axis (frame, height, width) in the latent grid, times
         the VAE scale factors (pixels); the frame axis shifted by causal_offset - scale_t and
         clamped at 0 (the causal VAE's first frame), then divided by fps: seconds.
         coords [B, 3, N, 2]
  audio  latent frames [shift, shift + n) times the audio scale factor (mel bins), shifted by
         causal_offset - scale and clipped at 0, times hop_length / sampling_rate: seconds.
         coords [B, 1, N, 2]
  The video's time axis and the audio's are both seconds, so the cross-attention tables
  (cross_attn_rope on video_coords[:, 0:1], cross_attn_audio_rope on audio_coords[:, 0:1]) put
  a video frame and the audio heard with it at the same angle.
diffusers' table (forward(coords)):
  position   p = (start + end) / 2 (the midpoint of [start, end)), divided by the max of its axis
             (base_num_frames, base_height, base_width; audio: base_num_frames): a fraction
  ladder     F = dim // (2 A) frequencies (A axes): f_i = theta ** linspace(0, 1, F) * pi / 2, in
             float64 (double_precision, the default) or float32, then rounded to float32
  angles     a[n, A i + axis] = (2 p[n, axis] - 1) f_i    float32, interleaved per frequency
  tables     cos/sin(a) repeated per pair (t0 t0 t1 t1 ..) after dim % (2 A) pass-through
             channels (cos 1, sin 0) laid first: cos, sin [B, N, dim] float32
The positions and the ladder are diffusers' expressions (plain torch ops, the same order); the
angles and cos/sin come from posenc's operator torch.ops.posenc.rope_cos_sin (sections (F,) * A,
interleaved; each angle the same float32 product, cos/sin the same elementwise kernels), equal to
diffusers' to the bit. The rotation (apply_interleaved_rotary_emb, across the heads: x [B, S, H Dh]
with the table [B, S, H Dh]) goes through torch.ops.posenc.apply_rotary (_ltx.rotate_across_heads),
q and k with their own tables in a2v / v2a cross attention.
Coordinates of another dtype than float32 (video_coords / audio_coords given so) are taken as in
LTX-Video's module (_ltx.py): bfloat16/float16 ones give float32 angles from grid * 2 - 1 rounded
in their dtype (the operator, the same table); float64 ones float64 angles and tables, computed by
_ltx.float64_tables (diffusers' expression in plain ATen, op for op: equal to the bit) and rotated
by posenc's operator's float64 path.

The pipeline's text connectors (pipelines/ltx2/connectors.py, LTX2TextConnectors) rotate the
text tokens with LTX2RotaryPosEmbed1d: positions i / base_seq_len (i = 0 .. S-1), the same ladder
(F = dim // 2) and tables, and LTX2AudioVideoAttnProcessor; posenc's LTX2RotaryPosEmbed1d computes
them the same way, so patch(connectors) gives the connectors' output to the bit too.

rope_type "split" (LTX-2.3's per-head tables; both modules): the same angles unrepeated,
[B, N, F A] (the first half of posenc's half-layout table, cat(t, t); float64 positions by
diffusers' expression), dim // 2 - F A pass-through pairs (cos 1, sin 0) first, then per head
[B, H, N, dim // 2 H], contiguous where diffusers' are (the same strides): equal to the bit. The
split rotation stays diffusers' own apply_split_rotary_emb (posenc's processors hand a split table
to it): it rotates with addcmul_, which ATen computes with a fused multiply-add on the CPU (one
rounding for x1 c - s x2), and posenc's rotation rounds the product and the sum apart.
"""

from __future__ import annotations

import math

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers import transformer_ltx2 as _dltx2

from . import _common
from ._ltx import (
    _carry_settings,
    angle_positions,
    float64_angles,
    float64_tables,
    rotate_across_heads,
)
from ._registry import Family, qualified_name, register

__all__ = [
    "LTX2AudioVideoRotaryPosEmbed",
    "LTX2RotaryPosEmbed1d",
    "LTX2AudioVideoAttnProcessor",
    "LTX2PerturbedAttnProcessor",
]

_NAME = "posenc.integrations.diffusers.LTX2AudioVideoRotaryPosEmbed"


class LTX2AudioVideoRotaryPosEmbed(_common.DiffusersRotary):
    """diffusers' LTX2AudioVideoRotaryPosEmbed (interleaved tables) computed by posenc."""

    def __init__(
        self,
        dim: int,
        patch_size: int = 1,
        patch_size_t: int = 1,
        base_num_frames: int = 20,
        base_height: int = 2048,
        base_width: int = 2048,
        sampling_rate: int = 16000,
        hop_length: int = 160,
        scale_factors: tuple[int, ...] = (8, 32, 32),
        theta: float = 10000.0,
        causal_offset: int = 1,
        modality: str = "video",
        double_precision: bool = True,
        rope_type: str = "interleaved",
        num_attention_heads: int = 32,
    ) -> None:
        super().__init__()
        _check_rope_type(_NAME, rope_type)
        if modality not in ("video", "audio"):
            raise ValueError(f"{_NAME}: modality must be 'video' or 'audio', got {modality!r}")
        if not isinstance(dim, int) or dim < 2:
            raise ValueError(f"{_NAME}: dim must be an integer >= 2, got {dim!r}")
        if not (isinstance(theta, (int, float)) and math.isfinite(theta) and theta > 0):
            raise ValueError(f"{_NAME}: theta must be a finite number > 0, got {theta!r}")
        self.dim = dim
        self.patch_size = patch_size
        self.patch_size_t = patch_size_t
        self.rope_type = rope_type
        self.base_num_frames = base_num_frames
        self.num_attention_heads = num_attention_heads
        self.base_height = base_height
        self.base_width = base_width
        self.sampling_rate = sampling_rate
        self.hop_length = hop_length
        self.audio_latents_per_second = (
            float(sampling_rate) / float(hop_length) / float(scale_factors[0])
        )
        self.scale_factors = scale_factors
        self.theta = theta
        self.causal_offset = causal_offset
        self.modality = modality
        self.double_precision = double_precision

    @classmethod
    def from_diffusers(cls, module: torch.nn.Module) -> LTX2AudioVideoRotaryPosEmbed:
        return cls(
            dim=module.dim,
            patch_size=module.patch_size,
            patch_size_t=module.patch_size_t,
            base_num_frames=module.base_num_frames,
            base_height=module.base_height,
            base_width=module.base_width,
            sampling_rate=module.sampling_rate,
            hop_length=module.hop_length,
            scale_factors=module.scale_factors,
            theta=module.theta,
            causal_offset=module.causal_offset,
            modality=module.modality,
            double_precision=module.double_precision,
            rope_type=module.rope_type,
            num_attention_heads=module.num_attention_heads,
        )

    # -- positions: diffusers' builders, line by line --------------------------------------------
    def prepare_video_coords(
        self,
        batch_size: int,
        num_frames: int,
        height: int,
        width: int,
        device: torch.device,
        fps: float = 24.0,
    ) -> torch.Tensor:
        """Patch boundaries [B, 3, N, 2]: frames in seconds (fps), height and width in pixels."""
        grid_f = torch.arange(
            start=0, end=num_frames, step=self.patch_size_t, dtype=torch.float32, device=device
        )
        grid_h = torch.arange(
            start=0, end=height, step=self.patch_size, dtype=torch.float32, device=device
        )
        grid_w = torch.arange(
            start=0, end=width, step=self.patch_size, dtype=torch.float32, device=device
        )
        grid = torch.meshgrid(grid_f, grid_h, grid_w, indexing="ij")
        grid = torch.stack(grid, dim=0)
        patch_size = (self.patch_size_t, self.patch_size, self.patch_size)
        patch_size_delta = torch.tensor(patch_size, dtype=grid.dtype, device=grid.device)
        patch_ends = grid + patch_size_delta.view(3, 1, 1, 1)
        latent_coords = torch.stack([grid, patch_ends], dim=-1)
        latent_coords = latent_coords.flatten(1, 3)
        latent_coords = latent_coords.unsqueeze(0).repeat(batch_size, 1, 1, 1)
        scale_tensor = torch.tensor(self.scale_factors, device=latent_coords.device)
        broadcast_shape = [1] * latent_coords.ndim
        broadcast_shape[1] = -1
        pixel_coords = latent_coords * scale_tensor.view(*broadcast_shape)
        pixel_coords[:, 0, ...] = (
            pixel_coords[:, 0, ...] + self.causal_offset - self.scale_factors[0]
        ).clamp(min=0)
        pixel_coords[:, 0, ...] = pixel_coords[:, 0, ...] / fps
        return pixel_coords

    def prepare_audio_coords(
        self, batch_size: int, num_frames: int, device: torch.device, shift: int = 0
    ) -> torch.Tensor:
        """Latent audio frames' [start, end) in seconds: [B, 1, N, 2]."""
        grid_f = torch.arange(
            start=shift,
            end=num_frames + shift,
            step=self.patch_size_t,
            dtype=torch.float32,
            device=device,
        )
        audio_scale_factor = self.scale_factors[0]
        grid_start_mel = grid_f * audio_scale_factor
        grid_start_mel = (grid_start_mel + self.causal_offset - audio_scale_factor).clip(min=0)
        grid_start_s = grid_start_mel * self.hop_length / self.sampling_rate
        grid_end_mel = (grid_f + self.patch_size_t) * audio_scale_factor
        grid_end_mel = (grid_end_mel + self.causal_offset - audio_scale_factor).clip(min=0)
        grid_end_s = grid_end_mel * self.hop_length / self.sampling_rate
        audio_coords = torch.stack([grid_start_s, grid_end_s], dim=-1)
        audio_coords = audio_coords.unsqueeze(0).expand(batch_size, -1, -1)
        return audio_coords.unsqueeze(1)

    def prepare_coords(self, *args, **kwargs):
        if self.modality == "video":
            return self.prepare_video_coords(*args, **kwargs)
        return self.prepare_audio_coords(*args, **kwargs)

    # -- the table -------------------------------------------------------------------------------
    def frequencies(self, count: int, device) -> torch.Tensor:
        """diffusers' ladder theta ** linspace(0, 1, count) * pi / 2 (float64 or float32),
        rounded to float32."""
        return _ladder(self.theta, count, self.double_precision, device)

    def forward(self, coords: torch.Tensor, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        if (
            not isinstance(coords, torch.Tensor)
            or coords.ndim not in (3, 4)
            or (coords.ndim == 4 and coords.shape[-1] != 2)
        ):
            got = tuple(coords.shape) if isinstance(coords, torch.Tensor) else repr(coords)
            raise ValueError(
                f"{_NAME}: coords must be [B, A, N] positions or [B, A, N, 2] "
                f"[start, end) bounds, got {got}"
            )
        device = device or coords.device
        num_pos_dims = coords.shape[1]
        max_positions = (
            (self.base_num_frames, self.base_height, self.base_width)
            if self.modality == "video"
            else (self.base_num_frames,)
        )
        if num_pos_dims > len(max_positions):
            raise ValueError(
                f"{_NAME}: {num_pos_dims} position axes for the {self.modality} "
                f"modality, which has {len(max_positions)}"
            )
        if coords.ndim == 4:  # [start, end) -> the midpoint
            coords_start, coords_end = coords.chunk(2, dim=-1)
            coords = (coords_start + coords_end) / 2.0
            coords = coords.squeeze(-1)
        grid = torch.stack(
            [coords[:, i] / max_positions[i] for i in range(num_pos_dims)], dim=-1
        ).to(device)
        num_rope_elems = num_pos_dims * 2
        count = self.dim // num_rope_elems
        freqs = self.frequencies(count, device)
        positions = angle_positions(grid).contiguous()  # [B, N, A], diffusers' grid * 2 - 1
        if self.rope_type == "split":
            cos, sin = _split_cos_sin(positions, freqs, num_pos_dims)
            return _split_heads(cos, sin, self.dim, self.num_attention_heads)
        if positions.dtype == torch.float64:  # float64 angles and tables, as diffusers computes
            return float64_tables(positions, freqs, self.dim)
        cos, sin = torch.ops.posenc.rope_cos_sin(
            positions,
            freqs.repeat_interleave(num_pos_dims),
            1.0,
            [count] * num_pos_dims,
            "interleaved",
            "interleaved",
        )
        if self.dim % num_rope_elems != 0:
            cos_padding = torch.ones_like(cos[:, :, : self.dim % num_rope_elems])
            sin_padding = torch.zeros_like(cos[:, :, : self.dim % num_rope_elems])
            cos = torch.cat([cos_padding, cos], dim=-1)
            sin = torch.cat([sin_padding, sin], dim=-1)
        return cos, sin


def _check_rope_type(name: str, rope_type) -> None:
    if rope_type not in ("interleaved", "split"):  # diffusers' own check
        raise ValueError(f"{name}: rope_type must be 'interleaved' or 'split', got {rope_type!r}")


def _split_cos_sin(positions: torch.Tensor, freqs: torch.Tensor, axes: int):
    """cos, sin of diffusers' angles [B, N, F A] (frequency-major: t h w t h w ...), unrepeated
    (the split layout's): float64 positions by diffusers' expression (float64_angles), others by
    posenc's operator (the half layout's cat(t, t), its first half), contiguous as diffusers'."""
    if positions.dtype == torch.float64:
        angles = float64_angles(positions, freqs)
        return angles.cos(), angles.sin()
    width = freqs.numel() * axes
    sections = [freqs.numel()] * axes
    if positions.dim() == 2:  # LTX2RotaryPosEmbed1d: [B, S], one axis
        positions, sections = positions.unsqueeze(-1), [freqs.numel()]
    cos, sin = torch.ops.posenc.rope_cos_sin(
        positions, freqs.repeat_interleave(axes), 1.0, sections, "interleaved", "half"
    )
    return cos[..., :width].contiguous(), sin[..., :width].contiguous()


def _split_heads(cos: torch.Tensor, sin: torch.Tensor, dim: int, heads: int):
    """diffusers' split tables: dim // 2 - F A pass-through pairs (cos 1, sin 0) first, then per
    head: [B, N, dim // 2] -> [B, H, N, dim // 2 H]."""
    pad = dim // 2 - cos.shape[-1]
    if pad != 0:
        cos = torch.concatenate([torch.ones_like(cos[:, :, :pad]), cos], axis=-1)
        sin = torch.concatenate([torch.zeros_like(sin[:, :, :pad]), sin], axis=-1)
    batch, tokens = cos.shape[0], cos.shape[1]
    cos = cos.reshape(batch, tokens, heads, -1)
    sin = sin.reshape(batch, tokens, heads, -1)
    return torch.swapaxes(cos, 1, 2), torch.swapaxes(sin, 1, 2)


def _ladder(theta: float, count: int, double_precision: bool, device) -> torch.Tensor:
    """diffusers' ladder theta ** linspace(0, 1, count) * pi / 2 (float64 or float32), rounded to
    float32."""
    dtype = torch.float64 if double_precision else torch.float32
    pow_indices = torch.pow(
        theta, torch.linspace(start=0.0, end=1.0, steps=count, dtype=dtype, device=device)
    )
    return (pow_indices * torch.pi / 2.0).to(dtype=torch.float32)


class LTX2RotaryPosEmbed1d(_common.DiffusersRotary):
    """diffusers' LTX2RotaryPosEmbed1d (LTX-2's text connectors; interleaved tables) computed by
    posenc: forward(batch_size, pos, device) -> cos, sin [batch_size, pos, dim] float32."""

    _NAME = "posenc.integrations.diffusers.LTX2RotaryPosEmbed1d"

    def __init__(
        self,
        dim: int,
        base_seq_len: int = 4096,
        theta: float = 10000.0,
        double_precision: bool = True,
        rope_type: str = "interleaved",
        num_attention_heads: int = 32,
    ) -> None:
        super().__init__()
        _check_rope_type(self._NAME, rope_type)
        if not isinstance(dim, int) or dim < 2:
            raise ValueError(f"{self._NAME}: dim must be an integer >= 2, got {dim!r}")
        self.dim = dim
        self.base_seq_len = base_seq_len
        self.theta = theta
        self.double_precision = double_precision
        self.rope_type = rope_type
        self.num_attention_heads = num_attention_heads

    @classmethod
    def from_diffusers(cls, module: torch.nn.Module) -> LTX2RotaryPosEmbed1d:
        return cls(
            dim=module.dim,
            base_seq_len=module.base_seq_len,
            theta=module.theta,
            double_precision=module.double_precision,
            rope_type=module.rope_type,
            num_attention_heads=module.num_attention_heads,
        )

    def forward(self, batch_size: int, pos: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        grid_1d = torch.arange(pos, dtype=torch.float32, device=device)
        grid_1d = grid_1d / self.base_seq_len
        grid = grid_1d.unsqueeze(0).repeat(batch_size, 1)  # [B, S]
        freqs = _ladder(self.theta, self.dim // 2, self.double_precision, device)
        if self.rope_type == "split":
            cos, sin = _split_cos_sin((grid * 2 - 1).contiguous(), freqs, 1)
            return _split_heads(cos, sin, self.dim, self.num_attention_heads)
        cos, sin = torch.ops.posenc.rope_cos_sin(
            (grid * 2 - 1).contiguous(), freqs, 1.0, [], "contiguous", "interleaved"
        )
        if self.dim % 2 != 0:
            cos = torch.cat([torch.ones_like(cos[:, :, :1]), cos], dim=-1)
            sin = torch.cat([torch.zeros_like(sin[:, :, :1]), sin], dim=-1)
        return cos, sin


def _rotate(attn, query, key, query_rotary_emb, key_rotary_emb):
    """diffusers' processors' rotation block: interleaved through posenc, split as diffusers."""
    key_tables = key_rotary_emb if key_rotary_emb is not None else query_rotary_emb
    if attn.rope_type == "interleaved":
        return rotate_across_heads(query, key, query_rotary_emb, key_tables)
    if attn.rope_type == "split":  # not computed by posenc (see the module's docstring)
        return (
            _dltx2.apply_split_rotary_emb(query, query_rotary_emb),
            _dltx2.apply_split_rotary_emb(key, key_tables),
        )
    return query, key  # diffusers rotates nothing for another rope_type


def _gate(attn, hidden_states, gate_logits):
    if attn.to_gate_logits is not None:
        hidden_states = hidden_states.unflatten(2, (attn.heads, -1))
        gates = 2.0 * torch.sigmoid(gate_logits)
        hidden_states = hidden_states * gates.unsqueeze(-1)
        hidden_states = hidden_states.flatten(2, 3)
    return hidden_states


def _prologue(attn, hidden_states, encoder_hidden_states, attention_mask):
    batch_size, sequence_length, _ = (
        hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
    )
    if attention_mask is not None:
        attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
        attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
    if encoder_hidden_states is None:
        encoder_hidden_states = hidden_states
    gate_logits = attn.to_gate_logits(hidden_states) if attn.to_gate_logits is not None else None
    return encoder_hidden_states, attention_mask, gate_logits


class LTX2AudioVideoAttnProcessor(_dltx2.LTX2AudioVideoAttnProcessor):
    """diffusers' LTX2AudioVideoAttnProcessor with the rotation computed by posenc."""

    @classmethod
    def from_diffusers(cls, processor) -> LTX2AudioVideoAttnProcessor:
        return _carry_settings(cls(), processor)

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        query_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        encoder_hidden_states, attention_mask, gate_logits = _prologue(
            attn, hidden_states, encoder_hidden_states, attention_mask
        )
        query = attn.to_q(hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        query = attn.norm_q(query)
        key = attn.norm_k(key)
        if query_rotary_emb is not None:
            query, key = _rotate(attn, query, key, query_rotary_emb, key_rotary_emb)
        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        hidden_states = dispatch_attention_fn(
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
        hidden_states = _gate(attn, hidden_states, gate_logits)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states


class LTX2PerturbedAttnProcessor(_dltx2.LTX2PerturbedAttnProcessor):
    """diffusers' LTX2PerturbedAttnProcessor with the rotation computed by posenc."""

    @classmethod
    def from_diffusers(cls, processor) -> LTX2PerturbedAttnProcessor:
        return _carry_settings(cls(), processor)

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        query_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        perturbation_mask: torch.Tensor | None = None,
        all_perturbed: bool | None = None,
    ) -> torch.Tensor:
        encoder_hidden_states, attention_mask, gate_logits = _prologue(
            attn, hidden_states, encoder_hidden_states, attention_mask
        )
        value = attn.to_v(encoder_hidden_states)
        if all_perturbed is None:
            all_perturbed = (
                torch.all(perturbation_mask == 0) if perturbation_mask is not None else False
            )
        if all_perturbed:
            hidden_states = value
        else:
            query = attn.to_q(hidden_states)
            key = attn.to_k(encoder_hidden_states)
            query = attn.norm_q(query)
            key = attn.norm_k(key)
            if query_rotary_emb is not None:
                query, key = _rotate(attn, query, key, query_rotary_emb, key_rotary_emb)
            query = query.unflatten(2, (attn.heads, -1))
            key = key.unflatten(2, (attn.heads, -1))
            value = value.unflatten(2, (attn.heads, -1))
            hidden_states = dispatch_attention_fn(
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
            if perturbation_mask is not None:
                value = value.flatten(2, 3)
                hidden_states = torch.lerp(value, hidden_states, perturbation_mask)
        hidden_states = _gate(attn, hidden_states, gate_logits)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states


FAMILY = register(
    Family(
        name="ltx2",
        rotary_class=qualified_name(_dltx2.LTX2AudioVideoRotaryPosEmbed),
        replace=LTX2AudioVideoRotaryPosEmbed.from_diffusers,
        processors={
            qualified_name(
                _dltx2.LTX2AudioVideoAttnProcessor
            ): LTX2AudioVideoAttnProcessor.from_diffusers,
            qualified_name(
                _dltx2.LTX2PerturbedAttnProcessor
            ): LTX2PerturbedAttnProcessor.from_diffusers,
        },
    )
)
# LTX-2's text connectors (a pipeline model; its class named as a string: importing
# diffusers.pipelines.ltx2 here would import the pipelines' text-encoder dependencies)
register(
    Family(
        name="ltx2_connector",
        rotary_class="diffusers.pipelines.ltx2.connectors.LTX2RotaryPosEmbed1d",
        replace=LTX2RotaryPosEmbed1d.from_diffusers,
    )
)

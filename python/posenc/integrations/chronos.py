"""posenc inside a Chronos-2 model (chronos-forecasting 2.3, chronos/chronos2): its time attention
computed by posenc's fused attention, RoPE applied inside the tiles.

    model = Chronos2Model(config)                       # or Chronos2Pipeline(...).model
    names = posenc.integrations.chronos.patch(model)    # the time-attention modules replaced
    out = model(context, num_output_patches=2)          # the same forecasts (float32: 1e-6)
    posenc.integrations.chronos.unpatch(model)          # Chronos' own forward back

What Chronos-2 does (chronos/chronos2/layers.py, MHA with use_rope=True in TimeSelfAttention):
per series, the patches attend to each other along time with rotary embeddings on the patch
index (position_ids = 0..N-1 whatever the padding, Chronos2Encoder.forward), rotate-half pairs
(i, i + D/2), tables built in float32 with autocast off

    cos, sin = cos(p * inv_freq), sin(p * inv_freq), cat(t, t),  inv_freq_i = theta^(-2i/D)

and *unscaled* attention, softmax(q k^T + mask) v (T5's convention: scale 1.0, not 1/sqrt(D));
the mask is the patch padding, (1 - m) * finfo.min on the keys. The group attention
(GroupSelfAttention) mixes the series of a batch at each time step with no positions ("no
natural ordering along the batch axis") and is left as Chronos computes it.

What patch() replaces: the forward of every MHA module that uses RoPE (an instance attribute;
unpatch() deletes it, so the class's own forward is back, the module itself never replaced)
by one that computes the same projections, the tables by posenc.rope_cos_sin from the module's
own inv_freq (Chronos' tables to the bit: the same float32 products and cos/sin), and
softmax(rot(q) rot(k)^T) v by posenc.positional_attention(q, k, v, cos, sin, scale=1.0,
attention_mask=keys kept). The result is Chronos' to float32 rounding (a tiled online softmax,
not SDPA's: 1e-6 relative in tests/python/test_timeseries_models.py, outputs and gradients).

What the fused attention does not compute as Chronos does runs posenc's tables and rotation
(posenc.apply_rotary_pos_emb, Chronos' products and sums in its dtypes) with Chronos' own
attention function (MHA._sdpa_attention, or _eager_attention where its config or
output_attentions=True picks it): Chronos' output to the bit. That is: activations or projections
in bfloat16/float16 (a model cast so, or autocast: Chronos rounds its tables, rotation, scores and
softmax to that dtype, posenc's kernel computes float32), attention weights
(output_attentions=True), dropout while training, a mask that is not a padding mask on the keys
(a boolean one under Chronos' eager attention, which adds it as 0 / 1; values other than 0 and
finfo.min; a mask that differs between heads), and a query row with every key masked (Chronos
averages all the values there, posenc's kernel returns 0). Cross attention (encoder_states given:
Chronos rotates nothing there) is Chronos' own forward.

Refused in one line (ValueError): a model without Chronos-2's RoPE attention, and a call without
position_ids (Chronos asserts them too). chronos is imported on first use.
"""

from __future__ import annotations

import importlib
import types

import torch

from ..attention import positional_attention
from ..rotary import apply_rotary_pos_emb, rope_cos_sin

__all__ = ["patch", "unpatch"]

_MARK = "_posenc_chronos_patched"  # set on a patched MHA; unpatch() removes it and the forward
_DTYPES = (torch.float32, torch.float64)


def _layers():
    try:
        return importlib.import_module("chronos.chronos2.layers")
    except ImportError as e:
        raise ValueError(
            f"posenc.integrations.chronos: chronos-forecasting (chronos.chronos2) is "
            f"not importable ({e})"
        ) from None


def _keys_kept(
    mask: torch.Tensor | None, batch: int, keys: int, sdpa: bool, device: torch.device
) -> torch.Tensor | None:
    """Chronos' additive time mask [B, 1, 1, Nk] ((1 - m) * finfo.min) -> the kept keys [B, Nk]
    where posenc's fused attention computes what Chronos' does with it, else None: a boolean mask
    only where Chronos runs SDPA (its eager attention adds a boolean mask as 0 / 1: nothing
    masked), one mask for every head, and every query seeing a key (on a row that sees none
    Chronos averages all the values, posenc's attention returns 0). No mask: every key under
    SDPA (its eager attention fails on None: Chronos' own error)."""
    if mask is None:
        return torch.ones(batch, keys, dtype=torch.bool, device=device) if sdpa else None
    if mask.dim() != 4 or mask.shape[0] != batch or mask.shape[2] != 1 or mask.shape[3] != keys:
        return None
    if mask.dtype == torch.bool:
        if not sdpa:
            return None
        kept = mask
    else:
        low = torch.finfo(mask.dtype).min
        if not bool(((mask == 0) | (mask == low)).all()):
            return None
        kept = mask == 0
    if kept.shape[1] != 1 and not bool((kept == kept[:, :1]).all()):
        return None
    kept = kept[:, 0, 0, :]
    return kept if bool(kept.any(-1).all()) else None


def _time_attention(
    self,
    hidden_states: torch.Tensor,
    mask: torch.Tensor,
    encoder_states: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    output_attentions: bool = False,
):
    """MHA.forward of a RoPE time attention, computed by posenc (the contract of Chronos'):
    posenc's fused attention where it computes what Chronos' does, else posenc's tables and
    rotation with Chronos' own attention function."""
    layers = _layers()
    if position_ids is None:  # Chronos asserts them (cross attention too)
        raise ValueError(
            "posenc.integrations.chronos: position_ids must be given to a RoPE time attention"
        )
    if encoder_states is not None:  # cross attention: Chronos rotates nothing there
        return type(self).forward(
            self, hidden_states, mask, encoder_states, position_ids, output_attentions
        )
    batch, length, _ = hidden_states.shape

    def heads(x: torch.Tensor) -> torch.Tensor:  # [B, N, H * D] -> [B, H, N, D]
        return x.view(batch, length, self.n_heads, self.kv_proj_dim).transpose(1, 2)

    q = heads(self.q(hidden_states))
    k = heads(self.k(hidden_states))
    v = heads(self.v(hidden_states))
    # Chronos2RotaryEmbedding.forward: float32 angles p * inv_freq, autocast off, cat(t, t),
    # then the dtype of v (the projections' dtype, autocast's included)
    with torch.autocast(device_type=hidden_states.device.type, enabled=False):
        cos, sin = rope_cos_sin(
            position_ids.to(hidden_states.device),
            self.rope_embed.inv_freq.float(),
            float(self.rope_embed.attention_scaling),
        )
    cos, sin = cos.to(v.dtype), sin.to(v.dtype)
    kept = None
    if (
        not output_attentions
        and not (self.training and self.dropout > 0)
        and hidden_states.dtype in _DTYPES
        and q.dtype in _DTYPES
    ):
        kept = _keys_kept(
            mask,
            batch,
            length,
            self.config._attn_implementation == "sdpa",
            hidden_states.device,
        )
    if kept is not None:
        out = positional_attention(q, k, v, cos=cos, sin=sin, scale=1.0, attention_mask=kept)
        weights = None
    else:
        out, weights = _chronos_attention(self, q, k, v, cos, sin, mask, output_attentions)
    out = self.o(out.transpose(1, 2).reshape(batch, length, self.inner_dim))
    return layers.AttentionOutput(
        hidden_states=out, attn_weights=weights if output_attentions else None
    )


def _chronos_attention(self, q, k, v, cos, sin, mask, output_attentions):
    """What posenc's fused attention does not compute as Chronos does (attention weights, dropout
    while training, a mask that is not a padding mask on the keys, a query row with every key
    masked, bfloat16/float16 activations or projections: Chronos rounds its tables, rotation,
    scores and softmax to that dtype): posenc's rotation (apply_rotary_pos_emb: Chronos' products
    and sums, its roundings) and Chronos' own _sdpa_attention / _eager_attention, as MHA.forward
    picks them: Chronos' output to the bit."""
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    eager = output_attentions or self.config._attn_implementation != "sdpa"
    if eager:
        return self._eager_attention(q, k, v, mask)
    return self._sdpa_attention(q, k, v, mask)


def _rope_attentions(model: torch.nn.Module, layers) -> list:
    return [
        (name, m) for name, m in model.named_modules() if isinstance(m, layers.MHA) and m.use_rope
    ]


def patch(model: torch.nn.Module) -> list[str]:
    """Replace the forward of the model's RoPE time attentions (Chronos-2's MHA with use_rope) by
    posenc's; returns their names. Refuses (ValueError, nothing changed) a model without one."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(
            f"posenc.integrations.chronos.patch: expected an nn.Module, got {type(model).__name__}"
        )
    layers = _layers()
    found = _rope_attentions(model, layers)
    if not found:
        raise ValueError(
            f"posenc.integrations.chronos.patch: {type(model).__name__} has no "
            f"Chronos-2 RoPE time attention (chronos.chronos2.layers.MHA, "
            f"use_rope=True)"
        )
    names = []
    for name, module in found:
        if not module.__dict__.get(_MARK, False):
            module.__dict__["forward"] = types.MethodType(_time_attention, module)
            module.__dict__[_MARK] = True
        names.append(name)
    return names


def unpatch(model: torch.nn.Module) -> list[str]:
    """Chronos' own forward back on every module patch() changed; returns their names."""
    restored = []
    for name, module in model.named_modules():
        if module.__dict__.pop(_MARK, False):
            module.__dict__.pop("forward", None)
            restored.append(name)
    return restored

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

Refused in one line (ValueError): a model without Chronos-2's RoPE attention, activations that
are not float32 or float64, autocast to another dtype included (Chronos rounds its tables and
rotation to bfloat16/float16; posenc's kernel rotates in float32), and, at call time, what the
fused attention does not compute: attention weights (output_attentions=True), dropout while
training, a mask that is not a padding mask on the keys (a boolean one under Chronos' eager
attention, which adds it as 0 / 1), a query row with every key masked
(Chronos averages all the values there, posenc returns 0), and cross-attention. chronos is
imported on first use.
"""

from __future__ import annotations

import importlib
import types

import torch

from ..attention import positional_attention
from ..rotary import rope_cos_sin

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


def _keys_kept(mask: torch.Tensor, batch: int, keys: int, sdpa: bool) -> torch.Tensor:
    """Chronos' additive time mask [B, 1, 1, Nk] ((1 - m) * finfo.min) -> the kept keys [B, Nk]; a
    boolean mask only where Chronos runs SDPA (its eager attention adds a boolean mask as 0 / 1:
    nothing masked)."""
    if mask.dim() != 4 or mask.shape[0] != batch or mask.shape[2] != 1 or mask.shape[3] != keys:
        raise ValueError(
            f"posenc.integrations.chronos: the time attention takes a padding mask "
            f"[B={batch}, 1, 1, Nk={keys}] (Chronos2Encoder's), got "
            f"{tuple(mask.shape)}"
        )
    if mask.dtype == torch.bool:
        if not sdpa:
            raise ValueError(
                "posenc.integrations.chronos: a boolean time mask under Chronos' eager attention "
                "(it adds the mask as 0 / 1, masking nothing); unpatch() for it"
            )
        kept = mask
    else:
        low = torch.finfo(mask.dtype).min
        if not bool(((mask == 0) | (mask == low)).all()):
            raise ValueError(
                "posenc.integrations.chronos: the time mask holds values other than 0 "
                "and finfo.min (not a padding mask); unpatch() for it"
            )
        kept = mask == 0
    if kept.shape[1] != 1 and not bool((kept == kept[:, :1]).all()):
        raise ValueError(
            "posenc.integrations.chronos: the time mask differs between heads; unpatch() for it"
        )
    kept = kept[:, 0, 0, :]
    if not bool(kept.any(-1).all()):
        row = int((~kept.any(-1)).nonzero()[0, 0])
        raise ValueError(
            f"posenc.integrations.chronos: series {row} masks every key (Chronos "
            f"averages all the values there, posenc's attention returns 0)"
        )
    return kept


def _time_attention(
    self,
    hidden_states: torch.Tensor,
    mask: torch.Tensor,
    encoder_states: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    output_attentions: bool = False,
):
    """MHA.forward of a RoPE time attention, computed by posenc (the contract of Chronos')."""
    layers = _layers()
    if encoder_states is not None:
        raise ValueError(
            "posenc.integrations.chronos: a patched time attention is self-attention "
            "(encoder_states given)"
        )
    if output_attentions:
        raise ValueError(
            "posenc.integrations.chronos: the fused attention returns no weights "
            "(output_attentions=True); unpatch() for them"
        )
    if self.training and self.dropout > 0:
        raise ValueError(
            f"posenc.integrations.chronos: the fused attention has no dropout "
            f"(training with dropout_rate={self.dropout}); eval() or dropout_rate=0"
        )
    if position_ids is None:
        raise ValueError(
            "posenc.integrations.chronos: position_ids must be given to a RoPE time attention"
        )
    if hidden_states.dtype not in _DTYPES:
        raise ValueError(
            f"posenc.integrations.chronos: float32 or float64 activations, got "
            f"{hidden_states.dtype} (Chronos rounds its RoPE to that dtype, posenc "
            f"rotates in float32)"
        )
    batch, length, _ = hidden_states.shape
    kept = _keys_kept(mask, batch, length, self.config._attn_implementation == "sdpa")

    def heads(x: torch.Tensor) -> torch.Tensor:  # [B, N, H * D] -> [B, H, N, D]
        return x.view(batch, length, self.n_heads, self.kv_proj_dim).transpose(1, 2)

    q = heads(self.q(hidden_states))
    k = heads(self.k(hidden_states))
    v = heads(self.v(hidden_states))
    if q.dtype not in _DTYPES:  # autocast: float32 activations, bfloat16/float16 projections
        raise ValueError(
            f"posenc.integrations.chronos: float32 or float64 projections, got {q.dtype} "
            f"(autocast; Chronos rounds its RoPE to that dtype, posenc rotates in float32)"
        )
    # Chronos2RotaryEmbedding.forward: float32 angles p * inv_freq, autocast off, cat(t, t)
    with torch.autocast(device_type=hidden_states.device.type, enabled=False):
        cos, sin = rope_cos_sin(
            position_ids.to(hidden_states.device),
            self.rope_embed.inv_freq.float(),
            float(self.rope_embed.attention_scaling),
        )
    cos, sin = cos.to(hidden_states.dtype), sin.to(hidden_states.dtype)
    out = positional_attention(q, k, v, cos=cos, sin=sin, scale=1.0, attention_mask=kept)
    out = self.o(out.transpose(1, 2).reshape(batch, length, self.inner_dim))
    return layers.AttentionOutput(hidden_states=out, attn_weights=None)


def _rope_attentions(model: torch.nn.Module, layers) -> list:
    return [
        (name, m) for name, m in model.named_modules() if isinstance(m, layers.MHA) and m.use_rope
    ]


def patch(model: torch.nn.Module) -> list[str]:
    """Replace the forward of the model's RoPE time attentions (Chronos-2's MHA with use_rope) by
    posenc's; returns their names. Refuses (ValueError, nothing changed) a model without one or
    with parameters that are not float32/float64."""
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
    for name, module in found:
        for p in module.parameters():
            if p.dtype not in _DTYPES:
                raise ValueError(
                    f"posenc.integrations.chronos.patch: {name} holds {p.dtype} "
                    f"weights; posenc's patch computes float32 or float64"
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

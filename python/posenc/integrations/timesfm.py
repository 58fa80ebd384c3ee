"""posenc inside a TimesFM 2.5 model of the timesfm package (3.0, timesfm/torch/transformer.py):
its rotary position embedding and its attention computed by posenc.

    model = TimesFM_2p5_200M_torch_module()              # or any module holding its layers
    names = posenc.integrations.timesfm.patch(model)     # the attention modules patched
    (_, out, point, quantiles), _ = model(inputs, masks) # the same forecasts (1e-6, below)
    posenc.integrations.timesfm.unpatch(model)           # timesfm's own code back

What TimesFM 2.5 does (MultiHeadAttention.forward): the patches of a context are left-padded to
a common length; num_masked = the padded patches of each series, and

    position = arange(N) + next_index - num_masked        (left padding shifts the positions:
        a series' first real patch is at 0, its padding at negative positions)
    q, k = rope(q, position), rope(k, position)            (rotate-half pairs (i, i + D/2),
        angle position / timescale_i, timescale_i = 10000^(2i/D))
    q, k = RMSNorm(q), RMSNorm(k); q = q * per-dimension scale   (after the rotation)
    out = softmax(q k^T + mask) v, unscaled (scale 1.0); mask = causal and key >= num_masked

What patch() replaces, per MultiHeadAttention with rotary embeddings (instance attributes;
unpatch() deletes them): its RotaryPositionalEmbedding's forward -> posenc's: the tables by
posenc.rope_cos_sin(position, 1 / timescale) and the rotation by posenc.rope_rotate ([B, N, H,
D], tokens before heads); and its attention_fn -> posenc.positional_attention(causal=True,
scale=1.0, attention_mask=the unpadded keys) where timesfm's mask is exactly that (the prefill:
causal with the left padding masked); a mask of another form (decoding with a cache, whose
queries sit at next_index in a longer buffer) runs timesfm's own attention function. timesfm
divides the position by the timescale where posenc multiplies by its inverse, so the angles
differ by at most one rounding: the patched forecasts equal timesfm's to 1e-6 relative
(tests/python/test_timeseries_models.py), not to the bit; posenc's tiled softmax sums in
another order than SDPA.

Refused in one line (ValueError, nothing changed): a model without a timesfm MultiHeadAttention
that rotates, weights other than float32, and at call time inputs that are not [B, N, H, D] or
tables whose width is not the head size. timesfm is imported on first use.
"""

from __future__ import annotations

import importlib
import types

import torch

from ..attention import positional_attention
from ..rotary import rope_cos_sin, rope_rotate

__all__ = ["patch", "unpatch"]

_MARK = "_posenc_timesfm_patched"


def _transformer():
    try:
        return importlib.import_module("timesfm.torch.transformer")
    except ImportError as e:
        raise ValueError(f"posenc.integrations.timesfm: timesfm (timesfm.torch) is not importable "
                         f"({e})") from None


def _rotary(self, inputs: torch.Tensor, position: torch.Tensor | None = None) -> torch.Tensor:
    """RotaryPositionalEmbedding.forward by posenc: inputs [B, N, H, D] rotated at `position`."""
    if inputs.dim() != 4 or inputs.shape[-1] != self.embedding_dims:
        raise ValueError(f"posenc.integrations.timesfm: the patched rotary embedding takes "
                         f"[B, N, H, D={self.embedding_dims}] inputs, got {tuple(inputs.shape)}")
    if position is None:  # timesfm's default: 0..N-1
        position = torch.arange(inputs.shape[1], dtype=torch.float32, device=inputs.device)[None]
    half = self.embedding_dims // 2
    # timesfm's timescales, min * (max / min)^(2i / D) (float32); posenc takes their inverse
    fraction = 2 * torch.arange(0, half, device=inputs.device) / self.embedding_dims
    timescale = self.min_timescale * (self.max_timescale / self.min_timescale) ** fraction
    cos, sin = rope_cos_sin(position.to(inputs.device), (1.0 / timescale).float())
    return rope_rotate(inputs, cos[..., :half], sin[..., :half], "half")


def _attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               mask: torch.Tensor | None = None, *, original=None) -> torch.Tensor:
    """timesfm's attention_fn ([B, L, H, D], unscaled) by posenc where the mask is causal with
    the left padding masked; timesfm's own function for any other mask."""
    batch, queries, _, _ = query.shape
    keys = key.shape[1]
    if mask is None or mask.dtype != torch.bool or mask.shape != (batch, 1, queries, keys) \
            or queries != keys:
        return original(query, key, value, mask)
    kept = mask[:, 0, -1, :]  # the last query sees every key that is not padding
    causal = torch.ones(queries, keys, dtype=torch.bool, device=mask.device).tril()
    if not torch.equal(mask[:, 0], causal & kept[:, None, :]):
        return original(query, key, value, mask)
    out = positional_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                               causal=True, scale=1.0, attention_mask=kept)
    return out.transpose(1, 2)


def patch(model: torch.nn.Module) -> list[str]:
    """Replace the rotary embedding and the attention function of the model's timesfm
    MultiHeadAttention modules by posenc's; returns their names."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"posenc.integrations.timesfm.patch: expected an nn.Module, got "
                         f"{type(model).__name__}")
    transformer = _transformer()
    found = [(name, m) for name, m in model.named_modules()
             if isinstance(m, transformer.MultiHeadAttention) and m.use_rotary_position_embeddings]
    if not found:
        raise ValueError(f"posenc.integrations.timesfm.patch: {type(model).__name__} has no timesfm "
                         f"MultiHeadAttention with rotary position embeddings")
    for name, module in found:
        for p in module.parameters():
            if p.dtype != torch.float32:
                raise ValueError(f"posenc.integrations.timesfm.patch: {name} holds {p.dtype} "
                                 f"weights; posenc's patch computes float32")
    for _, module in found:
        if module.__dict__.get(_MARK) is None:
            rotary = module.rotary_position_embedding
            rotary.__dict__["forward"] = types.MethodType(_rotary, rotary)
            original = module.attention_fn
            module.__dict__[_MARK] = original
            module.attention_fn = lambda q, k, v, mask=None, _o=original: _attention(
                q, k, v, mask, original=_o)
    return [name for name, _ in found]


def unpatch(model: torch.nn.Module) -> list[str]:
    """timesfm's own rotary forward and attention function back; returns the modules' names."""
    restored = []
    for name, module in model.named_modules():
        original = module.__dict__.pop(_MARK, None)
        if original is not None:
            module.attention_fn = original
            module.rotary_position_embedding.__dict__.pop("forward", None)
            restored.append(name)
    return restored

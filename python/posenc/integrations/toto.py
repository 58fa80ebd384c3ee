"""posenc inside a Toto model (toto-ts 0.2, toto/model/rope.py and attention.py): the rotary tables
and rotation of its time-wise attention computed by posenc.

    backbone = TotoBackbone(...)                      # or a Toto / Transformer module
    names = posenc.integrations.toto.patch(backbone)  # its TimeAwareRotaryEmbedding modules
    posenc.integrations.toto.unpatch(backbone)        # Toto's own method back

What Toto does: its layers alternate time-wise attention (each variate's patches along time,
causal) and space-wise attention (the variates of one time step, no positions: "invariant to
the order of the variates"). The time-wise one rotates q and k with rotary-embedding-torch's
interleaved RoPE (pairs (2i, 2i + 1), angle p * theta^(-2i/D), p = 0..N-1 plus the KV cache's
length) and xPos: q * s(p), k / s(p) with s(p)_d = zeta_d^((p - max(p) // 2) / 512) (scale base
512, rotary-embedding-torch's default: Toto passes none), zeta = (2i + 0.4 D) / (1.4 D). Toto's
get_scale lays zeta out cat(z, z) over the interleaved pairs, so the two members of a pair take
different scales (the xPos paper and rotary-embedding-torch's own get_scale give one per pair).

What patch() replaces: rotate_queries_and_keys of every TimeAwareRotaryEmbedding (an instance
attribute; unpatch() deletes it): the tables by posenc.rope_cos_sin(p, freqs,
layout="interleaved") (rotary-embedding-torch's to the bit: the same float32 products) and the
rotation by posenc.apply_rotary_pos_emb(layout="interleaved"); the xPos scale is Toto's own
get_scale (posenc's xPos scales each pair by one value, which is not Toto's layout). Toto folds
the scale into each product ((t cos) s + (rot(t) sin) s), posenc scales the rotated sum
((t cos + rot(t) sin) s): one rounding apart, so the patched outputs equal Toto's to 1e-6
relative (tests/python/test_timeseries_models.py), not to the bit. The attention itself stays
Toto's (SDPA or xFormers).

Refused in one line (ValueError): a model without a TimeAwareRotaryEmbedding with xPos, weights
or tables other than float32 (at call time too: a module moved after patch() differed by 3e-8
relative in float64), and at call time q, k that are not 4-D, per-series positions (seq_pos of
more than one dimension), and a rotary width below the head size. q, k of another dtype than the
tables (bfloat16 under autocast) are rotated as Toto does, in float32, rounded once.
"""

from __future__ import annotations

import importlib
import types

import torch

from ..rotary import apply_rotary_pos_emb, rope_cos_sin

__all__ = ["patch", "unpatch"]

_MARK = "_posenc_toto_patched"


def _rope():
    try:
        return importlib.import_module("toto.model.rope")
    except ImportError as e:
        raise ValueError(
            f"posenc.integrations.toto: toto-ts (toto.model) is not importable ({e})"
        ) from None


def _rotate_queries_and_keys(
    self,
    q: torch.Tensor,
    k: torch.Tensor,
    seq_dim: int | None = None,
    seq_pos: torch.Tensor | None = None,
    seq_pos_offset: int = 0,
):
    """TimeAwareRotaryEmbedding.rotate_queries_and_keys by posenc (Toto's contract)."""
    seq_dim = self.default_seq_dim if seq_dim is None else seq_dim
    if q.dim() != 4 or k.dim() != 4 or seq_dim not in (-2, -3, 1, 2):
        raise ValueError(
            f"posenc.integrations.toto: q and k of 4 dimensions with the sequence at "
            f"dimension -2 or -3, got {tuple(q.shape)} and seq_dim {seq_dim}"
        )
    heads_first = seq_dim in (-2, 2)
    length = q.shape[seq_dim]
    seq = (
        seq_pos if seq_pos is not None else self.get_seq_pos(length, dtype=q.dtype, device=q.device)
    )
    seq = seq + seq_pos_offset
    if seq.dim() != 1:
        raise ValueError(
            f"posenc.integrations.toto: one position per step (seq_pos [N]), got {tuple(seq.shape)}"
        )
    if self.freqs.dtype != torch.float32:  # e.g. the module moved to another dtype after patch()
        raise ValueError(
            f"posenc.integrations.toto: posenc's patch takes fixed float32 frequencies, got "
            f"{self.freqs.dtype} (the module was moved after patch(); unpatch() for it)"
        )
    if 2 * self.freqs.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"posenc.integrations.toto: a rotary width of the head size, got "
            f"{2 * self.freqs.shape[-1]} of {q.shape[-1]}"
        )
    cos, sin = rope_cos_sin(seq.to(self.freqs.dtype), self.freqs, layout="interleaved")
    q_rotated, k_rotated = apply_rotary_pos_emb(
        q, k, cos[None], sin[None], unsqueeze_dim=1 if heads_first else 2, layout="interleaved"
    )
    scale = self.get_scale(seq).to(q.dtype)  # Toto's own xPos scale, [N, D]
    if not heads_first:
        scale = scale.unsqueeze(1)
    return (q_rotated * scale).type(q.dtype), (k_rotated * scale**-1).type(k.dtype)


def patch(model: torch.nn.Module) -> list[str]:
    """Replace rotate_queries_and_keys of the model's TimeAwareRotaryEmbedding modules by
    posenc's; returns their names. Refuses (ValueError, nothing changed) a model without one."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(
            f"posenc.integrations.toto.patch: expected an nn.Module, got {type(model).__name__}"
        )
    rope = _rope()
    found = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, rope.TimeAwareRotaryEmbedding)
    ]
    if not found:
        raise ValueError(
            f"posenc.integrations.toto.patch: {type(model).__name__} has no Toto "
            f"TimeAwareRotaryEmbedding"
        )
    for name, module in found:
        if not module.use_xpos:
            raise ValueError(
                f"posenc.integrations.toto.patch: {name} has no xPos (Toto's "
                f"rotate_queries_and_keys requires it)"
            )
        if module.freqs.dtype != torch.float32 or module.learned_freq:
            raise ValueError(
                f"posenc.integrations.toto.patch: {name}: posenc's patch takes "
                f"fixed float32 frequencies, got {module.freqs.dtype}"
                f"{' (learned)' if module.learned_freq else ''}"
            )
    for _, module in found:
        if not module.__dict__.get(_MARK, False):
            module.__dict__["rotate_queries_and_keys"] = types.MethodType(
                _rotate_queries_and_keys, module
            )
            module.__dict__[_MARK] = True
    return [name for name, _ in found]


def unpatch(model: torch.nn.Module) -> list[str]:
    """Toto's own rotate_queries_and_keys back; returns the modules' names."""
    restored = []
    for name, module in model.named_modules():
        if module.__dict__.pop(_MARK, False):
            module.__dict__.pop("rotate_queries_and_keys", None)
            restored.append(name)
    return restored

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
queries sit at next_index in a longer buffer), or left padding (a query row that sees no key)
under an attention_fn other than timesfm's SDPA one, runs timesfm's own attention function
(posenc gives 0 on such a row, as SDPA does; an einsum softmax averages the values). timesfm
divides the position by the timescale where posenc multiplies by its inverse, so the angles
differ by at most one rounding: the patched forecasts equal timesfm's to 1e-6 relative
(tests/python/test_timeseries_models.py), not to the bit; posenc's tiled softmax sums in
another order than SDPA.

transformers' TimesFm2_5Model (transformers 5.24, models/timesfm2_5; the same model, ported)
computes position_ids = arange - num_masked the same way and has the usual transformers
contract: TimesFm2_5RotaryEmbedding returns cat(t, t) tables from inv_freq (a product, as
posenc's), TimesFm2_5Attention rotates with apply_rotary_pos_emb, then q_norm, k_norm, the
softplus per-dimension scale and attention with scaling 1.0 over create_causal_mask's mask.
patch() replaces, on such a model, the rotary module's forward (posenc.rope_cos_sin: the same
tables to the bit) and each attention's forward (posenc.apply_rotary_pos_emb, transformers'
rotation to the bit, then the module's own norms and scale, then posenc.positional_attention
with causal=True and the unpadded keys, where the mask is causal with left padding; any other
mask, a cache, output_attentions or left padding outside SDPA's boolean mask (eager attention
averages the values on a row that sees no key, posenc gives 0) runs transformers' own
forward): last hidden states and
forecasts equal to 1e-6 (posenc's tiled softmax), forward and backward.
Every rope type transformers builds TimesFm2_5RotaryEmbedding with (rope_parameters' rope_type:
default, linear, dynamic, yarn, longrope, llama3, proportional; transformers' ROPE_INIT_FUNCTIONS
give inv_freq and attention_scaling) is taken: posenc's tables are rope_cos_sin(position_ids,
inv_freq, attention_scaling), cos and sin each times the factor in float32 as transformers
multiplies them, from the module's own inv_freq at the call, and patch() wraps that forward in
transformers' own dynamic_rope_update (dynamic recomputes inv_freq beyond the context and resets
it below, longrope picks its long or short ladder), as the class's forward is wrapped: the tables
equal to the bit. In bfloat16, float16 or float64, or under autocast (the model cast before or
after patch()), transformers' attention rounds q, k, the scores and the softmax to that dtype
where posenc's fused kernel computes float32 (1.7e-2 relative apart in bfloat16): there the
patched attention is TimesFm2_5Attention.forward line by line with posenc's rotation
(apply_rotary_pos_emb, transformers' roundings) and transformers' own attention function (the one
config._attn_implementation names): the output equal to transformers' to the bit.

Refused in one line (ValueError, nothing changed): a model without a timesfm MultiHeadAttention
that rotates or a transformers TimesFM 2.5 attention; for the timesfm package's modules, weights
other than float32 and at call time activations that are not float32 or run under autocast (its
own rotation returns float32 for bfloat16 inputs and its attention then fails; posenc's patch of
it computes float32), inputs that are not [B, N, H, D] or tables whose width is not the head
size. timesfm and transformers are imported on first use.
"""

from __future__ import annotations

import importlib
import math
import sys
import types

import torch

from ..attention import positional_attention
from ..rotary import apply_rotary_pos_emb, rope_cos_sin, rope_rotate

__all__ = ["patch", "unpatch"]

_MARK = "_posenc_timesfm_patched"


def _transformer():
    try:
        return importlib.import_module("timesfm.torch.transformer")
    except ImportError as e:
        raise ValueError(
            f"posenc.integrations.timesfm: timesfm (timesfm.torch) is not importable ({e})"
        ) from None


def _check_dtype(x: torch.Tensor) -> None:
    """float32 activations outside autocast in timesfm's MultiHeadAttention, as patch() checked
    its weights (a model moved to another dtype after patch(): timesfm's rotation returns float32
    for bfloat16 inputs)."""
    if x.dtype != torch.float32:
        raise ValueError(
            f"posenc.integrations.timesfm: float32 activations, got {x.dtype} (the model "
            f"was moved after patch(); unpatch() for it)"
        )
    if torch.is_autocast_enabled(x.device.type):
        raise ValueError(
            "posenc.integrations.timesfm: under autocast the projections run in the autocast "
            "dtype, posenc's attention computes float32; unpatch() for it"
        )


def _rotary(self, inputs: torch.Tensor, position: torch.Tensor | None = None) -> torch.Tensor:
    """RotaryPositionalEmbedding.forward by posenc: inputs [B, N, H, D] rotated at `position`."""
    _check_dtype(inputs)
    if inputs.dim() != 4 or inputs.shape[-1] != self.embedding_dims:
        raise ValueError(
            f"posenc.integrations.timesfm: the patched rotary embedding takes "
            f"[B, N, H, D={self.embedding_dims}] inputs, got {tuple(inputs.shape)}"
        )
    if position is None:  # timesfm's default: 0..N-1
        position = torch.arange(inputs.shape[1], dtype=torch.float32, device=inputs.device)[None]
    half = self.embedding_dims // 2
    # timesfm's timescales, min * (max / min)^(2i / D) (float32); posenc takes their inverse
    fraction = 2 * torch.arange(0, half, device=inputs.device) / self.embedding_dims
    timescale = self.min_timescale * (self.max_timescale / self.min_timescale) ** fraction
    cos, sin = rope_cos_sin(position.to(inputs.device), (1.0 / timescale).float())
    return rope_rotate(inputs, cos[..., :half], sin[..., :half], "half")


def _padded_rows_zero(kept: torch.Tensor, peer_gives_zero: bool) -> bool:
    """Whether posenc's answer on the query rows that see no key (a left-padded row sees only
    padding: every row when its first key, at 0, is padded) is the peer's. posenc gives 0 there;
    SDPA with a boolean mask gives 0 too (torch >= 2.5), but timesfm's einsum attention
    (_dot_product_attention, -max / 2 on the masked keys) and transformers' eager attention
    (finfo.min added) average the values: those take the peer's own function."""
    return peer_gives_zero or bool(kept[:, 0].all())


def _attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    original=None,
) -> torch.Tensor:
    """timesfm's attention_fn ([B, L, H, D], unscaled) by posenc where the mask is causal with
    the left padding masked; timesfm's own function for any other mask."""
    batch, queries, _, _ = query.shape
    keys = key.shape[1]
    if (
        mask is None
        or mask.dtype != torch.bool
        or mask.shape != (batch, 1, queries, keys)
        or queries != keys
    ):
        return original(query, key, value, mask)
    kept = mask[:, 0, -1, :]  # the last query sees every key that is not padding
    causal = torch.ones(queries, keys, dtype=torch.bool, device=mask.device).tril()
    if not torch.equal(mask[:, 0], causal & kept[:, None, :]):
        return original(query, key, value, mask)
    if not _padded_rows_zero(kept, original is _transformer()._torch_dot_product_attention):
        return original(query, key, value, mask)
    out = positional_attention(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        causal=True,
        scale=1.0,
        attention_mask=kept,
    )
    return out.transpose(1, 2)


def _hf_modeling():
    """transformers' timesfm2_5 modeling module when transformers is already imported (a model of
    it can exist only then), else None."""
    if "transformers" not in sys.modules:
        return None
    try:
        return importlib.import_module("transformers.models.timesfm2_5.modeling_timesfm2_5")
    except ImportError:
        return None


def _hf_rotary(self, x: torch.Tensor, position_ids: torch.Tensor, **kwargs):
    """TimesFm2_5RotaryEmbedding.forward by posenc: cat(t, t) tables in x's dtype, from the
    module's inv_freq and attention_scaling as they are at the call (patch() wraps this in
    transformers' own dynamic_rope_update, which recomputes them first for "dynamic" and picks
    the long or short ladder for "longrope", as it does around the class's forward)."""
    cos, sin = rope_cos_sin(
        position_ids.to(x.device), self.inv_freq.float(), float(self.attention_scaling)
    )
    return cos.to(x.dtype), sin.to(x.dtype)


def _hf_rotary_forward(module: torch.nn.Module):
    """_hf_rotary bound to `module` under transformers' dynamic_rope_update (the decorator of
    TimesFm2_5RotaryEmbedding.forward: the frequency update of the dynamic and longrope types)."""
    rope_utils = importlib.import_module("transformers.modeling_rope_utils")
    return types.MethodType(rope_utils.dynamic_rope_update(_hf_rotary), module)


def _fused_attention_takes(hidden_states: torch.Tensor) -> bool:
    """Whether posenc's fused attention computes what transformers' does: float32 activations
    outside autocast (in bfloat16/float16 transformers' attention rounds q, k, the scores and the
    softmax to that dtype, posenc's kernel computes float32 inside: 1.7e-2 relative apart)."""
    return hidden_states.dtype == torch.float32 and not torch.is_autocast_enabled(
        hidden_states.device.type
    )


def _hf_attention_peer(
    self, hidden_states: torch.Tensor, position_embeddings, attention_mask, cache=None, **kwargs
):
    """TimesFm2_5Attention.forward line by line with posenc's rotation
    (posenc.apply_rotary_pos_emb: transformers' products and sums in the same dtypes, rounded as
    its eager code rounds them) and transformers' own attention function (the one its config
    names: SDPA, eager, ...): transformers' output to the bit in every dtype."""
    modeling = _hf_modeling()
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
    query_states = self.q_norm(query_states)
    key_states = self.k_norm(key_states)
    scale = torch.nn.functional.softplus(self.scaling).mul(1.442695041 / math.sqrt(self.head_dim))
    query_states = query_states * scale[None, None, None, :]
    if cache is not None:
        key_states, value_states = cache.update(
            key_states, value_states, self.layer_idx, kwargs=kwargs
        )
    attention_interface = modeling.ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, modeling.eager_attention_forward
    )
    attn_output, attn_weights = attention_interface(
        self,
        query_states,
        key_states,
        value_states,
        attention_mask,
        dropout=self.attention_dropout if self.training else 0.0,
        scaling=1.0,
        **kwargs,
    )
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    attn_output = self.o_proj(attn_output)
    return attn_output, attn_weights


def _causal_keys(mask: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor | None:
    """The unpadded keys [B, N] when `mask` (create_causal_mask's: None, bool or additive float
    [B, 1, N, N]) is exactly causal with those keys masked, else None."""
    if mask is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    if mask.shape != (batch, 1, length, length):
        return None
    if mask.dtype != torch.bool:
        low = torch.finfo(mask.dtype).min
        if not bool(((mask == 0) | (mask == low)).all()):
            return None
        mask = mask == 0
    kept = mask[:, 0, -1, :]
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return kept if torch.equal(mask[:, 0], causal & kept[:, None, :]) else None


def _hf_attention(
    self, hidden_states: torch.Tensor, position_embeddings, attention_mask, cache=None, **kwargs
):
    """TimesFm2_5Attention.forward by posenc where the mask is causal with left padding; in
    another dtype or under autocast posenc's rotation with transformers' attention function
    (_hf_attention_peer)."""
    if "past_key_values" in kwargs:  # the deprecated name: the class's forward renames it
        return type(self).forward(
            self, hidden_states, position_embeddings, attention_mask, cache=cache, **kwargs
        )
    if not _fused_attention_takes(hidden_states):
        return _hf_attention_peer(
            self, hidden_states, position_embeddings, attention_mask, cache=cache, **kwargs
        )
    batch, length, _ = hidden_states.shape
    kept = None
    if (
        cache is None
        and not kwargs.get("output_attentions")
        and not (self.training and self.attention_dropout > 0)
    ):
        kept = _causal_keys(attention_mask, batch, length, hidden_states.device)
        sdpa = self.config._attn_implementation == "sdpa" and (
            attention_mask is None or attention_mask.dtype == torch.bool
        )
        if kept is not None and not _padded_rows_zero(kept, sdpa):
            kept = None
    if kept is None:  # transformers' own forward (its class's)
        return type(self).forward(
            self, hidden_states, position_embeddings, attention_mask, cache=cache, **kwargs
        )
    shape = (batch, length, -1, self.head_dim)
    q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
    k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
    v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
    cos, sin = position_embeddings
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    q, k = self.q_norm(q), self.k_norm(k)
    scale = torch.nn.functional.softplus(self.scaling).mul(1.442695041 / math.sqrt(self.head_dim))
    q = q * scale[None, None, None, :]
    if self.num_key_value_groups > 1:  # transformers' repeat_kv
        k = k.repeat_interleave(self.num_key_value_groups, dim=1)
        v = v.repeat_interleave(self.num_key_value_groups, dim=1)
    out = positional_attention(q, k, v, causal=True, scale=1.0, attention_mask=kept)
    out = out.transpose(1, 2).reshape(batch, length, -1).contiguous()
    return self.o_proj(out), None


def _hf_found(model: torch.nn.Module) -> list:
    modeling = _hf_modeling()
    if modeling is None:
        return []
    kinds = (modeling.TimesFm2_5RotaryEmbedding, modeling.TimesFm2_5Attention)
    return [(name, m) for name, m in model.named_modules() if isinstance(m, kinds)]


def patch(model: torch.nn.Module) -> list[str]:
    """Replace the rotary embedding and the attention of the model's TimesFM 2.5 modules (the
    timesfm package's MultiHeadAttention; transformers' TimesFm2_5RotaryEmbedding and
    TimesFm2_5Attention) by posenc's; returns their names."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(
            f"posenc.integrations.timesfm.patch: expected an nn.Module, got {type(model).__name__}"
        )
    hf = _hf_found(model)
    found = []
    if not hf:
        transformer = _transformer()
        found = [
            (name, m)
            for name, m in model.named_modules()
            if isinstance(m, transformer.MultiHeadAttention) and m.use_rotary_position_embeddings
        ]
    if not found and not hf:
        raise ValueError(
            f"posenc.integrations.timesfm.patch: {type(model).__name__} has no timesfm "
            f"MultiHeadAttention with rotary position embeddings and no transformers "
            f"TimesFM 2.5 attention"
        )
    for name, module in found:  # the timesfm package's modules: float32 only (see above)
        for p in list(module.parameters()) + list(module.buffers()):
            if p.is_floating_point() and p.dtype != torch.float32:
                raise ValueError(
                    f"posenc.integrations.timesfm.patch: {name} holds {p.dtype} "
                    f"weights; posenc's patch of timesfm's MultiHeadAttention computes float32"
                )
    for _, module in found:
        if module.__dict__.get(_MARK) is None:
            rotary = module.rotary_position_embedding
            rotary.__dict__["forward"] = types.MethodType(_rotary, rotary)
            original = module.attention_fn
            module.__dict__[_MARK] = original
            module.attention_fn = lambda q, k, v, mask=None, _o=original: _attention(
                q, k, v, mask, original=_o
            )
    modeling = _hf_modeling()
    for _, module in hf:
        if module.__dict__.get(_MARK) is None:
            if isinstance(module, modeling.TimesFm2_5RotaryEmbedding):
                module.__dict__["forward"] = _hf_rotary_forward(module)
            else:
                module.__dict__["forward"] = types.MethodType(_hf_attention, module)
            module.__dict__[_MARK] = "forward"
    return [name for name, _ in found + hf]


def unpatch(model: torch.nn.Module) -> list[str]:
    """timesfm's and transformers' own code back; returns the modules' names."""
    restored = []
    for name, module in model.named_modules():
        original = module.__dict__.pop(_MARK, None)
        if original is None:
            continue
        if isinstance(original, str):  # transformers' module: its class's forward
            module.__dict__.pop("forward", None)
        else:
            module.attention_fn = original
            module.rotary_position_embedding.__dict__.pop("forward", None)
        restored.append(name)
    return restored

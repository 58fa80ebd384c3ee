"""posenc inside a Moirai-2 model (uni2ts 2.0, uni2ts/model/moirai2/module.py): the positions of its
attention computed by posenc (the RoPE tables and rotation always; the packed sample mask and the
binary variate bias too, in posenc's fused kernel, where the mask is one it takes).

    module = Moirai2Module(d_model=..., ...)              # or Moirai2Forecast(...).module
    names = posenc.integrations.uni2ts.patch(module)      # its attention modules
    preds = module(target, observed_mask, sample_id, time_id, variate_id, prediction_mask)
    posenc.integrations.uni2ts.unpatch(module)            # uni2ts' own forward back

What Moirai-2 does (uni2ts/module/attention.py GroupedQueryAttention, position/attn_projection.py
RotaryProjection with QueryKeyProjection(partial_factor=(0.0, 0.5)), position/attn_bias.py
BinaryAttentionBias, common/torch_util.py packed_causal_attention_mask). Several series, each a
run of tokens with its own sample_id, are packed into one sequence; inside a series every
variate lists its patches with time_id 0, 1, ... Then per head h:

    q, k = RMSNorm(q), RMSNorm(k)                          (per head, before the rotation)
    q[:, :W], k[:, :W] rotated by time_id, W = D/2         (the first half of each head; the
        pairs (2i, 2i + 1) interleaved, angle time_id * theta^(-2i/W), the second half passes)
    logits = q k^T / sqrt(D) + emb[var_i == var_j, h]      (emb = Embedding(2, H): row 0 for two
        different variates, row 1 for the same; learned)
    mask: sample_i == sample_j and time_j <= time_i        (a block per packed series, causal in
        time across all its variates: not causal in token order once a series has 2 variates)

What patch() replaces: the forward of each GroupedQueryAttention whose time projection is that
rotary one (an instance attribute; unpatch() deletes it): the same projections and norms, the
tables by posenc.rope_cos_sin(time_id, theta, layout="interleaved") (uni2ts' cos/sin buffer rows
to the bit: the same float32 products time_id * theta, cos, sin), then one of two paths:

* the mask is a block per contiguous run of tokens (Moirai 1's packed_attention_mask), or that
  and causal in token order (Moirai-2's packed_causal_attention_mask when every packed series
  has one variate, its patches in time order), or that and causal in time_id (Moirai-2's mask
  with several variates in a series: variate 1's patch at time 0 sees variate 0's at time 0
  but not at time 1, which comes first in token order), and no attention dropout: everything
  in posenc's fused kernel, posenc.positional_attention(cos, sin, layout="interleaved", causal
  or causal_ids=time_id, sample_ids=the runs, variate_ids, variate_bias=the
  BinaryAttentionBias weight): no [N, N] mask or bias is built; equal to uni2ts to 1e-6 (a
  tiled online softmax against SDPA). Which of them uni2ts' mask is, is checked exactly
  (torch.equal against the mask the kernel will apply), so a mask it is not takes the path
  below;
* any other mask (a sample id in two separate runs, a mask of another rule, attention
  dropout): the rotation of the first W dimensions by posenc.apply_rotary_pos_emb(
  layout="interleaved", partial width W) (uni2ts' cos * x + sin * rotate(x) to the bit), the
  variate bias and the mask built as uni2ts builds them (its own BinaryAttentionBias;
  [B, H, N, N]) and SDPA as uni2ts calls it: equal to uni2ts to the bit.

Both checked in tests/python/test_timeseries_models.py, outputs and gradients.

A Moirai-MoE model (one holding uni2ts' MoEFeedForward, uni2ts/module/ffn.py: each token's
experts are a hard torch.topk on its distances to centroids) takes, in every patched attention,
the path of the other dtypes below (uni2ts' own cos/sin rows, posenc's rotation, uni2ts' bias,
mask and SDPA on its layouts), never the fused kernel: the kernel's ~2e-7 from SDPA is within
1e-6, yet it can pick another expert for a token near a tie (6.5e-2 apart in one of 128
encoders, found by the hostile review). Checked at patch() on the model passed: patch the whole
model (or the encoder holding the MoE layers), not its attentions alone. Equal to uni2ts to the
bit (tests/python/test_timeseries_moirai_moe.py).

posenc's tables are uni2ts' rows only for a float32 model outside autocast whose cached rows are
what its theta gives. Otherwise (a model cast to float64 / bfloat16 / float16, before or after
patch(): uni2ts keeps its rows as cast buffers, float32 values in float64, rounded in half
precision, and rounds its rotation, scores and softmax to the dtype; autocast; a cast through a
lower precision and back, e.g. .half().float(), whose rounded rows uni2ts reads) the patched
attention reads uni2ts' own rows (RotaryProjection's: grown to the ids by its _init_freq, then
indexed), rotates with posenc.apply_rotary_pos_emb (uni2ts' products and sums in its dtypes) and
takes the second path's mask, bias and SDPA on uni2ts' layouts (q, k contiguous as its torch.cat
leaves them, v its einops repeat): equal to uni2ts to the bit
(tests/python/test_timeseries_patch_dtypes.py). Each of these was refused in one line before.

Refused in one line (ValueError, nothing changed): a model without such an attention, an
attention with another position layout (a variate projection, a time bias, a rotary part that
does not start at dimension 0, separate query and key rotations), and at call time
inputs that are not [B, N, dim] with the same ids for queries and keys (ids
left out for both take uni2ts' defaults: time_id 0..N-1, variate_id 0), and a negative time_id
(uni2ts reads self.cos[time_id]: -3 is a row from the end of its buffer, not the rotation by -3).
uni2ts is imported on first use (only its modules under uni2ts.module, not uni2ts.model's
package, which imports lightning and gluonts).
"""

from __future__ import annotations

import importlib
import types

import torch
import torch.nn.functional as F

from ..attention import positional_attention
from ..rotary import apply_rotary_pos_emb, rope_cos_sin

__all__ = ["patch", "unpatch"]

_MARK = "_posenc_uni2ts_patched"
_EXACT = "_posenc_uni2ts_exact"  # on a patched attention: always the path equal to uni2ts' bits


def _modules():
    try:
        attention = importlib.import_module("uni2ts.module.attention")
        position = importlib.import_module("uni2ts.module.position")
    except ImportError as e:
        raise ValueError(f"posenc.integrations.uni2ts: uni2ts is not importable ({e})") from None
    return attention, position


def _has_moe(model: torch.nn.Module) -> bool:
    """Whether the model holds uni2ts' MoEFeedForward (Moirai-MoE: experts chosen by a hard top-k
    on the distances to centroids, so a rounding apart in the attention can pick other experts)."""
    try:
        ffn = importlib.import_module("uni2ts.module.ffn")
    except ImportError:
        return False
    moe = getattr(ffn, "MoEFeedForward", None)
    return moe is not None and any(isinstance(m, moe) for m in model.modules())


def _why_not(module, position) -> str:
    """'' when posenc computes the module's positions, else why not."""
    proj = module.time_qk_proj
    if not isinstance(proj, position.QueryKeyProjection) or not isinstance(
        proj.query_proj, position.RotaryProjection
    ):
        return "its time projection is not uni2ts' RotaryProjection"
    if proj.key_proj is not proj.query_proj:
        return "its queries and keys rotate by different projections"
    if proj.split_sizes[0] != 0:
        return (
            f"its rotary part starts at dimension {proj.split_sizes[0]} (posenc rotates the "
            f"first dimensions of a head)"
        )
    if module.var_qk_proj is not None:
        return "it projects q and k by variate too"
    if module.time_attn_bias is not None:
        return "it adds a time bias"
    if module.var_attn_bias is not None and not isinstance(
        module.var_attn_bias, position.BinaryAttentionBias
    ):
        return f"its variate bias is {type(module.var_attn_bias).__name__}, not BinaryAttentionBias"
    return ""


_TABLE_CHECKED = "_posenc_uni2ts_table_checked"  # on a RotaryProjection: the state last checked


def _table_differs(rotary) -> bool:
    """Whether uni2ts' cached cos/sin rows are not posenc's tables from the module's theta (cast
    through a lower precision and back, e.g. .half().float(): uni2ts reads the rounded rows,
    posenc would recompute them). Checked again only when the buffers or theta change: the
    state kept (with the verdict) holds each checked storage alive, so a new tensor cannot reuse
    its address."""
    if rotary.cos is None:
        return False
    tensors = (rotary.cos, rotary.sin, rotary.theta)
    state = tuple((t.data_ptr(), t._version) for t in tensors)
    kept = rotary.__dict__.get(_TABLE_CHECKED)
    if kept is not None and kept[0] == state:
        return kept[2]
    positions = torch.arange(rotary.cos.shape[-2], device=rotary.theta.device)
    cos, sin = rope_cos_sin(positions, rotary.theta, layout="interleaved")
    differs = not (torch.equal(cos, rotary.cos) and torch.equal(sin, rotary.sin))
    rotary.__dict__[_TABLE_CHECKED] = (state, tuple(t.untyped_storage() for t in tensors), differs)
    return differs


def _posenc_tables_are_uni2ts(module, query: torch.Tensor, rotary) -> bool:
    """Whether posenc's tables and fused kernel compute what uni2ts does: float32 activations and
    weights outside autocast, and uni2ts' cached cos/sin rows what its theta gives. Else (a model
    cast to bfloat16/float16/float64, before or after patch(); autocast; a cast through a lower
    precision and back, whose rounded rows uni2ts reads) the patched attention reads uni2ts' own
    rows in their dtype and rotates with posenc's rotation (uni2ts' roundings), then uni2ts' mask,
    bias and SDPA call: uni2ts' output to the bit."""
    return (
        query.dtype == torch.float32
        and module.q_proj.weight.dtype == torch.float32
        and not torch.is_autocast_enabled(query.device.type)
        and rotary.theta.dtype == torch.float32
        and not _table_differs(rotary)
    )


def _same_ids(a, b, name: str) -> torch.Tensor:
    if a is None or b is None or (a is not b and not torch.equal(a, b)):
        raise ValueError(
            f"posenc.integrations.uni2ts: the patched attention takes the same "
            f"{name} for queries and keys (self-attention)"
        )
    return a


def _packed_runs(mask: torch.Tensor | None, time_id: torch.Tensor, batch: int, length: int):
    """(sample_ids [B, N], causal, causal_ids) when uni2ts' boolean mask [B, N, N] is exactly a
    block per contiguous run of tokens (packed_attention_mask: causal False, causal_ids None),
    that and causal in token order (packed_causal_attention_mask of series of one variate each,
    whose patches are in time order: causal True), or that and causal in time_id
    (packed_causal_attention_mask of series of several variates: causal_ids = time_id); else
    None. Two tokens of one sample see each other in at least one direction (time_j <= time_i
    or time_i <= time_j), so mask | mask^T is the sample mask; a run starts where a token and
    the one before it are not in one sample."""
    if mask is None or mask.dtype != torch.bool or mask.shape != (batch, length, length):
        return None
    either_way = mask | mask.mT
    with_previous = either_way.diagonal(offset=-1, dim1=1, dim2=2)  # [B, N-1]: [b, i, i-1]
    starts = torch.cat(
        [torch.ones(batch, 1, dtype=torch.bool, device=mask.device), ~with_previous], dim=1
    )
    sample_ids = starts.to(torch.int64).cumsum(1)
    same = sample_ids[:, :, None] == sample_ids[:, None, :]
    if torch.equal(mask, same):
        return sample_ids, False, None
    if torch.equal(mask, same.tril()):
        return sample_ids, True, None
    if (
        time_id.shape == (batch, length)
        and not time_id.dtype.is_floating_point
        and not time_id.dtype.is_complex
        and time_id.dtype != torch.bool
        and torch.equal(mask, same & (time_id[:, None, :] <= time_id[:, :, None]))
    ):
        return sample_ids, False, time_id  # uni2ts: time_id[..., None, :] <= time_id[..., :, None]
    return None


def _attention(
    self,
    query,
    key,
    value,
    attn_mask=None,
    query_var_id=None,
    kv_var_id=None,
    query_time_id=None,
    kv_time_id=None,
):
    """GroupedQueryAttention.forward with posenc's RoPE (uni2ts' contract, [B, N, dim] inputs)."""
    if query.dim() != 3:
        raise ValueError(
            f"posenc.integrations.uni2ts: the patched attention takes [B, N, dim] "
            f"inputs, got {tuple(query.shape)}"
        )
    batch, length, _ = query.shape
    # ids left out: uni2ts' defaults (_get_time_id: 0..N-1; _get_var_id: 0 for every token)
    if query_time_id is None and kv_time_id is None:
        query_time_id = kv_time_id = torch.arange(length, device=query.device).expand(batch, -1)
    if query_var_id is None and kv_var_id is None and self.var_attn_bias is not None:
        query_var_id = kv_var_id = torch.zeros(batch, length, dtype=torch.long, device=query.device)
    time_id = _same_ids(query_time_id, kv_time_id, "time_id")
    if time_id.numel() > 0 and time_id.min() < 0:
        raise ValueError(
            f"posenc.integrations.uni2ts: time_id {time_id.min().item()} is negative (uni2ts "
            f"indexes its cos/sin rows by time_id, so a negative id reads a row from the end of "
            f"its buffer, not the rotation by that id); unpatch() for uni2ts' own"
        )
    var_id = query_var_id
    if self.var_attn_bias is not None:
        var_id = _same_ids(query_var_id, kv_var_id, "variate_id")
    heads, groups, dim = self.num_heads, self.num_groups, self.head_dim
    # [B, N, heads * D] -> [B, heads, N, D]; k and v repeated over the heads of their group
    q = self.q_norm(self.q_proj(query).view(batch, length, heads, dim).transpose(1, 2))
    k = self.k_proj(key).view(batch, length, groups, 1, dim).expand(-1, -1, -1, heads // groups, -1)
    k = self.k_norm(k.reshape(batch, length, heads, dim).transpose(1, 2))
    value = self.v_proj(value)
    v = value.view(batch, length, groups, 1, dim).expand(-1, -1, -1, heads // groups, -1)
    v = v.reshape(batch, length, heads, dim).transpose(1, 2)
    # posenc: tables for time_id (interleaved pairs, width W) and the rotation of dims 0..W-1
    rotary = self.time_qk_proj.query_proj
    if not self.__dict__.get(_EXACT, False) and _posenc_tables_are_uni2ts(self, query, rotary):
        cos, sin = rope_cos_sin(time_id, rotary.theta, layout="interleaved")
        runs = _packed_runs(attn_mask, time_id, batch, length) if self.attn_dropout_p == 0 else None
    else:  # uni2ts' own rows (RotaryProjection.forward: grown to the ids, then indexed)
        rotary._init_freq(max_len=time_id.max() + 1)
        cos, sin = rotary.cos[time_id], rotary.sin[time_id]
        runs = None
    if runs is not None:  # the mask is posenc's sample-id mask: all in the fused kernel
        sample_ids, causal, causal_ids = runs
        bias = self.var_attn_bias
        out = positional_attention(
            q,
            k,
            v,
            cos=cos,
            sin=sin,
            layout="interleaved",
            scale=self.softmax_scale,
            causal=causal,
            sample_ids=sample_ids,
            # the bias reads only equality of ids: shifted to start at 0 (uni2ts takes any ids)
            variate_ids=None if bias is None else var_id - var_id.amin(),
            variate_bias=None if bias is None else bias.emb.weight,
            causal_ids=causal_ids,
        )
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, heads * dim))
    q, k = apply_rotary_pos_emb(q, k, cos, sin, layout="interleaved")
    # the variate bias and the packed mask as uni2ts builds them, and its SDPA call, on its
    # [B, G, heads per group, N, D] views
    shape = (batch, groups, heads // groups, length, dim)
    # q and k contiguous, as uni2ts' torch.cat of the rotated and passed parts leaves them, and v
    # as its einops repeat lays it out (a stride-0 view over the heads of a group): SDPA's products
    # depend on the strides (float64: 4e-16 apart otherwise)
    q, k = q.reshape(shape).contiguous(), k.reshape(shape).contiguous()
    v = importlib.import_module("einops").repeat(
        value,
        "... kv_len (group dim) -> ... group hpg kv_len dim",
        group=groups,
        hpg=heads // groups,
    )
    ids = None if var_id is None else var_id[:, None, None, :]
    mask = self._update_attn_mask(attn_mask, q, k, query_var_id=ids, kv_var_id=ids)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=self.attn_dropout_p, scale=self.softmax_scale
    )
    out = out.reshape(batch, heads, length, dim)
    return self.out_proj(out.transpose(1, 2).reshape(batch, length, heads * dim))


def patch(model: torch.nn.Module) -> list[str]:
    """Replace the forward of the model's rotary attentions (uni2ts' GroupedQueryAttention with a
    RotaryProjection on time) by posenc's; returns their names. In a model that holds uni2ts'
    MoEFeedForward (Moirai-MoE) every patched attention takes the path equal to uni2ts to the bit
    (posenc's rotation, uni2ts' rows, bias, mask and SDPA), never the fused kernel: its experts
    are a hard top-k, so the kernel's 1e-6 can pick another expert. Refuses (ValueError, nothing
    changed) a model without one or with one posenc does not reproduce."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(
            f"posenc.integrations.uni2ts.patch: expected an nn.Module, got {type(model).__name__}"
        )
    attention, position = _modules()
    found = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, attention.GroupedQueryAttention) and m.time_qk_proj is not None
    ]
    if not found:
        raise ValueError(
            f"posenc.integrations.uni2ts.patch: {type(model).__name__} has no uni2ts "
            f"attention with a rotary time projection"
        )
    for name, module in found:
        why = _why_not(module, position)
        if why:
            raise ValueError(f"posenc.integrations.uni2ts.patch: {name}: {why}")
    exact = _has_moe(model)
    for _, module in found:
        module.__dict__[_EXACT] = exact
        rotary = module.time_qk_proj.query_proj
        if rotary.theta.dtype == torch.float32:
            _table_differs(rotary)  # checked once here, not at the first call (the verdict kept)
        if not module.__dict__.get(_MARK, False):
            module.__dict__["forward"] = types.MethodType(_attention, module)
            module.__dict__[_MARK] = True
    return [name for name, _ in found]


def unpatch(model: torch.nn.Module) -> list[str]:
    """uni2ts' own forward back on every module patch() changed; returns their names."""
    restored = []
    for name, module in model.named_modules():
        if module.__dict__.pop(_MARK, False):
            module.__dict__.pop("forward", None)
            module.__dict__.pop(_EXACT, None)
            restored.append(name)
    return restored

"""Fake (meta) kernels: shapes, dtypes and strides only, for torch.compile and torch.export.

Each promises exactly what the C++ kernels return (src/bindings/*.cpp,
src/kernels/dispatch/*.cpp): apply_rotary's outputs are laid out as empty_like(q) / empty_like(k)
in the promoted dtype on every path; rope_rotate's are contiguous in x's shape and dtype;
rope_cos_sin's are contiguous float32 [..., N, 2F].

Every fake first checks its tensor arguments' devices as the C++ kernels do
(src/kernels/dispatch/operator_checks.h, the same words): a fake sees tensors on different devices
only in an eager call that mixes meta and real tensors (Meta outranks CPU in dispatch, so a meta
table among CPU tensors lands here, and a fake would hand back uninitialized CPU memory); under
FakeTensorMode every tensor carries the one fake device and all-meta calls (compile, export) pass.
"""

from __future__ import annotations

import functools

import torch

# Arguments that may live on the CPU when the first tensor argument is on CUDA (the documented
# exceptions: rope_rotate's tables, attention_fused's positions, slopes, tables and masks).
_HOST_OK = {
    "rope_rotate": ("cos", "sin"),
    "rope_rotate_qk": ("cos", "sin"),
    "rope_rotate_": ("cos", "sin"),
}
_FUSED_HOST_OK = (
    "q_positions",
    "k_positions",
    "slopes",
    "table",
    "key_padding",
    "q_cos",
    "q_sin",
    "k_cos",
    "k_sin",
    "sample_ids",
    "variate_ids",
    "variate_bias",
    "causal_ids",
)
for _name in ("attention_fused", "_attention_fused_forward", "_attention_fused_backward"):
    _HOST_OK[_name] = _FUSED_HOST_OK


def check_same_device(op: str, named, host_ok=()) -> None:
    """Every tensor on the first one's device (host_ok ones also on the CPU for a CUDA first)."""
    anchor = None
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            continue
        if anchor is None:
            anchor = (name, t.device)
            continue
        first, device = anchor
        if name in host_ok:
            if t.device != device and not (device.type == "cuda" and t.device.type == "cpu"):
                raise RuntimeError(
                    f"{op}: {name} is on {t.device} but {first} is on {device}; "
                    f"{name} must be on {first}'s device (or the CPU, for a CUDA "
                    f"{first})"
                )
        elif t.device != device:
            raise RuntimeError(
                f"{op}: {name} is on {t.device} but {first} is on {device}; "
                f"every tensor argument must be on {first}'s device"
            )


def _label(name: str) -> str:
    """The operator as the C++ kernels' messages name it."""
    if name.startswith("rope_rotate") or "attention_fused" in name:
        return name
    return "posenc." + name.lstrip("_").removesuffix("_forward").removesuffix("_backward")


def _fake(name: str):
    """register_fake for posenc::<name>, the devices of every tensor argument checked first."""

    def wrap(fn):
        schema = getattr(torch.ops.posenc, name).default._schema
        names = [a.name for a in schema.arguments]
        op = _label(name)

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            bound = list(zip(names, args)) + list(kwargs.items())
            check_same_device(op, bound, _HOST_OK.get(name, ()))
            return fn(*args, **kwargs)

        torch.library.register_fake(f"posenc::{name}")(checked)
        return fn

    return wrap


def _result_dtype(x, cos, sin):
    return torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype)


def _result_like(x, cos, unsqueeze_dim, dtype):
    # empty_like(x), or contiguous where the tables broadcast x to a larger shape: the leading
    # dims broadcast, x's head dim (the table's last dim is the rotary width, or 1 over all of it)
    table = cos.unsqueeze(unsqueeze_dim)
    lead = torch.broadcast_shapes(tuple(x.shape[:-1]), tuple(table.shape[:-1]))
    shape = tuple(lead) + (x.shape[-1],)
    if shape == tuple(x.shape):
        return torch.empty_like(x, dtype=dtype)
    return x.new_empty(shape, dtype=dtype)


@_fake("apply_rotary")
def _apply_rotary_fake(q, k, cos, sin, unsqueeze_dim=1, layout="half"):
    torch._check(cos.shape == sin.shape, lambda: "posenc.apply_rotary: cos and sin shapes differ")
    return (
        _result_like(q, cos, unsqueeze_dim, _result_dtype(q, cos, sin)),
        _result_like(k, cos, unsqueeze_dim, _result_dtype(k, cos, sin)),
    )


@_fake("apply_rotary_")
def _apply_rotary_inplace_fake(q, k, cos, sin, unsqueeze_dim=1, layout="half"):
    return None


# rope_rotate*: results contiguous in x's shape and dtype (empty_result in
# src/kernels/dispatch/rope_rotate_operator.cpp).
# Tables on x's device, or on the CPU for a CUDA x (_HOST_OK).
def _rope_rotate_shapes(op, cos, sin):
    torch._check(cos.shape == sin.shape, lambda: f"{op}: cos and sin shapes differ")


@_fake("rope_rotate")
def _rope_rotate_fake(x, cos, sin, layout="half", inverse=False):
    _rope_rotate_shapes("rope_rotate", cos, sin)
    return x.new_empty(x.shape)


@_fake("rope_rotate_qk")
def _rope_rotate_qk_fake(q, k, cos, sin, layout="half", inverse=False):
    _rope_rotate_shapes("rope_rotate_qk", cos, sin)
    return q.new_empty(q.shape), k.new_empty(k.shape)


@_fake("rope_rotate_")
def _rope_rotate_inplace_fake(x, cos, sin, layout="half", inverse=False):
    _rope_rotate_shapes("rope_rotate_", cos, sin)
    return None


@_fake("rope_cos_sin")
def _rope_cos_sin_fake(
    positions,
    inv_freq,
    attention_scaling=1.0,
    mrope_section=(),
    section_layout="contiguous",
    layout="half",
):
    lead = positions.shape if len(mrope_section) == 0 else positions.shape[:-1]
    shape = (*lead, 2 * inv_freq.shape[0])
    return (
        positions.new_empty(shape, dtype=torch.float32),
        positions.new_empty(shape, dtype=torch.float32),
    )


@_fake("patch_grid_rope")
def _patch_grid_rope_fake(
    feat_shape,
    bands,
    grid_type="index",
    ref_feat_shape=None,
    grid_offset=0.0,
    grid_indexing="ij",
    normalize_coords="separate",
    layout="interleaved",
):
    n = 1
    for s in feat_shape:
        n = n * s
    shape = (n, 2 * len(feat_shape) * bands.shape[0])
    return (
        bands.new_empty(shape, dtype=torch.float32),
        bands.new_empty(shape, dtype=torch.float32),
    )


# shaw_attention: outputs contiguous as the C++ kernels return them (backward: contiguous gradients
# in each input's dtype); lse is float64 for float64 inputs (their reference path), and dtable is
# [2K+1, D] in the table's dtype.
@_fake("shaw_attention")
def _shaw_attention_fake(q, k, v, table, causal=False, scale=None, attention_mask=None):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@_fake("_shaw_attention_forward")
def _shaw_attention_forward_fake(q, k, v, table, causal=False, scale=None, attention_mask=None):
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return (q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=lse_dtype))


@_fake("_shaw_attention_backward")
def _shaw_attention_backward_fake(
    grad_out, q, k, v, out, lse, table, causal=False, scale=None, attention_mask=None
):
    return (
        q.new_empty(q.shape),
        k.new_empty(k.shape),
        v.new_empty(v.shape),
        table.new_empty(table.shape),
    )


# positional_attention: as t5_attention (lse float64 for float64 inputs, their reference path);
# dtable is the T5 table's shape and dtype, or an empty float32 [0] without a table; dvariate
# variate_bias's likewise. causal_ids (like sample_ids) changes no shape.
@_fake("positional_attention")
def _positional_attention_fake(
    q,
    k,
    v,
    cos=None,
    sin=None,
    layout="half",
    slopes=None,
    symmetric=False,
    t5_table=None,
    bidirectional=True,
    max_distance=128,
    causal=False,
    scale=None,
    attention_mask=None,
    sample_ids=None,
    variate_ids=None,
    variate_bias=None,
    causal_ids=None,
):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@_fake("_positional_attention_forward")
def _positional_attention_forward_fake(
    q,
    k,
    v,
    cos=None,
    sin=None,
    layout="half",
    slopes=None,
    symmetric=False,
    t5_table=None,
    bidirectional=True,
    max_distance=128,
    causal=False,
    scale=None,
    attention_mask=None,
    sample_ids=None,
    variate_ids=None,
    variate_bias=None,
    causal_ids=None,
):
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return (q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=lse_dtype))


@_fake("_positional_attention_backward")
def _positional_attention_backward_fake(
    grad_out,
    q,
    k,
    v,
    out,
    lse,
    cos=None,
    sin=None,
    layout="half",
    slopes=None,
    symmetric=False,
    t5_table=None,
    bidirectional=True,
    max_distance=128,
    causal=False,
    scale=None,
    attention_mask=None,
    sample_ids=None,
    variate_ids=None,
    variate_bias=None,
    causal_ids=None,
):
    dtable = (
        t5_table.new_empty(t5_table.shape)
        if t5_table is not None
        else q.new_empty((0,), dtype=torch.float32)
    )
    dvariate = (
        variate_bias.new_empty(variate_bias.shape)
        if variate_bias is not None
        else q.new_empty((0,), dtype=torch.float32)
    )
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dtable, dvariate


# attention_fused (the C++ library's attention, src/kernels/dispatch/attention_fused_operator.cpp):
# q, k, v [B, N, H, D], out [B, Nq, H, Dv] contiguous in q's dtype, lse [B, H, Nq] float32; the
# backward's dtable has the table's shape and dtype, [0] float32 without one, and dvariate_bias
# variate_bias's ([0] without).
# Positions, slopes, tables and ids may live on the CPU for CUDA activations (_HOST_OK); q, k, v
# share one device.


@_fake("attention_fused")
def _attention_fused_fake(q, k, v, *args):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@_fake("_attention_fused_forward")
def _attention_fused_forward_fake(q, k, v, *args):
    # out: float32 on the CPU (the unrounded values the backward reads), q's dtype on CUDA (the
    # kernel's own); lse [B, H, Nq] float32
    out_dtype = torch.float32 if q.device.type == "cpu" else q.dtype
    return (
        q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=out_dtype),
        q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32),
    )


@_fake("_attention_fused_backward")
def _attention_fused_backward_fake(
    grad_out,
    out,
    lse,
    q,
    k,
    v,
    q_positions,
    k_positions,
    slopes,
    symmetric,
    table,
    *args,
    sample_ids=None,
    variate_ids=None,
    variate_bias=None,
    causal_ids=None,
):
    # the last four parameters (sample_ids, variate_ids, variate_bias, causal_ids) may come
    # positionally: (table_form, ..., rope_layout, sample_ids, variate_ids, variate_bias, ...)
    if len(args) >= 16:
        variate_bias = args[15]
    dtable = (
        table.new_empty(table.shape)
        if table is not None
        else q.new_empty((0,), dtype=torch.float32)
    )
    dvariate = (
        variate_bias.new_empty(variate_bias.shape)
        if variate_bias is not None
        else q.new_empty((0,), dtype=torch.float32)
    )
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dtable, dvariate


# The stream operators (src/bindings/streams.cpp): integer bookkeeping that reads its arguments'
# values on the host, so inputs on different real devices are read alike (the documented
# exception) and a meta tensor among real ones is one line (it holds no values); all on meta
# (compile, export) the shapes are the token types' alone: position_ids [3, B, L] int64, deltas [B, 1] int64, both
# contiguous on the token types' device. The checks are the C++ kernels' that read no values.
def _stream_checks(op, named, token_kinds):
    tensors = [(n, t) for n, t in named if isinstance(t, torch.Tensor)]
    if any(t.device.type == "meta" for _, t in tensors) and any(
        t.device.type != "meta" for _, t in tensors
    ):
        name = next(n for n, t in tensors if t.device.type == "meta")
        raise RuntimeError(
            f"{op}: {name} is on meta, which holds no values; this operator reads its "
            f"arguments' values"
        )
    who = dict(named)
    mask, token_types = who["attention_mask"], who["token_types"]
    if (
        mask.numel() != 0
        and mask.dtype != torch.bool
        and (mask.dtype.is_floating_point or mask.dtype.is_complex)
    ):
        raise RuntimeError(
            f"{op}: attention_mask must be bool or integer (1 = a real token, 0 = padding), "
            f"got {mask.dtype}"
        )
    torch._check(
        token_types.dim() == 2,
        lambda: f"{op}: token types must be [batch, length], got shape {tuple(token_types.shape)}",
    )
    torch._check(
        not (token_types.dtype.is_floating_point or token_types.dtype.is_complex)
        and token_types.dtype != torch.bool,
        lambda: f"{op}: token types must be integers ({token_kinds}), got {token_types.dtype}",
    )
    torch._check(
        mask.numel() == 0 or mask.shape == token_types.shape,
        lambda: f"{op}: attention_mask must be {tuple(token_types.shape)}, got {tuple(mask.shape)}",
    )
    batch, length = token_types.shape
    return (
        token_types.new_empty((3, batch, length), dtype=torch.long),
        token_types.new_empty((batch, 1), dtype=torch.long),
    )


def _register_stream_fake(name, op, token_kinds):
    names = [a.name for a in getattr(torch.ops.posenc, name).default._schema.arguments]

    def fake(*args, **kwargs):
        return _stream_checks(op, list(zip(names, args)) + list(kwargs.items()), token_kinds)

    torch.library.register_fake(f"posenc::{name}")(fake)


_register_stream_fake("qwen2_vl_rope_index", "posenc.get_rope_index", "0 text, 1 image, 2 video")
_register_stream_fake(
    "qwen2_5_omni_rope_index",
    "posenc.get_rope_index_omni",
    "0 other, 1 image, 2 video, 3 audio",
)

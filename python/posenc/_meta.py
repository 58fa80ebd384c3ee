"""Fake (meta) kernels: shapes, dtypes and strides only, for torch.compile and torch.export.

Each promises exactly what the C++ kernels return (src/ops/*.cpp): apply_rotary's outputs are laid
out as empty_like(q) / empty_like(k) in the promoted dtype on every path; rope_rotate's are
contiguous in x's shape and dtype; rope_cos_sin's are contiguous float32 [..., N, 2F].
"""

from __future__ import annotations

import torch


def _result_dtype(x, cos, sin):
    return torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype)


def _result_like(x, cos, unsqueeze_dim, dtype):
    # empty_like(x), or contiguous where the tables broadcast x to a larger shape
    table = cos.unsqueeze(unsqueeze_dim)
    rotary = torch.broadcast_shapes(tuple(x.shape[:-1]) + (cos.shape[-1],), tuple(table.shape))
    shape = tuple(rotary[:-1]) + (x.shape[-1],)
    if shape == tuple(x.shape):
        return torch.empty_like(x, dtype=dtype)
    return x.new_empty(shape, dtype=dtype)


@torch.library.register_fake("posenc::apply_rotary")
def _apply_rotary_fake(q, k, cos, sin, unsqueeze_dim=1, layout="half"):
    torch._check(cos.shape == sin.shape, lambda: "posenc.apply_rotary: cos and sin shapes differ")
    return (
        _result_like(q, cos, unsqueeze_dim, _result_dtype(q, cos, sin)),
        _result_like(k, cos, unsqueeze_dim, _result_dtype(k, cos, sin)),
    )


@torch.library.register_fake("posenc::apply_rotary_")
def _apply_rotary_inplace_fake(q, k, cos, sin, unsqueeze_dim=1, layout="half"):
    return None


# rope_rotate*: results contiguous in x's shape and dtype (src/ops/rope_rotate.cpp's empty_result).
# Tables on x's device (a CUDA x may read CPU tables): a real meta tensor among real CPU ones would
# otherwise bring this fake into an eager call and return uninitialized memory.
def _rope_rotate_devices(op, tensors, cos, sin):
    for t in (cos, sin):
        for x in tensors:
            torch._check(t.device == x.device or (x.device.type == "cuda" and t.device.type == "cpu"),
                         lambda: f"{op}: cos/sin on {t.device} for x on {x.device}")
    torch._check(cos.shape == sin.shape, lambda: f"{op}: cos and sin shapes differ")


@torch.library.register_fake("posenc::rope_rotate")
def _rope_rotate_fake(x, cos, sin, layout="half", inverse=False):
    _rope_rotate_devices("rope_rotate", (x,), cos, sin)
    return x.new_empty(x.shape)


@torch.library.register_fake("posenc::rope_rotate_qk")
def _rope_rotate_qk_fake(q, k, cos, sin, layout="half", inverse=False):
    _rope_rotate_devices("rope_rotate_qk", (q, k), cos, sin)
    return q.new_empty(q.shape), k.new_empty(k.shape)


@torch.library.register_fake("posenc::rope_rotate_")
def _rope_rotate_inplace_fake(x, cos, sin, layout="half", inverse=False):
    _rope_rotate_devices("rope_rotate_", (x,), cos, sin)
    return None


@torch.library.register_fake("posenc::rope_cos_sin")
def _rope_cos_sin_fake(positions, inv_freq, attention_scaling=1.0, mrope_section=(),
                       section_layout="contiguous", layout="half"):
    lead = positions.shape if len(mrope_section) == 0 else positions.shape[:-1]
    shape = (*lead, 2 * inv_freq.shape[0])
    return (
        positions.new_empty(shape, dtype=torch.float32),
        positions.new_empty(shape, dtype=torch.float32),
    )


@torch.library.register_fake("posenc::patch_grid_rope")
def _patch_grid_rope_fake(feat_shape, bands, grid_type="index", ref_feat_shape=None,
                          grid_offset=0.0, grid_indexing="ij", normalize_coords="separate",
                          layout="interleaved"):
    n = 1
    for s in feat_shape:
        n = n * s
    shape = (n, 2 * len(feat_shape) * bands.shape[0])
    return (bands.new_empty(shape, dtype=torch.float32),
            bands.new_empty(shape, dtype=torch.float32))


@torch.library.register_fake("posenc::alibi_attention")
def _alibi_attention_fake(q, k, v, slopes, causal=False, symmetric=False, scale=None, attention_mask=None):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.register_fake("posenc::_alibi_attention_forward")
def _alibi_attention_forward_fake(q, k, v, slopes, causal=False, symmetric=False, scale=None, attention_mask=None):
    return (q.new_empty((*q.shape[:-1], v.shape[-1])),
            q.new_empty(q.shape[:-1], dtype=torch.float32))


@torch.library.register_fake("posenc::_alibi_attention_backward")
def _alibi_attention_backward_fake(grad_out, q, k, v, out, lse, slopes, causal=False,
                                   symmetric=False, scale=None, attention_mask=None):
    # contiguous, as the kernel returns them (q, k, v may be transposed views)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# t5_attention: outputs contiguous as the C++ kernels return them (backward: contiguous
# float32 gradients converted to each input's dtype, dtable in the table's dtype).
@torch.library.register_fake("posenc::t5_attention")
def _t5_attention_fake(q, k, v, table, bidirectional=True, max_distance=128, causal=False,
                       scale=None, attention_mask=None):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.register_fake("posenc::_t5_attention_forward")
def _t5_attention_forward_fake(q, k, v, table, bidirectional=True, max_distance=128,
                               causal=False, scale=None, attention_mask=None):
    return (q.new_empty((*q.shape[:-1], v.shape[-1])),
            q.new_empty(q.shape[:-1], dtype=torch.float32))


@torch.library.register_fake("posenc::_t5_attention_backward")
def _t5_attention_backward_fake(grad_out, q, k, v, out, lse, table, bidirectional=True,
                                max_distance=128, causal=False, scale=None, attention_mask=None):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            table.new_empty(table.shape))


# shaw_attention: as t5_attention; lse is float64 for float64 inputs (their reference path), and
# dtable is [2K+1, D] in the table's dtype.
@torch.library.register_fake("posenc::shaw_attention")
def _shaw_attention_fake(q, k, v, table, causal=False, scale=None, attention_mask=None):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.register_fake("posenc::_shaw_attention_forward")
def _shaw_attention_forward_fake(q, k, v, table, causal=False, scale=None, attention_mask=None):
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return (q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=lse_dtype))


@torch.library.register_fake("posenc::_shaw_attention_backward")
def _shaw_attention_backward_fake(grad_out, q, k, v, out, lse, table, causal=False, scale=None, attention_mask=None):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            table.new_empty(table.shape))


# positional_attention: as t5_attention (lse float64 for float64 inputs, their reference path);
# dtable is the T5 table's shape and dtype, or an empty float32 [0] without a table.
@torch.library.register_fake("posenc::positional_attention")
def _positional_attention_fake(q, k, v, cos=None, sin=None, layout="half", slopes=None,
                               symmetric=False, t5_table=None, bidirectional=True,
                               max_distance=128, causal=False, scale=None, attention_mask=None):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.register_fake("posenc::_positional_attention_forward")
def _positional_attention_forward_fake(q, k, v, cos=None, sin=None, layout="half", slopes=None,
                                       symmetric=False, t5_table=None, bidirectional=True,
                                       max_distance=128, causal=False, scale=None, attention_mask=None):
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return (q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=lse_dtype))


@torch.library.register_fake("posenc::_positional_attention_backward")
def _positional_attention_backward_fake(grad_out, q, k, v, out, lse, cos=None, sin=None,
                                        layout="half", slopes=None, symmetric=False,
                                        t5_table=None, bidirectional=True, max_distance=128,
                                        causal=False, scale=None, attention_mask=None):
    dtable = (t5_table.new_empty(t5_table.shape) if t5_table is not None
              else q.new_empty((0,), dtype=torch.float32))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dtable


# attention_fused (the C++ library's attention, src/ops/attention_fused.cpp): q, k, v [B, N, H, D],
# out [B, Nq, H, Dv] contiguous in q's dtype, lse [B, H, Nq] float32; the backward's dtable has the
# table's shape and dtype, [0] float32 without one. Positions, slopes and tables may live on the
# CPU for CUDA activations; q, k, v share one device.
def _attention_fused_devices(q, k, v):
    torch._check(k.device == q.device and v.device == q.device,
                 lambda: f"attention_fused: q, k, v must share a device, got {q.device}, "
                         f"{k.device}, {v.device}")


@torch.library.register_fake("posenc::attention_fused")
def _attention_fused_fake(q, k, v, *args):
    _attention_fused_devices(q, k, v)
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.register_fake("posenc::_attention_fused_forward")
def _attention_fused_forward_fake(q, k, v, *args):
    _attention_fused_devices(q, k, v)
    # out: float32 on the CPU (the unrounded values the backward reads), q's dtype on CUDA (the
    # kernel's own); lse [B, H, Nq] float32
    out_dtype = torch.float32 if q.device.type == "cpu" else q.dtype
    return (q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=out_dtype),
            q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32))


@torch.library.register_fake("posenc::_attention_fused_backward")
def _attention_fused_backward_fake(grad_out, out, lse, q, k, v, q_positions, k_positions, slopes,
                                   symmetric, table, *args):
    _attention_fused_devices(q, k, v)
    dtable = table.new_empty(table.shape) if table is not None else \
        q.new_empty((0,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dtable

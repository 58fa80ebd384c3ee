"""Pieces every diffusers family module shares: diffusers' frequency ladder, its rotation through
posenc's operator, and the base of posenc's replacement rotary modules.

diffusers' embeddings.py (0.42.1) is the source of the arithmetic reproduced here:

  get_1d_rotary_pos_embed(dim, pos, theta, use_real, linear_factor, ntk_factor,
                          repeat_interleave_real, freqs_dtype)
      freqs = 1.0 / ((theta * ntk_factor) ** (arange(0, dim, 2, freqs_dtype) / dim)) / linear_factor
      angles = outer(pos, freqs)                       [S, dim/2] in freqs' (promoted) dtype
      use_real, repeat_interleave_real: cos(angles).repeat_interleave(2).float()   t0 t0 t1 t1 ..
      use_real:                         cat(cos(angles), cos(angles)).float()      cat(t, t)
  `frequencies` below is the first line with the same torch ops in the same order (the ladder
  posenc's tables are computed from; `theta ** tensor` is torch's pow, whose float32 result
  depends on the CPU's vector width, so it is recomputed live, never frozen). The tables
  themselves come from posenc's operator torch.ops.posenc.rope_cos_sin: float32 frequencies give
  float32 angles `p * f` and float32 cos/sin (diffusers' float32 path); float64 frequencies give
  float64 angles and cos/sin rounded once to float32 (diffusers' float64 path: the products
  `outer(pos, freqs)` of float64 frequencies, cos in float64, `.float()`). Each element is the
  same product and the same cos as diffusers' (torch's cos is elementwise: its vector kernel takes
  the tail too), so the tables are equal to the bit.

  apply_rotary_emb(x, freqs_cis, use_real=True, use_real_unbind_dim=-1, sequence_dim=2)
      (x.float() * cos + x_rotated.float() * sin).to(x.dtype)
      unbind -1: x_rotated = stack(-x_imag, x_real) over pairs (2i, 2i+1)   posenc "interleaved"
      unbind -2: x_rotated = cat(-x_imag, x_real) over the halves           posenc "half"
  `apply_rotary_emb_qk` computes that for q and k in one call of posenc's fused operator
  torch.ops.posenc.apply_rotary (q * c + rot(q) * s, each product rounded as eager PyTorch
  rounds it; `a + (-b) * s` is `a - b * s` to the bit), with its backward. A float64 x is rounded
  to float32 first (diffusers' x.float()); bfloat16/float16 x with float32 tables computes each
  product in float32, as x.float() * cos does; bfloat16/float16 tables are taken as float32
  (exact), so x of their dtype gets float32 products too. The complex path (use_real=False) is not
  computed here: a family needing it refuses it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ... import rotary as _rotary  # noqa: F401  (loads posenc's operators)

__all__ = [
    "ORIGINAL",
    "DiffusersRotary",
    "frequencies",
    "axes_tables",
    "apply_rotary_emb",
    "apply_rotary_emb_qk",
    "adjusted_float64",
    "same_tables",
]

# where a replaced diffusers object is kept on posenc's replacement (not registered: no
# state_dict keys, no second cast); unpatch() puts it back
ORIGINAL = "_posenc_diffusers_original"


class DiffusersRotary(torch.nn.Module):
    """Base of posenc's replacement rotary modules: the diffusers module it replaced (kept as
    ORIGINAL by patch()) follows every cast and move made to this one, so unpatch() gives it
    back in the model's present state."""

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        original = self.__dict__.get(ORIGINAL)
        if original is not None:
            original._apply(fn, *args, **kwargs)
        return module


def adjusted_float64(device: torch.device) -> torch.dtype:
    """diffusers' maybe_adjust_dtype_for_device(torch.float64, device): float32 on the devices
    without float64 (mps, npu, neuron), float64 elsewhere."""
    return torch.float32 if torch.device(device).type in ("mps", "npu", "neuron") else torch.float64


def frequencies(
    dim: int,
    theta: float,
    dtype: torch.dtype,
    device=None,
    ntk_factor: float = 1.0,
    linear_factor: float = 1.0,
) -> torch.Tensor:
    """diffusers' ladder 1 / ((theta ntk)^(2i/dim)) / linear_factor, i < dim/2, in its op order."""
    if dim % 2 != 0:
        raise ValueError(
            f"posenc.integrations.diffusers: a rotary axis needs an even dim, got {dim}"
        )
    theta = theta * ntk_factor
    ladder = torch.arange(0, dim, 2, dtype=dtype, device=device) / dim
    return 1.0 / (theta**ladder) / linear_factor


def axes_tables(
    positions: torch.Tensor, ladders: Sequence[torch.Tensor], layout: str = "interleaved"
) -> tuple[torch.Tensor, torch.Tensor]:
    """cat over axes a of get_1d_rotary_pos_embed(dims[a], positions[:, a], use_real=True) with
    the ladders given (one per axis, all float32 or all float64): positions [S, A] -> cos, sin
    [S, sum dims] float32, each axis's pairs laid out as `layout` (interleaved: t0 t0 t1 t1 ...,
    diffusers' repeat_interleave_real) one axis after the other, by posenc's rope_cos_sin."""
    if positions.dim() != 2 or positions.shape[1] != len(ladders):
        raise ValueError(
            f"posenc.integrations.diffusers: positions must be [S, {len(ladders)}], "
            f"got shape {tuple(positions.shape)}"
        )
    sections = [int(f.numel()) for f in ladders]
    inv_freq = torch.cat(list(ladders)) if len(ladders) > 1 else ladders[0]
    if layout == "interleaved":
        return torch.ops.posenc.rope_cos_sin(
            positions, inv_freq, 1.0, sections, "contiguous", "interleaved"
        )
    # cat(t, t) per axis: one call per axis (the half layout spans the axis's own width)
    cos, sin = zip(
        *(
            torch.ops.posenc.rope_cos_sin(
                positions[:, a].contiguous(), f, 1.0, [], "contiguous", "half"
            )
            for a, f in enumerate(ladders)
        )
    )
    return torch.cat(cos, -1), torch.cat(sin, -1)


def _tables_for(x: torch.Tensor, freqs_cis, sequence_dim: int):
    if not isinstance(freqs_cis, (tuple, list)) or len(freqs_cis) != 2:
        raise ValueError(
            "posenc.integrations.diffusers.apply_rotary_emb: use_real=True takes "
            f"(cos, sin), got {type(freqs_cis).__name__}"
        )
    cos, sin = freqs_cis
    if sequence_dim not in (1, 2):
        raise ValueError(f"`sequence_dim={sequence_dim}` but should be 1 or 2.")
    if cos.dim() != 2 or sin.shape != cos.shape:
        raise ValueError(
            f"posenc.integrations.diffusers.apply_rotary_emb: cos and sin must be "
            f"[S, D] of one shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if x.dim() != 4:
        raise ValueError(
            f"posenc.integrations.diffusers.apply_rotary_emb: x must be [B, H, S, D] "
            f"or [B, S, H, D], got shape {tuple(x.shape)}"
        )
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if t.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
            raise ValueError(
                f"posenc.integrations.diffusers.apply_rotary_emb: {name} must be "
                f"float32, float64, bfloat16 or float16, got {t.dtype}"
            )
    if cos.shape[0] not in (1, x.shape[sequence_dim]) or cos.shape[1] != x.shape[-1]:
        raise ValueError(
            f"posenc.integrations.diffusers.apply_rotary_emb: tables "
            f"{tuple(cos.shape)} do not fit x {tuple(x.shape)} with sequence_dim "
            f"{sequence_dim} (diffusers broadcasts [S, D] over x's sequence and head "
            f"dims)"
        )
    # diffusers: x.float() * cos, float32 products for bfloat16/float16 tables too; the operator
    # promotes x with the tables, so such tables go in as float32 (exact), never as x's dtype
    half = (torch.bfloat16, torch.float16)
    cos, sin = (t.float() if t.dtype in half else t for t in (cos, sin))
    # diffusers: cos[None, None] (sequence_dim 2) or cos[None, :, None] (1), moved to x's device
    return cos.to(x.device)[None], sin.to(x.device)[None], 1 if sequence_dim == 2 else 2


def _layout(use_real_unbind_dim: int) -> str:
    if use_real_unbind_dim == -1:
        return "interleaved"
    if use_real_unbind_dim == -2:
        return "half"
    raise ValueError(f"`use_real_unbind_dim={use_real_unbind_dim}` but should be -1 or -2.")


def _as_float(x: torch.Tensor) -> torch.Tensor:
    # diffusers' x.float(): exact for bfloat16/float16 (the operator promotes each product the
    # same way), a rounding for float64 (done here)
    return x.float() if x.dtype == torch.float64 else x


def apply_rotary_emb_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    freqs_cis,
    use_real: bool = True,
    use_real_unbind_dim: int = -1,
    sequence_dim: int = 2,
    fused: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """diffusers' apply_rotary_emb of q and of k with the same tables, in one posenc call:
    torch.ops.posenc.apply_rotary, or with `fused` posenc's fused rope_rotate_qk wherever it gives
    the same results and gradients (fused_takes; q, k [B, S, H, D] with tables whose pair members
    are equal, as the families' rotary modules give them)."""
    if not use_real:
        raise ValueError(
            "posenc.integrations.diffusers.apply_rotary_emb: the complex path "
            "(use_real=False) is not computed by posenc"
        )
    layout = _layout(use_real_unbind_dim)
    cos, sin, unsqueeze_dim = _tables_for(q, freqs_cis, sequence_dim)
    if (
        k.device != q.device
        or k.dim() != 4
        or k.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    ):
        raise ValueError(
            f"posenc.integrations.diffusers.apply_rotary_emb: k must be a 4-D "
            f"floating tensor on q's device ({q.device}), got {tuple(k.shape)} "
            f"{k.dtype} on {k.device}"
        )
    q_in, k_in = _as_float(q), _as_float(k)
    # q, k [B, S, H, D]: the fused kernel's layout. Its tables are checked for equal pair members,
    # a data-dependent test that torch.compile cannot trace: compiled code takes apply_rotary.
    if fused and unsqueeze_dim == 2 and not torch.compiler.is_compiling():
        pairs = per_pair_tables(cos, sin, layout)
        if pairs is not None and fused_takes(q_in, k_in, *pairs):
            q_out, k_out = torch.ops.posenc.rope_rotate_qk(q_in, k_in, *pairs, layout, False)
            return q_out.to(q.dtype), k_out.to(k.dtype)
    q_out, k_out = torch.ops.posenc.apply_rotary(q_in, k_in, cos, sin, unsqueeze_dim, layout)
    return q_out.to(q.dtype), k_out.to(k.dtype)


def per_pair_tables(cos: torch.Tensor, sin: torch.Tensor, layout: str):
    """One value per rotary pair ([..., D/2]) from diffusers' tables [..., D] where both members
    of every pair carry the same value (t0 t0 t1 t1 ... for interleaved, cat(t, t) for half, as
    every rotary module of these families gives them), else None."""
    width = cos.shape[-1]
    if width % 2:
        return None
    if layout == "interleaved":
        first, second = (cos[..., 0::2], sin[..., 0::2]), (cos[..., 1::2], sin[..., 1::2])
    else:
        first = (cos[..., : width // 2], sin[..., : width // 2])
        second = (cos[..., width // 2 :], sin[..., width // 2 :])
    if not all(torch.equal(a, b) for a, b in zip(first, second)):
        return None
    return first


def fused_takes(
    q: torch.Tensor, k: torch.Tensor, cos_pairs: torch.Tensor, sin_pairs: torch.Tensor
) -> bool:
    """Whether posenc's fused rope_rotate_qk gives diffusers' results here, forward and backward.

    Its forward is the formula's, product for product (x_a c - x_b s, x_b c + x_a s in the
    promoted dtype, rounded once to x's): equal to the bit in every dtype, for float32 tables.
    Its backward is the same kernel at -angle: equal to the bit for float32/float64 q and k; for
    bfloat16/float16 ones eager autograd rounds each product's gradient to the storage type
    before adding them, which torch.ops.posenc.apply_rotary's backward does and this one does not,
    so where a gradient is recorded for them apply_rotary takes the call (the fused kernel takes
    inference, where it is several times faster than apply_rotary's promoted path). CPU tensors
    only: the CUDA kernel computes x_a c - x_b s as nvcc contracts it (a fused multiply-add, one
    rounding fewer than eager's two kernels), so CUDA tensors take apply_rotary, whose CUDA path is
    the formula in ATen ops, as diffusers computes it."""
    if q.device.type != "cpu" or k.device.type != "cpu":
        return False
    if cos_pairs.dtype != torch.float32 or sin_pairs.dtype != torch.float32:
        return False
    if cos_pairs.requires_grad or sin_pairs.requires_grad:
        return False
    half = q.dtype in (torch.bfloat16, torch.float16) or k.dtype in (torch.bfloat16, torch.float16)
    records = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    return not (half and records)


def apply_rotary_emb(
    x: torch.Tensor,
    freqs_cis,
    use_real: bool = True,
    use_real_unbind_dim: int = -1,
    sequence_dim: int = 2,
) -> torch.Tensor:
    """diffusers' embeddings.apply_rotary_emb (use_real=True), name, signature and result."""
    if not use_real:
        raise ValueError(
            "posenc.integrations.diffusers.apply_rotary_emb: the complex path "
            "(use_real=False) is not computed by posenc"
        )
    layout = _layout(use_real_unbind_dim)
    cos, sin, unsqueeze_dim = _tables_for(x, freqs_cis, sequence_dim)
    # the operator rotates a pair (q, k); k is one head of x, so the second result costs 1/H
    head_dim = 2 if sequence_dim == 1 else 1
    xf = _as_float(x)
    head = xf.narrow(head_dim, 0, 1) if xf.size(head_dim) > 0 else xf
    return torch.ops.posenc.apply_rotary(xf, head, cos, sin, unsqueeze_dim, layout)[0].to(x.dtype)


def same_tables(ours: Sequence[torch.Tensor], theirs: Sequence[torch.Tensor]) -> str | None:
    """Why two (cos, sin) pairs differ (shape, dtype, device or a value), or None."""
    for name, a, b in zip(("cos", "sin"), ours, theirs):
        if b.device.type == "meta":
            return f"its {name} table is on the meta device (not materialised): patch after loading"
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return (
                f"{name} {tuple(b.shape)} {b.dtype} on {b.device} where posenc computes "
                f"{tuple(a.shape)} {a.dtype} on {a.device}"
            )
        if not torch.equal(a, b):
            bad = int((a != b).sum())
            return f"{name} differs from posenc's in {bad} of {a.numel()} values"
    return None

"""Rotary position embedding with transformers' contracts, computed by posenc's operators.

apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
    transformers' function (modeling_llama.py): q * cos + rotate_half(q) * sin, for q and k. The
    same result to the bit (float32, float64, bfloat16, float16): posenc's fused kernel rounds
    each product as eager PyTorch does, and any input it cannot take goes to the formula itself.

RotaryEmbedding.from_hf_config(config, layer_type=None, angle_dtype="float32")
    a rotary module like transformers' <Model>RotaryEmbedding: forward(x, position_ids) ->
    (cos, sin) of shape [B, N, W] in x's dtype, built from a config.json (path, dict or a
    transformers config) as transformers resolves it (posenc/config/hf_config.h): theta, head
    size, partial rotary, every rope_type (linear, dynamic, yarn, longrope, llama3, ...), M-RoPE
    sections (position_ids [3, B, N]), per-layer-type parameters (forward(x, position_ids,
    layer_type)). `.resolved` holds every value with its source. angle_dtype "float32" computes
    the angles as transformers does (equal to the bit); "float64" exactly.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from . import _library

_library.load()
from . import _meta  # noqa: E402,F401  (fake kernels for torch.compile)

__all__ = [
    "apply_rotary_pos_emb",
    "apply_rotary_pos_emb_",
    "rope_cos_sin",
    "hf_rope",
    "RotaryEmbedding",
]


def apply_rotary_pos_emb(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: Any = None,
    unsqueeze_dim: int = 1,
    *,
    layout: str = "half",
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' apply_rotary_pos_emb: returns (q * c + rot(q) * s, k * c + rot(k) * s).

    q: [B, Hq, N, D], k: [B, Hk, N, D] (unsqueeze_dim=1) or [B, N, H, D] (unsqueeze_dim=2);
    cos, sin: [B, N, W] with W <= D (dims W.. pass through: partial rotary). layout "half"
    (rotate_half) or "interleaved" (rotate_every_two: GPT-J, GLM). position_ids: accepted for
    the older signature and unused, as in transformers. Grouped-query heads (Hq != Hk) and tables
    [1, N, W] broadcast over the batch. Equal to transformers' function to the bit in float32,
    float64, bfloat16 and float16 (the same products and sums, rounded as its eager code rounds
    them); gradients for q, k and the tables.
    """
    if isinstance(position_ids, int) and unsqueeze_dim == 1:  # called positionally, new signature
        unsqueeze_dim, position_ids = position_ids, None
    return torch.ops.posenc.apply_rotary(q, k, cos, sin, unsqueeze_dim, layout)


def apply_rotary_pos_emb_(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
    *,
    layout: str = "half",
) -> None:
    """In place (inference, KV-cache writes): q and k are overwritten; records no gradient.

    The arguments are apply_rotary_pos_emb's. With autograd on and an input that needs a
    gradient, one line (use apply_rotary_pos_emb); q or k whose elements share memory (an
    expanded view), q and k that overlap, and tables that overlap them are refused in one line.
    """
    torch.ops.posenc.apply_rotary_(q, k, cos, sin, unsqueeze_dim, layout)


def rope_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    attention_scaling: float = 1.0,
    mrope_section: Sequence[int] = (),
    section_layout: str = "contiguous",
    layout: str = "half",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables [..., N, 2F] float32 for positions [..., N] (or [..., N, A] with mrope_section).

    inv_freq [F]: float32 frequencies compute the angles as transformers does (float32 products,
    its rounding); float64 ones exactly (rounded once to float32). attention_scaling multiplies
    both tables (YaRN's and LongRoPE's factor). mrope_section (Qwen2-VL's M-RoPE): the number of
    frequencies each position axis takes, section_layout "contiguous" (Qwen2-VL's runs) or
    "interleaved" (Qwen3-VL's t h w t h w ...). layout "half": each row cat(t, t), as
    transformers' rotary modules return it; "interleaved": t0 t0 t1 t1 ... (GPT-J's pairs).
    """
    return torch.ops.posenc.rope_cos_sin(
        positions, inv_freq, float(attention_scaling), list(mrope_section), section_layout, layout
    )


def rope_rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str = "half",
    inverse: bool = False,
) -> torch.Tensor:
    """The C++ library's fused rotation, the operator its encoders and trainer call.

    x: [B, N, H, Dh] (tokens before heads, as posenc's C++ attention lays them out); cos, sin:
    per-pair float32 tables [N, F] or [B or 1, N, F], F <= Dh/2 (the first half of a
    transformers table for the half layout, its even columns for the interleaved one).
    (x_a, x_b) -> (x_a cos - x_b sin, x_b cos + x_a sin) over pairs (i, i+F) or (2i, 2i+1); dims
    2F.. pass through; inverse rotates by -angle. Result contiguous, in x's dtype.
    """
    return torch.ops.posenc.rope_rotate(x, cos, sin, layout, inverse)


def rope_rotate_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str = "half",
    inverse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rope_rotate of q and k sharing the tables (one pass; head counts may differ)."""
    return torch.ops.posenc.rope_rotate_qk(q, k, cos, sin, layout, inverse)


def _config_dict(config: Any) -> dict:
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"posenc: no config file at {path}")
        with open(path, encoding="utf-8") as f:
            try:
                return json.load(f)
            except ValueError as e:
                raise ValueError(f"posenc: {path} is not JSON: {e}") from None
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_json_string"):  # a transformers PretrainedConfig
        return json.loads(config.to_json_string(use_diff=False))
    raise TypeError(
        f"posenc: a config is a path, a dict or a transformers config, got {type(config).__name__}"
    )


def hf_rope(
    config: Any, layer_type: str | None = None, angle_dtype: str = "float32", seq_len: int = -1
) -> tuple[torch.Tensor, float, dict]:
    """(inv_freq, attention_scaling, resolution) for a config.json, as transformers resolves it.

    config: a config.json path (or its folder), a dict or a transformers config; every model type
    of docs/hf_architectures.md resolves as transformers resolves it (the keys it reads, their
    defaults, legacy rope_scaling blocks), or is refused in one line with the reason. layer_type:
    a layer type with its own rope_parameters (Gemma 3's "sliding_attention"). angle_dtype
    "float32" (transformers' arithmetic, to the bit) or "float64" (exact). seq_len: the sequence
    length for the types whose frequencies change with it (dynamic, longrope; -1: the context).
    resolution: every value with its source and the warnings, as `posenc inspect --hf-config`
    prints them.
    """
    origin = os.fspath(config) if isinstance(config, (str, os.PathLike)) else "config.json"
    text = json.dumps(_config_dict(config), allow_nan=True)
    inv_freq, scaling, resolution = torch.ops.posenc.hf_rope(
        text, layer_type or "", angle_dtype, int(seq_len), origin
    )
    return inv_freq, scaling, json.loads(resolution)


def _layer_types(cfg: dict) -> list[str]:
    """The layer types with their own rope_parameters (Gemma 3, ...), sorted as transformers does.
    full_attention with parameters is kept even where layer_types does not list it: Gemma 4's
    config class makes the last layer full attention whatever the file lists."""
    for c in (cfg, cfg.get("text_config") or {}):
        params, types = c.get("rope_parameters"), c.get("layer_types")
        if (
            isinstance(params, dict)
            and types
            and params
            and set(params) & set(types)
            and all(isinstance(v, dict) or v is None for v in params.values())
        ):
            listed = set(types) | ({"full_attention"} & set(params))
            return sorted(t for t in listed if params.get(t) is not None)
    return []


class _Table:
    """One layer type's frequencies and the state transformers' dynamic_rope_update keeps."""

    def __init__(self, config_text: dict, layer_type: str, angle_dtype: str):
        self.layer_type = layer_type
        inv_freq, self.attention_scaling, self.resolved = hf_rope(
            config_text, layer_type, angle_dtype
        )
        self.inv_freq = inv_freq
        c = self.resolved["config"]
        self.rope_type = c.get("rope_type", "default")
        self.layout = c.get("layout", "half")
        self.mrope_section = list(c.get("mrope_section", []))
        self.section_layout = c.get("section_layout", "contiguous")
        # the coordinate axis each section reads (a vision tower's columns first: Step 3.7's,
        # Inkling 2's, Kimi-K2.5's); inv_freq comes in pair order (Pixtral's dealt ladder too)
        self.section_axes = list(c.get("section_axes", []))
        # angle = (s p) inv_freq: DINOv3's 2 pi over patch centres in [-1, 1]
        self.position_scale = float(c.get("position_scale", 1.0))
        self.max_position_embeddings = int(c.get("max_position_embeddings", 0) or 0)
        self.original_max = (
            int(c.get("original_max_position_embeddings", 0) or 0) or self.max_position_embeddings
        )
        self.max_seq_len_cached = self.max_position_embeddings
        self.long_inv_freq = None


class RotaryEmbedding(nn.Module):
    """transformers' rotary-module contract: forward(x, position_ids[, layer_type]) -> (cos, sin).

    Build it with from_hf_config. cos/sin: [B, N, W] in x's dtype (W = rotary_dim); position_ids
    [B, N] (or [3, B, N] / [B, N] broadcast to every axis for M-RoPE sections: Qwen2-VL's t, h, w).
    The tables' order: table_order "layout" (default) lays each pair's value where the layout
    rotates it (half: cat(t, t); interleaved: t0 t0 t1 t1 ...), what posenc.apply_rotary_pos_emb
    takes with that layout; "transformers" is cat(t, t) for every layout, what every transformers
    rotary module returns (GLM's apply_rotary_pos_emb re-interleaves it itself); "pairs" is one
    value per pair, t ([B, N, W/2]), what gpt-oss's module returns.

    The buffers follow model.to(dtype) as transformers' do: with float32 angles, inv_freq is read
    as inv_freq.float() (a bfloat16-cast model turns at bfloat16-rounded frequencies, as its own
    rotary module does). float64 angles need float64 frequencies: a buffer cast to another dtype
    is refused with one line. table_dtype "input" (default) returns the tables in x's dtype, as
    most transformers modules do; "float32" keeps them float32 whatever x is (OLMo's, Ernie's).
    """

    def __init__(
        self,
        config: Any,
        layer_type: str | None = None,
        angle_dtype: str = "float32",
        table_order: str = "layout",
        table_dtype: str = "input",
    ):
        super().__init__()
        if table_dtype not in ("input", "float32"):
            raise ValueError(
                f"posenc.RotaryEmbedding: table_dtype must be 'input' or 'float32', "
                f"got {table_dtype!r}"
            )
        self.table_dtype = table_dtype
        if angle_dtype not in ("float32", "float64"):
            raise ValueError(
                f"posenc.RotaryEmbedding: angle_dtype must be 'float32' or 'float64', "
                f"got {angle_dtype!r}"
            )
        if table_order not in ("layout", "transformers", "pairs"):
            raise ValueError(
                f"posenc.RotaryEmbedding: table_order must be 'layout', "
                f"'transformers' or 'pairs', got {table_order!r}"
            )
        cfg = _config_dict(config)
        self._config = cfg
        self.angle_dtype = angle_dtype
        self.table_order = table_order
        types = [layer_type] if layer_type else _layer_types(cfg)
        self.layer_types = types
        self._tables = {t: _Table(cfg, t, angle_dtype) for t in (types or [""])}
        for table in self._tables.values():  # what `posenc inspect --hf-config` prints as warnings
            for line in table.resolved.get("warnings", []):
                warnings.warn(f"posenc: {line}", stacklevel=3)
        for name, table in self._tables.items():  # transformers' buffer names
            self.register_buffer(self._buffer(name), table.inv_freq, persistent=False)
            # the frequencies at construction (transformers' original_inv_freq, which dynamic
            # NTK returns to; named apart so that transformers' _init_weights, which recomputes
            # any module with an `original_inv_freq` by its own rope functions, leaves this one be)
            self.register_buffer(
                self._buffer(name, "initial_inv_freq"), table.inv_freq.clone(), persistent=False
            )

    @classmethod
    def from_hf_config(
        cls,
        config: Any,
        layer_type: str | None = None,
        angle_dtype: str = "float32",
        table_order: str = "layout",
        table_dtype: str = "input",
    ) -> RotaryEmbedding:
        """From a config.json path (or its folder), a dict, or a transformers config.

        Resolved as transformers resolves it (every model type of docs/hf_architectures.md, else
        one line with the reason); .resolved holds every value with its source and the warnings
        (as `posenc inspect --hf-config` prints them), .attention_scaling and .rotary_dim the two
        numbers a caller needs. Per-layer-type parameters (Gemma 3): forward(x, position_ids,
        layer_type). dynamic and longrope change their frequencies with the sequence length
        exactly as transformers' dynamic_rope_update does (growth, reset below the context, the
        long/short switch). angle_dtype "float64" computes the angles exactly instead of as
        transformers does; "float32" (default) gives transformers' tables to the bit.
        """
        return cls(
            config,
            layer_type=layer_type,
            angle_dtype=angle_dtype,
            table_order=table_order,
            table_dtype=table_dtype,
        )

    @staticmethod
    def _buffer(layer_type: str, what: str = "inv_freq") -> str:
        return f"{layer_type}_{what}" if layer_type else what

    def _table(self, layer_type: str | None) -> _Table:
        if layer_type is None:
            if len(self._tables) != 1:
                raise ValueError(
                    f"posenc.RotaryEmbedding: this config has per-layer-type rotary "
                    f"parameters; pass layer_type, one of {sorted(self._tables)}"
                )
            return next(iter(self._tables.values()))
        if layer_type in self._tables:
            return self._tables[layer_type]
        if "" in self._tables:  # one table for every layer type
            return self._tables[""]
        raise ValueError(
            f"posenc.RotaryEmbedding: no rotary parameters for layer type "
            f"'{layer_type}'; known: {sorted(self._tables)}"
        )

    @property
    def resolved(self) -> dict:
        """The resolution (every value and its source, warnings), per layer type when nested."""
        if len(self._tables) == 1:
            return next(iter(self._tables.values())).resolved
        return {t: table.resolved for t, table in self._tables.items()}

    @property
    def attention_scaling(self) -> float:
        """The factor both tables carry (YaRN's and LongRoPE's; 1.0 for most types)."""
        return self._table(None).attention_scaling

    @property
    def rotary_dim(self) -> int:
        """W, the width of the tables: the head dims that rotate (partial rotary: fewer)."""
        return int(next(iter(self._tables.values())).resolved["rotary_dim"])

    # transformers' dynamic_rope_update, for the two types that change with the sequence length.
    def _update(self, table: _Table, name: str, position_ids: torch.Tensor, device) -> None:
        if table.rope_type == "dynamic":
            seq_len = int(torch.max(position_ids)) + 1
            cached = table.max_seq_len_cached
            if seq_len > cached:  # growth
                inv_freq, table.attention_scaling, _ = hf_rope(
                    self._config, table.layer_type, self.angle_dtype, seq_len
                )
                setattr(self, name, inv_freq.to(device))
                table.max_seq_len_cached = seq_len
            if seq_len < table.max_position_embeddings and cached > table.max_position_embeddings:
                original = getattr(self, self._buffer(table.layer_type, "initial_inv_freq"))
                setattr(self, name, original.to(device))  # reset
                table.max_seq_len_cached = table.max_position_embeddings
        elif table.rope_type == "longrope":
            seq_len = torch.max(position_ids) + 1
            if table.long_inv_freq is None:
                table.long_inv_freq, _, _ = hf_rope(
                    self._config, table.layer_type, self.angle_dtype, table.original_max + 1
                )
            long_inv = table.long_inv_freq.to(device)  # a plain attribute, as in transformers
            short_inv = getattr(self, self._buffer(table.layer_type, "initial_inv_freq")).to(device)
            getattr(self, name).copy_(
                torch.where(seq_len > table.original_max, long_inv, short_inv)
            )

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [B, N, W] in x's dtype (table_dtype "float32": float32) for position_ids
        [B, N] ([3, B, N] or [B, N] with M-RoPE sections); x gives only the dtype and device."""
        table = self._table(layer_type)
        name = self._buffer(table.layer_type)
        self._update(table, name, position_ids, x.device)
        inv_freq = getattr(self, name)
        if self.angle_dtype == "float32":  # transformers' self.inv_freq[...].float()
            inv_freq = inv_freq.float()
        elif inv_freq.dtype != torch.float64:
            raise ValueError(
                f"posenc.RotaryEmbedding: angle_dtype 'float64' needs float64 "
                f"frequencies, but the '{name}' buffer was cast to {inv_freq.dtype} "
                f"(model.to(dtype)); build the module after the cast, or use "
                f"angle_dtype='float32', which follows the cast as transformers does"
            )
        positions = position_ids
        if not table.mrope_section and positions.dim() == 3:
            # [A, B, N] axes without sections: a 1D table per axis is not what the model does
            raise ValueError(
                f"posenc.RotaryEmbedding: position_ids has {positions.shape[0]} axes "
                f"(shape {tuple(positions.shape)}) but the resolved config has no "
                f"mrope_section to give each axis its pairs; give the model's "
                f"mrope_section in rope_parameters, or [B, N] positions"
            )
        if table.mrope_section:
            axes = len(table.mrope_section)
            if positions.dim() == 2:  # text only: the same position on every axis
                positions = positions.unsqueeze(0).expand(axes, -1, -1)
            positions = positions.permute(1, 2, 0)  # [A, B, N] -> [B, N, A]
            if table.section_axes:  # section a reads axis section_axes[a]
                positions = positions[..., table.section_axes]
        if table.position_scale != 1.0:  # (s p) first, in the angles' dtype, as transformers
            positions = positions.to(inv_freq.dtype) * table.position_scale
        order = table.layout if self.table_order == "layout" else "half"
        cos, sin = rope_cos_sin(
            positions.to(inv_freq.device),
            inv_freq,
            1.0,
            table.mrope_section,
            table.section_layout,
            order,
        )
        if self.table_order == "pairs":  # cat(t, t) -> t
            half = cos.shape[-1] // 2
            cos, sin = cos[..., :half].contiguous(), sin[..., :half].contiguous()
        # transformers' `emb.cos() * attention_scaling`, the same float32 product; outside the
        # operator so that torch.compile keeps the scaling out of the operator's arguments (a
        # symbolic float there specializes the backward's sizes: a recompile per length)
        scaling = table.attention_scaling
        if scaling != 1.0:
            cos, sin = cos * scaling, sin * scaling
        if self.table_dtype == "float32":
            return cos.float(), sin.float()
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)

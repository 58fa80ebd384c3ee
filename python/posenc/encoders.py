"""posenc's encoders as nn.Modules: the same JSON/YAML configs as the C++ library and the tool.

    enc = posenc.build_encoder({"type": "rope", "mrope_section": [8, 8]}, dim=64, num_heads=2)
    plan = enc(posenc.Positions.grid(4, 4))      # one plan per set of positions
    x = plan.add(x)                              # the additive entry: x [B, N, D]
    q, k = plan.rotate(q, k)                     # the rotary entry: q, k [B, H, N, Dh] (layout="bhnd")
    bias = plan.bias(heads)                      # the bias entry: [H, Nq, Nk] (or [B, H, Nq, Nk]), or None
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

An encoder enters attention in one of three places (added to the embeddings, rotating q and k,
biasing the logits); a plan holds the parts of every encoder of the config (a "compose" config
stacks several), so a model never asks which encoder it holds. The C++ module is built by
torch.classes.posenc.Encoder (src/bindings/encoders.cpp); its parameters and buffers are the tensors
of this module (stepped in place by any torch.optim optimizer, moved by .to(), saved by
state_dict under the C++ names with "." written "_"; copied, pickled and saved with torch.save as
a module is, rebuilt from its config). Positions are float coordinates with named
axes (posenc.Positions): a token index "t", a patch's "h" and "w", a timestamp, a frame.
"""

from __future__ import annotations

import functools
import json
import math
import os
import warnings
from collections.abc import Iterable, Sequence

import torch

from .routes import AttentionRoute

__all__ = ["Positions", "Plan", "Encoder", "build_encoder"]


class Positions:
    """Coordinates with named axes: coords [N, A] or [B, N, A] (float64), axes A distinct names.

    Builders as in C++ (posenc/core/positions.h): sequence(n) on "t", grid(h, w) row-major on
    ("h", "w"), volume(t, h, w) frame-major on ("t", "h", "w"), values([...]) on one axis.
    """

    def __init__(self, coords: torch.Tensor, axes: Sequence[str]):
        if not isinstance(coords, torch.Tensor):
            coords = torch.as_tensor(coords, dtype=torch.float64)
        if coords.dim() not in (2, 3):
            raise ValueError(
                f"posenc.Positions: coords must be [N, A] or [B, N, A], got shape "
                f"{tuple(coords.shape)}"
            )
        if not coords.is_floating_point():
            coords = coords.to(torch.float64)
        axes = tuple(axes) if not isinstance(axes, str) else (axes,)
        if len(axes) != coords.shape[-1]:
            raise ValueError(
                f"posenc.Positions: coords have {coords.shape[-1]} axes (last dim) "
                f"but {len(axes)} axis names were given {axes}"
            )
        if len(set(axes)) != len(axes) or not all(isinstance(a, str) and a for a in axes):
            raise ValueError(
                f"posenc.Positions: axis names must be distinct non-empty strings, got {axes}"
            )
        self.coords = coords
        self.axes = axes

    @staticmethod
    def sequence(length: int, offset: float = 0.0, axis: str = "t") -> Positions:
        if length < 0:
            raise ValueError(f"posenc.Positions.sequence: length must be >= 0, got {length}")
        return Positions(torch.arange(length, dtype=torch.float64).add_(offset)[:, None], (axis,))

    @staticmethod
    def values(values: Iterable[float], axis: str = "t") -> Positions:
        return Positions(torch.as_tensor(list(values), dtype=torch.float64).reshape(-1, 1), (axis,))

    @staticmethod
    def grid(height: int, width: int) -> Positions:
        if height <= 0 or width <= 0:
            raise ValueError(
                f"posenc.Positions.grid: height and width must be positive, got {height} x {width}"
            )
        rows = torch.arange(height, dtype=torch.float64).repeat_interleave(width)
        cols = torch.arange(width, dtype=torch.float64).repeat(height)
        return Positions(torch.stack([rows, cols], 1), ("h", "w"))

    @staticmethod
    def volume(frames: int, height: int, width: int) -> Positions:
        if frames <= 0 or height <= 0 or width <= 0:
            raise ValueError(
                f"posenc.Positions.volume: frames, height and width must be positive, "
                f"got {frames} x {height} x {width}"
            )
        plane = Positions.grid(height, width).coords.repeat(frames, 1)
        t = torch.arange(frames, dtype=torch.float64).repeat_interleave(height * width)[:, None]
        return Positions(torch.cat([t, plane], 1), ("t", "h", "w"))

    def __len__(self) -> int:
        return self.coords.shape[-2]

    def __repr__(self) -> str:
        return f"Positions[N={len(self)}, axes=({', '.join(self.axes)})]"


def _to_cpp(t: torch.Tensor, layout: str) -> torch.Tensor:  # [B, H, N, Dh] -> [B, N, H, Dh] view
    return t.transpose(1, 2) if layout == "bhnd" else t


def _key_padding(mask: torch.Tensor) -> torch.Tensor:
    """key_padding as bool (True: a real key); integer 0 / 1 as transformers' attention_mask."""
    if not isinstance(mask, torch.Tensor):
        raise ValueError(
            f"posenc Plan.attention: key_padding must be a tensor, got {type(mask).__name__}"
        )
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point() or mask.is_complex():
        raise ValueError(
            f"posenc Plan.attention: key_padding must be bool or integer (True / 1 "
            f"= a real key, 0 = padding), got {mask.dtype}; an additive float mask "
            f"(0 keep, -inf pad) is not taken: pass mask == 0"
        )
    if (
        mask.numel() > 0
        and mask.device.type != "meta"
        and not bool(((mask == 0) | (mask == 1)).all())
    ):
        raise ValueError(
            f"posenc Plan.attention: key_padding values must be 0 or 1, got values "
            f"in [{int(mask.min())}, {int(mask.max())}]"
        )
    return mask.to(torch.bool)


_PLAN_NOT_COPIED = (
    "posenc Plan: a plan cannot be copied or pickled: it is one forward's tables, tied to its "
    "encoder's tensors through autograd; copy or pickle the Encoder (or the model holding it) and "
    "call it on the positions again"
)


class Plan:
    """One forward's parts of an encoder: add (embeddings), rotate (q, k), bias (logits)."""

    def __init__(self, cpp, layout: str):
        self._plan = cpp
        self._layout = layout

    def __copy__(self) -> Plan:  # the same C++ plan: a plan is only read
        return Plan(self._plan, self._layout)

    def __deepcopy__(self, memo) -> Plan:
        raise ValueError(_PLAN_NOT_COPIED)

    def __reduce_ex__(self, protocol):  # pickle, torch.save, multiprocessing
        raise ValueError(_PLAN_NOT_COPIED)

    def add(self, x: torch.Tensor, prefix: int = 0) -> torch.Tensor:
        """x [B, N, D] plus the additive embedding; the first `prefix` tokens (a class token) as
        they are. Without an additive part, x itself."""
        return self._plan.add(x, int(prefix))

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k rotated by the plan's RoPE (q and k as they are without a rotary part); layout
        "bhnd" [B, H, N, Dh] (SDPA's, transformers') or "bnhd" [B, N, H, Dh] (posenc's)."""
        if q.dim() != 4 or k.dim() != 4:
            raise ValueError(
                f"posenc Plan.rotate: q and k must be 4-D ({self._layout}), got "
                f"{tuple(q.shape)} and {tuple(k.shape)}"
            )
        qr, kr = self._plan.rotate(_to_cpp(q, self._layout), _to_cpp(k, self._layout))
        return _to_cpp(qr, self._layout), _to_cpp(kr, self._layout)

    def bias(self, heads: int, q: torch.Tensor | None = None) -> torch.Tensor | None:
        """Every bias part summed: [H, Nq, Nk] (or [B, H, Nq, Nk]), an additive attn_mask for
        scaled_dot_product_attention; None without one. q (in the plan's layout) for biases that
        depend on it (Shaw's key-side term)."""
        if not self._plan.has_bias():
            return None
        bias = self._plan.bias(
            int(heads), _to_cpp(q, self._layout) if q is not None else torch.empty(0)
        )
        if bias.shape[-3] != heads:  # a table of its own head count (T5's num_heads)
            raise ValueError(
                f"posenc Plan.bias: the plan's bias has {bias.shape[-3]} heads "
                f"(shape {tuple(bias.shape)}) but heads={heads} was asked for"
            )
        return bias

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = False,
        key_padding: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:
        """softmax(rot(q) rot(k)^T * scale + bias + masks) v with the plan's positions, in the
        plan's layout ("bhnd": q [B, H, Nq, Dh], k [B, H, Nk, Dh], v [B, H, Nk, Dv]; "bnhd":
        tokens before heads), q, k as projected (unrotated). The C++ layers' backend choice
        (attention_route says which and why): the short-sequence kernel (N <= 64, no bias),
        SDPA (no bias), posenc's fused kernel with the bias computed inside its tiles (ALiBi, T5,
        Shaw on one axis of positions, any real values: timestamps too; RoPE inside), else the
        materialized bias (the reference: what scaled_dot_product_attention(*rotate(q, k), v,
        attn_mask=bias(H)) computes). The plan covers Nq queries and Nk keys (keys given to the
        encoder apart; causal: the queries are the last Nq keys). key_padding [B, Nk] bool, True
        at a real key (or integer 1 / 0, as transformers' attention_mask; a float mask is refused:
        an additive 0 / -inf mask would read inverted); scale None is 1/sqrt(Dh) (1 for Dh = 0,
        where the dot products are empty and SDPA's logits are the bias alone). Gradients for q,
        k, v and the encoder's parameters (eager; torch.compile breaks the graph here)."""
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise ValueError(
                f"posenc Plan.attention: q, k, v must be 4-D ({self._layout}), got "
                f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
            )
        if scale is None:
            scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] > 0 else 1.0
        scale = float(scale)
        padding = _key_padding(key_padding) if key_padding is not None else torch.empty(0)
        y = self._plan.attention(
            _to_cpp(q, self._layout),
            _to_cpp(k, self._layout),
            _to_cpp(v, self._layout),
            bool(causal),
            padding,
            scale,
        )
        return _to_cpp(y, self._layout)

    def attention_route(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = False,
        key_padding: bool = False,
    ) -> AttentionRoute:
        """The backend attention() takes for these inputs and why the ones before it were
        passed over, as a posenc.AttentionRoute: ``taken`` ("short_rotary", "short", "sdpa",
        "fused", "reference"), ``rope_inside``, ``not_taken`` ((backend, why) in priority order);
        ``str(route)`` is the C++ line, e.g. "fused with RoPE inside (short_rotary: the plan has a
        bias; ...)"."""
        return AttentionRoute.from_plan(
            self._plan.attention_route(
                _to_cpp(q, self._layout),
                _to_cpp(k, self._layout),
                _to_cpp(v, self._layout),
                bool(causal),
                bool(key_padding),
            )
        )

    @property
    def parts(self) -> list[str]:
        """ "encoder: role" per contribution ("rope: rotary", "alibi: bias (alibi)", ...)."""
        return list(self._plan.parts())


@functools.cache
def _config_limits() -> tuple[int, int, int]:
    """The C++ library's config limits (posenc/config/config_reader.h): bytes, depth, values."""
    limits = torch.classes.posenc.ConfigLimits()
    return limits.max_bytes(), limits.max_depth(), limits.max_values()


_WHO = "posenc.build_encoder config"  # the origin the C++ library names in its errors


def _config_text(config: dict) -> str:
    """A config dict as JSON text, within the C++ library's config limits (depth, values, bytes of
    keys and strings), checked by a walk without recursion before json.dumps expands it: a dict
    that shares sub-lists (yaml.safe_load's aliases: a 492-byte "billion laughs" file), nests
    50000 deep or holds itself is the C++ library's one line (RuntimeError), not json.dumps
    running for hours or a RecursionError."""
    max_bytes, max_depth, max_values = _config_limits()
    stack = [(config, 0)]
    values = size = 0
    while stack:
        value, depth = stack.pop()
        values += 1
        if values > max_values:
            raise RuntimeError(f"{_WHO}: more than {max_values} values (the config size limit)")
        if depth > max_depth:
            raise RuntimeError(
                f"{_WHO}: nested deeper than {max_depth} levels (the config depth limit)"
            )
        if isinstance(value, str):
            size += len(value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, dict):
            size += sum(len(str(key).encode("utf-8", "surrogatepass")) for key in value)
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend((item, depth + 1) for item in value)
        if size > max_bytes:
            raise RuntimeError(
                f"{_WHO}: more than {max_bytes} bytes in its keys and strings (the "
                f"config size limit)"
            )
        if len(stack) > max_values:  # a list longer than the limit, before it is walked
            raise RuntimeError(f"{_WHO}: more than {max_values} values (the config size limit)")
    return json.dumps(config)


def _read_config_file(path: str) -> str:
    """A config file's text, read no further than the config size limit (the C++ library parses
    it: JSON, or YAML with its aliases counted as they expand)."""
    max_bytes = _config_limits()[0]
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise RuntimeError(
            f"{path}: {os.path.getsize(path)} bytes; configs are limited to "
            f"{max_bytes} bytes (the config size limit)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RuntimeError(
            f"{path}: byte {e.start} is not valid UTF-8; a config is UTF-8 text"
        ) from None


def _take(enc, cpp_name: str, own: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The C++ module's tensor `own` holding `value` (its storage, dtype and device; its
    requires_grad and .grad): the tensor a Python module keeps in its _parameters / _buffers."""
    with torch.no_grad():
        enc.set_data(cpp_name, value)
    own.requires_grad_(value.requires_grad)
    if value.grad is not None:
        own.grad = value.grad
    return own


def _self_contained(config_text: str) -> str:
    """The config (JSON text) with each hf part's config file read into it: a copy of the encoder
    is built from what the original read, not from a file that may have changed or moved since."""
    config = json.loads(config_text)
    stack = [config]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            path = value.get("config")
            if value.get("type") == "hf" and isinstance(path, str):
                try:
                    value["config"] = json.loads(_read_config_file(path))
                except (OSError, RuntimeError, ValueError):  # YAML, or gone: the path, absolute
                    value["config"] = os.path.abspath(path)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return json.dumps(config)


class Encoder(torch.nn.Module):
    """A posenc encoder (posenc.build_encoder); forward(positions, keys=None) -> Plan.

    config: a dict, or its text (JSON or YAML), read by the C++ library under its config limits.

    copy.deepcopy, pickle and torch.save / torch.load(weights_only=False) of it or of a model
    holding it (AveragedModel, EMA, DataLoader workers, spawn) rebuild the C++ module from the
    config (an hf part's config file as it was read at build) with the original's tensors: the
    same values, dtype, device and requires_grad, in storage of its own. The C++ module computes
    with its own tensors only: one put in their place (setattr, torch.func.functional_call) is
    refused at forward, load_state_dict(assign=True) gives its values to them, and .to("meta") is
    refused (they move in place, between devices with storage). A Plan is not copied: call the
    copied encoder on the positions again.
    """

    def __init__(
        self,
        config: dict | str,
        dim: int = 0,
        num_heads: int = 0,
        head_dim: int = 0,
        layout: str = "bhnd",
    ):
        super().__init__()
        if layout not in ("bhnd", "bnhd"):
            raise ValueError(
                f"posenc.build_encoder: layout must be 'bhnd' or 'bnhd', got {layout!r}"
            )
        self.layout = layout
        text = config if isinstance(config, str) else _config_text(config)
        self._enc = torch.classes.posenc.Encoder(text, int(dim), int(num_heads), int(head_dim))
        self.config = dict(config) if isinstance(config, dict) else json.loads(self._enc.config())
        # what a copy is rebuilt from (__setstate__): the config as read, files it names read now
        self._build = (_self_contained(self._enc.config()), int(dim), int(num_heads), int(head_dim))
        self.type = self._enc.type()
        self._names = {}  # python name -> C++ name
        for name, t in zip(self._enc.parameter_names(), self._enc.parameters()):
            self._names[name.replace(".", "_")] = name
            self._parameters[name.replace(".", "_")] = t  # the C++ module's own tensor
        for name, t in zip(self._enc.buffer_names(), self._enc.buffers()):
            self._names[name.replace(".", "_")] = name
            self._buffers[name.replace(".", "_")] = t
        self._own = self._tensors()  # what the C++ module computes with, by python name

    def _tensors(self) -> dict:
        return {**self._parameters, **self._buffers}

    def _check_own(self):
        """A tensor put in the module's place (setattr, torch.func.functional_call) is one the C++
        module never reads: refused, not computed silently with the module's own."""
        tensors = self._tensors()
        for name, own in self._own.items():
            if tensors.get(name) is not own:
                raise ValueError(
                    f"posenc Encoder: '{name}' was replaced by a tensor the C++ module does not "
                    f"hold (setattr, torch.func.functional_call); it computes with its own tensors "
                    f"only: change them in place (copy_, load_state_dict, an optimizer)"
                )

    def forward(
        self,
        positions: Positions,
        keys: Positions | None = None,
        device: torch.device | str | None = None,
    ) -> Plan:
        self._check_own()
        if not isinstance(positions, Positions):
            raise ValueError(
                f"posenc Encoder: positions must be posenc.Positions, got "
                f"{type(positions).__name__}"
            )
        if keys is not None and keys.axes != positions.axes:
            raise ValueError(
                f"posenc Encoder: keys have axes {keys.axes}, queries {positions.axes}"
            )
        if device is None:
            tensors = list(self._parameters.values()) + list(self._buffers.values())
            device = tensors[0].device if tensors else positions.coords.device
        plan = self._enc.plan(
            positions.coords,
            list(positions.axes),
            keys.coords if keys is not None else torch.empty(0),
            str(torch.device(device)),
        )
        return Plan(plan, self.layout)

    def train(self, mode: bool = True):
        self._enc.train(bool(mode))
        return super().train(mode)

    def _apply(self, fn, recurse=True):
        # the C++ module keeps its tensors: move them in place (set_data), as LibTorch's to() does;
        # every move is checked before the first is made (a refused one leaves the module as it was)
        with torch.no_grad():
            moves = []
            for store in (self._parameters, self._buffers):
                for name, t in store.items():
                    new = fn(t)
                    if new is not t and not torch._has_compatible_shallow_copy_type(t, new):
                        raise ValueError(
                            f"posenc Encoder: cannot move '{name}' ({t.device}, {t.dtype}) to "
                            f"{new.device} ({new.dtype}): the C++ module's tensors are moved in "
                            f"place (set_data), which takes devices with storage (cpu, cuda), "
                            f"not {new.device.type}"
                        )
                    moves.append((name, t, new))
            for name, t, new in moves:
                if new is not t:
                    self._enc.set_data(self._names[name], new)
                if isinstance(t, torch.Tensor) and t.grad is not None:
                    t.grad = fn(t.grad)
        return self

    # copy.deepcopy, pickle, torch.save (and AveragedModel, DataLoader workers, spawn): the C++
    # module is no Python object; a copy is built again from the config and takes the tensors of
    # the state (deep-copied or unpickled: values, dtype, device, requires_grad, .grad) as its C++
    # module's own (set_data), so its optimizers, .to() and state_dict work as the original's.
    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_enc"], state["_own"]
        return state

    def __setstate__(self, state):
        text, dim, num_heads, head_dim = state["_build"]
        with warnings.catch_warnings():  # an hf config's warnings were given to the original
            warnings.simplefilter("ignore")
            enc = torch.classes.posenc.Encoder(text, dim, num_heads, head_dim)
        own = dict(zip(enc.parameter_names(), enc.parameters()))
        own.update(zip(enc.buffer_names(), enc.buffers()))
        names = state["_names"]
        stores = {store: dict(state[store]) for store in ("_parameters", "_buffers")}
        for store in stores.values():
            for name, value in store.items():
                t = own.get(names.get(name, ""))
                if t is None or not isinstance(value, torch.Tensor) or t.shape != value.shape:
                    raise ValueError(
                        f"posenc Encoder: cannot rebuild the copy: its {enc.type()} config builds "
                        f"'{name}' as {None if t is None else tuple(t.shape)}, the state holds "
                        f"{tuple(value.shape) if isinstance(value, torch.Tensor) else value}"
                    )
                if not torch._has_compatible_shallow_copy_type(t, value):  # torch.load to "meta"
                    raise ValueError(
                        f"posenc Encoder: cannot rebuild the copy: '{name}' is on {value.device}, "
                        f"the C++ module's tensors take values on devices with storage (cpu, cuda)"
                    )
                store[name] = _take(enc, names[name], t, value)
        enc.train(bool(state.get("training", True)))
        super().__setstate__({**state, **stores})
        self._enc = enc
        self._own = self._tensors()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, *args):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, *args)
        # load_state_dict(assign=True) puts the state's tensors in the module's place: the C++
        # module's own tensors take them (set_data: dtype, device, requires_grad as the state's)
        for store in (self._parameters, self._buffers):
            for name, t in store.items():
                own = self._own[name]
                if t is not own:
                    if not torch._has_compatible_shallow_copy_type(own, t) or t.shape != own.shape:
                        store[name] = own
                        raise ValueError(
                            f"posenc Encoder: cannot assign '{name}' ({t.device}, "
                            f"{tuple(t.shape)}): the C++ module's tensor ({own.device}, "
                            f"{tuple(own.shape)}) takes values of its shape on a device with "
                            f"storage"
                        )
                    store[name] = _take(self._enc, self._names[name], own, t)

    def extra_repr(self) -> str:
        return f"type={self.type!r}, config={json.dumps(self.config)}"


def build_encoder(
    config, dim: int = 0, num_heads: int = 0, head_dim: int = 0, layout: str = "bhnd"
) -> Encoder:
    """The encoder a config describes, as the C++ library and `posenc train` build it.

    config: a dict ({"type": "rope", ...}; see docs/encoders.md for every type and key), its JSON
    text, or a path to a .json, .yaml or .yml file (read by the C++ library as the tool reads
    --config). dim, num_heads, head_dim: the model's width, heads and head size where the encoder
    needs them (0: unknown; additive tables need dim, rotary ones head_dim or dim / num_heads,
    biases num_heads). layout: q and k of Plan.rotate, "bhnd" [B, H, N, Dh] (SDPA's) or "bnhd"
    [B, N, H, Dh]. A config posenc refuses gives the same one line as the tool (RuntimeError),
    a config past the tool's limits too (size, nesting depth, values once YAML aliases expand).
    """
    if isinstance(config, (str, os.PathLike)) and not str(config).lstrip().startswith("{"):
        path = os.fspath(config)
        if not os.path.isfile(path):
            raise ValueError(f"posenc.build_encoder: {path!r} is neither JSON text nor a file")
        config = _read_config_file(path)  # text: parsed in C++, YAML aliases within the limits
    elif not isinstance(config, (str, dict)):
        raise ValueError(
            f"posenc.build_encoder: the config must be a dict with a 'type', got "
            f"{type(config).__name__}"
        )
    return Encoder(config, dim, num_heads, head_dim, layout)

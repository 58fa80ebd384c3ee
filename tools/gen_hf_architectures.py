#!/usr/bin/env python3
"""Every architecture transformers ships with a rotary embedding: its default config.json and its own
rotary class's numbers, as committed fixtures (tests/fixtures/hf_architectures/).

For each model type in transformers' CONFIG_MAPPING whose modeling file defines a rotary embedding class
taking a config (`<Family>RotaryEmbedding(config)`):

  <model_type>.config.json   the config class's defaults written as save_pretrained writes them
                             (to_json_string(use_diff=True): what a user's config.json holds);
  <model_type>.rotary.json   for each rotary class of the modeling file, the (sub)config it is built from
                             (found by the class's `config` annotation: the root config, text_config,
                             vision_config, ...) and, per layer type where the class has them:
                             - inv_freq and attention_scaling read from the instance (float32 buffers,
                               written as the float64 value of each float32: exact);
                             - cos and sin from the class's own forward(x, position_ids[, layer_type]) at
                               POSITIONS (1D; M-RoPE classes get the same position on every axis), one
                               value per rotary pair, attention scaling included; a vision tower
                               (rope_type 'axial') at GRID's (row, column) patch positions, or GRID3's
                               (t, row, column) where its vision model gives three axes (tower_axes);
                             - the pair layout the modeling file's own apply_rotary_pos_emb uses, found by
                               running it on a probe vector ("half": pairs (i, i + r/2); "interleaved":
                               pairs (2i, 2i + 1); "other" when neither matches; absent when the file
                               has no such function with a (q, k, cos, sin) signature);
                             - errors met on the way (a class whose defaults do not build, ...);
                             - partial_probe: the number of frequencies the class gives when the config
                               asks for half its partial_rotary_factor (set at the top level and in
                               rope_parameters, where transformers 5 reads it), and with the factor
                               as it is; default_partial_probe the same with the block made a plain
                               default rope: the same number both ways means the class's default
                               rope ignores partial_rotary_factor (Llama's does; GLM's does not);
                             - reads: for each key of a config.json (rope_theta, a block's
                               rope_theta, rope_parameters, rope_scaling, partial_rotary_factor),
                               whether two files differing in it alone give the class different
                               tables (reads_probe; GPT-J's table hard-codes theta 10000).
                             A config class whose modeling file builds its rotary only for one
                             position_embedding_type (ESM: 'rotary') is written with it.

  generated_rules.json       per model type, its config class's defaults for keys a file leaves out
                             ("defaults"; a composite's own text_config defaults:
                             "text_config_defaults") and the rules probed from its classes:
                             unread_keys (reads, false in every row of its own classes), pair_layout
                             (every row's layout, the complex view_as_complex rotations included),
                             head_size (the keys of a file its rotary classes size their tables
                             by: head_dim, kv_channels, d_model / n_heads, ...), rotary_gate,
                             values_rejected (spellings its classes refuse: a string rope_theta, a
                             float head_dim, legacy rope types 'su' and 'mrope'), ...;
                             no probe value (PROBE_VALUES) may reach it.
  src/config/hf_generated_rules.inc  the same rows as a typed C++ table (designated initializers of
                             include/posenc/config/hf_generated_rules.h's HfGeneratedRules, rendered
                             by rules_inc): a rule without a field there stops the generator.

  index.json                 one row per model type: its rotary classes, the sub-config path of each,
                             and why a type has no fixture (no default config, no config-taking rotary
                             class).

Every number comes from calling transformers' code; nothing is re-derived here.  posenc's CTest entry
hf_architectures (tests/test_hf_architectures.cpp) resolves every <model_type>.config.json with posenc's
rules and compares with these numbers, or expects the refusal that tests/fixtures/hf_architectures/
refusals.json lists for it.

Regenerate (from the repository root; the pinned version is PINNED_TRANSFORMERS below):

    V/bin/python tools/gen_hf_architectures.py            # writes tests/fixtures/hf_architectures/
    V/bin/python tools/gen_hf_architectures.py --check    # compares a (newer) transformers with the
                                                          # committed fixtures: which model types changed

Making such a venv:  python3 -m venv V && V/bin/pip install torch==2.15.0 && \\
    V/bin/pip install --no-deps transformers==5.24.0 && V/bin/pip install huggingface_hub tokenizers \\
    safetensors regex pyyaml tqdm packaging numpy
"""

import argparse
import contextlib
import copy
import importlib
import inspect
import io
import json
import logging
import os
import re
import sys
import tempfile
import typing
import warnings

import torch
import transformers
from transformers import CONFIG_MAPPING, PreTrainedConfig

PINNED_TRANSFORMERS = "5.24.0"
OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "hf_architectures"
)
POSITIONS = [0, 1, 2, 7, 100, 1023, 4097, 32767]
GRID = [[0, 0], [0, 1], [1, 0], [2, 3], [7, 5], [31, 17]]  # (row, column) of patches, vision towers
# (time, row, column) of patches, for towers whose vision model gives three axes (tower_axes)
GRID3 = [[0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [2, 3, 1], [3, 7, 5], [1, 31, 17]]
# patches (rows, columns) of the image given to a tower that builds its table from pixel_values
# (DINOv3 and its kin: patch centres in [-1, 1])
PATCH_GRID = (3, 5)
MAX_SUBCONFIG_DEPTH = 2


def tower_axes(module):
    """3 where the modeling file's vision model asks transformers' get_vision_position_ids for
    (t, h, w) per patch (`include_temporal = True`: MiniMax-M3), else 2 (row, column)."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return 2
    return 3 if re.search(r"include_temporal\s*=\s*True", source) else 2


def floats(t):
    return [float(v) for v in t.detach().to(torch.float64).reshape(-1).tolist()]


def sub_configs(cfg, path="", depth=0):
    """(path, config) for the config and every nested PreTrainedConfig attribute (text_config, ...)."""
    yield path, cfg
    if depth >= MAX_SUBCONFIG_DEPTH:
        return
    for key, value in sorted(vars(cfg).items()):
        if isinstance(value, PreTrainedConfig):
            yield from sub_configs(value, f"{path}.{key}" if path else key, depth + 1)


def config_annotation(cls, module):
    try:
        hints = typing.get_type_hints(cls.__init__, globalns=vars(module))
    except Exception:
        hints = {}
    ann = hints.get("config")
    if ann is None:
        ann = inspect.signature(cls.__init__).parameters["config"].annotation
        if isinstance(ann, str):
            ann = vars(module).get(ann)
    return ann if inspect.isclass(ann) else None


def modeling_module(cfg_cls):
    """configuration_<x>.py's sibling modeling_<x>.py (data2vec-audio: modeling_data2vec_audio)."""
    package, leaf = cfg_cls.__module__.rsplit(".", 1)
    return importlib.import_module(f"{package}.{leaf.replace('configuration_', 'modeling_', 1)}")


def rotary_classes(module):
    out = []
    for name, obj in sorted(vars(module).items()):
        # "Rotary" classes, and the "Rope" ones that name it otherwise (DINOv3's
        # RopePositionEmbedding, V-JEPA 2's RopeAttention)
        if not (
            inspect.isclass(obj)
            and ("Rotary" in name or "Rope" in name)
            and obj.__module__ == module.__name__
        ):
            continue
        if not issubclass(obj, torch.nn.Module):
            continue
        try:
            params = inspect.signature(obj.__init__).parameters
        except (TypeError, ValueError):
            continue
        out.append((name, obj, "config" in params))
    return out


def layout_of(module, config, c, s, dup, vision=False, rotary_name=""):
    """Which pairs the modeling file's own rotation turns, given per-pair tables c, s [N, r/2]:
    'half' (i, i + r/2), 'interleaved' (2i, 2i + 1) or 'other' (neither: a different rotation).
    The function probed is apply_rotary_pos_emb_interleave where the config asks for it (DeepSeek's
    rope_interleave) or the file has no other, else apply_rotary_pos_emb, else _apply_rotary_emb
    (GPT-OSS); it gets cos/sin duplicated as the class's forward returns them. Signatures
    (q, k, cos, sin, ...) and (x, cos, sin, ...) (Gemma 3n, Gemma 4) are probed; others are not."""
    fn = (
        getattr(module, "apply_rotary_pos_emb", None)
        or getattr(module, "_apply_rotary_emb", None)
        or getattr(module, "apply_rotary_emb", None)
    )  # Llama 4, DeepSeek-V2: complex rotations
    if vision:  # a tower's own rotation where the file has one (Llama 4's: vision_apply_rotary_emb)
        fn = (
            getattr(module, "apply_rotary_pos_emb_vision", None)
            or (getattr(module, "vision_apply_rotary_emb", None) if vision == "complex" else None)
            or fn
        )
    interleave = getattr(module, "apply_rotary_pos_emb_interleave", None)
    if interleave is not None and (
        fn is None
        or getattr(config, "rope_interleave", False)
        or attention_calls_interleave(module, rotary_name)
    ):
        fn = interleave
    if fn is None:
        return None
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    n, half_r = c.shape
    r = 2 * half_r
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, r, generator=g)
    if dup == "cat":  # [1, N, r] duplicated as the class's forward returns them
        cos, sin = torch.cat([c, c], dim=-1)[None], torch.cat([s, s], dim=-1)[None]
    elif dup == "repeat_interleave":
        cos, sin = c.repeat_interleave(2, dim=-1)[None], s.repeat_interleave(2, dim=-1)[None]
    else:  # one value per pair
        cos, sin = c[None], s[None]
    try:
        if params[:3] in (["xq", "xk", "freqs_cis"], ["query", "key", "freqs_ci"]):
            # view_as_complex over x: the table as e^(i angle)
            freqs = torch.complex(c, s)[None]  # [1, N, r/2]
            out = None
            # Llama 4 broadcasts freqs_cis[:, :, None] over q [B, N, H, r]; DeepSeek-V2
            # freqs_cis.unsqueeze(1) over q [B, H, N, r]
            for q in (x[None, :, None], x[None, None]):
                try:
                    got, _ = fn(q, q.clone(), freqs)
                except Exception:
                    continue
                if got.numel() == n * r:
                    out = got
                    break
            if out is None:
                return "unknown"
        elif params[:4] == ["q", "k", "cos", "sin"] and vision:  # q [N, heads, r], cos [N, r]
            out, _ = fn(x[:, None], x[:, None].clone(), cos[0], sin[0])
        elif params[:4] == ["q", "k", "cos", "sin"]:
            out, _ = fn(x[None, None], x[None, None].clone(), cos, sin)
        elif params[:3] == ["x", "cos", "sin"]:
            out = fn(
                x[None, None],
                cos[:, None] if dup == "none" else cos,
                sin[:, None] if dup == "none" else sin,
            )
        else:
            return None
    except Exception:
        return "unknown"
    o = out.reshape(n, r)
    a, b = x[:, :half_r], x[:, half_r:]
    half = torch.cat([a * c - b * s, b * c + a * s], dim=-1)
    inter = torch.empty_like(x)
    inter[:, 0::2] = x[:, 0::2] * c - x[:, 1::2] * s
    inter[:, 1::2] = x[:, 1::2] * c + x[:, 0::2] * s
    if torch.allclose(o, half, atol=1e-5):
        return "half"
    if torch.allclose(o, inter, atol=1e-5):
        return "interleaved"
    # DeepSeek's apply_rotary_pos_emb_interleave: pairs (2i, 2i + 1), the result left de-interleaved
    # (the same permutation on q and k, so the scores are those of the interleaved rotation)
    if torch.allclose(o, torch.cat([inter[:, 0::2], inter[:, 1::2]], dim=-1), atol=1e-5):
        return "interleaved"
    return "other"


def per_pair(t, pairs=None):
    """[N, r] -> [N, r/2]: one value per pair, whichever of the two duplications the class uses;
    [N, r/2] as it is when the class returns one value per pair (GPT-OSS)."""
    r = t.shape[-1]
    if pairs == r:
        return t, "none"
    if torch.equal(t[:, : r // 2], t[:, r // 2 :]):
        return t[:, : r // 2], "cat"
    if torch.equal(t[:, 0::2], t[:, 1::2]):
        return t[:, 0::2], "repeat_interleave"
    return t, "none"


def partial_probe(cls, config, layer_type, force_default=False):
    """{partial_rotary_factor: f, pairs: n, pairs_before: m}: the class's frequencies with the
    config's factor halved (n) and as it is (m). force_default: the block made a plain default rope
    first (its theta kept), so that every class's default rope is classified, whatever its default
    config's rope_type."""
    c2 = copy.deepcopy(config)
    params = getattr(c2, "rope_parameters", None)
    nested = (
        layer_type is not None
        and isinstance(params, dict)
        and isinstance(params.get(layer_type), dict)
    )
    block = params[layer_type] if nested else params
    if not isinstance(block, dict):
        return {"error": "no rope_parameters block"}
    if force_default:
        keep = {k: block[k] for k in ("rope_theta", "partial_rotary_factor") if k in block}
        block.clear()
        block.update(keep, rope_type="default")
    rope_type = block.get("rope_type", "default")
    current = block.get("partial_rotary_factor", getattr(c2, "partial_rotary_factor", None) or 1.0)
    name = f"{layer_type}_inv_freq" if layer_type else "inv_freq"

    def pairs(factor):
        block["partial_rotary_factor"] = factor
        try:
            c2.partial_rotary_factor = factor
        except Exception:
            pass
        with torch.device("cpu"):
            inv = getattr(cls(config=c2), name, None)
        if not isinstance(inv, torch.Tensor):
            raise ValueError("no inv_freq")
        return int(inv.numel())

    factor = float(current) / 2
    try:
        before = pairs(float(current))
        after = pairs(factor)
    except Exception as e:
        return {
            "rope_type": rope_type,
            "partial_rotary_factor": factor,
            "error": f"{type(e).__name__}: {str(e)[:120]}",
        }
    return {
        "rope_type": rope_type,
        "partial_rotary_factor": factor,
        "pairs": after,
        "pairs_before": before,
    }


# Probe values: no class's default, so a table or a loaded attribute holding one got there by the
# key the probe set. None may reach the generated data (PROBE_VALUES: main() refuses to write one;
# tests/python/test_hf_reads.py and tests/test_hf_architectures.cpp read every number of the
# generated rules against them).
LEGACY_THETA = 123456.0  # a top-level rope_theta
PROBE_PARTIAL = 0.375  # a top-level partial_rotary_factor
PROBE_LOCAL_BASE = 7777.0  # a flat rope_local_base_freq
PROBE_CONTEXT = 12345  # a composite's top-level max_position_embeddings
LEGACY_VARIANTS = {"theta": {}, "linear": {"rope_scaling": {"rope_type": "linear", "factor": 3.0}}}


def legacy_probe(cls, config, layer_type, load=None):
    """{variant: {inv_freq, attention_scaling} or {error}}: the class's frequencies for the config
    as transformers 4 wrote it: no rope_parameters, a top-level rope_theta (LEGACY_THETA) and, for
    "linear", a top-level rope_scaling block; loaded through the config class's from_dict, whose
    own conversion decides what reaches the rotary class (GPT-NeoX reads rotary_emb_base, not
    rope_theta; Cohere 2 MoE never reads rope_scaling; Moonshine Streaming's partial default lives
    in the default rope_parameters a rope_scaling replaces). load(d): the config as
    from_pretrained builds it from d (a composite's text_config goes through the composite's class,
    which may merge defaults of its own into it: GLM-ASR)."""
    load = load or type(config).from_dict
    out = {}
    for variant, extra in LEGACY_VARIANTS.items():
        d = copy.deepcopy(config.to_dict())
        d.pop("rope_parameters", None)
        d.pop("rope_scaling", None)
        d["rope_theta"] = LEGACY_THETA
        d.update(copy.deepcopy(extra))
        try:
            c2 = load(d)
            with torch.device("cpu"):
                emb = cls(config=c2)
            inv = getattr(emb, f"{layer_type}_inv_freq" if layer_type else "inv_freq", None)
            if not isinstance(inv, torch.Tensor):
                raise ValueError("no inv_freq")
            scaling = getattr(
                emb, f"{layer_type}_attention_scaling" if layer_type else "attention_scaling", 1.0
            )
            out[variant] = {"inv_freq": floats(inv), "attention_scaling": float(scaling)}
        except Exception as e:
            out[variant] = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
    return out


def rope_blocks(params):
    """The rope_parameters blocks of a config dict: one, or one per layer type (None entries left)."""
    if not isinstance(params, dict):
        return []
    if params and all(isinstance(v, dict) or v is None for v in params.values()):
        return [v for v in params.values() if isinstance(v, dict)]
    return [params]


def top_level_partial_probe(cls, config, layer_type):
    """{partial_rotary_factor: f, pairs: n}: the class's frequencies for a config.json whose
    partial_rotary_factor f is at the top level only (as transformers 4 wrote it), loaded as
    from_pretrained loads it (the config class's from_dict decides whether it reaches the block)."""
    d = copy.deepcopy(config.to_dict())
    for block in rope_blocks(d.get("rope_parameters")):
        block.pop("partial_rotary_factor", None)
    current = getattr(config, "partial_rotary_factor", None) or 1.0
    params = getattr(config, "rope_parameters", None)
    nested = (
        layer_type is not None
        and isinstance(params, dict)
        and isinstance(params.get(layer_type), dict)
    )
    block = params[layer_type] if nested else params
    if isinstance(block, dict) and isinstance(block.get("partial_rotary_factor"), (int, float)):
        current = block["partial_rotary_factor"]
    factor = float(current) / 2
    d["partial_rotary_factor"] = factor
    try:
        c2 = type(config).from_dict(d)
        with torch.device("cpu"):
            inv = getattr(
                cls(config=c2), f"{layer_type}_inv_freq" if layer_type else "inv_freq", None
            )
        if not isinstance(inv, torch.Tensor):
            raise ValueError("no inv_freq")
    except Exception as e:
        return {"partial_rotary_factor": factor, "error": f"{type(e).__name__}: {str(e)[:120]}"}
    return {"partial_rotary_factor": factor, "pairs": int(inv.numel())}


def top_level_partial_unread(model_types):
    """Model types whose config class does not carry a top-level partial_rotary_factor of a
    config.json into rope_parameters, where every rotary class reads it (Gemma 3, GPT-NeoX, ...)."""
    out = []
    for mt in model_types:
        try:
            cfg_cls = CONFIG_MAPPING[mt]
            d = copy.deepcopy(cfg_cls().to_dict())
        except Exception:
            continue
        for block in rope_blocks(d.get("rope_parameters")):
            block.pop("partial_rotary_factor", None)
        d.pop("rope_scaling", None)
        d["partial_rotary_factor"] = PROBE_PARTIAL
        try:
            blocks = rope_blocks(getattr(cfg_cls.from_dict(d), "rope_parameters", None))
        except Exception:
            continue
        if not blocks or any(b.get("partial_rotary_factor") != PROBE_PARTIAL for b in blocks):
            out.append(mt)
    return out


def attention_calls_interleave(module, rotary_name):
    """Whether the attention class of this rotary class (the same name prefix: DeepseekV32Attention
    for DeepseekV32RotaryEmbedding) rotates with apply_rotary_pos_emb_interleave whatever the config
    says (DeepSeek-V3.2, AXK2, dots3's text model; their indexers use rotate_half)."""
    prefix = rotary_name.split("RotaryEmbedding")[0]
    for name, obj in vars(module).items():
        if not (
            inspect.isclass(obj)
            and name == prefix + "Attention"
            and obj.__module__ == module.__name__
        ):
            continue
        try:
            src = inspect.getsource(obj.forward)
        except (OSError, TypeError):
            continue
        if "apply_rotary_pos_emb_interleave(" in src and "rope_interleave" not in src:
            return True
    return False


def forward_table(cls, config, layer_type):
    """The class's forward output at POSITIONS as one float tensor (cos then sin, or a complex table
    as real pairs), for a 1D class; raises where the class does not build or run."""
    with torch.device("cpu"):
        emb = cls(config=config)
    limit = getattr(config, "max_position_embeddings", None)
    positions = [
        p
        for p in POSITIONS
        if not (
            isinstance(limit, int)
            and getattr(emb, "embed_positions", None) is not None
            and p >= limit
        )
    ]
    pos = torch.tensor([positions], dtype=torch.long)
    x = torch.zeros(1, len(positions), 8, dtype=torch.float32)
    try:
        out = emb(x, pos, layer_type) if layer_type else emb(x, pos)
    except Exception:  # M-RoPE classes: [axes, B, N] position ids
        ids = pos[None].expand(3, -1, -1)
        out = emb(x, ids, layer_type) if layer_type else emb(x, ids)
    if isinstance(out, torch.Tensor):
        return (
            torch.view_as_real(out).reshape(-1).float()
            if out.is_complex()
            else out.reshape(-1).float()
        )
    return torch.cat([t.reshape(-1).float() for t in out[:2]])


READ_KEYS = (
    "rope_theta",
    "rope_parameters.rope_theta",
    "rope_parameters",
    "rope_scaling",
    "partial_rotary_factor",
)


def reads_probe(cls, config, layer_type, load=None):
    """Which keys of a config.json the class's table depends on: for each key, two files that
    differ only in it, each loaded as from_pretrained loads it (load) and given to the class; true
    where the tables differ, false where both build and are equal (the class never reads the key:
    GPT-J's and CodeGen's tables hard-code theta 10000; ESM's reads only the top-level rope_theta),
    absent where a file does not load or build (the key's effect is then not this probe's to say):
      rope_theta                    a top-level rope_theta (no block), the theta doubled
      rope_parameters.rope_theta    a flat default rope_parameters block's, doubled
      rope_parameters               a flat block made linear (factor 3), its theta kept
      rope_scaling                  a top-level rope_scaling made linear (factor 3), no block
      partial_rotary_factor         the factor halved at the top level and in a flat block
    Classes with one block per layer type are probed through their own blocks (nested kept)."""
    load = load or type(config).from_dict
    own = copy.deepcopy(config.to_dict())
    params = own.get("rope_parameters")
    nested = (
        isinstance(params, dict)
        and params
        and all(isinstance(v, dict) or v is None for v in params.values())
    )
    if isinstance(params, dict) and isinstance(
        params.get(layer_type if nested else "rope_theta"), (dict, int, float)
    ):
        block = params[layer_type] if nested else params
        theta = block.get("rope_theta", own.get("rope_theta"))
    else:
        block, theta = None, own.get("rope_theta")
    if not isinstance(theta, (int, float)) or isinstance(theta, bool):
        theta = 10000.0
    theta = float(theta)

    def file(blocks=None, scaling=None, top_theta=None, partial=None):
        d = copy.deepcopy(own)
        for key in ("rope_scaling", "rope_parameters", "rope_theta"):
            d.pop(key, None)
        if blocks is not None:
            d["rope_parameters"] = copy.deepcopy(blocks)
            if partial is not None:
                for b in rope_blocks(d["rope_parameters"]):
                    b["partial_rotary_factor"] = partial
        if scaling is not None:
            d["rope_scaling"] = scaling
        if top_theta is not None:
            d["rope_theta"] = top_theta
        if partial is not None:
            d["partial_rotary_factor"] = partial
        return d

    def flat(theta_value, **extra):  # the class's own block(s) with this theta and extra keys
        if nested:
            out = copy.deepcopy(params)
            for name, b in out.items():
                if isinstance(b, dict) and name == layer_type:
                    b.update(rope_theta=theta_value, **extra)
            return out
        keep = {
            k: v
            for k, v in (block or {}).items()
            if k not in ("rope_type", "type", "rope_theta", "factor")
        }
        return {**keep, "rope_type": "default", "rope_theta": theta_value, **extra}

    def table(d):
        try:
            return forward_table(cls, load(copy.deepcopy(d)), layer_type)
        except Exception:
            return None

    partial_now = None
    if isinstance(block, dict) and isinstance(block.get("partial_rotary_factor"), (int, float)):
        partial_now = float(block["partial_rotary_factor"])
    elif isinstance(own.get("partial_rotary_factor"), (int, float)):
        partial_now = float(own["partial_rotary_factor"])
    half = (partial_now or 1.0) / 2
    pairs = {
        "rope_theta": (file(top_theta=theta), file(top_theta=2 * theta)),
        "rope_parameters.rope_theta": (file(blocks=flat(theta)), file(blocks=flat(2 * theta))),
        "rope_parameters": (
            file(blocks=flat(theta)),
            file(blocks=flat(theta, rope_type="linear", factor=3.0)),
        ),
        "rope_scaling": (
            file(top_theta=theta),
            file(top_theta=theta, scaling={"rope_type": "linear", "factor": 3.0}),
        ),
        "partial_rotary_factor": (file(blocks=flat(theta)), file(blocks=flat(theta), partial=half)),
    }
    if "rope_theta" in own:  # keep a top-level theta where the file has one beside its block (ESM)
        for key in ("rope_parameters.rope_theta", "rope_parameters", "partial_rotary_factor"):
            for d in pairs[key]:
                d["rope_theta"] = own["rope_theta"]
    out = {}
    for key, (a, b) in pairs.items():
        ta, tb = table(a), table(b)
        if ta is None or tb is None:
            continue
        out[key] = not (ta.shape == tb.shape and torch.equal(ta, tb))
    return out


def patch_centre_probe(emb, config, module):
    """A tower whose forward(pixel_values) builds its table from the image's patch grid (DINOv3's
    DINOv3ViTRopePositionEmbedding, EoMT-DINOv3's, Sapiens 2's): in eval mode (the coordinate
    augmentations are training-only), an image of PATCH_GRID patches; positions are the patch
    centres the class rotates by (its module's own get_patches_center_coordinates: (row, column)
    in [-1, 1]), written as the float64 value of each float32."""
    centres = getattr(module, "get_patches_center_coordinates", None)
    if centres is None:
        return [
            {
                "error": f"forward{tuple(inspect.signature(emb.forward).parameters)} without the "
                f"module's get_patches_center_coordinates"
            }
        ]
    emb.eval()
    rows, cols = PATCH_GRID
    patch = (
        config.patch_size
        if isinstance(config.patch_size, (list, tuple))
        else (config.patch_size, config.patch_size)
    )
    pixels = torch.zeros(1, getattr(config, "num_channels", 3), rows * patch[0], cols * patch[1])
    row = {"layer_type": None}
    try:
        cos, sin = emb(pixels)
        coords = centres(rows, cols, dtype=torch.float32, device=torch.device("cpu"))
    except Exception as e:
        return [
            {"layer_type": None, "error": f"forward failed: {type(e).__name__}: {str(e)[:200]}"}
        ]
    inv = getattr(emb, "inv_freq", None)
    if isinstance(inv, torch.Tensor):
        row["inv_freq"] = floats(inv)
    row["attention_scaling"] = float(getattr(emb, "attention_scaling", 1.0))
    c, dup = per_pair(cos.reshape(-1, cos.shape[-1]).float())
    s, _ = per_pair(sin.reshape(-1, sin.shape[-1]).float())
    row["rotary_dim"] = 2 * int(c.shape[-1])
    row["duplication"] = dup
    row["patch_grid"] = list(PATCH_GRID)
    row["positions"] = [floats(p) for p in coords]
    row["cos"] = [floats(r) for r in c]
    row["sin"] = [floats(r) for r in s]
    layout = layout_of(module, config, c, s, dup)
    if layout:
        row["layout"] = layout
    return [row]


def fixed_grid_probe(emb, config, module):
    """Llama 4's vision rotary: a fixed table over the config's (image_size // patch_size)^2 patches
    and a class token (_compute_freqs_ci: e^(i angle), angles (column + 1) f then (row + 1) f per
    patch, 0 for the class token). Positions are those its arithmetic takes, (row + 1, column + 1)
    per patch, (0, 0) for the class token, at LLAMA4_TOKENS of its rows."""
    idx = config.image_size // config.patch_size
    table = emb(torch.zeros(1))
    if not table.is_complex():
        return [{"layer_type": None, "error": "a fixed table that is not e^(i angle)"}]
    table = table.reshape(table.shape[0], -1)
    tokens = [
        t for t in (0, 1, idx, idx + 1, 5 * idx + 7, idx * idx - 1, idx * idx) if t < table.shape[0]
    ]
    c, s = table.real[tokens].float(), table.imag[tokens].float()
    row = {
        "layer_type": None,
        "attention_scaling": 1.0,
        "rotary_dim": 2 * int(c.shape[-1]),
        "duplication": "none",
        "returns": "complex table (cos and sin of the angles)",
        "positions": [[t // idx + 1, t % idx + 1] if t < idx * idx else [0, 0] for t in tokens],
        "cos": [floats(r) for r in c],
        "sin": [floats(r) for r in s],
    }
    layout = layout_of(module, config, c, s, "none", vision="complex")
    if layout:
        row["layout"] = layout
    return [row]


def probe(cls, config, module, layer_types, load=None):
    """The class's own numbers for one config, per layer type."""
    with torch.device("cpu"):
        emb = cls(config=config)
    params = inspect.signature(emb.forward).parameters
    takes_layer = "layer_type" in params
    if list(params) == ["pixel_values"]:
        return patch_centre_probe(emb, config, module)
    if list(params) == ["hidden_states"] and hasattr(cls, "_compute_freqs_ci"):
        return fixed_grid_probe(emb, config, module)
    if list(params)[:2] != ["x", "position_ids"]:
        return [{"error": f"forward{tuple(params)} is not forward(x, position_ids, ...)"}]
    # (a class whose forward takes a layer type, on a config without layer types: ESM)
    types = (sorted({t for t in (layer_types or []) if t}) or [None]) if takes_layer else [None]
    rows = []
    for lt in types:
        row = {"layer_type": lt}
        name = f"{lt}_inv_freq" if lt else "inv_freq"
        inv = getattr(emb, name, None)
        if inv is None and lt:
            row["error"] = f"no {name}: the class has no RoPE for layer type {lt}"
            rows.append(row)
            continue
        if isinstance(inv, torch.Tensor):
            row["inv_freq"] = floats(inv)
            row["partial_probe"] = partial_probe(cls, config, lt)
            row["default_partial_probe"] = partial_probe(cls, config, lt, force_default=True)
            row["top_level_partial_probe"] = top_level_partial_probe(cls, config, lt)
            row["legacy_probe"] = legacy_probe(cls, config, lt, load)
        if not (
            isinstance(getattr(config, "rope_parameters", None), dict)
            and config.rope_parameters.get("rope_type") == "axial"
        ):
            row["reads"] = reads_probe(cls, config, lt, load)
        scaling = getattr(emb, f"{lt}_attention_scaling" if lt else "attention_scaling", None)
        if isinstance(scaling, (int, float)):
            row["attention_scaling"] = float(scaling)
        # classes with a fixed table (GPT-J's embed_positions) take positions inside it
        limit = getattr(config, "max_position_embeddings", None)
        positions = [
            p
            for p in POSITIONS
            if not (
                isinstance(limit, int)
                and getattr(emb, "embed_positions", None) is not None
                and p >= limit
            )
        ]
        pos = torch.tensor([positions], dtype=torch.long)
        x = torch.zeros(1, len(positions), 8, dtype=torch.float32)
        axial = (
            isinstance(getattr(config, "rope_parameters", None), dict)
            and config.rope_parameters.get("rope_type") == "axial"
        )
        if (
            axial
        ):  # vision towers: position_ids (N, A), one (row, column) or (t, row, column) per patch
            positions = GRID3 if tower_axes(module) == 3 else GRID
            pos = torch.tensor(positions, dtype=torch.long)
            x = torch.zeros(1, len(positions), 8, dtype=torch.float32)
        try:
            if axial:
                out = None
                for ids in (pos, pos[None], pos.T):
                    try:
                        out = emb(x, ids)
                        break
                    except Exception as e:
                        first = e
                if out is None:
                    raise first
            else:
                out = emb(x, pos, lt) if lt else emb(x, pos)
        except Exception as first:
            if axial:
                row["error"] = f"forward failed: {type(first).__name__}: {str(first)[:200]}"
                rows.append(row)
                continue
            try:  # M-RoPE classes that want [axes, B, N] position ids
                out = (
                    emb(x, pos[None].expand(3, -1, -1))
                    if not lt
                    else emb(x, pos[None].expand(3, -1, -1), lt)
                )
                row["position_ids"] = "3 axes, equal"
            except Exception:
                row["error"] = f"forward failed: {type(first).__name__}: {str(first)[:200]}"
                rows.append(row)
                continue
        if isinstance(out, torch.Tensor) and out.is_complex():
            # Llama 4, DeepSeek-V2: freqs_cis = e^(i p f) [B, N, r/2], rotated by view_as_complex
            cos, sin = out.real, out.imag
            row["returns"] = "complex"
        else:
            cos, sin = out[0], out[1]
        if (
            not axial
            and positions[0] == 0
            and not bool(cos.reshape(-1, cos.shape[-1])[0].abs().sum())
        ):
            cos, sin = sin, cos  # GPT-J and CodeGen return (sin, cos): cos(0) is 1, sin(0) is 0
            row["returns"] = "sin, cos"
        if cos.dim() == 4:  # per-axis tables [axes, B, N, r] (Qwen2-VL): equal positions -> axis 0
            cos, sin = cos[0], sin[0]
            row["position_ids"] = "per-axis output, equal"
        cos2 = cos.reshape(-1, cos.shape[-1]).to(torch.float32)
        sin2 = sin.reshape(-1, sin.shape[-1]).to(torch.float32)
        pairs = len(row["inv_freq"]) if "inv_freq" in row and not axial else None
        c, dup = per_pair(cos2, pairs)
        s, _ = per_pair(sin2, pairs)
        row["rotary_dim"] = 2 * int(c.shape[-1])
        row["duplication"] = dup
        row["positions"] = positions
        row["cos"] = [floats(r) for r in c]
        row["sin"] = [floats(r) for r in s]
        layout = layout_of(module, config, c, s, dup, vision=axial, rotary_name=cls.__name__)
        if layout:
            row["layout"] = layout
        rows.append(row)
    return rows


def dump(record):
    """JSON with one line per list of numbers (readable diffs, a third of the size of one per line)."""
    text = json.dumps(record, indent=1, allow_nan=False)
    return (
        re.sub(
            r"\[\s*(-?[0-9][^\[\]{}\"]*?)\s*\]",
            lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]",
            text,
        )
        + "\n"
    )


def config_json(cfg):
    with tempfile.TemporaryDirectory() as d:
        cfg.save_pretrained(d)
        with open(os.path.join(d, "config.json")) as f:
            return f.read()


ROTARY_GATE = re.compile(r"""position_embedding_type\s*==\s*["'](\w*(?:rot|rope)\w*)["']""")


def rotary_gate(cfg_cls):
    """{"key": k, "rotary": v, "absent": d}: the modeling file builds its rotary only where the
    config's k is v (ESM: position_embedding_type 'rotary', its default 'absolute'; Granite MoE
    Hybrid: 'rope', default None), d the config class's value for a file without k; None where
    the file tests no such key. Read from the file's source: the comparison is the model's own."""
    try:
        source = inspect.getsource(modeling_module(cfg_cls))
    except Exception:
        return None
    values = sorted(set(ROTARY_GATE.findall(source)))
    if len(values) != 1:
        return None
    try:
        own = vars(cfg_cls())
    except Exception:
        return None
    if "position_embedding_type" not in own:  # a sub-config's key (Evolla's protein encoder)
        return None
    return {
        "key": "position_embedding_type",
        "rotary": values[0],
        "absent": own["position_embedding_type"],
    }


def architecture(model_type):
    """The model type's rotary classes: those of its own modeling file, and those of each sub-config's
    model type (a composite such as LLaVA builds its text model, and its rotary, from text_config)."""
    cfg_cls = CONFIG_MAPPING[model_type]
    try:
        module = modeling_module(cfg_cls)
    except Exception as e:
        return None, {
            "model_type": model_type,
            "skipped": f"no modeling module ({type(e).__name__})",
        }
    try:
        cfg = cfg_cls()
    except Exception as e:
        cfg = None
        config_error = f"default config does not build: {str(e)[:200]}"
    gate = rotary_gate(cfg_cls)
    if cfg is not None and gate is not None:  # the config.json written with the rotary switched on
        setattr(cfg, gate["key"], gate["rotary"])
    own = [(name, cls, takes, module, None) for name, cls, takes in rotary_classes(module)]
    borrowed = []
    if cfg is not None:
        for path, sub in list(sub_configs(cfg))[1:]:
            sub_type = getattr(sub, "model_type", "")
            if (
                not sub_type
                or sub_type not in CONFIG_MAPPING
                or type(sub).__module__ == cfg_cls.__module__
            ):
                continue
            try:
                sub_module = modeling_module(type(sub))
            except Exception:
                continue
            if sub_module is module:
                continue
            borrowed += [
                (name, cls, takes, sub_module, path)
                for name, cls, takes in rotary_classes(sub_module)
            ]
    if not own and not borrowed:
        return None, {"model_type": model_type, "skipped": "no rotary class"}
    if cfg is None:
        return None, {"model_type": model_type, "skipped": config_error}
    tables = []
    subs = dict(sub_configs(cfg))
    for name, cls, takes_config, mod, fixed_path in own + borrowed:
        entry = {"class": name}
        if not takes_config:
            entry["skipped"] = (
                "constructor takes no config (built by the model from computed sizes)"
            )
            tables.append(entry)
            continue
        ann = config_annotation(cls, mod)
        if fixed_path is not None:  # a sub-config's own model type: built from that sub-config
            matches = (
                [(fixed_path, subs[fixed_path])]
                if ann is not None and isinstance(subs[fixed_path], ann)
                else []
            )
        else:
            matches = [
                (p, c) for p, c in sub_configs(cfg) if ann is not None and isinstance(c, ann)
            ]
        if not matches:
            entry["skipped"] = f"no {getattr(ann, '__name__', ann)} in this model type's config"
            tables.append(entry)
            continue
        # The annotated class first; a multimodal model builds its text rotary from text_config even
        # where the annotation names the composite config (Qwen2-VL).
        candidates = matches + (
            [(p, subs[p]) for p in ("text_config",) if p in subs] if fixed_path is None else []
        )
        errors = []
        for path, sub in candidates:
            try:
                load = None
                if path == "text_config":  # through the composite, as from_pretrained loads it

                    def load(d, root=cfg.to_dict()):  # noqa: B008  (bound now, on purpose)
                        return cfg_cls.from_dict(
                            dict(copy.deepcopy(root), text_config=d)
                        ).text_config

                rows = probe(cls, sub, mod, getattr(sub, "layer_types", None), load)
            except Exception as e:
                errors.append(f"{path or 'config'}: {type(e).__name__}: {str(e)[:200]}")
                continue
            entry["config_path"] = path
            entry["config_model_type"] = getattr(sub, "model_type", "")
            entry["layer_types"] = rows
            break
        if "layer_types" not in entry:
            entry["error"] = "; ".join(errors)
        tables.append(entry)
    if not any("layer_types" in t for t in tables):
        return None, {
            "model_type": model_type,
            "classes": tables,
            "skipped": "no rotary class builds from this model type's config",
        }
    record = {"model_type": model_type, "config_class": cfg_cls.__name__, "tables": tables}
    return (config_json(cfg), record), {
        "model_type": model_type,
        "classes": [{k: t[k] for k in ("class", "config_path") if k in t} for t in tables],
    }


MODEL_TYPES_INC = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "src", "config", "hf_model_types.inc"
)


RULES_INC = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "src", "config", "hf_generated_rules.inc"
)
RULES_JSON = "generated_rules.json"  # beside the fixtures: the rows RULES_INC is rendered from
# Keys posenc reads whose absence from a config.json transformers fills from the config class.
DEFAULT_KEYS = [
    "rope_theta",
    "partial_rotary_factor",
    "head_dim",
    "global_head_dim",
    "max_position_embeddings",
    "rope_interleave",
]


def safe_get(obj, key, default=None):
    """getattr that treats a per-layer attribute (Gemma 4's head_dim) as absent."""
    try:
        return getattr(obj, key, default)
    except Exception:
        return default


def without_rope_keys(cfg_cls):
    """The class's default config as a dict, with every RoPE key a file may give left out (the
    start of each probe file below); None where the class has no default instance."""
    try:
        base = copy.deepcopy(cfg_cls().to_dict())
    except Exception:
        return None
    for key in (
        "rope_parameters",
        "rope_scaling",
        "rope_theta",
        "rope_local_base_freq",
        "partial_rotary_factor",
    ):
        base.pop(key, None)
    return base


def absent_rope_parameters(cfg_cls):
    """The rope_parameters the config class builds for a config.json with neither rope_parameters
    nor rope_scaling (transformers 4's files without scaling): its own default block(s) (Apertus:
    llama3 scaling; Gemma 3: one per layer type; GPT-OSS: yarn), where a top-level rope_theta
    reaches only some blocks, or none (setdefault under the class's own theta). Each block that
    takes the file's top-level rope_theta says so with "rope_theta_from_file": true (its
    "rope_theta" is the class's value for a file without one). None where the class builds no
    rope_parameters, or only what posenc's generic rule gives (a default rope, the whole head)."""
    base = without_rope_keys(cfg_cls)
    if base is None:
        return None
    try:
        p0 = copy.deepcopy(getattr(cfg_cls.from_dict(copy.deepcopy(base)), "rope_parameters", None))
    except Exception:
        return None
    try:
        p1 = getattr(
            cfg_cls.from_dict(dict(copy.deepcopy(base), rope_theta=LEGACY_THETA)),
            "rope_parameters",
            None,
        )
    except Exception:  # a scalar top-level rope_theta fails (UltraBERT zips a list of them)
        p1 = {}
    if not isinstance(p0, dict) or not isinstance(p1, dict) or not p0:
        return None
    nested = all(isinstance(v, dict) or v is None for v in p0.values())
    pairs = [(p0[k], p1.get(k)) for k in p0 if isinstance(p0[k], dict)] if nested else [(p0, p1)]
    carried_everywhere = True
    for b0, b1 in pairs:
        b0.pop("type", None)
        if isinstance(b1, dict) and b1.get("rope_theta") == LEGACY_THETA:
            b0["rope_theta_from_file"] = True
        else:
            carried_everywhere = False
    generic = (
        not nested
        and carried_everywhere
        and set(p0) <= {"rope_type", "rope_theta", "rope_theta_from_file"}
        and p0.get("rope_type", "default") in ("default", "axial")
    )  # axial: a vision tower's own
    return None if generic else json.loads(json.dumps(p0))


def top_level_theta_raises(cfg_cls):
    """Whether the class fails on a file with a scalar top-level rope_theta and no rope_parameters
    (UltraBERT zips rope_theta with layer_types: TypeError), where it loads without it."""
    base = without_rope_keys(cfg_cls)
    if base is None:
        return False
    try:
        cfg_cls.from_dict(copy.deepcopy(base))
    except Exception:
        return False
    try:
        cfg_cls.from_dict(dict(copy.deepcopy(base), rope_theta=LEGACY_THETA))
    except Exception:
        return True
    return False


def null_rope_scaling_unsets(cfg_cls):
    """Whether a file's "rope_scaling": null leaves the class without rope_parameters (None: its
    rotary class then fails, TypeError), where the class's own dict, with or without its
    rope_parameters, has them (DiffusionGemma, EmbeddingGemma 2, Zaya assign the legacy key over
    the blocks)."""
    try:
        own = copy.deepcopy(cfg_cls().to_dict())
    except Exception:
        return False
    for keep_blocks in (True, False):
        base = copy.deepcopy(own)
        if not keep_blocks:
            base.pop("rope_parameters", None)
        base.pop("rope_scaling", None)
        try:
            plain = cfg_cls.from_dict(copy.deepcopy(base))
            nulled = cfg_cls.from_dict(dict(copy.deepcopy(base), rope_scaling=None))
        except Exception:
            return False
        if (
            safe_get(plain, "rope_parameters", None) is not None
            and safe_get(nulled, "rope_parameters", None) is None
        ):
            return True
    return False


def _probe_start(cfg_cls):
    """The class's default dict (a context length filled in) and its rope_parameters, the start
    of the probes of filled and required keys; None where the class has no default instance or
    no rope_parameters."""
    try:
        own = copy.deepcopy(cfg_cls().to_dict())
    except Exception:
        return None
    own.setdefault("max_position_embeddings", 4096)
    rp = own.get("rope_parameters")
    if not isinstance(rp, dict) or not rp:
        return None
    return own, rp


def _flat_block_file(own, rp, block):
    """own with its rope_parameters replaced by one flat block under the class's own theta."""
    d = copy.deepcopy(own)
    d.pop("rope_scaling", None)
    theta = rp.get("rope_theta", own.get("rope_theta", 10000.0)) or 10000.0
    d["rope_parameters"] = {"rope_theta": theta, **block}
    return d


# The scaling types whose block takes original_max_position_embeddings, for the probes of who
# fills it: SCALED_BLOCKS' yarn and llama3, and a longrope block (its factor lists' length is
# only warned about when a config loads, and these probes only load).
ORIGINAL_PROBE_BLOCKS = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    },
    "longrope": {
        "rope_type": "longrope",
        "short_factor": [1.0] * 4,
        "long_factor": [1.0] * 4,
        "original_max_position_embeddings": 1024,
    },
}


def original_not_filled(cfg_cls):
    """The scaling types whose block the class leaves without original_max_position_embeddings
    when the file gives none (transformers' validation then fails, KeyError), where most classes
    fill it from max_position_embeddings: the class's own rope_parameters (per layer type or flat)
    made yarn or llama3 without the key, loaded; the same with the key must load."""
    start = _probe_start(cfg_cls)
    if start is None:
        return None  # a class without RoPE (BERT): not this probe's question
    own, rp = start
    nested = all(isinstance(v, dict) for v in rp.values())
    out = []
    for name in ("yarn", "llama3", "longrope"):
        block = {
            k: v
            for k, v in ORIGINAL_PROBE_BLOCKS[name].items()
            if k != "original_max_position_embeddings"
        }

        def load(with_original):
            extra = {"original_max_position_embeddings": 1024} if with_original else {}
            if nested:
                d = copy.deepcopy(own)
                d.pop("rope_scaling", None)
                d["rope_parameters"] = {k: {**v, **block, **extra} for k, v in rp.items()}
            else:
                d = _flat_block_file(own, rp, {**block, **extra})
            try:
                cfg_cls.from_dict(d)
                return None
            except Exception as e:
                return f"{type(e).__name__}: {e}"

        if load(True) is None:
            failure = load(False)
            if failure is not None and "original_max_position_embeddings" in failure:
                out.append(name)
    return out or None


def _flat_probe_start(cfg_cls):
    """_probe_start where the class's rope_parameters is one flat block (posenc reads only the
    block where it is per layer type)."""
    start = _probe_start(cfg_cls)
    if start is None or any(isinstance(v, dict) for v in start[1].values()):
        return None
    return start


def top_original_unread(cfg_cls):
    """The scaling types whose flat block, without original_max_position_embeddings, the class
    refuses even beside a top-level original_max_position_embeddings (as Phi-3's files carry
    it): transformers' rope functions read the top-level attribute first, but Cohere 2 MoE
    validates its block before the file's extra keys become attributes (KeyError). A flat block
    of each type without the key and the top level at 1024, loaded: listed where that fails on
    the key."""
    start = _flat_probe_start(cfg_cls)
    if start is None:
        return None
    own, rp = start
    out = []
    for name in ("yarn", "llama3", "longrope"):
        block = {
            k: v
            for k, v in ORIGINAL_PROBE_BLOCKS[name].items()
            if k != "original_max_position_embeddings"
        }
        d = _flat_block_file(own, rp, block)
        d["original_max_position_embeddings"] = 1024
        try:
            cfg_cls.from_dict(d)
        except Exception as e:
            if "original_max_position_embeddings" in str(e):
                out.append(name)
    return out or None


def required_block_keys(cfg_cls):
    """The keys of a flat scaling block the class refuses to go without (transformers'
    validate_rope: KeyError "Missing required keys"), per scaling type, where posenc could
    otherwise take a default or derive one (yarn's factor from max_position_embeddings /
    original_max_position_embeddings, as transformers 4 did): each key of SCALED_BLOCKS' block of
    each type left out in turn (the original context kept at the top level too, so only the key
    itself is missing), loaded; listed where that fails naming the key."""
    start = _flat_probe_start(cfg_cls)
    if start is None:
        return None
    own, rp = start
    out = {}
    for name, full in SCALED_BLOCKS.items():
        for key in full:
            if key in ("rope_type", "original_max_position_embeddings"):
                continue
            d = _flat_block_file(own, rp, {k: v for k, v in full.items() if k != key})
            try:
                cfg_cls.from_dict(d)
            except Exception as e:
                if f"'{key}'" in str(e) and "Missing required keys" in str(e):
                    out.setdefault(name, []).append(key)
    return out or None


def mrope_rules(cfg_cls):
    """How the model type's M-RoPE rotary class sections the pairs, learned by calling it
    (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4V, PaddleOCR-VL, Cosmos 3, HY-V4-VL, ...):
      mrope_default_section: the sections it takes when the file gives none (its
        rope_parameters.get("mrope_section", default));
      mrope_layout: "contiguous" (axis a owns a run of sections[a] pairs) or "interleaved" (pairs
        cycle t, h, w, ...: Qwen3-VL's recomposition), found by comparing its forward on 3-axis
        positions with both, with the file's mrope_interleaved false and true (the classes read
        the layout from their code, not from that key; a class whose output follows the key is
        left out).
    None where the modeling file has no rotary class with a 3-section mrope_section."""
    try:
        own = copy.deepcopy(cfg_cls().to_dict())
        classes = [
            obj for _, obj, takes_config in rotary_classes(modeling_module(cfg_cls)) if takes_config
        ]
    except Exception:
        return None
    rp = own.get("rope_parameters")
    if not isinstance(rp, dict) or not rp or any(isinstance(v, dict) for v in rp.values()):
        return None
    n = 12
    positions = torch.stack([torch.arange(n), torch.arange(n) // 3 + 5, torch.arange(n) % 3 + 9])[
        :, None, :
    ]  # [3, 1, N]: t, h, w differ

    def call(cls, extra):
        d = copy.deepcopy(own)
        d["rope_parameters"] = {**rp, **extra}
        try:
            cfg = cfg_cls.from_dict(d)
            with torch.device("cpu"):
                emb = cls(config=cfg)
            cos = emb(torch.zeros(1, n, 8), positions)[0]
            return emb, cos.reshape(n, -1).float()
        except Exception:
            return None, None

    def expected(inv_freq, sections, layout):
        pairs = inv_freq.numel()
        if layout == "contiguous":
            axes = [a for a, s in enumerate(sections) for _ in range(s)]
        else:  # t, h, w, t, h, w, ... ; an axis whose count is used up is skipped
            left, axes = list(sections), []
            while len(axes) < sum(sections):
                for a in range(3):
                    if left[a] > 0 and len(axes) < sum(sections):
                        axes.append(a)
                        left[a] -= 1
        if len(axes) != pairs:
            return None
        angles = torch.stack(
            [positions[axes[i], 0].float() * inv_freq[i].float() for i in range(pairs)], -1
        )  # [N, F]
        return torch.cat([angles.cos(), angles.cos()], -1)

    for cls in classes:
        emb, cos = call(cls, {})
        sections = getattr(emb, "mrope_section", None) if emb is not None else None
        if cos is None or not isinstance(sections, (list, tuple)) or len(sections) != 3:
            continue
        sections = [int(s) for s in sections]
        layouts = set()
        for key in (
            {},
            {"mrope_section": sections, "mrope_interleaved": False},
            {"mrope_section": sections, "mrope_interleaved": True},
        ):
            e, c = call(cls, key)
            if c is None:
                return None
            found = [
                name
                for name in ("contiguous", "interleaved")
                if (want := expected(e.inv_freq, sections, name)) is not None
                and want.shape == c.shape
                and torch.allclose(want, c, atol=1e-5)
            ]
            if len(found) != 1:
                return None
            layouts.add(found[0])
        if len(layouts) != 1:
            return None  # the class follows the key: posenc reads the key too
        return {"mrope_default_section": sections, "mrope_layout": layouts.pop()}
    return None


ROTARY_HEAD_KEYS = ("qk_rope_head_dim", "kv_channels", "attention_head_dim")
PROBE_HEAD = 88  # no class's default head size


def head_dim_rules(cfg_cls):
    """How the config class takes a config.json's head_dim where posenc's rule reads another key
    or none (the resolver's head_dim_rules, src/config/hf_config.cpp):
      head_dim_overridden: the class sets head_dim itself (DeepSeek-V2: qk_rope_head_dim), the
        file's value is unread;
      head_dim_alias_of: an attribute_map alias (JetMoE: kv_channels), the file's value is that key;
      null_head_dim: what "head_dim": null gives: "raises" (a typed field: validation error),
        "derived" (hidden_size / num_attention_heads where the absent key is a constant: ERNIE
        4.5), "none" (the attribute stays None: the rope functions fall back to hidden / heads,
        or fail);
      absent_head_dim_none: leaving the key out also leaves None (Mixtral);
      head_dim_raises: a file with head_dim fails to load (Falcon's is a read-only property).
    Loaded from the class's default dict without RoPE keys and head_dim, then with head_dim set
    to PROBE_HEAD or null."""
    base = without_rope_keys(cfg_cls)
    if base is None:
        return {}
    base.pop("head_dim", None)

    def load(**kw):
        try:
            return cfg_cls.from_dict(dict(copy.deepcopy(base), **kw))
        except Exception:
            return None

    def head_of(cfg):
        return vars(cfg).get("head_dim", safe_get(cfg, "head_dim", None))

    c0 = load()
    if c0 is None:
        return {}
    out = {}
    c_h = load(head_dim=PROBE_HEAD)
    if c_h is not None and head_of(c_h) == PROBE_HEAD:
        alias = [
            k
            for k in ROTARY_HEAD_KEYS
            if safe_get(c_h, k, None) == PROBE_HEAD and safe_get(c0, k, None) != PROBE_HEAD
        ]
        if alias:
            out["head_dim_alias_of"] = alias[0]
    elif c_h is not None:
        out["head_dim_overridden"] = True
    elif isinstance(head_of(c0), int) and load(head_dim=head_of(c0)) is None:
        # the class refuses a head_dim key, even its own value (Falcon's is a read-only property)
        out["head_dim_raises"] = True
    c_null = load(head_dim=None)
    if c_null is None:
        out["null_head_dim"] = "raises"
    elif head_of(c_null) is None:
        out["null_head_dim"] = "none"
    elif head_of(c_null) != head_of(c0):
        out["null_head_dim"] = "derived"
    if "head_dim" in vars(c0) and vars(c0)["head_dim"] is None:
        out["absent_head_dim_none"] = True
    return out


# The head-size rules posenc's resolver knows (HfHeadSize, include/posenc/config/
# hf_generated_rules.h), by the keys of a config.json without head_dim that size the model type's
# rotary table (the attention's head; a head_dim beside them is the rotary table's, checked
# against it: the resolver's head_dim rules); "head_dim" and "qk_rope_head_dim" also read a
# file's head_dim first (the rope functions' getattr(config, "head_dim", None) or ...).
HEAD_SIZE_KEYS = {
    "rotary_dim": {"rotary_dim"},  # GPT-J, CodeGen: the rotary part; the head n_embd / n_head
    "memory_attention": {
        "memory_attention_hidden_size",
        "memory_attention_downsample_rate",
        "memory_attention_num_attention_heads",
    },  # the SAM 2/3 and EdgeTAM trackers' memory attention
    "kv_channels": {"kv_channels"},  # JetMoE
    "attention_head_dim": {"attention_head_dim"},  # Zamba2
    "d_model / n_heads": {"d_model", "n_heads"},  # DBRX
    "hidden_size / decoder_num_attention_heads": {
        "hidden_size",
        "decoder_num_attention_heads",
    },  # Moonshine
    "qk_rope_head_dim": {"qk_rope_head_dim"},  # DeepSeek-V2/V3 (head_dim = qk_rope_head_dim)
}
# keys no default config.json of a class carries that a modeling file may read as its head size
ABSENT_HEAD_KEYS = ("qk_rope_head_dim", "kv_channels", "attention_head_dim", "rotary_dim")


def rotary_widths(cfg_cls, classes, d):
    """{(class, buffer): width}: the last dimension of each floating buffer (inv_freq per layer
    type, GPT-J's embed_positions, ...) of each rotary class built on the config file d (a class
    that does not build on it is left out); None where the config class refuses d."""
    try:
        cfg = cfg_cls.from_dict(copy.deepcopy(d))
    except Exception:
        return None
    out = {}
    for cls in classes:
        try:
            with torch.device("cpu"):
                emb = cls(config=cfg)
        except Exception:
            continue
        for name, buf in emb.named_buffers():
            if buf.dim() >= 1 and (buf.is_floating_point() or buf.is_complex()):
                out[(cls.__name__, name)] = int(buf.shape[-1])
    return out


def head_size_rule(cfg_cls):
    """Where the model type's rotary classes take their head size from, as one of HEAD_SIZE_KEYS'
    rules or "head_dim" (a file's head_dim, else a constant of the class or hidden_size /
    num_attention_heads); None where the keys found are none of these (vision towers' num_heads,
    a class whose tables no key changes: the resolver's generic rule, or the model type's row).
    Probed on the class's default config.json (to_dict) without head_dim: each positive integer key
    doubled in turn, each key of ABSENT_HEAD_KEYS the file lacks set to PROBE_HEAD, and the keys
    that change the width of a rotary class's table (rotary_widths) are the ones it reads; then
    head_dim set to PROBE_HEAD: whether a file's head_dim is read at all; a "head_dim" class whose
    config has qk_rope_head_dim and whose attention reads it is "qk_rope_head_dim" (the part of
    each head its attention rotates). The answer is a key name, never a probed value (none can
    reach the generated rules)."""
    classes = _config_rotary_classes(cfg_cls)
    try:
        base = copy.deepcopy(cfg_cls().to_dict())
    except Exception:
        return None
    if not classes:
        return None
    base.pop("head_dim", None)
    widths = rotary_widths(cfg_cls, classes, base)
    if not widths:
        return None

    def changes(**kw):
        w = rotary_widths(cfg_cls, classes, dict(copy.deepcopy(base), **kw))
        return w is not None and any(k in widths and widths[k] != v for k, v in w.items())

    probes = {
        k: 2 * v
        for k, v in base.items()
        if isinstance(v, int) and not isinstance(v, bool) and v > 0
    }
    probes.update({k: PROBE_HEAD for k in ABSENT_HEAD_KEYS if k not in probes})
    reads = {k for k, v in probes.items() if changes(**{k: v})}
    for rule, keys in HEAD_SIZE_KEYS.items():
        if reads == keys:
            return rule
    if reads <= {"hidden_size", "num_attention_heads"} and changes(head_dim=PROBE_HEAD):
        # a multi-head latent attention rotates the qk_rope_head_dim part it splits off each head
        # (LongCat-Flash: torch.split(q, [qk_nope_head_dim, qk_rope_head_dim])), whatever size its
        # rotary class takes from head_dim: a file where the two differ fails in transformers, and
        # the generic rule refuses it (the resolver's head_dim rules)
        if "qk_rope_head_dim" in base and attention_reads(cfg_cls, "qk_rope_head_dim"):
            return "qk_rope_head_dim"
        return "head_dim"
    return None


def attention_reads(cfg_cls, key):
    """Whether the model type's modeling file reads config.<key> (its attention's own sizes: the
    rotary classes' tables do not show them). Read from the file's source, as rotary_gate is."""
    try:
        source = inspect.getsource(modeling_module(cfg_cls))
    except Exception:
        return False
    return re.search(rf"config\.{key}\b", source) is not None


MAX_POSITION_ALIASES = (
    "max_seq_len",
    "model_max_length",
    "n_positions",
    "max_sequence_length",
    "seq_length",
    "n_ctx",
    "max_seq_length",
)
PROBE_MAX = 7777  # no class's default context length
PROBE_VALUES = (LEGACY_THETA, PROBE_PARTIAL, PROBE_LOCAL_BASE, PROBE_CONTEXT, PROBE_HEAD, PROBE_MAX)


def max_position_rules(cfg_cls):
    """Where the class takes max_position_embeddings from, and what original_max_position_embeddings
    it gives a yarn/llama3/longrope block without one (the resolver's max_position_rules):
      max_position_alias: a file key the class reads as max_position_embeddings (DBRX max_seq_len,
        GPT-J n_positions; attribute_map or set last);
      alias_original: the original the class fills when the file gives that alias: a constant (its
        default, filled before the alias was set: Bailing's 262144), or null (none: yarn fails);
      unset_original: the same for a file giving max_position_embeddings itself, where that is not
        it (DBRX: 2048, its max_seq_len default at __post_init__).
    Loaded from the class's default dict without RoPE keys and context lengths, with PROBE_MAX under
    each key and a flat yarn block without original_max_position_embeddings."""
    base = without_rope_keys(cfg_cls)
    if base is None:
        return {}
    for key in ("max_position_embeddings",) + MAX_POSITION_ALIASES:
        base.pop(key, None)

    def load(**kw):
        try:
            return cfg_cls.from_dict(dict(copy.deepcopy(base), **kw))
        except Exception:
            return None

    def original(
        key,
    ):  # (loaded, the yarn block's original); None where the class takes no flat yarn
        cfg = load(
            **{
                key: PROBE_MAX,
                "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0},
            }
        )
        params = safe_get(cfg, "rope_parameters", None) if cfg is not None else None
        if not isinstance(params, dict) or params.get("rope_type") != "yarn":
            return False, None
        return True, params.get("original_max_position_embeddings")

    c0 = load()
    if c0 is None:
        return {}
    out = {}
    loaded, value = original("max_position_embeddings")
    if loaded and value != PROBE_MAX:
        out["unset_original"] = value
    for key in MAX_POSITION_ALIASES:
        c = load(**{key: PROBE_MAX})
        if (
            c is not None
            and safe_get(c, "max_position_embeddings", None) == PROBE_MAX
            and safe_get(c0, "max_position_embeddings", None) != PROBE_MAX
        ):
            out["max_position_alias"] = key
            loaded, value = original(key)
            if not loaded or value != PROBE_MAX:
                out["alias_original"] = value if loaded else None
            break
    return out


def legacy_scaling_rules(cfg_cls, absent_partial, absent_theta=None):
    """How the config class reads transformers 4's top-level rope_scaling (and rope_theta) where it
    departs from the standard conversion (the block is rope_scaling, rope_theta joins it, the
    class's partial default applies): {"reads_scaling": false} (Cohere 2 MoE never reads it),
    {"rope_theta_from_file": false, "rope_theta": x} (GPT-NeoX), {"partial_rotary_factor": f or
    null} (Moonshine Streaming: its partial default lived in the default block the file's replaces).
    None where the class converts as the standard does."""
    base = without_rope_keys(cfg_cls)
    if base is None:
        return None
    base["rope_theta"] = LEGACY_THETA
    base["rope_scaling"] = {"rope_type": "linear", "factor": 3.0}
    # (every load gets its own copy: transformers' conversion writes the file's rope_theta into the
    # rope_scaling dict it is given, which a second load of the same dict would read as the file's)
    try:
        params = getattr(cfg_cls.from_dict(copy.deepcopy(base)), "rope_parameters", None)
    except Exception:
        return None
    blocks = rope_blocks(params)
    if len(blocks) != 1:
        return None  # per-layer conversions: the rows' flat rules (Gemma 3, OLMo 3, ...)
    b = blocks[0]
    out = {}
    if b.get("rope_type") != "linear" or b.get("factor") != 3.0:
        out["reads_scaling"] = False
    if b.get("rope_theta") != LEGACY_THETA:
        out["rope_theta_from_file"] = False
        out["rope_theta"] = b.get("rope_theta")
    partial = b.get("partial_rotary_factor")
    if partial != absent_partial and not (partial is None and absent_partial == 1.0):
        out["partial_rotary_factor"] = partial
    # a file's own flat rope_parameters block without partial_rotary_factor replaces the class's
    # default block the same way (Moonshine Streaming: no factor, the whole head)
    v5 = copy.deepcopy(base)
    v5.pop("rope_scaling", None)
    v5["rope_parameters"] = {"rope_type": "default", "rope_theta": LEGACY_THETA}
    try:
        v5_blocks = rope_blocks(
            getattr(cfg_cls.from_dict(copy.deepcopy(v5)), "rope_parameters", None)
        )
    except Exception:
        v5_blocks = []
    if len(v5_blocks) == 1:
        p5 = v5_blocks[0].get("partial_rotary_factor")
        if p5 != absent_partial and not (p5 is None and absent_partial == 1.0):
            out["block_partial_rotary_factor"] = p5
    # the same file without a top-level rope_theta: the class's attribute default, which can
    # differ from its default block's (Ministral 3: 1e4 beside a 1e6 block)
    base.pop("rope_theta")
    try:
        bare = rope_blocks(getattr(cfg_cls.from_dict(copy.deepcopy(base)), "rope_parameters", None))
    except Exception:
        bare = []
    if (
        len(bare) == 1
        and isinstance(bare[0].get("rope_theta"), (int, float))
        and bare[0]["rope_theta"] != absent_theta
    ):
        out["absent_rope_theta"] = float(bare[0]["rope_theta"])
    return out or None


def composite_text_defaults(model_type, own):
    """The keys of DEFAULT_KEYS whose value the composite's text_config takes, for a file whose
    text_config leaves them out, where that differs from the text config class's own defaults."""
    try:
        cfg_cls = CONFIG_MAPPING[model_type]
        spec = (getattr(cfg_cls, "sub_configs_defaults", None) or {}).get("text_config")
        if spec is None:
            return None
        d = copy.deepcopy(cfg_cls().to_dict())
        text = d.get("text_config")
        text_type = (text or {}).get("model_type") if isinstance(text, dict) else None
        if not text_type or text_type not in CONFIG_MAPPING:
            return None
        d["text_config"] = {"model_type": text_type}
        loaded = cfg_cls.from_dict(d).get_text_config()
        bare = CONFIG_MAPPING[text_type].from_dict({"model_type": text_type})
    except Exception:
        return None
    out = {}
    for key in DEFAULT_KEYS:
        a = vars(loaded).get(key, safe_get(loaded, key, None))
        b = vars(bare).get(key, safe_get(bare, key, None))
        if key == "rope_theta":
            pa, pb = (
                safe_get(loaded, "rope_parameters", None),
                safe_get(bare, "rope_parameters", None),
            )
            if isinstance(pa, dict) and "rope_theta" in pa:
                a = pa["rope_theta"]
            if isinstance(pb, dict) and "rope_theta" in pb:
                b = pb["rope_theta"]
        if key == "head_dim":  # a constant where it is not the loaded hidden_size / heads
            hidden, heads = (
                safe_get(loaded, "hidden_size", None),
                safe_get(loaded, "num_attention_heads", None),
            )
            if (
                isinstance(a, int)
                and isinstance(hidden, int)
                and isinstance(heads, int)
                and heads > 0
                and a != hidden // heads
            ):
                out[key] = a
            continue
        if a != b and isinstance(a, (int, float)) and not isinstance(a, bool):
            out[key] = a
    # a composite whose own text_config defaults hold a rope_parameters block keeps it over a
    # file's top-level rope_theta (GLM-ASR: {**init_kwargs, **file} gives the text class both, and
    # its conversion only setdefaults the theta): recorded as that block, the file's theta unread
    try:
        d["text_config"] = {"model_type": text_type, "rope_theta": LEGACY_THETA}
        marked = cfg_cls.from_dict(copy.deepcopy(d)).get_text_config()
        blocks = rope_blocks(safe_get(marked, "rope_parameters", None))
    except Exception:
        blocks = []
    if (
        len(blocks) == 1
        and isinstance(blocks[0].get("rope_theta"), (int, float))
        and blocks[0]["rope_theta"] != LEGACY_THETA
    ):
        block = {k: v for k, v in blocks[0].items() if k != "type"}
        out["rope_parameters"] = json.loads(json.dumps(block))
    return out or None


def block_theta_defaults(cfg_cls):
    """The rope_theta the class gives a rope_parameters block of the file that has none (and no
    top-level rope_theta): per layer type for nested blocks ({"full_attention": 1e6, ...}), or one
    number. The class's own default block with rope_theta removed, loaded through from_dict."""
    try:
        base = copy.deepcopy(cfg_cls().to_dict())
        params = base.get("rope_parameters")
        if not isinstance(params, dict) or not params:
            return None
        for b in rope_blocks(params):
            b.pop("rope_theta", None)
        base.pop("rope_theta", None)
        base.pop("rope_scaling", None)
        loaded = getattr(cfg_cls.from_dict(base), "rope_parameters", None)
    except Exception:
        return None
    if not isinstance(loaded, dict):
        return None
    if all(isinstance(v, dict) or v is None for v in loaded.values()) and loaded:
        out = {
            k: v.get("rope_theta")
            for k, v in loaded.items()
            if isinstance(v, dict) and isinstance(v.get("rope_theta"), (int, float))
        }
        return out or None
    t = loaded.get("rope_theta")
    return float(t) if isinstance(t, (int, float)) else None


def block_theta_missing(cfg_cls):
    """The layer types ("" for a flat block; "*": the class refuses the file) whose rope_parameters
    block, given without rope_theta and with no top-level rope_theta, the class leaves without one:
    transformers' rope functions then fail (KeyError 'rope_theta'; Gemma 4, MiMo-V2-Flash), where
    most classes fill default_theta. The class's own default dict, thetas removed, loaded."""
    try:
        base = copy.deepcopy(cfg_cls().to_dict())
    except Exception:
        return None
    params = base.get("rope_parameters")
    if not isinstance(params, dict) or not params:
        return None
    for b in rope_blocks(params):
        b.pop("rope_theta", None)
    base.pop("rope_theta", None)
    base.pop("rope_scaling", None)
    try:
        loaded = getattr(cfg_cls.from_dict(base), "rope_parameters", None)
    except Exception:
        return ["*"]
    if not isinstance(loaded, dict) or not loaded:
        return None
    if "rope_type" not in loaded and all(isinstance(v, dict) or v is None for v in loaded.values()):
        missing = sorted(
            k for k, v in loaded.items() if isinstance(v, dict) and "rope_theta" not in v
        )
        return missing or None
    return [""] if "rope_theta" not in loaded else None


SCALED_BLOCKS = {  # one valid block of each scaling type (the rope functions' required keys)
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    },
}


def _config_rotary_classes(cfg_cls):
    """The rotary classes of the model type's modeling file that take a config."""
    try:
        return [
            obj for _, obj, takes_config in rotary_classes(modeling_module(cfg_cls)) if takes_config
        ]
    except Exception:
        return []


def _loads_and_builds(cfg_cls, file_dict, rotary, kept):
    """True where the config class loads file_dict and every rotary class builds on it, False
    where either raises, None where the loaded rope_parameters fail kept(params) (converted)."""
    try:
        cfg = cfg_cls.from_dict(file_dict)
        if not kept(safe_get(cfg, "rope_parameters", None)):
            return None
        for cls in rotary:
            with torch.device("cpu"):
                cls(config=cfg)
        return True
    except Exception:
        return False


def _nested_rope_types_rejected(cfg_cls, base, own_rp):
    """rope_types_rejected for a class whose default rope_parameters is one block per layer type."""
    base = dict(base)
    base.setdefault("max_position_embeddings", 4096)
    rotary = _config_rotary_classes(cfg_cls)

    def works(block, with_rotary):
        layers = {}
        for lt, own in own_rp.items():
            kept = {k: v for k, v in own.items() if k in ("rope_theta", "partial_rotary_factor")}
            layers[lt] = {**kept, **copy.deepcopy(block)}

        def kept_type(params):  # converted: not this probe's question
            return isinstance(params, dict) and all(
                isinstance(v, dict) and v.get("rope_type") == block["rope_type"]
                for v in params.values()
                if v is not None
            )

        return _loads_and_builds(
            cfg_cls,
            dict(copy.deepcopy(base), rope_parameters=layers),
            rotary if with_rotary else [],
            kept_type,
        )

    if works({"rope_type": "default"}, False) is not True:
        return None
    # the scaled types through the rotary classes too, where they build the default rope
    with_rotary = works({"rope_type": "default"}, True) is True
    rejected = [t for t, b in SCALED_BLOCKS.items() if works(b, with_rotary) is False]
    if (
        works(
            {
                "rope_type": "longrope",
                "original_max_position_embeddings": 1024,
                "short_factor": [1.0] * 4,
                "long_factor": [2.0] * 4,
                "short_mscale": 1.0,
                "long_mscale": 1.0,
            },
            False,
        )
        is False
    ):
        rejected.append("longrope")
    return rejected or None


def rope_types_rejected(cfg_cls):
    """The scaling types the model type's config class or rotary class refuses where it takes the
    default rope (Phi-3's validate_rope: default and longrope only; RecurrentGemma's rotary class:
    default only): a flat block of each type (SCALED_BLOCKS, with the class's own theta) on the
    class's default dict, loaded and given to each rotary class of its modeling file that takes a
    config. Per-layer-type classes (a nested default) get the block in every layer type (each
    keeping its own theta and partial factor); their longrope block is judged by the config
    class alone (Gemma 4's validator cannot read a global head_dim and raises on any longrope
    block), since one factor list cannot fit layer types of different rotary sizes."""
    base = without_rope_keys(cfg_cls)
    if base is None:
        return None
    try:
        own_rp = cfg_cls().to_dict().get("rope_parameters")
    except Exception:
        own_rp = None
    nested = (
        isinstance(own_rp, dict) and own_rp and all(isinstance(v, dict) for v in own_rp.values())
    )
    if nested:
        return _nested_rope_types_rejected(cfg_cls, base, own_rp)
    base.setdefault("max_position_embeddings", 4096)
    # a head size the rope functions can read (a class leaving head_dim None fails on dynamic and
    # yarn for that reason alone: the resolver's head_dim rules say so)
    hidden, heads = base.get("hidden_size"), base.get("num_attention_heads")
    if (
        base.get("head_dim") is None
        and isinstance(hidden, int)
        and isinstance(heads, int)
        and heads
    ):
        base["head_dim"] = hidden // heads
    rotary = _config_rotary_classes(cfg_cls)

    def works(block):
        return _loads_and_builds(  # converted or nested: not this probe's question
            cfg_cls,
            dict(copy.deepcopy(base), rope_parameters=dict(block)),
            rotary,
            lambda params: (
                isinstance(params, dict) and params.get("rope_type") == block["rope_type"]
            ),
        )

    theta = {"rope_theta": 10000.0}
    if works({"rope_type": "default", **theta}) is not True:
        return None
    rejected = [t for t, b in SCALED_BLOCKS.items() if works({**b, **theta}) is False]
    # longrope: one factor per frequency (the class's own partial factor, or the whole head) and
    # PhiMoE's required mscales (other classes ignore them)
    head = base.get("head_dim")
    if isinstance(head, int) and head > 0:
        own = cfg_cls().to_dict()
        own_rp = own.get("rope_parameters") if isinstance(own.get("rope_parameters"), dict) else {}
        partials = {
            1.0,
            float(own_rp.get("partial_rotary_factor") or own.get("partial_rotary_factor") or 1.0),
        }
        outcomes = []
        for partial in sorted(partials):
            pairs = int(head * partial) // 2
            outcomes.append(
                works(
                    {
                        "rope_type": "longrope",
                        "original_max_position_embeddings": 1024,
                        "short_factor": [1.0] * pairs,
                        "long_factor": [2.0] * pairs,
                        "short_mscale": 1.0,
                        "long_mscale": 1.0,
                        **theta,
                    }
                )
            )
        if outcomes and all(o is False for o in outcomes):
            rejected.append("longrope")
    return rejected or None


def values_rejected(cfg_cls):
    """The spellings of a config.json the model type's config or rotary class refuses where the
    usual one loads and builds (transformers' strict dataclass fields, its rope functions' pow, its
    ROPE_INIT_FUNCTIONS without legacy names), each a file that differs from a working one in that
    spelling alone:
      rope_theta_string / rope_theta_integer   a top-level rope_theta "10000.0" / 10000 (ESM's
                                               typed field takes only a float)
      block_rope_theta_string                  a flat rope_parameters block's rope_theta as a string
      head_dim_float                           head_dim 64.0 for 64 (Llama's typed field)
      max_position_embeddings_float            max_position_embeddings 4096.0 for 4096
      rope_type_su                             a legacy rope_scaling {"type": "su"} (Phi-3's own
                                               name for longrope) where "longrope" builds
      rope_type_mrope                          a legacy rope_scaling {"type": "mrope"} (Qwen2-VL's)
                                               where a default block with the same sections builds
    None where the class has no default instance or no rotary class that takes a config."""
    rotary = _config_rotary_classes(cfg_cls)
    base = without_rope_keys(cfg_cls)
    if not rotary or base is None:
        return None
    try:
        own = copy.deepcopy(cfg_cls().to_dict())
    except Exception:
        return None
    own.pop("rope_scaling", None)
    own.setdefault("max_position_embeddings", 4096)
    base.setdefault("max_position_embeddings", 4096)
    rp = own.get("rope_parameters")
    theta = rp.get("rope_theta") if isinstance(rp, dict) else None
    theta = (
        float(theta) if isinstance(theta, (int, float)) and not isinstance(theta, bool) else 10000.0
    )

    def builds(d, classes):
        try:
            cfg = cfg_cls.from_dict(copy.deepcopy(d))
            for cls in classes:
                with torch.device("cpu"):
                    cls(config=cfg)
            return True
        except Exception:
            return False

    rotary = [cls for cls in rotary if builds(own, [cls])]  # a tower's class takes another config

    def works(d):
        return bool(rotary) and builds(d, rotary)

    legacy = dict(copy.deepcopy(base), rope_theta=theta)
    cases = {
        "rope_theta_string": (legacy, dict(copy.deepcopy(legacy), rope_theta=str(theta))),
        "max_position_embeddings_float": (
            own,
            dict(copy.deepcopy(own), max_position_embeddings=float(own["max_position_embeddings"])),
        ),
    }
    if theta == int(theta):
        cases["rope_theta_integer"] = (legacy, dict(copy.deepcopy(legacy), rope_theta=int(theta)))
    if isinstance(rp, dict) and rp and not any(isinstance(v, dict) for v in rp.values()):
        flat = dict(copy.deepcopy(own), rope_parameters=dict(rp, rope_theta=theta))
        cases["block_rope_theta_string"] = (
            flat,
            dict(copy.deepcopy(flat), rope_parameters=dict(rp, rope_theta=str(theta))),
        )
    head = own.get("head_dim")
    if isinstance(head, int) and not isinstance(head, bool):
        cases["head_dim_float"] = (own, dict(copy.deepcopy(own), head_dim=float(head)))
    hidden, heads = own.get("hidden_size"), own.get("num_attention_heads")
    if (
        not isinstance(head, int)
        and isinstance(hidden, int)
        and isinstance(heads, int)
        and heads > 0
    ):
        head = hidden // heads
    if isinstance(head, int) and head > 0 and not isinstance(head, bool):
        partial = (
            float(
                (rp or {}).get("partial_rotary_factor") or own.get("partial_rotary_factor") or 1.0
            )
            if isinstance(rp, dict)
            else 1.0
        )
        pairs = int(head * partial) // 2
        block = {
            "short_factor": [1.0] * pairs,
            "long_factor": [2.0] * pairs,
            "original_max_position_embeddings": 1024,
            "short_mscale": 1.0,
            "long_mscale": 1.0,
        }
        cases["rope_type_su"] = (
            dict(copy.deepcopy(legacy), rope_scaling=dict(block, rope_type="longrope")),
            dict(copy.deepcopy(legacy), rope_scaling=dict(block, type="su")),
        )
        if pairs >= 3:
            sections = [pairs - 2 * (pairs // 3), pairs // 3, pairs // 3]
            cases["rope_type_mrope"] = (
                dict(
                    copy.deepcopy(legacy),
                    rope_scaling={"rope_type": "default", "mrope_section": sections},
                ),
                dict(
                    copy.deepcopy(legacy), rope_scaling={"type": "mrope", "mrope_section": sections}
                ),
            )
    out = sorted(name for name, (a, b) in cases.items() if works(a) and not works(b))
    return out or None


def absent_defaults(cfg_cls):
    """What the config class uses for each DEFAULT_KEYS key a config.json leaves out: a constant
    (read from a default instance), or nothing when the class derives it (head_dim from
    hidden_size / num_attention_heads: a second instance with another hidden_size tells)."""
    try:
        cfg = cfg_cls()
    except Exception:
        return {}
    out = {}
    params = safe_get(cfg, "rope_parameters", None)
    if isinstance(params, dict) and isinstance(params.get("rope_theta"), (int, float)):
        out["rope_theta"] = float(params["rope_theta"])
    elif isinstance(safe_get(cfg, "rope_theta", None), (int, float)):
        out["rope_theta"] = float(cfg.rope_theta)
    if isinstance(params, dict) and isinstance(params.get("partial_rotary_factor"), (int, float)):
        out["partial_rotary_factor"] = float(params["partial_rotary_factor"])
    elif isinstance(safe_get(cfg, "partial_rotary_factor", None), (int, float)):
        out["partial_rotary_factor"] = float(cfg.partial_rotary_factor)
    block = absent_rope_parameters(cfg_cls)
    if block is not None:
        out["rope_parameters"] = block
    if top_level_theta_raises(cfg_cls):
        out["rope_theta_raises"] = True
    if null_rope_scaling_unsets(cfg_cls):
        out["null_rope_scaling_unsets"] = True
    for key, probe in (
        ("original_not_filled", original_not_filled),
        ("top_original_unread", top_original_unread),
        ("required_block_keys", required_block_keys),
    ):
        found = probe(cfg_cls)
        if found is not None:
            out[key] = found
    mrope = mrope_rules(cfg_cls)
    if mrope is not None:
        out.update(mrope)
    gate = rotary_gate(cfg_cls)
    if gate is not None:
        out["rotary_gate"] = gate
    rejected = values_rejected(cfg_cls)
    if rejected is not None:
        out["values_rejected"] = rejected
    block_theta = block_theta_defaults(cfg_cls)
    if block_theta is not None:
        out["block_rope_theta"] = block_theta
    missing = block_theta_missing(cfg_cls)
    if missing is not None:
        out["block_theta_missing"] = missing
    legacy = legacy_scaling_rules(cfg_cls, out.get("partial_rotary_factor"), out.get("rope_theta"))
    if legacy is not None:
        out["legacy_rope_scaling"] = legacy
    for key in ("max_position_embeddings", "global_head_dim"):
        value = safe_get(cfg, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    if isinstance(safe_get(cfg, "rope_interleave", None), bool):
        out["rope_interleave"] = cfg.rope_interleave
    head = vars(cfg).get("head_dim", safe_get(cfg, "head_dim", None))
    # (read from the instance first: a per-layer attribute such as dots3's num_attention_heads
    # raises through getattr)
    hidden = vars(cfg).get("hidden_size", safe_get(cfg, "hidden_size", None))
    heads = vars(cfg).get("num_attention_heads", safe_get(cfg, "num_attention_heads", None))
    if isinstance(head, int) and isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        # loaded as from_pretrained loads a file without head_dim: a constant, or hidden / heads
        # (checked again at another hidden_size)
        def head_without_key(hidden_size):
            d = copy.deepcopy(cfg.to_dict())
            d.pop("head_dim", None)
            d["hidden_size"] = hidden_size
            loaded = cfg_cls.from_dict(d)
            # a per-layer attribute (Gemma 4) is stored all the same
            return vars(loaded).get("head_dim", safe_get(loaded, "head_dim", None))

        try:
            h1 = head_without_key(hidden)
            if isinstance(h1, int) and (
                h1 != hidden // heads or head_without_key(hidden * 2) == h1
            ):
                out["head_dim"] = h1
        except Exception:
            try:
                other = cfg_cls(hidden_size=hidden * 2)
                if safe_get(other, "head_dim", None) == head:  # a constant, not hidden / heads
                    out["head_dim"] = head
            except Exception:
                pass
    return out


def numbers_in(value):
    """Every number of a JSON-like value (bools left out)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers_in(v)]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in numbers_in(v)]
    return []


# The typed table's fields (include/posenc/config/hf_generated_rules.h), in declaration order
# (designated initializers follow it), each with its kind: D double, I integer, B a bool set only
# where it departs from its default, OB an optional bool, S a string, SL a list of strings, IL a
# list of integers, ND / NI a double / integer that may be None, RT a set of rope types, and
# nested structs. A key the generator writes that is not here stops the generator: it must be
# given a field (and the resolver a reader) before posenc can take it.
BLOCK_FIELDS = {
    "layer_type": "S",
    "no_rope": "B",
    "rope_type": "S",
    "rope_theta": "D",
    "rope_theta_from_file": "B",
    "partial_rotary_factor": "D",
    "factor": "D",
    "original_max_position_embeddings": "I",
    "max_position_embeddings": "I",
    "attention_factor": "D",
    "beta_fast": "D",
    "beta_slow": "D",
    "mscale": "D",
    "mscale_all_dim": "D",
    "truncate": "OB",
    "low_freq_factor": "D",
    "high_freq_factor": "D",
    "llama_4_scaling_beta": "D",
    "mrope_section": "IL",
}
DEFAULTS_FIELDS = {
    "rope_theta": "D",
    "partial_rotary_factor": "D",
    "head_dim": "I",
    "global_head_dim": "I",
    "max_position_embeddings": "I",
    "rope_interleave": "OB",
    "rope_parameters": "BLOCKS",
}
ROPE_TYPES = ("linear", "dynamic", "yarn", "longrope", "llama3")
NULL_HEAD_DIM = {"none": "kNone", "raises": "kRaises", "derived": "kDerived"}
# head_size_rule's answers -> HfHeadSize (include/posenc/config/hf_generated_rules.h; its
# hf_head_size_name gives the same names back)
HEAD_SIZES = {
    "qk_rope_head_dim": "kGeneric",
    "head_dim": "kHeadDim",
    "kv_channels": "kKvChannels",
    "attention_head_dim": "kAttentionHeadDim",
    "d_model / n_heads": "kDModelPerHead",
    "hidden_size / decoder_num_attention_heads": "kDecoderHeads",
    "rotary_dim": "kRotaryDim",
    "memory_attention": "kMemoryAttention",
}
STRUCTS = {
    "HfHeadDimRules": {
        "null_head_dim": "NULL_HEAD_DIM",
        "head_dim_overridden": "B",
        "head_dim_raises": "B",
        "head_dim_alias_of": "S",
        "absent_head_dim_none": "B",
    },
    "HfLegacyScaling": {
        "reads_scaling": "B_TRUE",
        "rope_theta_from_file": "B_TRUE",
        "rope_theta": "ND",
        "absent_rope_theta": "D",
        "partial_rotary_factor": "ND",
        "block_partial_rotary_factor": "ND",
    },
    "HfMaxPositionRules": {
        "max_position_alias": "S",
        "alias_original": "NI",
        "unset_original": "NI",
    },
    "HfRotaryGate": {"key": "S", "rotary": "S", "absent": "OS"},
}
RULE_FIELDS = {
    "defaults": "DEFAULTS",
    "text_config_defaults": "DEFAULTS",
    "block_rope_theta": "LAYER_THETA",
    "block_theta_missing": "SL",
    "head_dim_rules": "HfHeadDimRules",
    "head_size": "HEAD_SIZE",
    "legacy_rope_scaling": "HfLegacyScaling",
    "max_position_rules": "HfMaxPositionRules",
    "mrope_default_section": "IL",
    "mrope_layout": "S",
    "null_rope_scaling_unsets": "B",
    "original_not_filled": "RT",
    "pair_layout": "S",
    "required_block_keys": "REQUIRED",
    "rope_theta_raises": "B",
    "rope_types_rejected": "RT",
    "rotary_gate": "ROTARY_GATE",
    "top_original_unread": "RT",
    "unread_keys": "SL",
    "values_rejected": "REJECTED",
}
VALUES_REJECTED = (
    "rope_theta_string",
    "rope_theta_integer",
    "block_rope_theta_string",
    "head_dim_float",
    "max_position_embeddings_float",
    "rope_type_su",
    "rope_type_mrope",
)
STRINGS_ALLOWED = {
    "pair_layout": ("half", "interleaved"),
    "mrope_layout": ("contiguous", "interleaved"),
}


def rules_rows(rows):
    """[(model type or "<composite>/text_config", values)] -> one row per model type in the typed
    table's shape: its config class's defaults for absent keys under "defaults" (a composite's own
    text_config defaults under "text_config_defaults"), each rule under its own name."""
    out = {}
    for mt, values in rows:
        composite = mt.endswith("/text_config")
        base = mt[: -len("/text_config")] if composite else mt
        row = out.setdefault(base, {"model_type": base})
        defaults = {k: v for k, v in values.items() if k in DEFAULTS_FIELDS}
        rules = {k: v for k, v in values.items() if k not in DEFAULTS_FIELDS}
        if composite and rules:
            raise ValueError(f"{mt}: a composite's text_config row holds rules {sorted(rules)}")
        if defaults:
            row["text_config_defaults" if composite else "defaults"] = defaults
        row.update(rules)
    return [out[k] for k in sorted(out)]


def _cpp(value, kind, where):
    """The C++ initializer of one field's value."""

    def fail(why):
        raise ValueError(f"gen_hf_architectures: {where}: {why}: {value!r}")

    if kind in ("D", "ND"):
        if kind == "ND" and value is None:
            return "kHfNone"
        if not isinstance(value, float) or value != value or value in (float("inf"), -float("inf")):
            fail("expected a finite float")
        return repr(value)
    if kind in ("I", "NI"):
        if kind == "NI" and value is None:
            return "kHfNone"
        if not isinstance(value, int) or isinstance(value, bool):
            fail("expected an integer")
        return str(value)
    if kind in ("B", "B_TRUE"):
        if not isinstance(value, bool) or value == (kind == "B_TRUE"):
            fail("expected a bool departing from the field's default")
        return "true" if value else "false"
    if kind == "OB":
        if not isinstance(value, bool):
            fail("expected a bool")
        return "true" if value else "false"
    if kind in ("S", "OS"):
        if not isinstance(value, str) or not value.isascii() or '"' in value or "\\" in value:
            fail("expected a plain string")
        allowed = STRINGS_ALLOWED.get(where.rsplit(".", 1)[-1])
        if allowed and value not in allowed:
            fail(f"expected one of {allowed}")
        return f'"{value}"'
    if kind == "SL":
        if not isinstance(value, list) or not value:
            fail("expected a non-empty list of strings")
        return "{" + ", ".join(_cpp(v, "S", where) for v in value) + "}"
    if kind == "IL":
        if not isinstance(value, list) or not value:
            fail("expected a non-empty list of integers")
        return "{" + ", ".join(_cpp(v, "I", where) for v in value) + "}"
    if kind == "RT":
        if not isinstance(value, list) or not value or any(v not in ROPE_TYPES for v in value):
            fail(f"expected rope types of {ROPE_TYPES}")
        return "{" + ", ".join(f".{t} = true" for t in ROPE_TYPES if t in value) + "}"
    if kind == "REJECTED":
        if not isinstance(value, list) or not value or any(v not in VALUES_REJECTED for v in value):
            fail(f"expected names of {VALUES_REJECTED}")
        return "{" + ", ".join(f".{t} = true" for t in VALUES_REJECTED if t in value) + "}"
    if kind == "REQUIRED":
        if not isinstance(value, dict) or not value or set(value) - set(ROPE_TYPES):
            fail(f"expected lists of keys per rope type of {ROPE_TYPES}")
        return (
            "{"
            + ", ".join(f".{t} = {_cpp(value[t], 'SL', where)}" for t in ROPE_TYPES if t in value)
            + "}"
        )
    if kind == "NULL_HEAD_DIM":
        if value not in NULL_HEAD_DIM:
            fail(f"expected one of {sorted(NULL_HEAD_DIM)}")
        return "HfNullHeadDim::" + NULL_HEAD_DIM[value]
    if kind == "HEAD_SIZE":  # a rule's name, never a number (no probed size reaches the table)
        if value not in HEAD_SIZES:
            fail(f"expected one of {sorted(HEAD_SIZES)}")
        return "HfHeadSize::" + HEAD_SIZES[value]
    if kind == "LAYER_THETA":
        pairs = [("", value)] if not isinstance(value, dict) else sorted(value.items())
        if not pairs:
            fail("expected a theta or thetas per layer type")
        return (
            "{"
            + ", ".join(f"{{{_cpp(t, 'S', where)}, {_cpp(v, 'D', where)}}}" for t, v in pairs)
            + "}"
        )
    if kind == "ROTARY_GATE":
        if not isinstance(value, dict) or set(value) != {"key", "rotary", "absent"}:
            fail("expected key, rotary and absent")
        fields = {k: v for k, v in value.items() if not (k == "absent" and v is None)}
        return _struct(fields, STRUCTS["HfRotaryGate"], where, "")
    if kind in STRUCTS:
        if not isinstance(value, dict) or not value:
            fail("expected a non-empty object")
        return _struct(value, STRUCTS[kind], where, kind)
    if kind == "DEFAULTS":
        if not isinstance(value, dict) or not value:
            fail("expected a non-empty object")
        return _struct(value, DEFAULTS_FIELDS, where, "")
    if kind == "BLOCKS":
        if not isinstance(value, dict) or not value:
            fail("expected a rope_parameters object")
        nested = all(isinstance(v, dict) or v is None for v in value.values())
        blocks = (
            [
                dict(v or {}, layer_type=k, **({"no_rope": True} if v is None else {}))
                for k, v in sorted(value.items())  # (the class's dict order means nothing)
            ]
            if nested
            else [value]
        )
        return "{" + ", ".join(_struct(b, BLOCK_FIELDS, where, "") for b in blocks) + "}"
    fail(f"unknown kind {kind}")
    return ""


def _struct(value, fields, where, type_name):
    """A designated initializer of `fields` (declaration order) from a JSON object."""
    unknown = set(value) - set(fields)
    if unknown:
        raise ValueError(
            f"gen_hf_architectures: {where}: {sorted(unknown)} have no field in "
            "include/posenc/config/hf_generated_rules.h (add one, and the rule that reads it)"
        )
    parts = [
        f".{name} = {_cpp(value[name], kind, where + '.' + name)}"
        for name, kind in fields.items()
        if name in value
    ]
    return type_name + "{" + ", ".join(parts) + "}"


def rules_inc(rows, version):
    """src/config/hf_generated_rules.inc: the rows as designated initializers of HfGeneratedRules
    (include/posenc/config/hf_generated_rules.h), one field a line."""
    lines = [
        f"// Generated by tools/gen_hf_architectures.py from transformers {version}: for each model",
        "// type, what its config class uses for a key posenc reads when a config.json leaves it out",
        "// (defaults) and how its config and rotary classes read a file (the rules), learned by",
        "// calling them; the same rows as JSON: tests/fixtures/hf_architectures/generated_rules.json.",
        "// Do not edit: rerun the generator. Included by src/config/hf_generated_rules.cpp.",
    ]
    for row in rows:
        mt = row["model_type"]
        unknown = set(row) - set(RULE_FIELDS) - {"model_type"}
        if unknown:
            raise ValueError(
                f"gen_hf_architectures: {mt}: rules {sorted(unknown)} have no field in "
                "include/posenc/config/hf_generated_rules.h (add one, and the step that reads it)"
            )
        fields = [f".model_type = {_cpp(mt, 'S', mt)}"] + [
            f".{name} = {_cpp(row[name], kind, mt + '.' + name)}"
            for name, kind in RULE_FIELDS.items()
            if name in row
        ]
        lines.append("    {" + ",\n     ".join(fields) + "},")
    return "\n".join(lines) + "\n"


def partial_ignored(records):
    """Model types (of the config a class is built from) whose default rope ignores
    partial_rotary_factor: every probed 1D table of theirs keeps its frequencies when the factor is
    halved (Llama's compute_default_rope_parameters takes the whole head_dim)."""
    verdicts = {}
    for record in records:
        for table in record["tables"]:
            for row in table.get("layer_types", []):
                probe_row, inv = row.get("default_partial_probe") or {}, row.get("inv_freq")
                if "pairs" not in probe_row or not inv:
                    continue
                if row.get("rotary_dim") != 2 * len(inv):  # a vision tower's per-axis ladder
                    continue
                key = table.get("config_model_type") or record["model_type"]
                own = record["model_type"] == key  # the model type's own modeling file
                verdicts.setdefault(key, {True: set(), False: set()})[own].add(
                    probe_row["pairs"] == probe_row["pairs_before"]
                )
    # a model type's own class decides (a Llama config also builds GLM-ASR's encoder rotary)
    return sorted(k for k, v in verdicts.items() if (v[True] or v[False]) == {True})


def unread_keys(records):
    """Model type -> the reads_probe keys its own rotary classes never read: false in every probed
    row of the classes of its modeling file built from a config of that type (true or unprobed in
    none). The resolver ignores them (with a warning), as the class does."""
    verdicts = {}
    for record in records:
        for table in record["tables"]:
            key = table.get("config_model_type") or record["model_type"]
            if key != record["model_type"] or (
                table.get("config_path") and not table.get("config_model_type")
            ):
                continue  # another modeling file's class (GLM-ASR's text model: Llama's), or a
                # sub-config without a model type (Evolla's protein encoder)
            for row in table.get("layer_types", []):
                if "cos" not in row:
                    continue
                reads = row.get("reads")
                for k in READ_KEYS:
                    verdicts.setdefault(key, {}).setdefault(k, set()).add(
                        reads.get(k) if isinstance(reads, dict) else None
                    )
    out = {}
    for mt, v in sorted(verdicts.items()):
        keys = [k for k in READ_KEYS if v.get(k) == {False}]
        # the factor is probed on the default rope only, which Llama's ignores and its scaled ropes
        # read: unread only where no block is read at all (GPT-J, ESM)
        if "partial_rotary_factor" in keys and "rope_parameters" not in keys:
            keys.remove("partial_rotary_factor")
        if keys:
            out[mt] = keys
    return out


def pair_layouts(records):
    """Model type -> the pair layout its own rotary classes' attention rotates ("half" or
    "interleaved", layout_of: rotate_half, rotate_every_two, view_as_complex, ...), where every
    probed row of the classes of its modeling file built from a config of that type agrees. The
    resolver takes it for a model type without a row of its own (Llama 4: view_as_complex)."""
    seen = {}
    for record in records:
        for table in record["tables"]:
            key = table.get("config_model_type") or record["model_type"]
            if key != record["model_type"] or (
                table.get("config_path") and not table.get("config_model_type")
            ):
                continue
            for row in table.get("layer_types", []):
                if "layout" in row:
                    seen.setdefault(key, set()).add(row["layout"])
    return {
        mt: v.pop()
        for mt, v in sorted(seen.items())
        if len(v) == 1 and v <= {"half", "interleaved"}
    }


def text_config_types(records):
    """(composite model type, its text_config's model type) where a class is built from text_config:
    what transformers builds a text_config without a model_type as (LLaVA's: Llama)."""
    pairs = {}
    for record in records:
        for table in record["tables"]:
            sub = table.get("config_model_type")
            if table.get("config_path") == "text_config" and sub and sub != record["model_type"]:
                pairs.setdefault(record["model_type"], sub)
    return sorted(pairs.items())


def flat_text_carried(text_types):
    """Composites whose config class builds text_config from text keys at the top level of a
    config.json without one (transformers 4's flat layout: Qwen2-VL); the others ignore such keys and
    take the text config class's defaults (LLaVA), so posenc refuses a flat config of theirs."""
    out = []
    for composite, _ in text_types:
        try:
            d = copy.deepcopy(CONFIG_MAPPING[composite]().to_dict())
        except Exception:
            continue
        d.pop("text_config", None)
        d.pop("rope_parameters", None)
        d.pop("rope_scaling", None)
        d["rope_theta"] = LEGACY_THETA
        d["max_position_embeddings"] = PROBE_CONTEXT
        try:
            text = CONFIG_MAPPING[composite].from_dict(d).get_text_config()
        except Exception:
            continue
        params = getattr(text, "rope_parameters", None)
        thetas = [b.get("rope_theta") for b in rope_blocks(params)] or [
            getattr(text, "rope_theta", None)
        ]
        if (
            all(t == LEGACY_THETA for t in thetas)
            and getattr(text, "max_position_embeddings", None) == PROBE_CONTEXT
        ):
            out.append(composite)
    return out


def local_base_freq_readers(model_types):
    """Model types whose config class turns a flat rope_local_base_freq into the sliding-window
    layers' rope_theta (Gemma 3 and its kin); the others ignore the key."""
    out = []
    for mt in model_types:
        cfg_cls = CONFIG_MAPPING[mt]
        d = without_rope_keys(cfg_cls)
        if d is None:
            continue
        d["rope_theta"] = LEGACY_THETA
        d["rope_local_base_freq"] = PROBE_LOCAL_BASE
        try:
            blocks = rope_blocks(getattr(cfg_cls.from_dict(d), "rope_parameters", None))
        except Exception:
            continue
        if any(b.get("rope_theta") == PROBE_LOCAL_BASE for b in blocks):
            out.append(mt)
    return out


def model_types_inc(
    index, ignores_partial=(), top_level_unread=(), text_types=(), flat_carried=(), local_base=()
):
    """src/config/hf_model_types.inc: the model types of this transformers by status."""

    def array(name, names):
        lines, line = [], "   "
        for n in names:
            item = f' "{n}",'
            if len(line) + len(item) > 98:
                lines.append(line)
                line = "   "
            line += item
        lines.append(line)
        return f"constexpr std::string_view {name}[] = {{\n" + "\n".join(lines) + "\n};\n"

    rotary = [
        r["model_type"]
        for r in index
        if "skipped" not in r or r["skipped"].startswith("no rotary class builds")
    ]
    none = [r["model_type"] for r in index if r.get("skipped") == "no rotary class"]
    unchecked = [r["model_type"] for r in index if r.get("skipped", "").startswith("no modeling")]
    return (
        f"// Generated by tools/gen_hf_architectures.py from transformers {transformers.__version__}'s\n"
        "// CONFIG_MAPPING; tests/test_hf_architectures.cpp checks it against the fixtures' index.json.\n"
        "//   kRotaryModelTypes    the modeling file defines a rotary embedding class\n"
        "//   kNoRotaryModelTypes  the modeling file defines none (learned, sinusoidal, relative or no\n"
        "//                        positions)\n"
        "//   kNoModelingModelTypes  no generated modeling file (only a modular one): not checked\n"
        "//   kDefaultRopeIgnoresPartialModelTypes  the class's default rope takes the whole head\n"
        "//                        whatever partial_rotary_factor says (its partial_probe)\n"
        "//   kTopLevelPartialUnreadModelTypes  the config class leaves a top-level\n"
        "//                        partial_rotary_factor out of rope_parameters (unread)\n"
        "//   kTextConfigModelTypes  a composite's text_config model type (its default class)\n"
        "//   kLocalBaseFreqModelTypes  the config class gives a flat rope_local_base_freq to the\n"
        "//                        sliding-window layers (Gemma 3); the others ignore the key\n"
        "//   kFlatTextCarriedModelTypes  composites whose config class builds text_config from\n"
        "//                        top-level text keys when there is none (the others ignore them)\n"
        + array("kRotaryModelTypes", rotary)
        + array("kNoRotaryModelTypes", none)
        + array("kNoModelingModelTypes", unchecked)
        + array("kDefaultRopeIgnoresPartialModelTypes", ignores_partial)
        + array("kTopLevelPartialUnreadModelTypes", top_level_unread)
        + "constexpr std::pair<std::string_view, std::string_view> kTextConfigModelTypes[] = {\n"
        + "".join(f'    {{"{a}", "{b}"}},\n' for a, b in text_types)
        + "};\n"
        + array("kFlatTextCarriedModelTypes", flat_carried)
        + array("kLocalBaseFreqModelTypes", local_base)
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--check", action="store_true", help="compare with the committed fixtures; write nothing"
    )
    ap.add_argument("--only", nargs="*", help="model types to (re)generate")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    if not args.check and transformers.__version__ != PINNED_TRANSFORMERS:
        sys.exit(
            f"gen_hf_architectures: transformers {transformers.__version__} is installed; the fixtures "
            f"are generated with {PINNED_TRANSFORMERS} (use --check to compare a newer one)"
        )
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    types = args.only or sorted(CONFIG_MAPPING.keys())
    index, changed, records = [], [], []
    os.makedirs(args.out, exist_ok=True)
    for mt in types:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                result, row = architecture(mt)
            except Exception as e:
                result, row = (
                    None,
                    {
                        "model_type": mt,
                        "skipped": f"generator error: {type(e).__name__}: {str(e)[:200]}",
                    },
                )
        index.append(row)
        if result is None:
            if not args.check:  # no stale fixture of an earlier run stays behind
                for suffix in (".config.json", ".rotary.json"):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(os.path.join(args.out, mt + suffix))
            continue
        text, record = result
        records.append(record)
        record_text = dump(record)
        paths = {
            os.path.join(args.out, f"{mt}.config.json"): text,
            os.path.join(args.out, f"{mt}.rotary.json"): record_text,
        }
        if args.check:
            for p in paths:
                old = open(p).read() if os.path.exists(p) else None
                if old is None:
                    changed.append(f"{mt}: new model type")
                    break
                if p.endswith("rotary.json") and json.loads(old)["tables"] != record["tables"]:
                    changed.append(f"{mt}: rotary numbers differ")
        else:
            for p, t in paths.items():
                with open(p, "w") as f:
                    f.write(t)
        print(f"{mt}: {len(record['tables'])} rotary classes", file=sys.stderr)
    if args.check:
        index_path = os.path.join(args.out, "index.json")
        if os.path.exists(index_path) and not args.only:
            known = {r["model_type"] for r in json.load(open(index_path))["model_types"]}
            changed += [
                f"{mt}: no longer in transformers {transformers.__version__}"
                for mt in sorted(known - set(types))
            ]
        print("\n".join(changed) if changed else "no model type changed")
        return 1 if changed else 0
    if not args.only:
        # float32 tables are torch's vectorized pow/cos/sin at this capability, bit for bit
        meta = {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "positions": POSITIONS,
            "grid_positions": GRID,
            "grid3_positions": GRID3,
            "model_types": index,
        }
        with open(os.path.join(args.out, "index.json"), "w") as f:
            json.dump(meta, f, indent=1)
            f.write("\n")
        with open(MODEL_TYPES_INC, "w") as f:
            rotary_types = [
                r["model_type"]
                for r in index
                if "skipped" not in r or r["skipped"].startswith("no rotary class builds")
            ]
            text_types = text_config_types(records)
            f.write(
                model_types_inc(
                    index,
                    partial_ignored(records),
                    top_level_partial_unread(rotary_types),
                    text_types,
                    flat_text_carried(text_types),
                    local_base_freq_readers(rotary_types),
                )
            )
        rows = []
        for mt in sorted(CONFIG_MAPPING.keys()):
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                values = absent_defaults(CONFIG_MAPPING[mt])
            if values:
                rows.append((mt, values))
        # a composite may build its text_config with defaults of its own ({**init_kwargs, **file}:
        # Voxtral's text model without rope_theta is 1e8, not Llama's 1e4); probed by loading the
        # composite with a text_config that names only its model type: "<composite>/text_config"
        own = dict(rows)
        for mt in sorted(CONFIG_MAPPING.keys()):
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                values = composite_text_defaults(mt, own)
            if values:
                rows.append((mt + "/text_config", values))
        # head_dim as each rotary model type's class takes it (head_dim_rules), and the keys its
        # head size comes from (head_size)
        rotary_set = set(rotary_types)
        by_type = dict(rows)
        for mt in sorted(rotary_set & set(CONFIG_MAPPING.keys())):
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                rules = head_dim_rules(CONFIG_MAPPING[mt])
            if rules:
                by_type.setdefault(mt, {})["head_dim_rules"] = rules
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                head_size = head_size_rule(CONFIG_MAPPING[mt])
            if head_size is not None:
                by_type.setdefault(mt, {})["head_size"] = head_size
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                rules = max_position_rules(CONFIG_MAPPING[mt])
            if rules:
                by_type.setdefault(mt, {})["max_position_rules"] = rules
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                rejected = rope_types_rejected(CONFIG_MAPPING[mt])
            if rejected:
                by_type.setdefault(mt, {})["rope_types_rejected"] = rejected
        for mt, keys in unread_keys(records).items():
            by_type.setdefault(mt, {})["unread_keys"] = keys
        for mt, layout in pair_layouts(records).items():
            by_type.setdefault(mt, {})["pair_layout"] = layout
        write_rules(rules_rows(sorted(by_type.items())), args.out)
    return 0


def write_rules(rows, out):
    """The typed table (RULES_INC) and its rows as JSON (RULES_JSON under `out`); no probe value
    may reach either."""
    leaked = [(r["model_type"], v) for r in rows for v in numbers_in(r) if v in PROBE_VALUES]
    if leaked:
        sys.exit(f"gen_hf_architectures: a probe value reached the generated rules: {leaked[:5]}")
    text = rules_inc(rows, transformers.__version__)  # (stops on a rule without a field)
    with open(os.path.join(out, RULES_JSON), "w") as f:
        # one row a line (a regenerated table's diff names the model types that changed)
        # (probe_values: what tests/test_hf_architectures.cpp scans the compiled table for)
        f.write(
            f'{{"transformers": "{transformers.__version__}", '
            f'"probe_values": {json.dumps(sorted(set(PROBE_VALUES)))}, "rows": [\n'
        )
        f.write(",\n".join(json.dumps(r, sort_keys=True) for r in rows) + "\n]}\n")
    with open(RULES_INC, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())

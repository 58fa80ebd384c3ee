#!/usr/bin/env python3
"""Generate tests/fixtures/hf_rope_configs.json: RoPE reference values for REAL Hugging Face model configs.

What it reads:

  tests/fixtures/hf_configs/<name>.json   real model config.json files (where each came from: SOURCES.md there).

What it writes (one JSON object {"generator": {...}, "source": ..., "notes": [...], "cases": [...],
"extra_cases": [...], "load_errors": [...]}):

  tests/fixtures/hf_rope_configs.json     per config (and per layer type for configs with per-layer-type RoPE,
                                          named "<name>:<layer_type>"; seq-len-dependent types get a second
                                          "<name>:short" case):
      - inv_freq and attention_scaling from HF's own init function:
        transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=...) for
        scaled types, the model's <Family>RotaryEmbedding.compute_default_rope_parameters for "default";
      - cos/sin at fixed positions from the model family's own <Family>RotaryEmbedding.forward in float32
        (so they include attention_scaling exactly as HF's module returns them).  Only the per-frequency
        half is stored: columns j = 0 .. r/2-1 hold cos/sin(pos * inv_freq[j]) * attention_scaling;
      - the rotary layout the family's apply function uses ("half": rotate_half, pairs (j, j + r/2);
        "interleaved": pairs (2j, 2j+1)), the head_dim the module uses, the rotary dim r, and the softmax
        scale the family's attention module sets (self.scaling), read from an instance built on the meta
        device (no weights allocated): "softmax_scale" for DeepSeek (where YaRN's mscale changes it),
        "attention_module_scaling" for the others.

Every number comes from calling transformers' code; nothing is re-derived here.  Floats are the float64 values
of HF's float32 tensors, written with Python's shortest round-trip repr (exact).  The config is loaded the way
from_pretrained loads a checkpoint directory (AutoConfig.from_pretrained on a temp dir holding the file as
config.json), and transformers' warnings emitted while loading/validating are stored with each case.

Regenerate (from the repository root):

    /work/venv-tools/bin/python tools/gen_hf_fixtures.py

Making such a venv (the CUDA wheels are not needed; torch imports on CPU without most of them):

    python3 -m venv V && V/bin/pip install --no-deps torch==2.15.0 && \\
        V/bin/pip install numpy filelock sympy networkx jinja2 fsspec typing_extensions transformers==5.24.0

The torch/transformers versions used are recorded under "generator".  The RoPE semantics (how rope_scaling is
standardized into rope_parameters, which keys are read from where) differ between transformers releases, so
regenerate with a comparable version.
"""

import contextlib
import json
import logging
import os
import platform
import shutil
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.utils import logging as _hf_logging

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO_ROOT, "tests", "fixtures")
CONFIG_DIR = os.path.join(FIXTURES, "hf_configs")
OUT_NAME = "hf_rope_configs.json"

GENERATOR = {
    "script": "tools/gen_hf_fixtures.py",
    "command": "/work/venv-tools/bin/python tools/gen_hf_fixtures.py",
    "python": platform.python_version(),
    "torch": torch.__version__,
    "transformers": transformers.__version__,
    "numpy": np.__version__,
}

# Positions every 1-D case is evaluated at.  65535 makes seq_len = max(position_ids) + 1 = 65536, which is what
# HF's dynamic_rope_update uses to decide dynamic-NTK growth and LongRoPE's long/short switch.
POSITIONS = [0, 1, 2, 3, 100, 4095, 4096, 8191, 65535]
# Second case for the seq-len-dependent types (HF picks the factors from max(position_ids) + 1).
SHORT_POSITIONS = {
    "dynamic": [
        0,
        1,
        2,
        3,
    ],  # seq_len 4 <= max_position_embeddings: original (unscaled) frequencies
    "longrope": [
        0,
        1,
        2,
        3,
        100,
        4095,
    ],  # seq_len 4096 <= original_max_position_embeddings: short_factor
}
# Configs whose cases go to "extra_cases" instead of "cases".
EXTRA_CONFIGS = {"hf_configs/gemma-4-26b-a4b.json"}
# Qwen2-VL: (t, h, w) triples, fed as position_ids of shape (3, batch=1, n).
MROPE_POSITIONS = [
    [0, 0, 0],
    [1, 1, 1],
    [2, 3, 4],
    [100, 7, 9],
    [4095, 31, 17],
    [8191, 8191, 8191],
    [65535, 2, 3],
]


# ----------------------------------------------------------------------------------------------------------------
# Per-family facts: which HF classes produce the values and which rotary layout the family's apply code uses.
# "layout" is read from the apply function named in "layout_source" (checked against site-packages 5.24.0).
# ----------------------------------------------------------------------------------------------------------------
def _family(module, rotary, attention, layout, layout_source, emb="cat"):
    return dict(
        module=module,
        rotary=rotary,
        attention=attention,
        layout=layout,
        layout_source=layout_source,
        emb=emb,
    )


_HALF = (
    "rotate_half: x1 = x[..., :d/2], x2 = x[..., d/2:], cat(-x2, x1); cos/sin = cat(freqs, freqs)"
)
FAMILIES = {
    "llama": _family(
        "transformers.models.llama.modeling_llama",
        "LlamaRotaryEmbedding",
        "LlamaAttention",
        "half",
        "transformers/models/llama/modeling_llama.py: apply_rotary_pos_emb + rotate_half ("
        + _HALF
        + ")",
    ),
    "qwen2": _family(
        "transformers.models.qwen2.modeling_qwen2",
        "Qwen2RotaryEmbedding",
        "Qwen2Attention",
        "half",
        "transformers/models/qwen2/modeling_qwen2.py: apply_rotary_pos_emb + rotate_half ("
        + _HALF
        + ")",
    ),
    "phi3": _family(
        "transformers.models.phi3.modeling_phi3",
        "Phi3RotaryEmbedding",
        "Phi3Attention",
        "half",
        "transformers/models/phi3/modeling_phi3.py: apply_rotary_pos_emb (q[..., :rotary_dim] gets rotate_half, "
        "the rest passes through) + rotate_half",
    ),
    "gpt_neox": _family(
        "transformers.models.gpt_neox.modeling_gpt_neox",
        "GPTNeoXRotaryEmbedding",
        "GPTNeoXAttention",
        "half",
        "transformers/models/gpt_neox/modeling_gpt_neox.py: apply_rotary_pos_emb (rotary_dim = cos.shape[-1]; "
        "q[..., :rotary_dim] gets rotate_half, q[..., rotary_dim:] passes through)",
    ),
    "glm": _family(
        "transformers.models.glm.modeling_glm",
        "GlmRotaryEmbedding",
        "GlmAttention",
        "interleaved",
        "transformers/models/glm/modeling_glm.py: apply_rotary_pos_emb takes cos[..., :d/2].repeat_interleave(2) "
        "and rotate_half is x1 = x[..., 0::2], x2 = x[..., 1::2], stack((-x2, x1)).flatten(-2): pairs (2j, 2j+1) "
        "on the first rotary_dim dims, the rest pass through",
    ),
    "deepseek_v3": _family(
        "transformers.models.deepseek_v3.modeling_deepseek_v3",
        "DeepseekV3RotaryEmbedding",
        "DeepseekV3Attention",
        "interleaved",
        "transformers/models/deepseek_v3/modeling_deepseek_v3.py: DeepseekV3Attention.forward uses "
        "apply_rotary_pos_emb_interleave when config.rope_interleave (default True): pairs (q[..., 0::2], "
        "q[..., 1::2]) rotated by cos[..., :d/2]; the result is written de-interleaved, cat(evens', odds') "
        "(same permutation for q and k, so q.k is that of the interleaved rotation); rope_interleave=False "
        "would use rotate_half",
    ),
    "gpt_oss": _family(
        "transformers.models.gpt_oss.modeling_gpt_oss",
        "GptOssRotaryEmbedding",
        "GptOssAttention",
        "half",
        "transformers/models/gpt_oss/modeling_gpt_oss.py: GptOssRotaryEmbedding.forward returns cos/sin of "
        "freqs only (width r/2, no cat); _apply_rotary_emb splits x with torch.chunk(x, 2) into first/second "
        "half: pairs (j, j + r/2)",
        emb="freqs",
    ),
    "qwen2_vl": _family(
        "transformers.models.qwen2_vl.modeling_qwen2_vl",
        "Qwen2VLRotaryEmbedding",
        "Qwen2VLAttention",
        "half",
        "transformers/models/qwen2_vl/modeling_qwen2_vl.py: Qwen2VLRotaryEmbedding.recomposition_frequencies "
        "takes frequency block i of mrope_section from position row i % 3 (t, h, w), then cat(freq, freq); "
        "apply_rotary_pos_emb + rotate_half (copied from llama)",
    ),
    "gemma3_text": _family(
        "transformers.models.gemma3.modeling_gemma3",
        "Gemma3RotaryEmbedding",
        "Gemma3Attention",
        "half",
        "transformers/models/gemma3/modeling_gemma3.py: apply_rotary_pos_emb + rotate_half ("
        + _HALF
        + ")",
    ),
    "hunyuan_v1_dense": _family(
        "transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense",
        "HunYuanDenseV1RotaryEmbedding",
        "HunYuanDenseV1Attention",
        "half",
        "transformers/models/hunyuan_v1_dense/modeling_hunyuan_v1_dense.py: apply_rotary_pos_emb + rotate_half ("
        + _HALF
        + "); its rotary class reads rope_type 'dynamic' with a non-zero alpha as 'ntk_alpha' "
        "(compute_ntk_alpha_rope_parameters: theta * alpha ** (head_dim / (head_dim - 2)), fixed)",
    ),
    "gemma4": _family(
        "transformers.models.gemma4.modeling_gemma4",
        "Gemma4TextRotaryEmbedding",
        "Gemma4TextAttention",
        "half",
        "transformers/models/gemma4/modeling_gemma4.py: apply_rotary_pos_emb(x, cos, sin) + rotate_half "
        "(" + _HALF + ")",
    ),
}


# ----------------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------------
def flist(t):
    """Tensor -> (nested) list of Python floats (float64 values of the tensor's elements, full precision)."""
    a = (
        t.detach().to(torch.float64).cpu().numpy()
        if isinstance(t, torch.Tensor)
        else np.asarray(t, np.float64)
    )
    if a.ndim == 0:
        return float(a)
    if a.ndim == 1:
        return [float(v) for v in a]
    return [flist(row) for row in a]


def jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return flist(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


class _CaptureHandler(logging.Handler):
    """Collects the warnings transformers logs (config loading, rope validation) so they are stored per case."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


_capture = _CaptureHandler()
_tf_logger = logging.getLogger("transformers")


@contextlib.contextmanager
def captured_warnings():
    """Yields a list that receives transformers' warnings (and Python warnings) raised inside the block."""
    import warnings

    # transformers' logger.warning_once is an lru_cache: clear it so each config gets its own once-only warnings
    _hf_logging.warning_once.cache_clear()
    start = len(_capture.records)
    out = []
    with warnings.catch_warnings(record=True) as py_warnings:
        warnings.simplefilter("always")
        yield out
    out.extend(_capture.records[start:])
    out.extend(f"{w.category.__name__}: {w.message}" for w in py_warnings)


def load_config(path):
    """Load like from_pretrained does for a checkpoint directory: <tmp>/config.json -> AutoConfig.from_pretrained."""
    tmp = tempfile.mkdtemp(prefix="hfcfg_")
    try:
        shutil.copyfile(path, os.path.join(tmp, "config.json"))
        return AutoConfig.from_pretrained(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def family_classes(fam):
    mod = __import__(fam["module"], fromlist=[fam["rotary"], fam["attention"]])
    return getattr(mod, fam["rotary"]), getattr(mod, fam["attention"])


def head_dim_of(cfg):
    """The head_dim HF's rope functions use: config.head_dim, else hidden_size // num_attention_heads."""
    hd = getattr(cfg, "head_dim", None)
    return int(hd) if hd else int(cfg.hidden_size // cfg.num_attention_heads)


def softmax_scale_of(attention_cls, cfg, layer_idx):
    """self.scaling of the family's attention module, built on the meta device (no weights allocated)."""
    with torch.device("meta"):
        attn = attention_cls(cfg, layer_idx)
    return float(attn.scaling)


# ----------------------------------------------------------------------------------------------------------------
# one case
# ----------------------------------------------------------------------------------------------------------------
def run_case(
    name, config_file, raw, cfg, text_cfg, fam, positions, layer_type=None, load_warnings=()
):
    rotary_cls, attention_cls = family_classes(fam)
    per_layer = layer_type is not None
    rope_params = text_cfg.rope_parameters[layer_type] if per_layer else text_cfg.rope_parameters
    rope_type = rope_params["rope_type"]
    # Gemma4 resolves a per-layer-type config (its head_dim differs per layer type) before calling the init fn.
    init_cfg = (
        text_cfg.per_layer_config[layer_type]
        if fam["rotary"] == "Gemma4TextRotaryEmbedding"
        else text_cfg
    )
    head_dim = head_dim_of(init_cfg)

    mrope = fam["rotary"] == "Qwen2VLRotaryEmbedding"
    if mrope:
        pos = torch.tensor(positions, dtype=torch.int64).T.reshape(3, 1, -1)  # rows t, h, w
        seq_len = int(pos.max()) + 1
    else:
        pos = torch.tensor([positions], dtype=torch.int64)
        seq_len = max(positions) + 1

    with captured_warnings() as case_warnings:
        # 1. inv_freq / attention_scaling from HF's init function (at the sequence length used, where that matters)
        kwargs = {"layer_type": layer_type} if per_layer else {}
        if (
            getattr(rotary_cls(text_cfg), "rope_type", None) == "ntk_alpha"
        ):  # HunYuan: dynamic + alpha
            fn_name = f"{fam['module']}.{fam['rotary']}.compute_ntk_alpha_rope_parameters"
            inv_freq, attention_scaling = rotary_cls.compute_ntk_alpha_rope_parameters(init_cfg)
        elif rope_type == "default":
            fn_name = f"{fam['module']}.{fam['rotary']}.compute_default_rope_parameters"
            # called exactly as <Family>RotaryEmbedding.__init__ calls it
            if per_layer:
                inv_freq, attention_scaling = rotary_cls.compute_default_rope_parameters(
                    init_cfg, None, **kwargs
                )
            else:
                inv_freq, attention_scaling = rotary_cls.compute_default_rope_parameters(init_cfg)
        else:
            fn = ROPE_INIT_FUNCTIONS[rope_type]
            fn_name = f"transformers.modeling_rope_utils.{fn.__name__} (ROPE_INIT_FUNCTIONS[{rope_type!r}])"
            if rope_type in ("dynamic", "longrope"):
                inv_freq, attention_scaling = fn(init_cfg, None, seq_len=seq_len, **kwargs)
                fn_name += f" with seq_len={seq_len}"
            elif per_layer:
                inv_freq, attention_scaling = fn(init_cfg, None, **kwargs)
            else:
                inv_freq, attention_scaling = fn(init_cfg)

        # 2. cos/sin from the family's rotary module forward, float32 (fresh module: dynamic/longrope mutate state)
        module = rotary_cls(text_cfg)
        x = torch.zeros(1, dtype=torch.float32)
        with torch.no_grad():
            cos, sin = module(x, pos, layer_type) if per_layer else module(x, pos)
        used_inv_freq = getattr(module, f"{layer_type}_inv_freq" if per_layer else "inv_freq")
        used_scaling = getattr(
            module, f"{layer_type}_attention_scaling" if per_layer else "attention_scaling"
        )

    assert cos.dtype == torch.float32 and sin.dtype == torch.float32
    cos = cos.reshape(-1, cos.shape[-1])  # (n, width)
    sin = sin.reshape(-1, sin.shape[-1])
    width = cos.shape[-1]
    if fam["emb"] == "cat":
        half = width // 2
        # the module returns cat(freqs, freqs): both halves identical
        assert torch.equal(cos[:, :half], cos[:, half:]) and torch.equal(
            sin[:, :half], sin[:, half:]
        ), name
        applied_dim = width
    else:  # gpt-oss: the module returns the freqs half only, the apply function works on 2 * width dims
        half = width
        applied_dim = 2 * width
    assert half == inv_freq.numel(), (name, half, inv_freq.numel())

    inv_freq_f32 = inv_freq.to(torch.float32)
    used_f32 = used_inv_freq.to(torch.float32)
    nonzero = int((inv_freq != 0).sum())
    case = {
        "name": name,
        "config_file": "hf_configs/" + config_file,
        "model_type": raw.get("model_type"),
        "hf_config_class": type(cfg).__name__
        + ("" if text_cfg is cfg else f".text_config ({type(text_cfg).__name__})"),
        "layer_type": layer_type,
        "rope_type": rope_type,
        "rope_parameters": jsonable(rope_params),
        "layout": fam["layout"],
        "layout_source": fam["layout_source"],
        "head_dim": head_dim,
        # dims of q/k the family's apply function feeds through the rotation (the rest pass through unchanged)
        "rotary_dim": applied_dim,
        "rope_theta": rope_params["rope_theta"],
        "max_position_embeddings": int(text_cfg.max_position_embeddings),
        "attention_scaling": float(attention_scaling),
        "inv_freq": flist(inv_freq),
        "positions": positions,
        "seq_len": seq_len,
        "cos": flist(cos[:, :half]),
        "sin": flist(sin[:, :half]),
        "hf_function": {
            "inv_freq": fn_name,
            "cos_sin": f"{fam['module']}.{fam['rotary']}.forward (float32, "
            + (
                "position_ids shape (3, 1, n): rows t, h, w"
                if mrope
                else "position_ids shape (1, n)"
            )
            + (f", layer_type={layer_type!r}" if per_layer else "")
            + ")",
        },
    }
    if nonzero != inv_freq.numel():
        # 'proportional' (Gemma 4): zero frequencies pad the rotated block, they rotate nothing
        case["nonzero_rotary_dim"] = 2 * nonzero
        case["note"] = (
            f"inv_freq has {inv_freq.numel() - nonzero} trailing zeros: HF rotates pairs (j, j + {width // 2}) for "
            f"j < {nonzero} only; exponent denominator is head_dim ({head_dim}), not the rotated width"
        )
    if fam["rotary"] == "DeepseekV3RotaryEmbedding":
        case["rope_interleave"] = bool(getattr(text_cfg, "rope_interleave", False))
        case["qk_head_dim"] = int(text_cfg.qk_head_dim)
    # The module's own frequencies must be the init function's (same code, same seq_len); record if not bit-equal.
    if not torch.equal(inv_freq_f32, used_f32):
        case["inv_freq_module"] = flist(used_f32)
        case["inv_freq_module_note"] = (
            "RotaryEmbedding.forward recomputed inv_freq inside dynamic_rope_update with a tensor seq_len "
            f"(max abs diff vs the init-function call: {float((inv_freq_f32 - used_f32).abs().max())!r}); cos/sin "
            "use inv_freq_module"
        )
    if float(used_scaling) != float(attention_scaling):
        case["attention_scaling_module"] = float(used_scaling)

    # softmax scale the family's attention module uses (DeepSeek: yarn_apply_mscale -> mscale(factor, mscale_all_dim)^2)
    layer_idx = 0
    if per_layer:
        layer_idx = list(text_cfg.layer_types).index(layer_type)
    # "softmax_scale" (+ "qk_head_dim") only where RoPE scaling changes it (DeepSeek MLA with mscale_all_dim);
    # every other family's module scale goes to "attention_module_scaling" (informative: head_dim**-0.5, Gemma 3
    # query_pre_attn_scalar**-0.5, Gemma 4 1.0 with q/k norms).
    key = (
        "softmax_scale"
        if fam["rotary"] == "DeepseekV3RotaryEmbedding"
        else "attention_module_scaling"
    )
    try:
        case[key] = softmax_scale_of(attention_cls, text_cfg, layer_idx)
        case["hf_function"][key] = (
            f"{fam['module']}.{fam['attention']}(config, layer_idx={layer_idx}).scaling"
        )
    except Exception as exc:  # recorded, not fatal: the RoPE values do not depend on it
        case[key + "_error"] = f"{type(exc).__name__}: {exc}"

    warnings_all = list(load_warnings) + case_warnings
    if warnings_all:
        case["hf_warnings"] = sorted(set(warnings_all))
    return case


# ----------------------------------------------------------------------------------------------------------------
# all configs
# ----------------------------------------------------------------------------------------------------------------
def gen():
    cases, load_errors = [], []
    for config_file in sorted(f for f in os.listdir(CONFIG_DIR) if f.endswith(".json")):
        stem = config_file[: -len(".json")]
        path = os.path.join(CONFIG_DIR, config_file)
        with open(path) as f:
            raw = json.load(f)
        with captured_warnings() as load_warnings:
            try:
                cfg = load_config(path)
            except Exception as exc:
                load_errors.append(
                    {
                        "config_file": "hf_configs/" + config_file,
                        "model_type": raw.get("model_type"),
                        "error": f"{type(exc).__name__}: {exc}",
                        "hf_function": "transformers.AutoConfig.from_pretrained(<dir holding the file as config.json>)",
                    }
                )
                print(f"{config_file}: transformers could not load it: {type(exc).__name__}: {exc}")
                continue
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        fam_key = raw["model_type"] if raw["model_type"] in FAMILIES else text_cfg.model_type
        fam = FAMILIES[fam_key]
        rp = text_cfg.rope_parameters
        layer_types = [
            lt for lt in sorted(set(getattr(text_cfg, "layer_types", None) or [])) if lt in rp
        ]
        if layer_types:  # per-layer-type rope_parameters: one case per layer type
            for lt in layer_types:
                cases.append(
                    run_case(
                        f"{stem}:{lt}",
                        config_file,
                        raw,
                        cfg,
                        text_cfg,
                        fam,
                        POSITIONS,
                        lt,
                        load_warnings,
                    )
                )
        elif fam["rotary"] == "Qwen2VLRotaryEmbedding":
            cases.append(
                run_case(
                    stem, config_file, raw, cfg, text_cfg, fam, MROPE_POSITIONS, None, load_warnings
                )
            )
        else:
            cases.append(
                run_case(stem, config_file, raw, cfg, text_cfg, fam, POSITIONS, None, load_warnings)
            )
            if rp["rope_type"] in SHORT_POSITIONS:
                cases.append(
                    run_case(
                        f"{stem}:short",
                        config_file,
                        raw,
                        cfg,
                        text_cfg,
                        fam,
                        SHORT_POSITIONS[rp["rope_type"]],
                        None,
                        load_warnings,
                    )
                )
        print(
            f"{config_file}: {sum(c['config_file'].endswith(config_file) for c in cases)} case(s)"
        )

    # Gemma 4 ('proportional' RoPE, per-layer-type head_dim) is kept apart so consumers that iterate "cases"
    # only meet the rope types they were asked to support; same schema.
    extra_cases = [c for c in cases if c["config_file"] in EXTRA_CONFIGS]
    cases = [c for c in cases if c["config_file"] not in EXTRA_CONFIGS]

    return {
        "generator": GENERATOR,
        "source": (
            "HF transformers "
            + transformers.__version__
            + ": config loaded with AutoConfig.from_pretrained from a "
            "directory holding tests/fixtures/hf_configs/<file> as config.json; inv_freq/attention_scaling from "
            "transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type] (scaled types) or the family's "
            "<Family>RotaryEmbedding.compute_default_rope_parameters ('default'); cos/sin from the family's "
            "<Family>RotaryEmbedding.forward in float32; softmax_scale from the family's attention module "
            "(.scaling) built on the meta device. Config provenance: tests/fixtures/hf_configs/SOURCES.md."
        ),
        "notes": [
            "cos[i][j] / sin[i][j] = cos/sin(positions[i] * inv_freq[j]) * attention_scaling as computed by HF in "
            "float32, j = 0 .. len(inv_freq)-1 (the per-frequency half; HF's tensor repeats it as cat(freqs, freqs) "
            "except GPT-OSS, whose module returns the half only).",
            "layout 'half': frequency j rotates the pair (j, j + rotary_dim/2) (rotate_half / NeoX); layout "
            "'interleaved': frequency j rotates the pair (2j, 2j+1) (GPT-J / GLM / DeepSeek rope_interleave). "
            "Dims >= rotary_dim pass through unchanged.",
            "seq_len is max(positions) + 1, the value HF's dynamic_rope_update uses: 'dynamic' grows the base only "
            "when seq_len > max_position_embeddings; 'longrope' uses long_factor when seq_len > "
            "original_max_position_embeddings (for the whole batch) and short_factor otherwise, with the same "
            "attention_scaling either way. The ':short' cases give the other branch.",
            "Qwen2-VL positions are (t, h, w) triples; frequency block k of mrope_section [16, 24, 24] takes its "
            "position from row k (t for j < 16, h for 16 <= j < 40, w for j >= 40).",
            "Per-layer-type rope_parameters (Gemma 3 / Gemma 4: {'full_attention': {...}, 'sliding_attention': "
            "{...}}) give one case per layer type, named '<config>:<layer_type>'.",
            "HF forms the angle position * inv_freq in float32 (position_ids.float() * inv_freq), so at large "
            "positions (65535) cos/sin carry the float32 rounding of the angle: they differ from cos/sin of the "
            "float64 angle by up to ~2e-3, but match cos/sin(float32(float32(pos) * float32(inv_freq))) * "
            "attention_scaling to ~1e-7. Compare with a tolerance that allows this, or form the angle the same way.",
            "softmax_scale (DeepSeek only) = qk_head_dim**-0.5 * mscale(factor, mscale_all_dim)**2, the "
            "DeepseekV3Attention.scaling (yarn_apply_mscale); attention_module_scaling: the other families' "
            "attention .scaling, for information.",
            "extra_cases: same schema, configs beyond the basic set (Gemma 4: nested per-layer-type rope_parameters "
            "with 'proportional' RoPE on full-attention layers whose head_dim (global_head_dim 512) differs from "
            "the sliding layers' (256)).",
            "hf_warnings: messages transformers logged while loading/validating the config or building the module.",
            "load_errors: configs transformers "
            + transformers.__version__
            + " refuses to load (kept as fixtures: "
            "a loader may want to accept them).",
        ],
        "cases": cases,
        "extra_cases": extra_cases,
        "load_errors": load_errors,
    }


def write_json(name, obj):
    path = os.path.join(FIXTURES, name)
    text = json.dumps(obj, indent=None, separators=(",", ":"), sort_keys=False, allow_nan=False)
    with open(path, "w") as f:
        f.write(text)
        f.write("\n")
    with open(path) as f:
        back = json.load(f)
    assert back == json.loads(text)
    size = os.path.getsize(path)
    print(
        f"{os.path.relpath(path, REPO_ROOT)}: {len(back['cases'])} cases, {len(back['extra_cases'])} extra cases, "
        f"{len(back['load_errors'])} load errors, "
        f"{size} bytes"
    )
    return back


def main():
    torch.set_grad_enabled(False)
    _tf_logger.addHandler(_capture)
    print(f"generator: {GENERATOR}")
    try:
        write_json(OUT_NAME, gen())
    finally:
        _tf_logger.removeHandler(_capture)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Generate the JSON reference fixtures in tests/fixtures/ for the posenc C++ tests.

What it writes (each file is a JSON object {"generator": {...}, "source": ..., "notes": [...], "cases": [...]}):

  tests/fixtures/rope.json            RoPE inverse frequencies + attention scaling for every HF rope_type
                                      (default, linear, dynamic, yarn, llama3, longrope, proportional,
                                      partial rotary), and for a subset of cases the cos/sin tables
                                      and the rotate-half (Llama/NeoX) and rotate-every-two (GPT-J)
                                      rotation of a fixed input.
  tests/fixtures/t5_buckets.json      T5 relative-position buckets (HF T5Attention._relative_position_bucket).
  tests/fixtures/alibi.json           ALiBi slopes for 1..64 heads (HF Bloom build_alibi_tensor and Press et al.
                                      get_slopes, copied verbatim).
  tests/fixtures/sinusoidal.json      Sinusoidal absolute position encodings, "concat" (MAE layout: sin block then
                                      cos block) and "interleaved" (Vaswani et al. 2017: sin at 2i, cos at 2i+1).
  tests/fixtures/learned_resize.json  Resizing a learned [L, D] table along L with torch F.interpolate
                                      (linear and bicubic, align_corners=False).

Values come from calling the reference Python implementations (HF transformers, torch) wherever such a
function exists; values that are hand-derived are labelled so in a "source" field.  Everything is deterministic
(no randomness); floats are float64 values written with Python's shortest round-trip repr (full precision).

Regenerate (from the repository root):

    ~/.cache/posenc/venv/bin/python tools/gen_fixtures.py

(the venv scripts/setup.sh installs: python/requirements-test.txt).

The torch/transformers/timm/numpy versions used are recorded in each JSON file under "generator".
The fixtures were generated with transformers 5.24.0; the RoPE semantics (rope_parameters layout, defaults) differ
between transformers releases, so regenerate with a comparable version.
"""

import json
import logging
import math
import os
import platform
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.gpt_neox.modeling_gpt_neox import (
    apply_rotary_pos_emb as neox_apply_rotary_pos_emb,
)
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_apply_rotary_pos_emb
from transformers.models.gptj.modeling_gptj import (
    create_sinusoidal_positions as gptj_create_sinusoidal_positions,
)
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import (
    apply_rotary_pos_emb as llama_apply_rotary_pos_emb,
)
from transformers.models.llama.modeling_llama import rotate_half as llama_rotate_half
from transformers.models.t5.modeling_t5 import T5Attention
from transformers.models.videomae.modeling_videomae import get_sinusoid_encoding_table
from transformers.models.vit_mae.modeling_vit_mae import build_2d_sinusoidal_position_embedding
from transformers.utils import logging as hf_logging

try:
    import timm

    TIMM_VERSION = timm.__version__
except Exception:  # timm is not needed for any value, only recorded
    TIMM_VERSION = None

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(REPO_ROOT, "tests", "fixtures")

GENERATOR = {
    "script": "tools/gen_fixtures.py",
    "command": "/work/venv-tools/bin/python tools/gen_fixtures.py",
    "python": platform.python_version(),
    "torch": torch.__version__,
    "transformers": transformers.__version__,
    "timm": TIMM_VERSION,
    "numpy": np.__version__,
}


# ----------------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------------
def flist(t):
    """Tensor/ndarray -> nested list of Python floats (float64 values, full precision)."""
    if isinstance(t, torch.Tensor):
        t = t.detach().to(torch.float64).cpu().numpy()
    a = np.asarray(t, dtype=np.float64)
    if a.ndim == 0:
        return float(a)
    if a.ndim == 1:
        return [float(v) for v in a]
    return [flist(row) for row in a]


def ilist(t):
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().numpy()
    return [int(v) for v in np.asarray(t).reshape(-1)]


def jsonable(obj):
    """Make a rope_parameters dict JSON-serialisable (copy; tensors/np scalars -> python)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    return obj


def write_json(name, obj):
    path = os.path.join(OUT_DIR, name)
    text = json.dumps(obj, indent=None, separators=(",", ":"), sort_keys=False, allow_nan=False)
    with open(path, "w") as f:
        f.write(text)
        f.write("\n")
    # verify it loads back identically
    with open(path) as f:
        back = json.load(f)
    assert back == json.loads(text)
    size = os.path.getsize(path)
    print(f"{os.path.relpath(path, REPO_ROOT)}: {len(back['cases'])} cases, {size} bytes")
    if size > 300 * 1024:
        print(f"  WARNING: {name} is larger than 300 KiB")
    return back


class _CaptureHandler(logging.Handler):
    """Collects warnings that transformers logs (rope validation) so they can be stored with each case."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record.getMessage())


_capture = _CaptureHandler()
_tf_logger = logging.getLogger("transformers")
_tf_logger.addHandler(_capture)


# ----------------------------------------------------------------------------------------------------------------
# 1. RoPE
# ----------------------------------------------------------------------------------------------------------------
ROPE_POSITIONS = [0, 1, 2, 3, 7, 31, 127, 1000, 4095]

# Only these cases carry cos/sin/input/output_* (the full tables for every case would make rope.json ~1.2 MB).
# The rotation code path is the same for all rope types once inv_freq/attention_scaling are known; the chosen
# cases cover full rotary, partial rotary (0.5 and 0.75, i.e. 16 and 24 frequencies) and attention_scaling != 1.
ROPE_ROTATION_CASES = {"default_theta1e4", "default_partial0.5", "yarn_f4", "yarn_f4_partial0.75"}


def rope_input(n, head_dim):
    """Deterministic input: x[r, c] = sin(0.37 * (r * head_dim + c)), float64."""
    return torch.sin(torch.arange(n * head_dim, dtype=torch.float64) * 0.37).reshape(n, head_dim)


def make_rope_config(
    head_dim, max_position_embeddings, rope_parameters, partial_rotary_factor=None, num_heads=4
):
    kwargs = dict(
        head_dim=head_dim,
        hidden_size=head_dim * num_heads,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        num_hidden_layers=1,
        intermediate_size=4 * head_dim,
        vocab_size=16,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(rope_parameters),
    )
    if partial_rotary_factor is not None:
        kwargs["partial_rotary_factor"] = partial_rotary_factor
    return LlamaConfig(**kwargs)


def ntk_alpha_rope(head_dim, max_position_embeddings, rope_parameters):
    """HunYuan's ntk_alpha, as its model's own class reaches it: a config whose block says 'dynamic' with a
    non-zero alpha makes HunYuanDenseV1RotaryEmbedding take compute_ntk_alpha_rope_parameters. Returns the
    HunYuan config (rope_parameters in the posenc/fixture form: rope_type 'ntk_alpha'), inv_freq, scaling."""
    from transformers import HunYuanDenseV1Config
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import (
        HunYuanDenseV1RotaryEmbedding,
    )

    block = dict(rope_parameters, rope_type="dynamic", factor=1.0)
    config = HunYuanDenseV1Config(
        head_dim=head_dim,
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=1,
        intermediate_size=4 * head_dim,
        vocab_size=16,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=block,
    )
    module = HunYuanDenseV1RotaryEmbedding(config)
    assert module.rope_type == "ntk_alpha", module.rope_type
    inv_freq, scaling = HunYuanDenseV1RotaryEmbedding.compute_ntk_alpha_rope_parameters(config)
    assert torch.equal(inv_freq, module.inv_freq)
    return config, inv_freq, scaling


def rope_case(
    name,
    head_dim,
    max_position_embeddings,
    rope_parameters,
    partial_rotary_factor=None,
    seq_len=None,
    positions=ROPE_POSITIONS,
):
    _capture.records.clear()
    hf_logging.warning_once.cache_clear()  # so that every case records its own warn-once validation messages
    if rope_parameters["rope_type"] == "ntk_alpha":
        config, inv_freq, attention_scaling = ntk_alpha_rope(
            head_dim, max_position_embeddings, rope_parameters
        )
        config.rope_parameters = dict(
            rope_parameters
        )  # the fixture's block: posenc's name for the type
        fn_name = (
            "transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense.HunYuanDenseV1RotaryEmbedding."
            "compute_ntk_alpha_rope_parameters (its class's rope_type for 'dynamic' with alpha)"
        )
        rope_type = "ntk_alpha"
    else:
        config = make_rope_config(
            head_dim, max_position_embeddings, rope_parameters, partial_rotary_factor
        )
        rope_type = config.rope_parameters["rope_type"]
    if rope_type == "ntk_alpha":
        pass
    elif rope_type == "default":
        # LlamaRotaryEmbedding.compute_default_rope_parameters ignores partial_rotary_factor in this version; the
        # GPT-NeoX one (also Phi, StableLM) honours it.  For partial_rotary_factor == 1 both must agree.
        fn_name = (
            "transformers.models.gpt_neox.modeling_gpt_neox.GPTNeoXRotaryEmbedding."
            "compute_default_rope_parameters"
        )
        inv_freq, attention_scaling = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(
            config, device="cpu", seq_len=seq_len
        )
        llama_inv, llama_scale = LlamaRotaryEmbedding.compute_default_rope_parameters(
            config, device="cpu", seq_len=seq_len
        )
        if config.rope_parameters.get("partial_rotary_factor", 1.0) == 1.0:
            assert torch.equal(llama_inv, inv_freq) and llama_scale == attention_scaling
    else:
        fn_name = (
            f"transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[{rope_type!r}] = "
            f"{ROPE_INIT_FUNCTIONS[rope_type].__name__}"
        )
        inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](
            config, device="cpu", seq_len=seq_len
        )
    attention_scaling = float(attention_scaling)
    rot_dim = 2 * inv_freq.numel()

    case = {
        "name": name,
        "head_dim": head_dim,
        "rope_theta": float(config.rope_parameters["rope_theta"]),
        "partial_rotary_factor": float(config.rope_parameters.get("partial_rotary_factor", 1.0)),
        "max_position_embeddings": max_position_embeddings,
        "rope_parameters": jsonable(dict(config.rope_parameters)),
        "rope_parameters_input": jsonable(dict(rope_parameters)),
        "seq_len": seq_len,
        "hf_function": fn_name,
        "inv_freq_dtype": str(inv_freq.dtype).replace("torch.", ""),
        "rot_dim": rot_dim,
        "inv_freq": flist(inv_freq),
        "attention_scaling": attention_scaling,
        "positions": list(positions),
    }
    if partial_rotary_factor is not None:
        case["partial_rotary_factor_input"] = partial_rotary_factor

    if name in ROPE_ROTATION_CASES:
        pos = torch.tensor(positions, dtype=torch.int64)
        n = len(positions)
        # HF convention (LlamaRotaryEmbedding.forward), but evaluated in float64
        freqs = pos[:, None].double() * inv_freq[None, :].double()  # [N, rot_dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [N, rot_dim]
        cos = emb.cos() * attention_scaling
        sin = emb.sin() * attention_scaling

        x = rope_input(n, head_dim)

        # rotate-half (Llama / GPT-NeoX / Phi): GPT-NeoX's apply_rotary_pos_emb rotates the first cos.shape[-1]
        # dims and passes the rest through.  q: [batch=1, heads=1, N, head_dim]; cos: [1, N, rot_dim].
        q = x[None, None]
        out_half, _ = neox_apply_rotary_pos_emb(q, q, cos[None], sin[None], unsqueeze_dim=1)
        out_half = out_half[0, 0]
        # cross-check with Llama's apply_rotary_pos_emb/rotate_half on the rotated slice + pass-through
        q_rot = x[None, None, :, :rot_dim]
        llama_rot, _ = llama_apply_rotary_pos_emb(
            q_rot, q_rot, cos[None], sin[None], unsqueeze_dim=1
        )
        llama_out = torch.cat([llama_rot[0, 0], x[:, rot_dim:]], dim=-1)
        manual = torch.cat(
            [x[:, :rot_dim] * cos + llama_rotate_half(x[:, :rot_dim]) * sin, x[:, rot_dim:]], -1
        )
        assert torch.equal(llama_out, out_half) and torch.equal(manual, out_half)

        # rotate-every-two (GPT-J): sin/cos of shape [N, rot_dim/2] are repeat_interleave'd by GPT-J's
        # apply_rotary_pos_emb.  tensor: [batch=1, N, heads=1, rot_dim]; sin/cos: [1, N, rot_dim/2].
        sin_j = (freqs.sin() * attention_scaling)[None]
        cos_j = (freqs.cos() * attention_scaling)[None]
        t_rot = x[None, :, None, :rot_dim]
        out_j = gptj_apply_rotary_pos_emb(t_rot, sin_j, cos_j)[0, :, 0]
        out_inter = torch.cat([out_j, x[:, rot_dim:]], dim=-1)  # as GPTJAttention.forward does

        assert (
            cos.dtype == torch.float64
            and out_half.dtype == torch.float64
            and out_inter.dtype == torch.float64
        )
        case.update(
            {
                "cos": flist(cos),
                "sin": flist(sin),
                "input": flist(x),
                "output_half": flist(out_half),
                "output_interleaved": flist(out_inter),
            }
        )
    case["hf_warnings"] = list(dict.fromkeys(_capture.records))
    return case


def gen_rope():
    cases = []
    skipped = []

    def add(*args, **kwargs):
        name = args[0]
        try:
            cases.append(rope_case(*args, **kwargs))
        except Exception as e:  # rejected by this transformers version's validation
            msg = f"{name}: {type(e).__name__}: {e}"
            print(f"  SKIP rope case {msg}")
            skipped.append(msg)

    T = 10000.0
    # a) default theta 10000
    add("default_theta1e4", 64, 4096, {"rope_type": "default", "rope_theta": T})
    # b) default theta 500000, head_dim 128
    add("default_theta5e5_hd128", 128, 8192, {"rope_type": "default", "rope_theta": 500000.0})
    # c) default with partial_rotary_factor 0.5
    add(
        "default_partial0.5",
        64,
        4096,
        {"rope_type": "default", "rope_theta": T},
        partial_rotary_factor=0.5,
    )
    # d) linear factor 4
    add("linear_f4", 64, 4096, {"rope_type": "linear", "rope_theta": T, "factor": 4.0})
    # e) dynamic factor 2, max_position_embeddings 2048, seq_len None / 1024 (unchanged) / 8192
    for sl in (None, 1024, 2048, 8192):
        add(
            f"dynamic_f2_seq{sl}",
            64,
            2048,
            {"rope_type": "dynamic", "rope_theta": T, "factor": 2.0},
            seq_len=sl,
        )
    # f) yarn factor 4, original 4096, max 16384, default betas
    yarn_base = {
        "rope_type": "yarn",
        "rope_theta": T,
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
    }
    add("yarn_f4", 64, 16384, dict(yarn_base))
    # g) yarn beta_fast 16, beta_slow 2
    add("yarn_f4_beta16_2", 64, 16384, dict(yarn_base, beta_fast=16.0, beta_slow=2.0))
    # h) DeepSeek-style yarn: factor 40, original 4096 (max 163840), mscale 1 / mscale_all_dim 1; and 0.707 / 1
    ds = {
        "rope_type": "yarn",
        "rope_theta": T,
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
    }
    add("yarn_f40_mscale1_all1", 64, 163840, dict(ds, mscale=1.0, mscale_all_dim=1.0))
    add("yarn_f40_mscale0.707_all1", 64, 163840, dict(ds, mscale=0.707, mscale_all_dim=1.0))
    add("yarn_f40_mscale0.707_only", 64, 163840, dict(ds, mscale=0.707))
    # i) yarn explicit attention_factor
    add("yarn_f4_attn1.5", 64, 16384, dict(yarn_base, attention_factor=1.5))
    # j) yarn truncate false
    add("yarn_f4_notruncate", 64, 16384, dict(yarn_base, truncate=False))
    # extra yarn semantics: explicit factor disagreeing with max/original (explicit factor wins), original omitted
    # (standardisation sets original = max_position_embeddings), factor None (factor = max / original)
    add("yarn_f4_max32768_mismatch", 64, 32768, dict(yarn_base))
    add("yarn_f4_no_original", 64, 16384, {"rope_type": "yarn", "rope_theta": T, "factor": 4.0})
    add("yarn_factorNone_max16384_orig4096", 64, 16384, dict(yarn_base, factor=None))
    # k) llama3
    add(
        "llama3_f8",
        128,
        131072,
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    # l) longrope short (seq_len 2048) / long (seq_len 8192) / seq_len None
    short = [1.0 + 0.05 * i for i in range(32)]
    long = [1.0 + 0.2 * i for i in range(32)]
    lr = {
        "rope_type": "longrope",
        "rope_theta": T,
        "short_factor": short,
        "long_factor": long,
        "original_max_position_embeddings": 4096,
    }
    add("longrope_seq2048_short", 64, 131072, dict(lr), seq_len=2048)
    add("longrope_seq4096_short", 64, 131072, dict(lr), seq_len=4096)
    add("longrope_seq4097_long", 64, 131072, dict(lr), seq_len=4097)
    add("longrope_seq8192_long", 64, 131072, dict(lr), seq_len=8192)
    add("longrope_seqNone_short", 64, 131072, dict(lr), seq_len=None)
    # m) longrope explicit attention_factor; and explicit factor (used only for the attention factor)
    add("longrope_attn1.25_seq8192", 64, 131072, dict(lr, attention_factor=1.25), seq_len=8192)
    add("longrope_factor8_seq8192", 64, 131072, dict(lr, factor=8.0), seq_len=8192)
    # n) partial 0.75 with yarn
    add("yarn_f4_partial0.75", 64, 16384, dict(yarn_base), partial_rotary_factor=0.75)
    # partial rotary with linear and llama3 (scaled types honour partial_rotary_factor)
    add(
        "linear_f4_partial0.5",
        64,
        4096,
        {"rope_type": "linear", "rope_theta": T, "factor": 4.0},
        partial_rotary_factor=0.5,
    )
    # o) proportional (Gemma 4): theta^(-2i/Dh) for the rotating pairs, 0 for the rest, / factor
    add(
        "proportional_partial0.25",
        64,
        4096,
        {"rope_type": "proportional", "rope_theta": T},
        partial_rotary_factor=0.25,
    )
    add(
        "proportional_f2",
        64,
        4096,
        {"rope_type": "proportional", "rope_theta": T, "factor": 2.0},
        partial_rotary_factor=0.5,
    )
    # p) ntk_alpha (HunYuan): theta * alpha^(r/(r-2)) at every length; HunYuan's released alpha 1000, and 50
    add(
        "ntk_alpha_1000_hd128",
        128,
        32768,
        {"rope_type": "ntk_alpha", "rope_theta": T, "alpha": 1000.0},
    )
    add("ntk_alpha_50", 64, 4096, {"rope_type": "ntk_alpha", "rope_theta": T, "alpha": 50.0})

    by_name = {c["name"]: c for c in cases}

    # ---- semantic checks used for the notes (all assertions are on HF outputs) ----
    d_none, d_1024, d_2048 = (
        by_name[f"dynamic_f2_seq{s}"]["inv_freq"] for s in ("None", 1024, 2048)
    )
    assert d_none == d_1024 == d_2048 == by_name["default_theta1e4"]["inv_freq"]
    assert by_name["dynamic_f2_seq8192"]["inv_freq"] != d_none
    assert by_name["yarn_f4_max32768_mismatch"]["inv_freq"] == by_name["yarn_f4"]["inv_freq"]
    assert (
        by_name["yarn_f4_no_original"]["rope_parameters"]["original_max_position_embeddings"]
        == 16384
    )
    assert by_name["yarn_f4_no_original"]["inv_freq"] != by_name["yarn_f4"]["inv_freq"]
    assert by_name["yarn_f4_notruncate"]["inv_freq"] != by_name["yarn_f4"]["inv_freq"]
    assert (
        by_name["yarn_factorNone_max16384_orig4096"]["inv_freq"] == by_name["yarn_f4"]["inv_freq"]
    )
    assert (
        by_name["yarn_factorNone_max16384_orig4096"]["attention_scaling"]
        == by_name["yarn_f4"]["attention_scaling"]
    )
    assert by_name["yarn_f40_mscale1_all1"]["attention_scaling"] == 1.0
    assert by_name["yarn_f40_mscale0.707_only"]["attention_scaling"] == 0.1 * math.log(40.0) + 1.0
    assert by_name["yarn_f4"]["attention_scaling"] == 0.1 * math.log(4.0) + 1.0
    assert (
        by_name["longrope_seq4096_short"]["inv_freq"]
        == by_name["longrope_seq2048_short"]["inv_freq"]
    )
    assert (
        by_name["longrope_seq4097_long"]["inv_freq"] == by_name["longrope_seq8192_long"]["inv_freq"]
    )
    assert (
        by_name["longrope_seq2048_short"]["attention_scaling"]
        == by_name["longrope_seq8192_long"]["attention_scaling"]
    )
    assert len(by_name["default_partial0.5"]["inv_freq"]) == 16
    assert len(by_name["yarn_f4_partial0.75"]["inv_freq"]) == 24

    # Llama's default ignores partial_rotary_factor (checked here, recorded in the notes)
    cfg = make_rope_config(
        64, 4096, {"rope_type": "default", "rope_theta": T}, partial_rotary_factor=0.5
    )
    llama_partial_len = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)[0].numel()
    neox_partial_len = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(cfg)[0].numel()

    # GPT-J's own sin/cos table (base 10000, float32) agrees with the cos/sin used for output_interleaved
    c = by_name["default_theta1e4"]
    sc = gptj_create_sinusoidal_positions(max(c["positions"]) + 1, c["rot_dim"])[
        c["positions"]
    ].double()
    half = c["rot_dim"] // 2
    gptj_sin, gptj_cos = sc[:, :half], sc[:, half:]
    cos_tab = torch.tensor(c["cos"], dtype=torch.float64)[:, :half]
    sin_tab = torch.tensor(c["sin"], dtype=torch.float64)[:, :half]
    gptj_err = max((gptj_cos - cos_tab).abs().max().item(), (gptj_sin - sin_tab).abs().max().item())
    assert gptj_err < 1e-3, gptj_err

    notes = [
        f"transformers {transformers.__version__}: every HF init function returns inv_freq as float32 "
        "(torch.arange(...).float(); base ** float32). The stored inv_freq are those float32 values widened to "
        "float64. cos/sin/output_* are computed in float64 FROM THESE float32 inv_freq, so a float64 C++ "
        "inv_freq differs by ~1e-7 relative, and at position 4095 the angle differs by up to ~2e-4 rad. A C++ "
        "test should either (a) build cos/sin/rotations from the fixture's inv_freq, or (b) compare its own "
        "inv_freq with rtol ~1e-6 and cos/sin at large positions with atol ~1e-3.",
        "The HF forward (LlamaRotaryEmbedding.forward) multiplies position_ids.float() * inv_freq in float32; the "
        "fixture does the same product in float64 (positions[:,None].double() * inv_freq[None,:].double()), then "
        "emb = cat(freqs, freqs); cos = emb.cos()*attention_scaling; sin = emb.sin()*attention_scaling.",
        "'default' is not in ROPE_INIT_FUNCTIONS; each model class has compute_default_rope_parameters. "
        f"LlamaRotaryEmbedding's IGNORES partial_rotary_factor (gives {llama_partial_len} freqs for head_dim 64, "
        f"prf 0.5); GPTNeoX/Phi/StableLM's honour it (gives {neox_partial_len}). Fixtures use the GPT-NeoX one "
        "(identical to Llama's when partial_rotary_factor == 1, asserted).",
        "All ROPE_INIT_FUNCTIONS (linear, dynamic, yarn, longrope, llama3) honour partial_rotary_factor: "
        "dim = int(head_dim * partial_rotary_factor), inv_freq has dim//2 entries, exponents are arange(0,dim,2)/dim "
        "(i.e. relative to the ROTATED dim, not head_dim). rot_dim in the fixture = 2*len(inv_freq).",
        "Config standardisation (LlamaConfig.__init__ -> convert_rope_params_to_dict/standardize_rope_params): "
        "rope_theta and partial_rotary_factor are moved into rope_parameters (setdefault); rope_type defaults to "
        "'default' (old key 'type' accepted); for llama3/yarn/longrope, original_max_position_embeddings is "
        "setdefault'ed to config.max_position_embeddings when absent. 'rope_parameters' in each case is the dict "
        "after standardisation, 'rope_parameters_input' what was passed.",
        "linear: inv_freq = default_inv_freq / factor; attention_scaling 1.",
        "dynamic: seq_len None -> max_position_embeddings; otherwise seq_len = max(seq_len, max_position_embeddings). "
        "base' = base * ((factor*seq_len/max_position_embeddings) - (factor-1)) ** (dim/(dim-2)); so for "
        "seq_len <= max_position_embeddings inv_freq equals the default one exactly (asserted for None, 1024, "
        "2048). The reference is config.max_position_embeddings (NOT original_max_position_embeddings, which "
        "dynamic does not accept). attention_scaling 1. At runtime the dynamic_rope_update decorator recomputes with "
        "seq_len = max(position_ids)+1 only when it exceeds the cached length, and resets to the original inv_freq "
        "when seq_len < original max and the cache had grown.",
        "yarn: 'factor' and 'original_max_position_embeddings' are required keys (missing -> KeyError). The "
        "EXPLICIT factor is always used; max_position_embeddings/original_max_position_embeddings is only used when "
        "factor is None (then factor = max/original; case yarn_factorNone_max16384_orig4096 == yarn_f4, with "
        "validation warnings) and otherwise only triggers a warning when it differs "
        "(case yarn_f4_max32768_mismatch gives the same inv_freq as yarn_f4). If original_max_position_embeddings "
        "is omitted it becomes max_position_embeddings (case yarn_f4_no_original: ramp computed with 16384).",
        "yarn defaults: beta_fast = rope_parameters.get('beta_fast') or 32, beta_slow = ... or 1 (so 0/None -> "
        "default); truncate defaults to True and is read from config.rope_parameters (top level) via "
        ".get('truncate', True). With truncate, low = floor(low), high = ceil(high), then clamped to [0, dim-1] "
        "(dim = rotated dim, not dim/2). find_correction_dim(r) = dim*ln(orig/(r*2*pi)) / (2*ln(base)), using "
        "original_max_position_embeddings. Ramp: (arange(dim//2, float32) - low)/(high - low) clamped to [0,1] "
        "(high += 0.001 if low == high); extrapolation_factor = 1 - ramp; inv_freq = inv_interp*(1-ef) + "
        "inv_extrap*ef with inv_interp = 1/(factor*pos_freqs), inv_extrap = 1/pos_freqs. I.e. low dims "
        "(high frequency) keep the original frequency, dims above 'high' are divided by factor.",
        "yarn attention_scaling: if attention_factor given, used verbatim. Else get_mscale(s, m) = 1.0 if s <= 1 "
        "else 0.1*m*ln(s) + 1.0; if mscale AND mscale_all_dim are both truthy: attention_factor = "
        "get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) (== 1.0 when equal, e.g. DeepSeek-V3 "
        "mscale=mscale_all_dim=1); otherwise get_mscale(factor) with m = 1 (mscale alone is IGNORED, case "
        "yarn_f40_mscale0.707_only). DeepSeek-V3 additionally multiplies the softmax scale by "
        "get_mscale(factor, mscale_all_dim)**2 in its attention (modeling_deepseek_v3.yarn_apply_mscale); that is "
        "not part of attention_scaling.",
        "longrope: seq_len > original_max_position_embeddings (strict) -> long_factor, else (incl. seq_len None "
        "or 0) -> short_factor; inv_freq = 1/(ext_factor[i] * base**(2i/dim)). 'factor' is optional: if None it is "
        "max_position_embeddings/original_max_position_embeddings (131072/4096 = 32 here); it is NOT overridden when "
        "given (case longrope_factor8_seq8192 uses 8), and it only affects the attention factor: attention_factor "
        "(if not given) = 1.0 if factor <= 1 else sqrt(1 + ln(factor)/ln(original_max_position_embeddings)). The "
        "attention factor is the same for the short and long set. At runtime the model picks the long set when "
        "max(position_ids)+1 > original_max_position_embeddings (computed with seq_len = original+1).",
        "llama3: wavelen = 2*pi/inv_freq; low_freq_wavelen = orig/low_freq_factor, high_freq_wavelen = "
        "orig/high_freq_factor; wavelen > low_freq_wavelen -> inv_freq/factor; wavelen < high_freq_wavelen -> "
        "unchanged; otherwise smooth = (orig/wavelen - low)/(high - low), inv = (1-smooth)*inv/factor + "
        "smooth*inv. Computed in float32. attention_scaling 1.",
        "output_half: rotate_half convention, rotation pairs (i, i + rot_dim/2) share inv_freq[i]; computed with "
        "GPT-NeoX apply_rotary_pos_emb (rotates the first cos.shape[-1] dims, passes the rest) and cross-checked "
        "bit-exactly against Llama apply_rotary_pos_emb/rotate_half on the rotated slice.",
        "output_interleaved: GPT-J convention, pairs (2i, 2i+1) share inv_freq[i]: gptj.apply_rotary_pos_emb(t, "
        "sin, cos) with sin/cos = sin/cos(freqs)*attention_scaling of shape [N, rot_dim/2] (repeat_interleave'd "
        "inside) and rotate_every_two; dims >= rot_dim are passed through as GPTJAttention does. Note GPT-J's "
        "own table (create_sinusoidal_positions) is float32 with base 10000 and no scaling; it matches this "
        f"fixture's default_theta1e4 table to {gptj_err:.2e}.",
        f"Only cases {sorted(ROPE_ROTATION_CASES)} carry cos/sin/input/output_half/output_interleaved (to keep the "
        "file < 300 KB); the rest carry inv_freq/attention_scaling only. input[r][c] = sin(0.37*(r*head_dim + c)).",
        "Validation problems in this version are logger warnings (stored per case in 'hf_warnings'), except missing "
        "required keys which raise KeyError.",
    ]
    if skipped:
        notes.append("Skipped (rejected by this transformers version): " + "; ".join(skipped))

    return {
        "generator": GENERATOR,
        "source": "HF transformers: transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type](LlamaConfig(...), "
        "device='cpu', seq_len=seq_len) for scaled types; "
        "GPTNeoXRotaryEmbedding.compute_default_rope_parameters for 'default'; rotations with "
        "gpt_neox.modeling_gpt_neox.apply_rotary_pos_emb (rotate_half) and "
        "gptj.modeling_gptj.apply_rotary_pos_emb (rotate_every_two); cos/sin tables per the "
        "LlamaRotaryEmbedding.forward formula evaluated in float64 (see notes).",
        "notes": notes,
        "cases": cases,
    }


# ----------------------------------------------------------------------------------------------------------------
# 2. T5 buckets
# ----------------------------------------------------------------------------------------------------------------
def gen_t5():
    rel = torch.arange(-300, 301, dtype=torch.int64)
    cases = []
    for bidirectional in (True, False):
        for num_buckets, max_distance in ((32, 128), (64, 256), (8, 20)):
            b = T5Attention._relative_position_bucket(
                rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
            )
            cases.append(
                {
                    "bidirectional": bidirectional,
                    "num_buckets": num_buckets,
                    "max_distance": max_distance,
                    "relative_position": ilist(rel),
                    "buckets": ilist(b),
                }
            )
    return {
        "generator": GENERATOR,
        "source": "transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(relative_position, "
        "bidirectional, num_buckets, max_distance) on an int64 tensor",
        "notes": [
            "relative_position = memory_position - query_position (key - query), as in HF T5Attention.compute_bias.",
            "bidirectional: num_buckets is halved; positive relative positions get +num_buckets/2; then |rel|. "
            "unidirectional: rel = -min(rel, 0), so all positive (future) offsets map to bucket 0.",
            "max_exact = nb/2 (nb after halving); large bucket = max_exact + int(log(rel/max_exact)/log(max_distance/"
            "max_exact)*(nb - max_exact)) computed in float32 and truncated toward zero (.to(long)), clamped to nb-1.",
        ],
        "cases": cases,
    }


# ----------------------------------------------------------------------------------------------------------------
# 3. ALiBi
# ----------------------------------------------------------------------------------------------------------------
# Copied verbatim from Press et al., github.com/ofirpress/attention_with_linear_biases,
# fairseq/models/transformer.py (TransformerDecoder.__init__), commit 3b7c2eca8397d27be08c6dffad9b60855507f9b7.
def get_slopes(n):
    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(
            n
        )  # In the paper, we only train models that have 2^a heads for some a. This function has
    else:  # some good properties that only occur when the input is a power of 2. To maintain that even
        closest_power_of_2 = 2 ** math.floor(
            math.log2(n)
        )  # when the number of heads is not a power of 2, we use this workaround.
        return (
            get_slopes_power_of_2(closest_power_of_2)
            + get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
        )


def gen_alibi():
    cases = []
    max_rel = 0.0
    for n in range(1, 65):
        mask = torch.ones(1, 2, dtype=torch.int64)
        alibi = build_alibi_tensor(mask, n, torch.float64)  # [num_heads, 1, 2]
        hf = alibi[:, 0, 1] - alibi[:, 0, 0]
        press = torch.tensor(get_slopes(n), dtype=torch.float64)
        assert hf.shape == press.shape == (n,)
        rel = ((hf - press).abs() / press).max().item()
        assert rel < 1e-6, (n, rel)  # HF computes slopes in float32
        max_rel = max(max_rel, rel)
        cases.append({"num_heads": n, "slopes": flist(press), "slopes_hf_bloom": flist(hf)})
    print(
        f"  alibi: HF Bloom (float32) vs Press get_slopes (float64) max relative difference {max_rel:.3e}"
    )
    return {
        "generator": GENERATOR,
        "source": "slopes: Press et al. get_slopes copied verbatim (hand-copied) from "
        "github.com/ofirpress/attention_with_linear_biases fairseq/models/transformer.py "
        "(TransformerDecoder.__init__, commit 3b7c2eca), evaluated in Python float64; "
        "slopes_hf_bloom: transformers.models.bloom.modeling_bloom.build_alibi_tensor(ones(1,2), num_heads, "
        "float64)[:, 0, 1] - [:, 0, 0] (HF computes the slopes in float32).",
        "notes": [
            f"Both sources agree to float32 precision (max relative difference {max_rel:.3e}); they "
            "are bit-identical whenever the slope base is an exact power of two (e.g. power-of-two "
            "head counts <= 8).",
            "Non-power-of-two n: slopes of the closest lower power of two p, then every other slope of 2p, first "
            "n - p of them.",
        ],
        "cases": cases,
    }


# ----------------------------------------------------------------------------------------------------------------
# 4. Sinusoidal
# ----------------------------------------------------------------------------------------------------------------
# Copied verbatim from github.com/facebookresearch/mae util/pos_embed.py (commit a9f5c70): used only as a cross-check
# (it computes omega in float32 and only supports base 10000).
def mae_get_1d_sincos_pos_embed_from_grid(embed_dim, pos):
    """
    embed_dim: output dimension for each position
    pos: a list of positions to be encoded: size (M,)
    out: (M, D)
    """
    assert embed_dim % 2 == 0
    omega = np.arange(embed_dim // 2, dtype=np.float32)
    omega /= embed_dim / 2.0
    omega = 1.0 / 10000**omega  # (D/2,)

    pos = pos.reshape(-1)  # (M,)
    out = np.einsum("m,d->md", pos, omega)  # (M, D/2), outer product

    emb_sin = np.sin(out)  # (M, D/2)
    emb_cos = np.cos(out)  # (M, D/2)

    emb = np.concatenate([emb_sin, emb_cos], axis=1)  # (M, D)
    return emb


def concat_hand(dim, base, positions):
    """Hand-derived MAE layout in numpy float64: [sin(p*w_i) for i<dim/2] + [cos(p*w_i)], w_i = base**(-i/(dim/2))."""
    omega = 1.0 / base ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
    out = np.asarray(positions, dtype=np.float64)[:, None] * omega[None, :]
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def interleaved_hand(dim, base, positions):
    """Hand-derived Vaswani et al. 2017 in numpy float64: PE[p,2i] = sin(p/base^(2i/d)), PE[p,2i+1] = cos(...)."""
    i = np.arange(dim // 2, dtype=np.float64)
    angle = np.asarray(positions, dtype=np.float64)[:, None] / base ** (2.0 * i / dim)[None, :]
    pe = np.empty((len(positions), dim), dtype=np.float64)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return pe


def gen_sinusoidal():
    positions = [0, 1, 2, 5, 17, 100, 511, 2.5]
    cases = []
    for dim, base in ((8, 10000.0), (64, 10000.0), (6, 10000.0), (64, 100.0)):
        if dim % 2:
            print(f"  skip sinusoidal dim {dim} (odd)")
            continue
        int_pos = [p for p in positions if float(p).is_integer()]
        # HF ViT-MAE: 2D builder with width 1 and embed_dim 2*dim -> columns [:dim] are [sin_h | cos_h] with
        # omega_i = temperature**(-i/(dim/2)), float64 internally, for integer positions 0..height-1.
        hf = build_2d_sinusoidal_position_embedding(
            height=int(max(int_pos)) + 1,
            width=1,
            embed_dim=2 * dim,
            temperature=base,
            dtype=torch.float64,
        )[:, :dim].numpy()
        hand = concat_hand(dim, base, positions)
        concat = np.empty_like(hand)
        row_source = []
        for r, p in enumerate(positions):
            if float(p).is_integer():
                concat[r] = hf[int(p)]
                row_source.append("hf_vit_mae_build_2d_sinusoidal_position_embedding")
                assert np.max(np.abs(hf[int(p)] - hand[r])) < 1e-12
            else:
                concat[r] = hand[r]
                row_source.append("hand_derived_numpy_float64")
        if base == 10000.0:
            mae = mae_get_1d_sincos_pos_embed_from_grid(
                dim, np.asarray(positions, dtype=np.float64)
            )
            assert np.max(np.abs(mae - concat)) < 1e-3 * max(
                positions
            )  # float32 omega in the MAE original
            vm = (
                get_sinusoid_encoding_table(int(max(int_pos)) + 1, dim)[0].double().numpy()
            )  # float32 output
        inter = interleaved_hand(dim, base, positions)
        if base == 10000.0:
            for r, p in enumerate(positions):
                if float(p).is_integer():
                    assert np.max(np.abs(vm[int(p)] - inter[r])) < 1e-5, (dim, p)
        cases.append(
            {
                "dim": dim,
                "base": base,
                "positions": [float(p) if not float(p).is_integer() else int(p) for p in positions],
                "concat": flist(concat),
                "interleaved": flist(inter),
                "concat_row_source": row_source,
            }
        )
    return {
        "generator": GENERATOR,
        "source": "concat (MAE layout, sin block then cos block, omega_i = base**(-i/(dim/2))): rows for integer "
        "positions from transformers.models.vit_mae.modeling_vit_mae.build_2d_sinusoidal_position_"
        "embedding(height=max_pos+1, width=1, embed_dim=2*dim, temperature=base, dtype=float64)[:, :dim] "
        "(float64 internally); rows for fractional positions hand-derived in numpy float64 with the same "
        "formula (see concat_row_source). interleaved: hand-derived numpy float64 from Vaswani et al. "
        "2017, PE[p,2i] = sin(p/base^(2i/d)), PE[p,2i+1] = cos(p/base^(2i/d)).",
        "notes": [
            "transformers 5.x no longer has MAE's get_1d_sincos_pos_embed_from_grid; build_2d_sinusoidal_position_"
            "embedding (which accepts a temperature) is used instead. The MAE original (facebookresearch/mae "
            "util/pos_embed.py, copied into the generator) computes omega in float32; it was used only as a "
            "cross-check (agrees to float32 precision).",
            "Both layouts use the same frequencies: concat column i and i+dim/2 <-> interleaved columns 2i and 2i+1.",
            "interleaved cross-checked for base 10000 against transformers.models.videomae.modeling_videomae."
            "get_sinusoid_encoding_table (float32 output) to < 1e-5.",
            "Hand-derived concat rows agree with the HF rows to < 1e-12 at integer positions (asserted).",
        ],
        "cases": cases,
    }


# ----------------------------------------------------------------------------------------------------------------
# 5. Learned table resize
# ----------------------------------------------------------------------------------------------------------------
def gen_learned_resize():
    L, D = 7, 3
    pos = torch.arange(L, dtype=torch.float64)[:, None]
    d = torch.arange(D, dtype=torch.float64)[None, :]
    table = torch.sin(0.7 * pos + 1.3 * d) + 0.1 * pos * pos  # [L, D]
    cases = []
    for new in (11, 4, 7):
        lin = F.interpolate(table.T[None], size=new, mode="linear", align_corners=False)[0].T
        cub = F.interpolate(
            table.T[None, :, :, None], size=(new, 1), mode="bicubic", align_corners=False
        )[0, :, :, 0].T
        assert lin.dtype == torch.float64 and cub.dtype == torch.float64
        assert lin.shape == (new, D) and cub.shape == (new, D)
        if new == L:
            assert torch.allclose(lin, table, rtol=0, atol=1e-15) and torch.allclose(
                cub, table, rtol=0, atol=1e-15
            )
        cases.append(
            {
                "old_length": L,
                "new_length": new,
                "table": flist(table),
                "linear": flist(lin),
                "cubic": flist(cub),
            }
        )
    return {
        "generator": GENERATOR,
        "source": "table T[l,d] = sin(0.7*l + 1.3*d) + 0.1*l*l (float64); linear = torch.nn.functional.interpolate("
        "T.T[None], size=new, mode='linear', align_corners=False)[0].T; cubic = F.interpolate("
        "T.T[None,:,:,None], size=(new,1), mode='bicubic', align_corners=False)[0,:,:,0].T",
        "notes": [
            "align_corners=False: source coordinate x = (j + 0.5) * old/new - 0.5. linear clamps x to >= 0 and the "
            "upper neighbour index to old-1. bicubic uses Keys' kernel with A = -0.75 and clamps the 4 tap indices to "
            "[0, old-1] (no clamping of x itself); the width-1 axis is an identity.",
            "new_length == old_length reproduces the table (asserted to 1e-15).",
        ],
        "cases": cases,
    }


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.set_grad_enabled(False)
    print(f"generator: {GENERATOR}")
    write_json("rope.json", gen_rope())
    write_json("t5_buckets.json", gen_t5())
    write_json("alibi.json", gen_alibi())
    write_json("sinusoidal.json", gen_sinusoidal())
    write_json("learned_resize.json", gen_learned_resize())
    _tf_logger.removeHandler(_capture)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Generate the multi-axis JSON reference fixtures in tests/fixtures/ for the posenc C++ tests.

What it writes (each file is a JSON object {"generator": {...}, "source": ..., "notes": [...], "cases": [...]}):

  tests/fixtures/sincos_2d.json       2D sin-cos position tables for patch grids, in two column layouts:
                                      "mae"  (ViT-MAE / facebookresearch/mae: [sin_w | cos_w | sin_h | cos_h]) and
                                      "timm" (timm build_sincos2d_pos_embed: [sin_h | sin_w | cos_h | cos_w]).
  tests/fixtures/mrope.json           Qwen2-VL / Qwen2.5-VL multimodal RoPE: 3 x N position ids from get_rope_index for
                                      text/image/video token streams (incl. left padding and Qwen2.5-VL time scaling),
                                      and the M-RoPE rotation (cos/sin per axis, mrope_section recomposition, rotated
                                      q/k) for head_dim 16, mrope_section [2, 3, 3].
  tests/fixtures/resample_2d.json     Resampling an absolute [1 + H*W, D] position table with a CLS prefix to another
                                      grid: timm resample_abs_pos_embed (bicubic+antialias, bilinear) and HF ViT
                                      interpolate_pos_encoding (bicubic, no antialias).
  tests/fixtures/time_features.json   Informer-style calendar time features in [-0.5, 0.5] (hand-derived with Python's
                                      datetime; pandas/gluonts are not installed in the venv).

Values come from calling the reference Python implementations (HF transformers, timm, torch) wherever such a
function exists; values that are hand-derived are labelled so in a "source" field.  Everything is deterministic
(no randomness, tiny models are only used for their index/rotary helpers, never for weights); floats are float64
values written with Python's shortest round-trip repr (full precision).

Regenerate (from the repository root):

    /work/venv-tools/bin/python tools/gen_fixtures_multiaxis.py

(the venv has torch 2.15, transformers 5.24, timm 1.0.31; the exact versions are recorded in each JSON file under
"generator").  NOTE: the Qwen2-VL get_rope_index semantics changed between transformers 4.x and 5.x (see the notes
in mrope.json); regenerate with a comparable transformers version.
"""

import calendar
import datetime
import json
import math
import os
import platform
import sys

import numpy as np
import timm
import torch
import torch.nn.functional as F
import transformers
from timm.layers.pos_embed import resample_abs_pos_embed
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, ViTConfig, ViTMAEConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import (
    apply_rotary_pos_emb as qwen2vl_apply_rotary_pos_emb,
)
from transformers.models.qwen2_vl.modeling_qwen2_vl import rotate_half as qwen2vl_rotate_half
from transformers.models.vit.modeling_vit import ViTEmbeddings
from transformers.models.vit_mae.modeling_vit_mae import (
    ViTMAEEmbeddings,
    build_2d_sinusoidal_position_embedding,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(REPO_ROOT, "tests", "fixtures")

GENERATOR = {
    "script": "tools/gen_fixtures_multiaxis.py",
    "command": "/work/venv-tools/bin/python tools/gen_fixtures_multiaxis.py",
    "python": platform.python_version(),
    "torch": torch.__version__,
    "transformers": transformers.__version__,
    "timm": timm.__version__,
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


def inested(t):
    """Integer tensor/ndarray -> nested list of Python ints."""
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().numpy()
    a = np.asarray(t)
    if a.ndim == 0:
        return int(a)
    return [inested(row) for row in a]


def write_json(name, obj):
    path = os.path.join(OUT_DIR, name)
    text = json.dumps(obj, indent=None, separators=(",", ":"), sort_keys=False, allow_nan=False)
    with open(path, "w") as f:
        f.write(text)
        f.write("\n")
    with open(path) as f:
        back = json.load(f)
    assert back == json.loads(text)
    size = os.path.getsize(path)
    print(f"{os.path.relpath(path, REPO_ROOT)}: {len(back['cases'])} cases, {size} bytes")
    if size > 300 * 1024:
        print(f"  WARNING: {name} is larger than 300 KiB")
    return back


def maxabs(a, b):
    a = (
        a.detach().double()
        if isinstance(a, torch.Tensor)
        else torch.as_tensor(np.asarray(a, dtype=np.float64))
    )
    b = (
        b.detach().double()
        if isinstance(b, torch.Tensor)
        else torch.as_tensor(np.asarray(b, dtype=np.float64))
    )
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max()) if a.numel() else 0.0


# ----------------------------------------------------------------------------------------------------------------
# 1. 2D sin-cos tables
# ----------------------------------------------------------------------------------------------------------------
def mae_2d_sincos_numpy_f64(h, w, dim, temperature):
    """facebookresearch/mae util/pos_embed.py get_2d_sincos_pos_embed, generalised to an (h, w) grid and a
    temperature, in float64 (the original uses one grid_size and float32/np.float omega).  Cross-check only."""
    grid_h = np.arange(h, dtype=np.float64)
    grid_w = np.arange(w, dtype=np.float64)
    grid = np.meshgrid(grid_w, grid_h)  # here w goes first  (as in the original)
    grid = np.stack(grid, axis=0).reshape([2, 1, h, w])

    def one_d(d, pos):
        omega = np.arange(d // 2, dtype=np.float64) / (d / 2.0)
        omega = 1.0 / temperature**omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    emb_h = one_d(
        dim // 2, grid[0]
    )  # the original's "emb_h" encodes grid[0], i.e. the w coordinate
    emb_w = one_d(dim // 2, grid[1])
    return np.concatenate([emb_h, emb_w], axis=1)  # (h*w, dim), row-major h outer


def gen_sincos_2d():
    cases = []
    combos = [(g, d, 10000.0) for g in ((4, 4), (3, 5), (2, 7)) for d in (16, 32)] + [
        ((3, 5), 16, 100.0)
    ]
    for (h, w), dim, temp in combos:
        # HF: [sin_h | cos_h | sin_w | cos_w], float64 internally; ViTMAE.initialize_weights swaps the halves.
        hf = build_2d_sinusoidal_position_embedding(
            height=h, width=w, embed_dim=dim, temperature=temp, cls_token=False, dtype=torch.float64
        )
        assert hf.shape == (h * w, dim) and hf.dtype == torch.float64
        half = dim // 2
        mae = torch.cat(
            [hf[..., half:], hf[..., :half]], dim=-1
        )  # exactly what ViTMAEEmbeddings.initialize_weights does
        assert maxabs(mae, mae_2d_sincos_numpy_f64(h, w, dim, temp)) < 1e-12

        # timm: computed in float32 internally (float32 grid and bands); its layout is a column permutation of the HF
        # float64 table: [sin_h | sin_w | cos_h | cos_w].  Store the float64 permutation, verified against timm.
        q = dim // 4
        sin_h, cos_h, sin_w, cos_w = (
            hf[:, :q],
            hf[:, q : 2 * q],
            hf[:, 2 * q : 3 * q],
            hf[:, 3 * q :],
        )
        timm64 = torch.cat([sin_h, sin_w, cos_h, cos_w], dim=1)
        timm32 = build_sincos2d_pos_embed(
            feat_shape=[h, w],
            dim=dim,
            temperature=temp,
            reverse_coord=False,
            interleave_sin_cos=False,
        )
        assert timm32.shape == (h * w, dim)
        assert maxabs(timm32, timm64) < 1e-5, maxabs(timm32, timm64)
        # interleave_sin_cos=True in timm is block-wise [sin_h | cos_h | sin_w | cos_w] (= the HF layout), and
        # reverse_coord=True swaps h and w: record both as checks in the notes, not as data.
        assert (
            maxabs(build_sincos2d_pos_embed([h, w], dim, temp, interleave_sin_cos=True), hf) < 1e-5
        )
        rev = build_sincos2d_pos_embed([h, w], dim, temp, reverse_coord=True)
        assert rev.shape == (h * w, dim)
        # direct check of the token order of the timm table: token t <-> (t // w, t % w)
        hh = torch.arange(h, dtype=torch.float64).repeat_interleave(w)
        ww = torch.arange(w, dtype=torch.float64).repeat(h)
        bands = 1.0 / temp ** (torch.arange(q, dtype=torch.float64) / q)
        direct = torch.cat(
            [
                torch.sin(hh[:, None] * bands),
                torch.sin(ww[:, None] * bands),
                torch.cos(hh[:, None] * bands),
                torch.cos(ww[:, None] * bands),
            ],
            dim=1,
        )
        assert maxabs(direct, timm64) < 1e-12
        cases.append(
            {
                "h": h,
                "w": w,
                "dim": dim,
                "temperature": temp,
                "mae": flist(mae),
                "timm": flist(timm64),
            }
        )

    # ViTMAE model initialisation (square grid, CLS row) really produces the "mae" layout.
    cfg = ViTMAEConfig(hidden_size=16, image_size=8, patch_size=2, num_channels=3)
    emb = ViTMAEEmbeddings(cfg)
    emb.initialize_weights()
    pe = emb.position_embeddings[0].detach()
    assert pe.shape == (17, 16) and float(pe[0].abs().max()) == 0.0
    ref = next(c for c in cases if c["h"] == 4 and c["w"] == 4 and c["dim"] == 16)
    assert maxabs(pe[1:], ref["mae"]) < 1e-6
    return {
        "generator": GENERATOR,
        "source": "mae: transformers.models.vit_mae.modeling_vit_mae.build_2d_sinusoidal_position_embedding(height=h, "
        "width=w, embed_dim=dim, temperature=temperature, cls_token=False, dtype=torch.float64) (layout "
        "[sin_h|cos_h|sin_w|cos_w], float64 internally) followed by the half swap that ViTMAEEmbeddings."
        "initialize_weights applies (torch.cat([pe[..., dim/2:], pe[..., :dim/2]], -1)). timm: the same HF "
        "float64 table with its four dim/4 column blocks permuted to [sin_h|sin_w|cos_h|cos_w]; checked "
        "against timm.layers.pos_embed_sincos.build_sincos2d_pos_embed(feat_shape=[h, w], dim=dim, "
        "temperature=temperature, reverse_coord=False, interleave_sin_cos=False) to < 1e-5 (timm computes "
        "in float32), and against a direct float64 formula to < 1e-12.",
        "notes": [
            "Both tables are [h*w, dim], tokens in row-major order: token t = i*w + j is grid row i (height "
            "coordinate, 0..h-1) and column j (width coordinate, 0..w-1), i.e. h outer, w inner. No CLS row "
            "(build_2d_sinusoidal_position_embedding(cls_token=True) would prepend an all-zero row; ViTMAE uses that).",
            "Frequencies: omega_k = temperature**(-k/(dim/4)), k = 0..dim/4-1, for both layouts (each axis gets dim/2 "
            "columns, which is the 1D concat sin/cos layout of width dim/2). Positions are the integer indices i, j.",
            "mae layout: columns [0, dim/4) = sin(j*omega), [dim/4, dim/2) = cos(j*omega), [dim/2, 3dim/4) = "
            "sin(i*omega), [3dim/4, dim) = cos(i*omega): the WIDTH coordinate first (facebookresearch/mae "
            "get_2d_sincos_pos_embed: grid = np.meshgrid(grid_w, grid_h), its emb_h is computed from grid[0] = w). "
            "transformers 5.x build_2d_sinusoidal_position_embedding returns the canonical [sin_h|cos_h|sin_w|cos_w] "
            "and ViTMAEEmbeddings/ViTMAEDecoder.initialize_weights swap the two halves to restore the MAE layout "
            "(verified here: a tiny ViTMAEEmbeddings (4x4 grid, dim 16) initialises exactly to the 'mae' table with a "
            "zero CLS row, to float32 precision). Agrees with a float64 numpy port of the MAE original generalised to "
            "(h, w) to < 1e-12.",
            "timm layout (build_sincos2d_pos_embed, interleave_sin_cos=False, reverse_coord=False): columns [0, dim/4) "
            "= sin(i*omega), [dim/4, dim/2) = sin(j*omega), [dim/2, 3dim/4) = cos(i*omega), [3dim/4, dim) = "
            "cos(j*omega), i.e. [sin_h | sin_w | cos_h | cos_w] as documented. Output shape is [h*w, dim] (no batch "
            "dim), flattened from torch.meshgrid(indexing='ij') over (h, w): h outer, w inner.",
            "timm interleave_sin_cos=True is NOT element-wise interleaving: it gives block-wise [sin_h|cos_h|sin_w|"
            "cos_w] (= the HF canonical layout; asserted). reverse_coord=True swaps the roles of h and w.",
            "timm computes grid and bands in float32 and returns float32 by default; the stored 'timm' values are the "
            "float64 table (agrees with timm's float32 output to < 1e-5).",
        ],
        "cases": cases,
    }


# ----------------------------------------------------------------------------------------------------------------
# 2. Qwen2-VL M-RoPE
# ----------------------------------------------------------------------------------------------------------------
TEXT_IDS = [
    9707,
    11,
    1879,
    0,
    3555,
    374,
    419,
    30,
    785,
    525,
    13,
    576,
]  # arbitrary ordinary text token ids


def tiny_text_config(mrope_section):
    return dict(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": list(mrope_section),
        },
    )


def tiny_qwen2vl():
    cfg = Qwen2VLConfig(
        text_config=tiny_text_config([2, 3, 3]),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=2),
    )
    return Qwen2VLModel(cfg).eval()


def tiny_qwen25vl():
    cfg = Qwen2_5_VLConfig(
        text_config=tiny_text_config([2, 3, 3]),
        vision_config=dict(
            depth=1,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            out_hidden_size=32,
            fullatt_block_indexes=[0],
            tokens_per_second=4,
        ),
    )
    return Qwen2_5_VLModel(cfg).eval()


def build_stream(cfg, segments, merge, pad_left=0):
    """segments: list of ("text", n) | ("image", (t, h, w)) | ("video", (t, h, w)).
    Every vision segment is preceded by <|vision_start|> and followed by <|vision_end|> (both ordinary text tokens,
    mm_token_type 0), as the Qwen2-VL processor emits them; these two tokens count towards the neighbouring text
    runs given in `segments` (the text run before a vision segment ends with vision_start, the one after starts
    with vision_end)."""
    pad_id = 151643  # <|endoftext|>, used as pad token by the Qwen2-VL tokenizer
    ids, kinds, ttype = [pad_id] * pad_left, ["pad"] * pad_left, [0] * pad_left
    image_grids, video_grids = [], []
    text_counter = 0
    for si, (kind, arg) in enumerate(segments):
        if kind == "text":
            run = []
            for _k in range(arg):
                run.append(TEXT_IDS[text_counter % len(TEXT_IDS)])
                text_counter += 1
            if si > 0 and segments[si - 1][0] != "text":
                run[0] = cfg.vision_end_token_id
            if si + 1 < len(segments) and segments[si + 1][0] != "text":
                run[-1] = cfg.vision_start_token_id
            ids += run
            kinds += ["text"] * arg
            ttype += [0] * arg
        else:
            t, h, w = arg
            n = t * (h // merge) * (w // merge)
            tok = cfg.image_token_id if kind == "image" else cfg.video_token_id
            ids += [tok] * n
            kinds += [kind] * n
            ttype += [1 if kind == "image" else 2] * n
            (image_grids if kind == "image" else video_grids).append([t, h, w])
    mask = [0] * pad_left + [1] * (len(ids) - pad_left)
    return ids, kinds, ttype, mask, image_grids, video_grids


def legacy_rope_index(kinds, image_grids, video_grids, merge, time_intervals=None):
    """Hand-derived transformers 4.x / original Qwen2-VL rule (cross-reference only): text after a vision segment
    resumes at (max over all three rows of everything so far) + 1; vision positions are (t*interval, h, w) + st."""
    img_it, vid_it = iter(image_grids), iter(video_grids)
    ti = iter(time_intervals or [])
    cols, prev_max = [], -1
    i, n = 0, len(kinds)
    valid = [k for k in kinds if k != "pad"]
    while i < len(valid):
        k = valid[i]
        j = i
        while j < len(valid) and valid[j] == k:
            j += 1
        st = prev_max + 1
        if k == "text":
            for p in range(j - i):
                cols.append((st + p,) * 3)
        else:
            t, h, w = next(img_it) if k == "image" else next(vid_it)
            interval = next(ti) if k == "video" and time_intervals else 1.0
            seg = []
            for a in range(t):
                for b in range(h // merge):
                    for c in range(w // merge):
                        seg.append((int(a * interval) + st, b + st, c + st))
            assert len(seg) == j - i
            cols += seg
        prev_max = max(max(c) for c in cols)
        i = j
    pos = np.zeros(
        (3, n), dtype=np.int64
    )  # 4.x initialised with ones; padded slots here are left at 0 (see notes)
    valid_idx = [q for q, k in enumerate(kinds) if k != "pad"]
    pos[:, valid_idx] = np.array(cols, dtype=np.int64).T
    delta = int(np.max(cols)) + 1 - len(valid)
    return pos, delta


def rope_index_case(model, name, segments, pad_left=0, second_per_grid_ts=None):
    cfg = model.config
    merge = cfg.vision_config.spatial_merge_size
    ids, kinds, ttype, mask, image_grids, video_grids = build_stream(cfg, segments, merge, pad_left)
    kwargs = dict(
        input_ids=torch.tensor([ids], dtype=torch.long),
        mm_token_type_ids=torch.tensor([ttype], dtype=torch.int32),
        image_grid_thw=torch.tensor(image_grids, dtype=torch.long) if image_grids else None,
        video_grid_thw=torch.tensor(video_grids, dtype=torch.long) if video_grids else None,
        attention_mask=torch.tensor([mask], dtype=torch.long),
    )
    if second_per_grid_ts is not None:
        kwargs["second_per_grid_ts"] = torch.tensor(second_per_grid_ts, dtype=torch.float32)
    pos, deltas = model.get_rope_index(**kwargs)
    assert pos.shape == (3, 1, len(ids)) and deltas.shape == (1, 1)
    pos = pos[:, 0]
    case = {
        "name": name,
        "model": type(model).__name__,
        "token_kinds": kinds,
        "input_ids": ids,
        "mm_token_type_ids": ttype,
        "attention_mask": mask,
        "image_grid_thw": image_grids,
        "video_grid_thw": video_grids,
        "spatial_merge_size": merge,
    }
    intervals = None
    if isinstance(model, Qwen2_5_VLModel):
        tps = cfg.vision_config.tokens_per_second
        case["tokens_per_second"] = tps
        case["second_per_grid_ts"] = second_per_grid_ts
        if video_grids:
            spg = second_per_grid_ts if second_per_grid_ts is not None else [1.0] * len(video_grids)
            # exactly as get_rope_index: (arange(t) * (tokens_per_second * float32(second_per_grid_t))).long()
            intervals = [float(tps * torch.tensor(s, dtype=torch.float32)) for s in spg]
    case["position_ids"] = inested(pos)
    case["mrope_position_deltas"] = [int(deltas[0, 0])]
    legacy_pos, legacy_delta = legacy_rope_index(kinds, image_grids, video_grids, merge, intervals)
    same = bool(np.array_equal(legacy_pos, pos.numpy())) and legacy_delta == int(deltas[0, 0])
    case["same_as_transformers4_rule"] = same
    if not same:
        case["position_ids_transformers4_rule"] = inested(legacy_pos)
        case["mrope_position_deltas_transformers4_rule"] = [legacy_delta]
    return case


def gen_mrope():
    torch.manual_seed(
        0
    )  # tiny models' weights are never used; seed only to keep construction reproducible
    m2 = tiny_qwen2vl()
    m25 = tiny_qwen25vl()
    cases = []
    # (i) 3 text, image (1,4,6) -> 1x2x3 = 6 tokens, 4 text
    s1 = [("text", 3), ("image", (1, 4, 6)), ("text", 4)]
    cases.append(rope_index_case(m2, "text3_image_1x4x6_text4", s1))
    # (ii) 2 text, video (4,4,4) -> 4x2x2 = 16 tokens, 3 text
    cases.append(
        rope_index_case(
            m2, "text2_video_4x4x4_text3", [("text", 2), ("video", (4, 4, 4)), ("text", 3)]
        )
    )
    # (iii) two images back to back (separated only by <|vision_end|><|vision_start|>)
    cases.append(
        rope_index_case(
            m2,
            "two_images_back_to_back",
            [("text", 2), ("image", (1, 4, 6)), ("text", 2), ("image", (1, 6, 4)), ("text", 2)],
        )
    )
    # (iv) stream (i) with 3 left-padding tokens
    cases.append(rope_index_case(m2, "text3_image_1x4x6_text4_leftpad3", s1, pad_left=3))
    # (v) video then image, larger t than h/w (text resumes before the last temporal index)
    cases.append(
        rope_index_case(
            m2,
            "text2_video_6x2x4_text2_image_1x4x4_text1",
            [("text", 2), ("video", (6, 2, 4)), ("text", 2), ("image", (1, 4, 4)), ("text", 1)],
        )
    )
    # Qwen2.5-VL: temporal axis scaled by tokens_per_second * second_per_grid_t
    cases.append(
        rope_index_case(
            m25,
            "qwen2_5_vl_text2_video_4x4x4_text3_spg2.0",
            [("text", 2), ("video", (4, 4, 4)), ("text", 3)],
            second_per_grid_ts=[2.0],
        )
    )
    cases.append(
        rope_index_case(
            m25,
            "qwen2_5_vl_text2_image_1x4x6_text2_video_4x4x4_text2_spg0.3",
            [("text", 2), ("image", (1, 4, 6)), ("text", 2), ("video", (4, 4, 4)), ("text", 2)],
            second_per_grid_ts=[0.3],
        )
    )

    # two images with NO text token between them: mm_token_type_ids groups them into one run -> transformers fails
    adjacent_error = None
    try:
        ids = TEXT_IDS[:2] + [m2.config.image_token_id] * 12 + TEXT_IDS[2:4]
        tt = [0, 0] + [1] * 12 + [0, 0]
        m2.get_rope_index(
            torch.tensor([ids]),
            torch.tensor([tt], dtype=torch.int32),
            image_grid_thw=torch.tensor([[1, 4, 6], [1, 6, 4]]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        )
    except Exception as e:  # noqa: BLE001
        adjacent_error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    assert adjacent_error is not None

    # ---- (c) rotation -------------------------------------------------------------------------------------------
    rot = m2.language_model.rotary_emb
    head_dim, section, theta = 16, [2, 3, 3], 10000.0
    assert rot.mrope_section == section and rot.inv_freq.shape == (head_dim // 2,)
    pos = torch.tensor(cases[0]["position_ids"], dtype=torch.long)  # [3, N], stream (i)
    N = pos.shape[1]
    ar = torch.arange(N * head_dim, dtype=torch.float64)
    q = torch.sin(0.37 * ar).reshape(1, 1, N, head_dim)
    k = torch.cos(0.53 * ar + 0.25).reshape(1, 1, N, head_dim)

    # float64 path: inv_freq and freqs in float64, then the library's recomposition + apply_rotary_pos_emb
    inv64 = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    assert maxabs(inv64, rot.inv_freq) < 1e-7
    freqs64 = pos[..., None].double() * inv64  # [3, N, head_dim/2]
    cos_axes = torch.cat(
        [freqs64.cos(), freqs64.cos()], dim=-1
    )  # [3, N, head_dim] per-axis (before mrope selection)
    sin_axes = torch.cat([freqs64.sin(), freqs64.sin()], dim=-1)
    cos64 = rot.recomposition_frequencies(freqs64.cos())  # [N, head_dim]
    sin64 = rot.recomposition_frequencies(freqs64.sin())
    q_rot, k_rot = qwen2vl_apply_rotary_pos_emb(q, k, cos64[None], sin64[None], unsqueeze_dim=1)
    assert q_rot.dtype == torch.float64

    # cross-check against the library forward (float32 internally), with and without the mrope selection
    x = torch.zeros(1, N, 32, dtype=torch.float64)
    cos_lib, sin_lib = rot(x, pos[:, None, :])  # [1, N, head_dim]
    assert maxabs(cos_lib[0], cos64) < 1e-5 and maxabs(sin_lib[0], sin64) < 1e-5
    orig = rot.recomposition_frequencies
    rot.recomposition_frequencies = lambda f: torch.cat(
        (f, f), dim=-1
    )  # per-axis tables as the forward builds them
    try:
        cos_ax_lib, sin_ax_lib = rot(x, pos[:, None, :])  # [3, 1, N, head_dim]
    finally:
        rot.recomposition_frequencies = orig
    assert maxabs(cos_ax_lib[:, 0], cos_axes) < 1e-5 and maxabs(sin_ax_lib[:, 0], sin_axes) < 1e-5
    # cross-check the rotation by hand (rotate-half)
    assert maxabs(q_rot, q * cos64 + qwen2vl_rotate_half(q) * sin64) < 1e-15
    # which axis feeds which head dim: recompose a table whose entries are the axis number
    axis_code = torch.arange(3, dtype=torch.float64)[:, None].expand(3, head_dim // 2)
    dim_axis = [int(v) for v in rot.recomposition_frequencies(axis_code)]
    hand_axis = []
    for a, s in enumerate(section):
        hand_axis += [a] * s
    assert dim_axis == hand_axis + hand_axis
    # the selected cos equals cos_axes[dim_axis[d], :, d]
    sel = torch.stack([cos_axes[dim_axis[d], :, d] for d in range(head_dim)], dim=-1)
    assert maxabs(sel, cos64) == 0.0

    rotation_case = {
        "name": "rotation_stream_text3_image_1x4x6_text4",
        "head_dim": head_dim,
        "rope_theta": theta,
        "mrope_section": section,
        "dim_axis": dim_axis,
        "position_ids": cases[0]["position_ids"],
        "inv_freq": flist(inv64),
        "q": flist(q[0, 0]),
        "k": flist(k[0, 0]),
        "cos_axes": flist(cos_axes),
        "sin_axes": flist(sin_axes),
        "cos": flist(cos64),
        "sin": flist(sin64),
        "q_rot": flist(q_rot[0, 0]),
        "k_rot": flist(k_rot[0, 0]),
    }
    cases.append(rotation_case)

    return {
        "generator": GENERATOR,
        "source": "position ids: transformers.models.qwen2_vl.modeling_qwen2_vl.Qwen2VLModel.get_rope_index and "
        "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLModel.get_rope_index (which call "
        "get_vision_position_ids), called on tiny CPU model instances (text: hidden 32, 1 layer, 2 heads -> "
        "head_dim 16, rope_theta 10000, mrope_section [2,3,3]; vision: depth 1; default token ids and "
        "spatial_merge_size 2 from Qwen2VLConfig()/Qwen2_5_VLConfig(), Qwen2.5 tokens_per_second 4). "
        "Fields *_transformers4_rule are HAND-DERIVED (legacy rule, see notes), only present where they "
        "differ. rotation: inv_freq/cos/sin computed in float64 by hand (1/theta**(arange(0,hd,2)/hd), "
        "pos*inv_freq), recomposed with the library's Qwen2VLRotaryEmbedding.recomposition_frequencies "
        "and applied with transformers.models.qwen2_vl.modeling_qwen2_vl.apply_rotary_pos_emb in float64; "
        "cross-checked against Qwen2VLRotaryEmbedding.forward (float32 internally) to < 1e-5, cos_axes/"
        "sin_axes against the same forward with recomposition_frequencies replaced by cat((f, f), -1).",
        "notes": [
            "transformers 5.24 has no apply_multimodal_rotary_pos_emb: the mrope_section selection moved into "
            "Qwen2VLRotaryEmbedding.forward (recomposition_frequencies) and the rotation is the plain Llama "
            "rotate-half apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) on [B, heads, N, head_dim] tensors.",
            "mrope_section split: the half-dim frequency vector (head_dim/2 = 8 entries, inv_freq_j = theta**(-2j/"
            "head_dim)) is split into consecutive chunks of sizes mrope_section = [2, 3, 3]; chunk c takes its values "
            "from position axis c % 3 (0 = t, 1 = h, 2 = w): j in [0,2) -> t, [2,5) -> h, [5,8) -> w. The result is "
            "duplicated (cat(f, f)) to head_dim, so head dims 0-1 and 8-9 use t, 2-4 and 10-12 use h, 5-7 and 13-15 "
            "use w (field dim_axis). Equivalent to the 4.x apply_multimodal_rotary_pos_emb, which split the full "
            "head_dim cos/sin with mrope_section*2 = [2,3,3,2,3,3] and took chunk i from axis i % 3.",
            "cos_axes/sin_axes: [3, N, head_dim], axis a row n = cat(cos(pos[a,n]*inv_freq), cos(pos[a,n]*inv_freq)); "
            "cos/sin: [N, head_dim] after selection, cos[n, d] = cos_axes[dim_axis[d], n, d]. q_rot = q*cos + "
            "rotate_half(q)*sin with rotate_half(x) = cat(-x[8:], x[:8]). q[n, d] = sin(0.37*(n*16+d)), k[n, d] = "
            "cos(0.53*(n*16+d) + 0.25) (shape [1, 1, N, 16] in the call; stored without the two leading dims). "
            "attention_scaling is 1.0 for rope_type default.",
            "get_rope_index (transformers 5.24) segments the sequence by mm_token_type_ids (0 text, 1 image, 2 video; "
            "input_ids values themselves are not inspected), after dropping attention_mask == 0 tokens. A running "
            "counter current_pos starts at 0. Text run of length L: all three rows = current_pos + arange(L); "
            "current_pos += L. Vision run with grid (T, H, W) and merge m: llm grid (T, H/m, W/m), tokens in order t "
            "outer, h, w inner; rows = (floor(t*interval) + current_pos, h + current_pos, w + current_pos) where "
            "interval = 1 for Qwen2-VL and for Qwen2.5-VL images, and tokens_per_second * second_per_grid_t "
            "(float; product with t is truncated with .long()) for Qwen2.5-VL videos; then current_pos += max(H, W) "
            "/ m (integer division of max(H, W) by m). So text after a vision segment resumes at start + max(H/m, "
            "W/m) -- the temporal extent is NOT taken into account.",
            "Consequence: for a video whose temporal positions exceed max(H/m, W/m) - 1 (e.g. T=4 > H/m=W/m=2, or "
            "any Qwen2.5-VL video with interval > 1) the following text positions overlap the video's t-row values. "
            "transformers 4.x (and the original Qwen2-VL code) instead resumed text at (max over all 3 rows so far) "
            "+ 1; for images both rules agree. The hand-derived 4.x values are stored in "
            "position_ids_transformers4_rule / mrope_position_deltas_transformers4_rule where they differ "
            "(same_as_transformers4_rule == false).",
            "mrope_position_deltas = max(position_ids over the unmasked tokens, all 3 rows) + 1 - (number of unmasked "
            "tokens); shape [B, 1] in transformers, stored as [delta]. During generation (compute_3d_position_ids with "
            "a cache) the new tokens get position cache_length + arange(new) + delta on all three rows.",
            "Left padding: masked tokens are removed before the positions are computed, so the unmasked part gets "
            "exactly the positions of the unpadded stream; masked slots are left at 0 (position_ids is "
            "initialised with zeros in 5.24; 4.x initialised with ones, so padded slots held 1). The delta uses the "
            "unmasked length (same delta as the unpadded stream).",
            "Grids are consumed in order of appearance from iterators over image_grid_thw / video_grid_thw that are "
            "shared across the batch (row 0's images first, then row 1's, ...).",
            "Token streams: each vision segment is surrounded by <|vision_start|> (id 151652) and <|vision_end|> "
            "(151653), which are ordinary text tokens (mm_token_type 0) and are counted in the neighbouring text runs "
            "of token_kinds; image pad id 151655, video pad id 151656, pad 151643. 'two_images_back_to_back' has only "
            "<|vision_end|><|vision_start|> between the images. Without any text token between two images of the "
            "same modality the two runs merge into one and transformers fails: " + adjacent_error,
            "Qwen2.5-VL second_per_grid_ts is passed as a float32 tensor (as the processor produces); 0.3 -> interval "
            "4*0.3 = 1.2 -> t positions floor([0, 1.2, 2.4, 3.6]) = [0, 1, 2, 3].",
            "mrope_section defaults to [16, 24, 24] when rope_parameters has no mrope_section (Qwen2-VL-7B: "
            "head_dim 128).",
        ],
        "cases": cases,
    }


# ----------------------------------------------------------------------------------------------------------------
# 3. 2D resampling of an absolute table with a CLS prefix
# ----------------------------------------------------------------------------------------------------------------
def resample_input():
    """[1, 1 + 4*4, 8] table, values k/1024 (exactly representable in float32, so timm's .float() is lossless)."""
    r = torch.arange(16, dtype=torch.float64)[:, None]
    d = torch.arange(8, dtype=torch.float64)[None, :]
    i, j = r // 4, r % 4
    patch = torch.sin(0.9 * i + 0.4 * j + 0.7 * d) + 0.05 * i * j - 0.1 * d
    patch = torch.round(patch * 1024) / 1024
    cls = -(torch.arange(8, dtype=torch.float64)[None, :] + 1) / 8
    t = torch.cat([cls, patch], dim=0)[None]
    assert torch.equal(t.float().double(), t)
    return t


def timm_f64(posemb, new_size, old_size, interpolation, antialias):
    """timm.resample_abs_pos_embed's pipeline replicated in float64 (timm itself casts to float32)."""
    prefix, grid = posemb[:, :1], posemb[:, 1:]
    dim = grid.shape[-1]
    g = grid.reshape(1, old_size[0], old_size[1], -1).permute(0, 3, 1, 2)
    g = F.interpolate(g, size=new_size, mode=interpolation, align_corners=None, antialias=antialias)
    g = g.permute(0, 2, 3, 1).reshape(1, -1, dim)
    return torch.cat([prefix, g], dim=1)


def _cubic(x, a):
    x = abs(x)
    if x < 1:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def hand_resample_matrix(n_in, n_out, mode, antialias):
    """HAND-DERIVED 1D weight matrix [n_out, n_in] of F.interpolate(align_corners=False); cross-check only."""
    scale = n_in / n_out
    M = torch.zeros(n_out, n_in, dtype=torch.float64)
    for i in range(n_out):
        if antialias:
            s = max(scale, 1.0)
            support = (2.0 if mode == "bicubic" else 1.0) * s
            center = scale * (i + 0.5)
            lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
            ws = [
                (
                    _cubic((j - center + 0.5) / s, -0.5)
                    if mode == "bicubic"
                    else max(0.0, 1 - abs((j - center + 0.5) / s))
                )
                for j in range(lo, hi)
            ]
            for j, wgt in zip(range(lo, hi), ws):
                M[i, j] += wgt / sum(ws)
        else:
            x = (i + 0.5) * scale - 0.5
            if mode == "bicubic":
                x0 = math.floor(x)
                t = x - x0
                for k, wgt in zip(
                    range(x0 - 1, x0 + 3),
                    (
                        _cubic(t + 1, -0.75),
                        _cubic(t, -0.75),
                        _cubic(1 - t, -0.75),
                        _cubic(2 - t, -0.75),
                    ),
                ):
                    M[i, min(max(k, 0), n_in - 1)] += wgt
            else:
                x = max(x, 0.0)
                x0 = int(x)
                x1 = min(x0 + 1, n_in - 1)
                M[i, x0] += 1 - (x - x0)
                M[i, x1] += x - x0
    return M


def hand_resample(table, old, new, mode, antialias):
    g = table[0, 1:].reshape(old[0], old[1], -1)
    out = torch.einsum(
        "hi,wj,ijd->hwd",
        hand_resample_matrix(old[0], new[0], mode, antialias),
        hand_resample_matrix(old[1], new[1], mode, antialias),
        g,
    )
    return torch.cat([table[0, :1], out.reshape(-1, g.shape[-1])], dim=0)[None]


def gen_resample_2d():
    table = resample_input()
    old = [4, 4]
    cases = []
    specs = [
        ((6, 6), "bicubic", True),
        ((3, 5), "bicubic", True),
        ((2, 2), "bicubic", True),
        ((3, 5), "bilinear", False),
    ]
    for new, interp, aa in specs:
        out = resample_abs_pos_embed(
            table,
            new_size=list(new),
            old_size=old,
            num_prefix_tokens=1,
            interpolation=interp,
            antialias=aa,
        )
        assert out.dtype == torch.float64 and out.shape == (1, 1 + new[0] * new[1], 8)
        out64 = timm_f64(table, list(new), old, interp, aa)
        err = maxabs(out, out64)
        assert err < 1e-5, err
        assert maxabs(out64, hand_resample(table, old, new, interp, aa)) < 1e-13
        assert torch.equal(out[0, 0], table[0, 0])
        cases.append(
            {
                "implementation": "timm.resample_abs_pos_embed",
                "old_grid": old,
                "new_grid": list(new),
                "num_prefix_tokens": 1,
                "interpolation": interp,
                "antialias": aa,
                "align_corners": False,
                "input": flist(table[0]),
                "output": flist(out[0]),
                "output_float64": flist(out64[0]),
            }
        )

    # antialias=True changes the result even when upsampling (different cubic kernel), recorded in the notes
    up_aa = timm_f64(table, [6, 6], old, "bicubic", True)
    up_no = timm_f64(table, [6, 6], old, "bicubic", False)
    aa_up_diff = maxabs(up_aa, up_no)
    assert aa_up_diff > 1e-3

    # HF ViT interpolate_pos_encoding (bicubic, align_corners=False, no antialias), float64 throughout
    ps = 2
    vcfg = ViTConfig(hidden_size=8, image_size=old[0] * ps, patch_size=ps, num_channels=3)
    vemb = ViTEmbeddings(vcfg).double()
    assert vemb.position_embeddings.shape == table.shape
    with torch.no_grad():
        vemb.position_embeddings.copy_(table)
    for new in ((6, 6), (3, 5), (2, 2)):
        dummy = torch.zeros(1, 1 + new[0] * new[1], 8, dtype=torch.float64)
        out = vemb.interpolate_pos_encoding(dummy, height=new[0] * ps, width=new[1] * ps)
        assert out.dtype == torch.float64 and out.shape == (1, 1 + new[0] * new[1], 8)
        assert maxabs(out, timm_f64(table, list(new), old, "bicubic", False)) < 1e-14
        assert maxabs(out, hand_resample(table, old, new, "bicubic", False)) < 1e-13
        cases.append(
            {
                "implementation": "transformers ViTEmbeddings.interpolate_pos_encoding",
                "old_grid": old,
                "new_grid": list(new),
                "num_prefix_tokens": 1,
                "interpolation": "bicubic",
                "antialias": False,
                "align_corners": False,
                "input": flist(table[0]),
                "output": flist(out[0]),
                "output_float64": flist(out[0]),
            }
        )
    return {
        "generator": GENERATOR,
        "source": "timm cases: timm.layers.pos_embed.resample_abs_pos_embed(posemb[1,17,8] float64, new_size, "
        "old_size=[4,4], num_prefix_tokens=1, interpolation, antialias) -> 'output' (timm casts to float32 "
        "for F.interpolate, then back to float64); 'output_float64' = the same pipeline replicated in "
        "float64 with torch.nn.functional.interpolate(mode, align_corners=None, antialias) (agrees to "
        "< 1e-5). ViT cases: transformers.models.vit.modeling_vit.ViTEmbeddings.interpolate_pos_encoding "
        "on a tiny float64 ViTEmbeddings (hidden 8, patch 2, image 8 -> 4x4 grid) whose position_embeddings "
        "are set to the input table; height/width passed as new_grid*patch_size (output is float64, "
        "'output_float64' == 'output').",
        "notes": [
            "input/output are [num_prefix_tokens + H*W, D] (leading batch dim dropped). Row 0 is the CLS/prefix "
            "token and is copied unchanged; rows 1.. are the grid in row-major order (h outer, w inner). The grid is "
            "reshaped to [1, H, W, D] -> permute to [1, D, H, W] -> F.interpolate(size=(newH, newW)) -> back.",
            "input: CLS row c[d] = -(d+1)/8; grid row r = 4*i + j: round(1024*(sin(0.9 i + 0.4 j + 0.7 d) + "
            "0.05 i j - 0.1 d))/1024 (exactly representable in float32).",
            "align_corners=False (timm passes align_corners=None, which F.interpolate treats as False): source "
            "coordinate x = (dst + 0.5) * in/out - 0.5.",
            "bicubic without antialias (HF ViT, timm with antialias=False): Keys cubic convolution with A = -0.75, "
            "4 taps at floor(x)-1..floor(x)+2, tap indices clamped to [0, in-1].",
            "antialias=True (torch 'aa' separable path, PIL-style), per axis with scale = in/out, s = max(scale, 1): "
            "support = 2*s for bicubic (1*s for bilinear); center = scale*(dst + 0.5); taps src in [max(int(center - "
            "support + 0.5), 0), min(int(center + support + 0.5), in)); weight(src) = K((src - center + 0.5) / s) with "
            "K = cubic with A = -0.5 (not -0.75!) for bicubic, triangle max(0, 1-|x|) for bilinear; weights "
            "renormalised to sum 1 (no index clamping). So antialias=True differs from False even when UPSAMPLING "
            f"(4 -> 6: max |diff| = {aa_up_diff:.3g}), not only when downsampling.",
            "All cases are reproduced by a hand-derived separable weight-matrix implementation of these rules "
            "(hand_resample in the generator) to < 1e-13.",
            "bilinear antialias=False: standard linear interpolation per axis, x clamped to >= 0 and "
            "the upper index to in-1.",
            "timm returns the input unchanged when new_size == old_size (early out); no such case here.",
        ],
        "cases": cases,
    }


# ----------------------------------------------------------------------------------------------------------------
# 4. Informer time features
# ----------------------------------------------------------------------------------------------------------------
def gen_time_features():
    stamps = [
        "2010-01-01 00:00:00",
        "2010-03-15 13:45:30",
        "2010-12-31 23:59:59",
        "2012-02-29 12:00:00",
        "2012-12-31 06:07:08",
        "2016-01-03 23:00:59",
    ]
    cases = []
    for s in stamps:
        dt = datetime.datetime.strptime(s, "%Y-%m-%d %H:%M:%S")
        doy = dt.timetuple().tm_yday
        iso_week = dt.isocalendar()[1]
        feats = {
            "SecondOfMinute": dt.second / 59.0 - 0.5,
            "MinuteOfHour": dt.minute / 59.0 - 0.5,
            "HourOfDay": dt.hour / 23.0 - 0.5,
            "DayOfWeek": dt.weekday() / 6.0 - 0.5,
            "DayOfMonth": (dt.day - 1) / 30.0 - 0.5,
            "DayOfYear": (doy - 1) / 365.0 - 0.5,
            "MonthOfYear": (dt.month - 1) / 11.0 - 0.5,
            "WeekOfYear": (iso_week - 1) / 52.0 - 0.5,
        }
        by_freq = {
            "m": ["MonthOfYear"],
            "w": ["DayOfMonth", "WeekOfYear"],
            "d": ["DayOfWeek", "DayOfMonth", "DayOfYear"],
            "h": ["HourOfDay", "DayOfWeek", "DayOfMonth", "DayOfYear"],
            "t": ["MinuteOfHour", "HourOfDay", "DayOfWeek", "DayOfMonth", "DayOfYear"],
            "s": [
                "SecondOfMinute",
                "MinuteOfHour",
                "HourOfDay",
                "DayOfWeek",
                "DayOfMonth",
                "DayOfYear",
            ],
        }
        cases.append(
            {
                "timestamp": s,
                "epoch_seconds_utc": calendar.timegm(dt.timetuple()),
                "calendar": {
                    "year": dt.year,
                    "month": dt.month,
                    "day": dt.day,
                    "hour": dt.hour,
                    "minute": dt.minute,
                    "second": dt.second,
                    "dayofweek": dt.weekday(),
                    "dayofyear": doy,
                    "isoweek": iso_week,
                },
                "features": feats,
                "timeenc1_by_freq": {f: [feats[n] for n in names] for f, names in by_freq.items()},
                "timeenc0_freq_t": [dt.month, dt.day, dt.weekday(), dt.hour, dt.minute // 15],
            }
        )
        assert all(-0.5 <= v <= 0.5 for v in feats.values())
    # sanity: epoch and weekday against known values
    assert (
        cases[0]["epoch_seconds_utc"] == 1262304000 and cases[0]["calendar"]["dayofweek"] == 4
    )  # Friday
    assert cases[3]["calendar"]["dayofyear"] == 60
    return {
        "generator": GENERATOR,
        "source": "HAND-DERIVED with Python's datetime (pandas and gluonts are not installed in the venv), following "
        "zhouhaoyi/Informer2020 utils/timefeatures.py (commit 0de49232): SecondOfMinute = second/59 - 0.5, "
        "MinuteOfHour = minute/59 - 0.5, HourOfDay = hour/23 - 0.5, DayOfWeek = dayofweek/6 - 0.5 "
        "(Monday = 0), DayOfMonth = (day-1)/30 - 0.5, DayOfYear = (dayofyear-1)/365 - 0.5, MonthOfYear = "
        "(month-1)/11 - 0.5, WeekOfYear = (isocalendar().week-1)/52 - 0.5.",
        "notes": [
            "Timestamps are naive and treated as UTC; epoch_seconds_utc = calendar.timegm (seconds since "
            "1970-01-01 00:00:00 UTC, no leap seconds).",
            "timeenc1_by_freq: Informer time_features(timeenc=1, freq) column order per pandas offset: m/M (MonthEnd) "
            "[MonthOfYear]; w/W [DayOfMonth, WeekOfYear]; d/D and b/B [DayOfWeek, DayOfMonth, DayOfYear]; h/H "
            "[HourOfDay, DayOfWeek, DayOfMonth, DayOfYear]; t/T/min [MinuteOfHour, HourOfDay, DayOfWeek, DayOfMonth, "
            "DayOfYear]; s/S [SecondOfMinute, MinuteOfHour, HourOfDay, DayOfWeek, DayOfMonth, DayOfYear]. "
            "Y/A yields no features; Q/M [MonthOfYear].",
            "timeenc0_freq_t: Informer time_features(timeenc=0, freq='t') integer columns [month, day, weekday "
            "(Monday = 0), hour, minute // 15]; other freqs take a prefix: d/b first 3, h first 4, m/w first 1.",
            "DayOfYear divides by 365 also in leap years, so Dec 31 of a leap year gives 365/365 - 0.5 = 0.5 and "
            "Dec 31 of a non-leap year 364/365 - 0.5. DayOfMonth divides by 30, so day 31 gives 0.5.",
            "WeekOfYear uses the ISO week (1..53); Jan 1-3 can belong to week 52/53 of the previous year (e.g. "
            "2010-01-01 is ISO week 53, giving 52/52 - 0.5 = 0.5; 2016-01-03 is ISO week 53 of 2015).",
        ],
        "cases": cases,
    }


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.set_grad_enabled(False)
    print(f"generator: {GENERATOR}")
    write_json("sincos_2d.json", gen_sincos_2d())
    write_json("mrope.json", gen_mrope())
    write_json("resample_2d.json", gen_resample_2d())
    write_json("time_features.json", gen_time_features())
    return 0


if __name__ == "__main__":
    sys.exit(main())

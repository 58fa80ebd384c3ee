#!/usr/bin/env python3
"""Generate tests/fixtures/tmrope.json: Qwen2.5-Omni TMRoPE (time-aligned multimodal RoPE) position ids.

What it writes (a JSON object {"generator": {...}, "source": ..., "notes": [...], "cases": [...]}, the same layout as
tests/fixtures/mrope.json):

  tests/fixtures/tmrope.json   3 x N position ids and rope deltas from the Qwen2.5-Omni thinker's get_rope_index for
                               token streams made of text, audio, image and video segments, videos with their own
                               audio track interleaved in 2-second chunks (use_audio_in_video=True), left padding and
                               a batch of two streams.  Every case lists its segments in builder terms (kinds text /
                               padding / audio / image / video, video optionally with audio) together with the full
                               input_ids, attention_mask, the per-token kinds and the HF inputs (grids, audio mel
                               lengths, seconds per grid).

Values come from calling transformers' Qwen2_5OmniThinkerModel.get_rope_index on a tiny thinker built on the meta
device (get_rope_index only reads the config and spatial_merge_size, never weights).  The token layout of a video
with audio comes from the processor's own Qwen2_5OmniProcessor.replace_video_with_audio_token (called with a stub
`self`: no tokenizer files needed), and audio token counts from the processor's _get_feat_extract_output_lengths.
Every case is also recomputed by a hand-written implementation of the rules stated in the notes (ref_positions
below) and the two must agree exactly, so the notes are checked against HF on every case.  Deterministic: no
randomness, no weights.

Regenerate (from the repository root):

    /work/venv-tools/bin/python tools/gen_fixtures_omni.py

(the venv has torch 2.15, transformers 5.24; the versions are recorded under "generator").
"""

import json
import os
import platform
import sys
import types

import numpy as np
import torch
import transformers
from transformers import Qwen2_5OmniThinkerConfig
from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as omni_modeling
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerModel
from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import Qwen2_5OmniProcessor
from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import (
    _get_feat_extract_output_lengths as processor_audio_tokens,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(REPO_ROOT, "tests", "fixtures")

GENERATOR = {
    "script": "tools/gen_fixtures_omni.py",
    "command": "/work/venv-tools/bin/python tools/gen_fixtures_omni.py",
    "python": platform.python_version(),
    "torch": torch.__version__,
    "transformers": transformers.__version__,
    "numpy": np.__version__,
}

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
PAD_ID = 151643  # <|endoftext|>, the pad token of the Qwen2.5-Omni tokenizer
TEMPORAL_PATCH_SIZE = (
    2  # Qwen2_5OmniVisionEncoderConfig.temporal_patch_size: 2 frames per temporal grid step
)


# ----------------------------------------------------------------------------------------------------------------
# helpers (same conventions as tools/gen_fixtures_multiaxis.py)
# ----------------------------------------------------------------------------------------------------------------
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
    print(
        f"{os.path.relpath(path, REPO_ROOT)}: {len(back['cases'])} cases, {size} bytes "
        f"(transformers {transformers.__version__}, torch {torch.__version__})"
    )
    if size > 300 * 1024:
        print(f"  WARNING: {name} is larger than 300 KiB")
    return back


# ----------------------------------------------------------------------------------------------------------------
# tiny thinker
# ----------------------------------------------------------------------------------------------------------------
def tiny_omni_thinker():
    """Qwen2.5-Omni thinker with tiny sub-configs, built on the meta device (no memory, no weights).
    Token ids, position_id_per_seconds (25), seconds_per_chunk (2), spatial_merge_size (2) and temporal_patch_size (2)
    are the config defaults (= Qwen/Qwen2.5-Omni-7B).  Qwen2_5OmniThinkerConfig has no vision_start/end token ids
    of its own but get_rope_index reads config.vision_start_token_id; the checkpoint's thinker_config.json carries
    151652/151653, passed here the same way."""
    cfg = Qwen2_5OmniThinkerConfig(
        audio_config=dict(
            num_mel_bins=8,
            encoder_layers=1,
            encoder_attention_heads=2,
            encoder_ffn_dim=16,
            d_model=8,
            output_dim=32,
            max_source_positions=64,
            n_window=4,
        ),
        vision_config=dict(
            depth=1,
            hidden_size=16,
            intermediate_size=32,
            num_heads=2,
            out_hidden_size=32,
            fullatt_block_indexes=[0],
        ),
        text_config=dict(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=64,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],
            },
        ),
        vision_start_token_id=151652,
        vision_end_token_id=151653,
    )
    with torch.device("meta"):
        model = Qwen2_5OmniThinkerModel(cfg)
    model.eval()
    assert (
        model.spatial_merge_size == 2
        and cfg.vision_config.temporal_patch_size == TEMPORAL_PATCH_SIZE
    )
    assert cfg.position_id_per_seconds == 25 and cfg.seconds_per_chunk == 2
    return model


def token_ids(cfg):
    ids = {
        "pad": PAD_ID,
        "vision_bos": cfg.vision_start_token_id,  # <|vision_bos|> (= <|vision_start|>) 151652
        "vision_eos": cfg.vision_end_token_id,  # <|vision_eos|> (= <|vision_end|>) 151653
        "audio_bos": cfg.audio_start_token_id,  # <|audio_bos|> 151647
        "audio_eos": cfg.audio_end_token_id,  # <|audio_eos|> 151648
        "image": cfg.image_token_id,  # <|IMAGE|> 151655
        "video": cfg.video_token_id,  # <|VIDEO|> 151656
        "audio": cfg.audio_token_id,  # <|AUDIO|> 151646
    }
    assert ids == {
        "pad": 151643,
        "vision_bos": 151652,
        "vision_eos": 151653,
        "audio_bos": 151647,
        "audio_eos": 151648,
        "image": 151655,
        "video": 151656,
        "audio": 151646,
    }, ids
    return ids


def audio_tokens(model, mel_frames):
    """Number of audio placeholder tokens for an audio of `mel_frames` mel frames (processor and encoder agree)."""
    n_proc = int(processor_audio_tokens(torch.tensor(mel_frames)))
    _, n_enc = model.audio_tower._get_feat_extract_output_lengths(torch.tensor(mel_frames))
    assert n_proc == int(n_enc)
    return n_proc


def video_with_audio_layout(model, grid_thw, second_per_grid, n_audio_tokens):
    """Token layout of a video with its audio, exactly as Qwen2_5OmniProcessor.replace_video_with_audio_token builds
    it (<|audio_bos|> + per chunk: video tokens then audio tokens + <|audio_eos|>; the surrounding <|vision_bos|> /
    <|vision_eos|> come from the chat template).  Returns the token kinds between the two audio markers and the
    per-chunk (video, audio) counts."""
    cfg = model.config
    marks = {
        "<|audio_bos|>": "audio_bos",
        "<|audio_eos|>": "audio_eos",
        "<|VIDEO|>": "video",
        "<|AUDIO|>": "audio",
    }
    stub = types.SimpleNamespace(
        audio_bos_token="<|audio_bos|>",
        audio_eos_token="<|audio_eos|>",
        video_token="<|VIDEO|>",
        audio_token="<|AUDIO|>",
        video_processor=types.SimpleNamespace(merge_size=model.spatial_merge_size),
    )
    stub.get_chunked_index = lambda idx, tpc: Qwen2_5OmniProcessor.get_chunked_index(stub, idx, tpc)
    video_inputs = {
        "video_grid_thw": torch.tensor([grid_thw]),
        "video_second_per_grid": [second_per_grid],
    }
    audio_inputs = {"num_audio_tokens": torch.tensor([n_audio_tokens])}
    text = Qwen2_5OmniProcessor.replace_video_with_audio_token(
        stub,
        video_inputs,
        0,
        audio_inputs,
        0,
        position_id_per_seconds=cfg.position_id_per_seconds,
        seconds_per_chunk=cfg.seconds_per_chunk,
    )
    kinds = []
    while text:
        for m, k in marks.items():
            if text.startswith(m):
                kinds.append(k)
                text = text[len(m) :]
                break
        else:
            raise AssertionError(text[:40])
    assert kinds[0] == "audio_bos" and kinds[-1] == "audio_eos"
    body = kinds[1:-1]
    # per-chunk counts from the processor's own chunk indices; their concatenation must be the placeholder string
    tpc = int(cfg.position_id_per_seconds * cfg.seconds_per_chunk)
    t, h, w = grid_thw
    m = model.spatial_merge_size
    vt = np.broadcast_to(np.arange(t).reshape(-1, 1, 1), (t, h // m, w // m)).reshape(-1)
    vt = vt * second_per_grid * cfg.position_id_per_seconds
    vch = Qwen2_5OmniProcessor.get_chunked_index(stub, vt, tpc)
    ach = Qwen2_5OmniProcessor.get_chunked_index(stub, np.arange(n_audio_tokens), tpc)
    chunks = []
    for j in range(max(len(vch), len(ach))):
        chunks.append(
            [
                vch[j][1] - vch[j][0] if j < len(vch) else 0,
                ach[j][1] - ach[j][0] if j < len(ach) else 0,
            ]
        )
    rebuilt = []
    for nv, na in chunks:
        rebuilt += ["video"] * nv + ["audio"] * na
    assert rebuilt == body
    return body, chunks


def t_offsets(frames, second_per_grid, per_second):
    """Per-frame temporal offsets exactly as get_rope_index computes them:
    (torch.arange(grid_t) * second_per_grids[i].float() * position_id_per_seconds).long()  -- float32, truncated."""
    return (
        (torch.arange(frames) * torch.tensor([second_per_grid]).float()[0] * per_second)
        .long()
        .tolist()
    )


# ----------------------------------------------------------------------------------------------------------------
# stream construction
# ----------------------------------------------------------------------------------------------------------------
def build_stream(model, segments, use_audio_in_video, pad_to=None):
    """segments (builder terms, markers implicit):
      {"kind": "padding", "tokens": n}                    left padding (attention_mask 0), only first
      {"kind": "text", "tokens": n}                       n ordinary text tokens
      {"kind": "audio", "mel_frames": N}                  <|audio_bos|> + M x <|AUDIO|> + <|audio_eos|>
      {"kind": "image", "frames": 1, "height": H, "width": W}
                                                          <|vision_bos|> + t*(H/2)*(W/2) x <|IMAGE|> + <|vision_eos|>
      {"kind": "video", "frames": T, "height": H, "width": W, "fps": f}
                                                          <|vision_bos|> + T*(H/2)*(W/2) x <|VIDEO|> + <|vision_eos|>
      {"kind": "video", ..., "audio_mel_frames": N}      (use_audio_in_video) <|vision_bos|><|audio_bos|> + per
                                                          2 s chunk: its video tokens then its audio tokens +
                                                          <|audio_eos|><|vision_eos|>
    Returns the filled-in segment descriptions, token kinds, input_ids, attention mask and the HF side inputs."""
    cfg = model.config
    ids_of = token_ids(cfg)
    m = model.spatial_merge_size
    kinds, desc = [], []
    image_grids, video_grids, audio_seqlens, spgs = [], [], [], []
    text_counter = 0
    text_ids = []
    for si, seg in enumerate(segments):
        k = seg["kind"]
        d = dict(seg)
        if k == "padding":
            assert si == 0
            kinds += ["pad"] * seg["tokens"]
        elif k == "text":
            kinds += ["text"] * seg["tokens"]
            for _ in range(seg["tokens"]):
                text_ids.append(TEXT_IDS[text_counter % len(TEXT_IDS)])
                text_counter += 1
        elif k == "audio":
            n = audio_tokens(model, seg["mel_frames"])
            assert n > 0
            d["tokens"] = n
            d["span"] = n + 2
            kinds += ["audio_bos"] + ["audio"] * n + ["audio_eos"]
            audio_seqlens.append(seg["mel_frames"])
        elif k in ("image", "video"):
            t, h, w = seg["frames"], seg["height"], seg["width"]
            assert h % m == 0 and w % m == 0
            n = t * (h // m) * (w // m)
            d["tokens"] = n
            if k == "image":
                assert t == 1
                image_grids.append([t, h, w])
                d["span"] = n + 2
                kinds += ["vision_bos"] + ["image"] * n + ["vision_eos"]
            else:
                spg = (
                    TEMPORAL_PATCH_SIZE / seg["fps"]
                )  # Qwen2_5OmniProcessor._process_videos: temporal_patch_size/fps
                d["seconds_per_grid"] = spg
                d["t_offsets"] = t_offsets(t, spg, cfg.position_id_per_seconds)
                video_grids.append([t, h, w])
                spgs.append(spg)
                has_audio = "audio_mel_frames" in seg
                assert has_audio == use_audio_in_video, (
                    "use_audio_in_video applies to every video of the call"
                )
                if has_audio:
                    na = audio_tokens(model, seg["audio_mel_frames"])
                    body, chunks = video_with_audio_layout(model, [t, h, w], spg, na)
                    d["audio_tokens"] = na
                    d["chunks"] = chunks
                    d["span"] = n + na + 4
                    kinds += ["vision_bos", "audio_bos"] + body + ["audio_eos", "vision_eos"]
                    audio_seqlens.append(seg["audio_mel_frames"])
                else:
                    d["span"] = n + 2
                    kinds += ["vision_bos"] + ["video"] * n + ["vision_eos"]
        else:
            raise ValueError(k)
        desc.append(d)
    if pad_to is not None and len(kinds) < pad_to:  # batch rows: left-pad to a common length
        extra = pad_to - len(kinds)
        kinds = ["pad"] * extra + kinds
        if desc[0]["kind"] == "padding":
            desc[0]["tokens"] += extra
        else:
            desc.insert(0, {"kind": "padding", "tokens": extra})
    it = iter(text_ids)
    ids = [next(it) if kd == "text" else ids_of[kd] for kd in kinds]
    mask = [0 if kd == "pad" else 1 for kd in kinds]
    return dict(
        segments=desc,
        token_kinds=kinds,
        input_ids=ids,
        attention_mask=mask,
        image_grid_thw=image_grids,
        video_grid_thw=video_grids,
        audio_seqlens=audio_seqlens,
        second_per_grids=spgs,
    )


# ----------------------------------------------------------------------------------------------------------------
# hand-written implementation of the rules in the notes (cross-check of every case)
# ----------------------------------------------------------------------------------------------------------------
def ref_chunks(values, start, per_chunk):
    """get_chunked_index as stated in the notes: walk the tokens; the chunk counter c starts at 1; whenever a
    token's (value - start) >= c * per_chunk, a new chunk starts at that token and c += 1 (one step per token)."""
    bounds, s, c = [], 0, 1
    for i, v in enumerate(values):
        if v - start >= c * per_chunk:
            bounds.append((s, i))
            s, c = i, c + 1
    bounds.append((s, len(values)))
    return bounds


def ref_positions(model, segments, use_audio_in_video):
    """Positions of the unpadded stream from the segment list alone, following the notes."""
    cfg = model.config
    m = model.spatial_merge_size
    per_chunk = int(cfg.position_id_per_seconds * cfg.seconds_per_chunk)
    cols = []  # (t, h, w) per real token
    nxt = 0  # = max(last emitted block) + 1

    def line(n):
        nonlocal nxt
        for q in range(n):
            cols.append((nxt + q,) * 3)
        nxt += n

    for seg in segments:
        k = seg["kind"]
        if k == "padding":
            continue
        if k == "text":
            line(seg["tokens"])
        elif k == "audio":
            line(
                1 + audio_tokens(model, seg["mel_frames"]) + 1
            )  # bos, audio, eos: one running line
        else:
            t, gh, gw = seg["frames"], seg["height"] // m, seg["width"] // m
            if k == "image":
                offs = [
                    f * cfg.position_id_per_seconds for f in range(t)
                ]  # arange(grid_t) * 1 * 25 (grid_t = 1)
            else:
                offs = t_offsets(t, TEMPORAL_PATCH_SIZE / seg["fps"], cfg.position_id_per_seconds)
            if k == "video" and use_audio_in_video:
                bos = nxt
                cols += [(bos,) * 3, (bos,) * 3]  # vision_bos and audio_bos share one position
                s = bos + 1
                vid = [
                    (s + offs[f], s + r, s + c)
                    for f in range(t)
                    for r in range(gh)
                    for c in range(gw)
                ]
                aud = [(s + q,) * 3 for q in range(audio_tokens(model, seg["audio_mel_frames"]))]
                vch = ref_chunks([p[0] for p in vid], s, per_chunk)
                ach = ref_chunks([p[0] for p in aud], s, per_chunk)
                last = None
                for j in range(max(len(vch), len(ach))):
                    if j < len(vch):
                        last = vid[vch[j][0] : vch[j][1]]
                        cols += last
                    if j < len(ach):
                        last = aud[ach[j][0] : ach[j][1]]
                        cols += last
                eos = max(max(p) for p in last) + 1  # max of the LAST appended chunk only
                cols += [(eos,) * 3, (eos,) * 3]  # audio_eos and vision_eos share one position
                nxt = eos + 1
            else:
                line(1)  # vision_bos
                s = nxt
                blk = [
                    (s + offs[f], s + r, s + c)
                    for f in range(t)
                    for r in range(gh)
                    for c in range(gw)
                ]
                cols += blk
                nxt = max(max(p) for p in blk) + 1
                line(1)  # vision_eos
    pos = np.array(cols, dtype=np.int64).T
    return pos, int(pos.max()) + 1 - pos.shape[1]


# ----------------------------------------------------------------------------------------------------------------
# cases
# ----------------------------------------------------------------------------------------------------------------
def hf_rope_index(model, rows, use_audio_in_video):
    """Calls get_rope_index for a batch of built rows (the side inputs are concatenated in row order)."""
    cat = lambda key: [g for r in rows for g in r[key]]  # noqa: E731
    image_grids, video_grids, seqlens, spgs = (
        cat("image_grid_thw"),
        cat("video_grid_thw"),
        cat("audio_seqlens"),
        cat("second_per_grids"),
    )
    kwargs = dict(
        input_ids=torch.tensor([r["input_ids"] for r in rows], dtype=torch.long),
        image_grid_thw=torch.tensor(image_grids, dtype=torch.long) if image_grids else None,
        video_grid_thw=torch.tensor(video_grids, dtype=torch.long) if video_grids else None,
        attention_mask=torch.tensor([r["attention_mask"] for r in rows], dtype=torch.long),
        use_audio_in_video=use_audio_in_video,
        audio_seqlens=torch.tensor(seqlens, dtype=torch.long) if seqlens else None,
        # the processor returns video_second_per_grid as a list of Python floats -> float32 tensor in the batch
        second_per_grids=torch.tensor(spgs, dtype=torch.float32) if spgs else None,
    )
    pos, deltas = model.get_rope_index(**kwargs)
    assert pos.shape == (3, len(rows), len(rows[0]["input_ids"])) and deltas.shape == (
        len(rows),
        1,
    ), (pos.shape, deltas.shape)
    branch = "3d" if (image_grids or video_grids) else "text_fallback"
    return pos, deltas, branch


def finish_row(model, row, pos, delta, use_audio_in_video):
    """Adds HF's positions to a built row, checks them against the hand-written rules and annotates oddities."""
    row["position_ids"] = inested(pos)
    row["rope_deltas"] = [int(delta)]
    real = [i for i, k in enumerate(row["token_kinds"]) if k != "pad"]
    ref, ref_delta = ref_positions(model, row["segments"], use_audio_in_video)
    got = pos.numpy()
    assert np.array_equal(got[:, real], ref), (row["segments"], got[:, real].tolist(), ref.tolist())
    assert ref_delta == int(delta), (ref_delta, int(delta))
    pad = [i for i, k in enumerate(row["token_kinds"]) if k == "pad"]
    assert all(int(v) == 1 for v in got[:, pad].reshape(-1)), "padded slots hold 1"
    # annotate each video-with-audio segment: max position inside its interleaved block and the eos position
    kinds = row["token_kinds"]
    i = 0
    for seg in row["segments"]:
        if seg["kind"] == "padding":
            i += seg["tokens"]
            continue
        span = seg["tokens"] if seg["kind"] == "text" else seg["span"]
        if seg["kind"] == "video" and "audio_mel_frames" in seg:
            assert kinds[i : i + 2] == ["vision_bos", "audio_bos"] and kinds[
                i + span - 2 : i + span
            ] == ["audio_eos", "vision_eos"]
            body = got[:, i + 2 : i + span - 2]
            seg["block_max"] = int(body.max())
            seg["eos_position"] = int(got[0, i + span - 2])
            seg["eos_overlaps_block"] = seg["eos_position"] <= seg["block_max"]
        i += span
    assert i == len(kinds)
    return row


def single_case(model, name, segments, use_audio_in_video=False, comment=None):
    row = build_stream(model, segments, use_audio_in_video)
    pos, deltas, branch = hf_rope_index(model, [row], use_audio_in_video)
    finish_row(model, row, pos[:, 0], deltas[0, 0], use_audio_in_video)
    case = {"name": name, "batch_size": 1}
    if comment:
        case["comment"] = comment
    case.update(
        use_audio_in_video=use_audio_in_video,
        spatial_merge_size=model.spatial_merge_size,
        position_id_per_seconds=model.config.position_id_per_seconds,
        seconds_per_chunk=model.config.seconds_per_chunk,
        hf_branch=branch,
    )
    case.update(row)
    return case


def batch_case(model, name, rows_segments, use_audio_in_video=False, comment=None):
    built = [build_stream(model, s, use_audio_in_video) for s in rows_segments]
    n = max(len(r["input_ids"]) for r in built)
    built = [build_stream(model, s, use_audio_in_video, pad_to=n) for s in rows_segments]
    pos, deltas, branch = hf_rope_index(model, built, use_audio_in_video)
    rows = []
    for b, row in enumerate(built):
        finish_row(model, row, pos[:, b], deltas[b, 0], use_audio_in_video)
        # each row alone gives the same positions on its unpadded tokens (the side inputs are consumed in row order)
        alone = build_stream(model, rows_segments[b], use_audio_in_video)
        pa, da, _ = hf_rope_index(model, [alone], use_audio_in_video)
        real = [i for i, k in enumerate(row["token_kinds"]) if k != "pad"]
        assert torch.equal(pos[:, b, real], pa[:, 0]) and int(da[0, 0]) == int(deltas[b, 0])
        rows.append(row)
    case = {"name": name, "batch_size": len(rows)}
    if comment:
        case["comment"] = comment
    case.update(
        use_audio_in_video=use_audio_in_video,
        spatial_merge_size=model.spatial_merge_size,
        position_id_per_seconds=model.config.position_id_per_seconds,
        seconds_per_chunk=model.config.seconds_per_chunk,
        hf_branch=branch,
        image_grid_thw=[g for r in rows for g in r["image_grid_thw"]],
        video_grid_thw=[g for r in rows for g in r["video_grid_thw"]],
        audio_seqlens=[g for r in rows for g in r["audio_seqlens"]],
        second_per_grids=[g for r in rows for g in r["second_per_grids"]],
        rows=rows,
    )
    return case


def T(n):
    return {"kind": "text", "tokens": n}


def PAD(n):
    return {"kind": "padding", "tokens": n}


def A(mel):
    return {"kind": "audio", "mel_frames": mel}


def IMG(h, w):
    return {"kind": "image", "frames": 1, "height": h, "width": w}


def VID(t, h, w, fps, audio_mel=None):
    v = {"kind": "video", "frames": t, "height": h, "width": w, "fps": fps}
    if audio_mel is not None:
        v["audio_mel_frames"] = audio_mel
    return v


def gen_tmrope():
    torch.set_grad_enabled(False)
    model = tiny_omni_thinker()
    cases = []
    # ---- no audio in video ---------------------------------------------------------------------------------------
    cases.append(
        single_case(
            model,
            "text3_audio_mel37_text2",
            [T(3), A(37), T(2)],
            comment="no image/video grid: get_rope_index takes its text fallback branch",
        )
    )
    cases.append(single_case(model, "text2_image_1x4x6_text3", [T(2), IMG(4, 6), T(3)]))
    cases.append(
        single_case(
            model,
            "text2_video_4x4x4_fps2_text2",
            [T(2), VID(4, 4, 4, 2.0), T(2)],
            comment="seconds_per_grid 1.0: t offsets 0, 25, 50, 75",
        )
    )
    cases.append(
        single_case(
            model,
            "text2_video_4x4x4_fps4_text1_video_3x4x2_fps1_text2",
            [T(2), VID(4, 4, 4, 4.0), T(1), VID(3, 4, 2, 1.0), T(2)],
            comment="seconds_per_grid 0.5 (t 0, 12, 25, 37: floor of 12.5 steps) and 2.0 (t 0, 50, "
            "100)",
        )
    )
    cases.append(
        single_case(
            model,
            "text1_video_6x2x2_fps6.25_text1",
            [T(1), VID(6, 2, 2, 6.25), T(1)],
            comment="seconds_per_grid 0.32: float32 arithmetic gives t offset 39 for frame 5 "
            "(exact 5*0.32*25 = 40)",
        )
    )
    cases.append(
        single_case(
            model,
            "text2_audio_mel37_text1_audio_mel64_text2_image_1x4x4_text1",
            [T(2), A(37), T(1), A(64), T(2), IMG(4, 4), T(1)],
            comment="two audios; the image makes get_rope_index take its 3D branch",
        )
    )
    # ---- video with its audio (use_audio_in_video=True) ---------------------------------------------------------
    cases.append(
        single_case(
            model,
            "text2_video_2x4x4_fps4_audio_mel60_text2_1chunk",
            [T(2), VID(2, 4, 4, 4.0, audio_mel=60), T(2)],
            use_audio_in_video=True,
            comment="video t 0, 12; audio 15 tokens (0..14): one chunk",
        )
    )
    cases.append(
        single_case(
            model,
            "text2_video_3x4x4_fps2_audio_mel320_text2_2chunks_audio_longer",
            [T(2), VID(3, 4, 4, 2.0, audio_mel=320), T(2)],
            use_audio_in_video=True,
            comment="video t 0, 25, 50 (2 chunks); audio 80 tokens (2 chunks); audio outlasts video",
        )
    )
    cases.append(
        single_case(
            model,
            "leftpad3_text2_video_3x4x4_fps2_audio_mel320_text2",
            [PAD(3), T(2), VID(3, 4, 4, 2.0, audio_mel=320), T(2)],
            use_audio_in_video=True,
            comment="previous stream with 3 left-padding tokens (attention_mask 0)",
        )
    )
    cases.append(
        single_case(
            model,
            "text2_video_4x4x4_fps2_audio_mel240_text2_2chunks_video_longer",
            [T(2), VID(4, 4, 4, 2.0, audio_mel=240), T(2)],
            use_audio_in_video=True,
            comment="video t 0..75, audio 60 tokens, both 2 chunks; the last appended chunk is audio "
            "(max offset 59) so the eos markers and the text after them land below the "
            "video's last t (offset 75)",
        )
    )
    cases.append(
        single_case(
            model,
            "text1_video_6x4x2_fps2_audio_mel600_text1_3chunks",
            [T(1), VID(6, 4, 2, 2.0, audio_mel=600), T(1)],
            use_audio_in_video=True,
            comment="6 s of video (t 0..125, 3 chunks) with its 6 s of audio (150 tokens, 3 chunks "
            "of 50)",
        )
    )
    cases.append(
        single_case(
            model,
            "text1_video_8x2x2_fps2.5_audio_mel100_text1_video_more_chunks",
            [T(1), VID(8, 2, 2, 2.5, audio_mel=100), T(1)],
            use_audio_in_video=True,
            comment="seconds_per_grid 0.8: video t 0, 20, .., 140 (3 chunks); audio 25 tokens "
            "(1 chunk): video outlasts audio, last appended chunk is video",
        )
    )
    cases.append(
        single_case(
            model,
            "text1_video_3x2x4_fps0.667_audio_mel900_text1_split_frames",
            [T(1), VID(3, 2, 4, 2.0 / 3.0, audio_mel=900), T(1)],
            use_audio_in_video=True,
            comment="seconds_per_grid 3.0 (9 s of video) with its 9 s of audio (225 tokens, 5 "
            "chunks): video t 0, 75, 150 jumps over chunk boundaries; the chunker then "
            "emits one-token video chunks (frame 2, at 6 s, split over chunks 2 and 3) and "
            "puts frame 2's first token before the 4-6 s audio chunk",
        )
    )
    cases.append(
        single_case(
            model,
            "text1_audio_mel37_text1_image_1x2x2_video_3x4x4_fps2_audio_mel160_text2",
            [T(1), A(37), T(1), IMG(2, 2), VID(3, 4, 4, 2.0, audio_mel=160), T(2)],
            use_audio_in_video=True,
            comment="a standalone audio, an image and a video with audio in one stream; "
            "audio_seqlens are consumed in stream order (standalone audio first)",
        )
    )
    # ---- batch ------------------------------------------------------------------------------------------------------
    cases.append(
        batch_case(
            model,
            "batch2_audio_image__audio_video",
            [[T(2), A(37), T(1), IMG(4, 6), T(2)], [T(1), A(64), T(1), VID(2, 4, 4, 2.0), T(1)]],
            comment="two rows, the shorter left-padded; image_grid_thw / video_grid_thw / "
            "audio_seqlens / second_per_grids are flat lists consumed in row order",
        )
    )

    # ---- checks that back statements in the notes ------------------------------------------------------------------
    by = {c["name"]: c for c in cases}
    assert by["text2_video_4x4x4_fps4_text1_video_3x4x2_fps1_text2"]["segments"][1][
        "t_offsets"
    ] == [0, 12, 25, 37]
    assert by["text1_video_6x2x2_fps6.25_text1"]["segments"][1]["t_offsets"] == [
        0,
        8,
        16,
        24,
        32,
        39,
    ]
    longer = by["text2_video_4x4x4_fps2_audio_mel240_text2_2chunks_video_longer"]["segments"][1]
    assert (
        longer["eos_overlaps_block"]
        and longer["eos_position"] == 3 + 60
        and longer["block_max"] == 3 + 75
    )
    split = by["text1_video_3x2x4_fps0.667_audio_mel900_text1_split_frames"]["segments"][1]
    assert split["chunks"] == [[2, 50], [2, 50], [1, 50], [1, 50], [0, 25]], split["chunks"]
    assert not any(
        s.get("eos_overlaps_block")
        for c in cases
        if c["batch_size"] == 1
        for s in c["segments"]
        if c["name"] != "text2_video_4x4x4_fps2_audio_mel240_text2_2chunks_video_longer"
    )
    # t offsets follow the float32 formula of rule 4
    for c in cases:
        for r in c["rows"] if c["batch_size"] > 1 else [c]:
            for sg in r["segments"]:
                if sg["kind"] == "video":
                    f32 = np.float32
                    want = [
                        int(np.trunc(f32(f32(f) * f32(sg["seconds_per_grid"])) * f32(25)))
                        for f in range(sg["frames"])
                    ]
                    assert sg["t_offsets"] == want, (sg, want)
    # audio token counts: (mel-1)//2+1 then (x-2)//2+1
    assert [audio_tokens(model, n) for n in (37, 60, 64, 100, 160, 240, 320, 400, 500, 600)] == [
        9,
        15,
        16,
        25,
        40,
        60,
        80,
        100,
        125,
        150,
    ]
    assert [audio_tokens(model, n) for n in (1, 2, 3, 4, 5, 6, 7)] == [0, 0, 1, 1, 1, 1, 2]
    # text fallback: padded slots 1, delta 0; same values as the 3D branch would give for text+audio
    fb = by["text3_audio_mel37_text2"]
    assert fb["hf_branch"] == "text_fallback" and fb["position_ids"][0] == list(
        range(len(fb["input_ids"]))
    )
    # processor float64 chunking vs model float32 chunking can disagree (documented in the notes)
    spg = 2.0 / 2.6
    mt = (torch.arange(40) * torch.tensor([spg]).float()[0] * 25).long()
    pt = np.arange(40) * spg * 25
    assert int(mt[39]) == 750 and pt[39] < 750
    assert Qwen2_5OmniProcessor.get_chunked_index(None, pt, 50) != model.get_chunked_index(
        mt, 50, 0
    )
    # videos without second_per_grids fail
    no_spg_error = None
    try:
        row = build_stream(model, [T(1), VID(2, 2, 2, 2.0), T(1)], False)
        model.get_rope_index(
            torch.tensor([row["input_ids"]]),
            None,
            torch.tensor(row["video_grid_thw"]),
            torch.tensor([row["attention_mask"]]),
            False,
            None,
            None,
        )
    except Exception as e:  # noqa: BLE001
        no_spg_error = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    assert no_spg_error is not None

    src_file = os.path.relpath(
        omni_modeling.__file__, os.path.dirname(os.path.dirname(transformers.__file__))
    )
    return {
        "generator": GENERATOR,
        "source": "position_ids / rope_deltas: transformers.models.qwen2_5_omni.modeling_qwen2_5_omni."
        "Qwen2_5OmniThinkerModel.get_rope_index (defined on Qwen2_5OmniPreTrainedModelForConditional"
        "Generation together with get_llm_pos_ids_for_vision and get_chunked_index; "
        + src_file
        + ") "
        "called on a tiny thinker built on the meta device (only config values are read: token ids, "
        "position_id_per_seconds 25, seconds_per_chunk 2, vision spatial_merge_size 2, temporal_patch_size "
        "2 -- all Qwen2.5-Omni-7B defaults; vision_start/end_token_id 151652/151653 passed as in the "
        "checkpoint's thinker_config). Token layout of a video with audio: Qwen2_5OmniProcessor."
        "replace_video_with_audio_token (processing_qwen2_5_omni.py) called with a stub self. Audio token "
        "counts: processing_qwen2_5_omni._get_feat_extract_output_lengths (= Qwen2_5OmniAudioEncoder."
        "_get_feat_extract_output_lengths). seconds_per_grid = temporal_patch_size / fps as in "
        "Qwen2_5OmniProcessor._process_videos. Every case is also recomputed by a hand-written "
        "implementation of the rules below (ref_positions in the generator) and agrees exactly.",
        "notes": NOTES
        + [
            "A video without second_per_grids (None) makes get_rope_index fail: " + no_spg_error,
        ],
        "cases": cases,
    }


NOTES = [
    # layout of the file
    "Case layout. batch_size 1: the stream fields are at the top level: segments, token_kinds, input_ids, "
    "attention_mask, image_grid_thw, video_grid_thw, audio_seqlens, second_per_grids (the exact HF inputs), "
    "position_ids [3][N] (rows t, h, w) and rope_deltas [delta]. batch_size 2: the same per-row fields under rows[b] "
    "(each row's grids/audio lists are its own share); the flat batch inputs that were passed to HF are also at the "
    "top level. hf_branch says which branch of get_rope_index ran (3d or text_fallback). Every case also records "
    "use_audio_in_video, spatial_merge_size (2), position_id_per_seconds (25) and seconds_per_chunk (2).",
    "Segments (builder terms; the marker tokens are implicit in each non-text segment and counted in its 'span'): "
    "padding {tokens} = left padding (attention_mask 0, token_kind 'pad', id 151643); text {tokens} = ordinary text; "
    "audio {mel_frames, tokens} = <|audio_bos|> + tokens x <|AUDIO|> + <|audio_eos|>; image {frames 1, height, width, "
    "tokens} = <|vision_bos|> + tokens x <|IMAGE|> + <|vision_eos|>; video {frames, height, width, fps, "
    "seconds_per_grid, t_offsets, tokens} = <|vision_bos|> + tokens x <|VIDEO|> + <|vision_eos|>; video with audio "
    "{..., audio_mel_frames, audio_tokens, chunks} = <|vision_bos|> <|audio_bos|> then for each chunk j of chunks "
    "[[video_count, audio_count], ...]: video_count <|VIDEO|> then audio_count <|AUDIO|>, then <|audio_eos|> "
    "<|vision_eos|> (span = tokens + audio_tokens + 4). height/width/frames are the vision grid_thw before merging "
    "(tokens = frames * (height/2) * (width/2)); frames is the temporal grid (one grid step = temporal_patch_size = "
    "2 video frames). Token ids: <|vision_bos|> 151652, <|vision_eos|> 151653, <|audio_bos|> 151647, <|audio_eos|> "
    "151648, <|IMAGE|> 151655, <|VIDEO|> 151656, <|AUDIO|> 151646, pad 151643. token_kinds names every token: "
    "pad, text, vision_bos, vision_eos, audio_bos, audio_eos, image, video, audio.",
    "Audio token count (processor _get_feat_extract_output_lengths, = audio encoder's): tokens = ((mel_frames - 1) "
    "// 2 + 1 - 2) // 2 + 1, i.e. conv stride 2 then average-pool stride 2. Mel frames are 10 ms (16 kHz, hop 160), "
    "so one audio token = 40 ms = one position at 25 positions per second. E.g. 100 mel frames (1 s) -> 25 tokens, "
    "37 -> 9, 60 -> 15, 64 -> 16; 1 or 2 mel frames -> 0 tokens. get_rope_index does NOT count the <|AUDIO|> tokens "
    "in input_ids: it recomputes each audio's length from audio_seqlens (= feature_attention_mask.sum(-1), the mel "
    "lengths), consumed in order of appearance, so audio_seqlens must match the stream.",
    # the rules
    "Rule 0 (running start). get_rope_index (3D branch) appends position blocks in stream order: a text run, each "
    "single marker token, an audio's tokens, an image's or a video's token grid. Each block starts at st_idx = (max "
    "over all three rows of the PREVIOUSLY APPENDED block) + 1, or 0 for the first block (exceptions only inside a "
    "video with audio, rule 5). Text runs, markers and audio are 1D blocks: all three rows = st_idx + arange(len). "
    "Only unmasked tokens take part (see padding).",
    "Rule 1 (text). A text run continues the running line: st_idx + arange(L) on all three rows. Text after any "
    "modality starts at (position of that modality's last marker) + 1.",
    "Rule 2 (standalone audio). <|audio_bos|> at s, the M audio tokens at s+1 .. s+M on all three rows (t = h = w, "
    "plain arange: one position per 40 ms token, no scaling), <|audio_eos|> at s+M+1. So a standalone audio is "
    "indistinguishable from M+2 text tokens.",
    "Rule 3 (image). <|vision_bos|> at s (1D), then with v = s+1 the image tokens, in order t outer, h, w inner over "
    "the merged grid (frames, height/2, width/2): (v + t_off, v + h, v + w) with t_off = frame * 1 * 25 (= 0 for "
    "the usual frames = 1); <|vision_eos|> at max(block) + 1 = v + max(height/2, width/2) for a one-frame image.",
    "Rule 4 (video, use_audio_in_video false). <|vision_bos|> at s, then with v = s+1 tokens (v + t_off[f], v + h, "
    "v + w), t_off[f] = trunc(f * second_per_grid * 25) computed exactly as (torch.arange(grid_t) * "
    "second_per_grids[i].float() * 25).long(): float32 arithmetic (int64 arange * float32 scalar -> float32, * 25 "
    "in float32) then truncation toward zero. second_per_grid = temporal_patch_size / fps = 2 / fps (processor "
    "default fps 2.0 -> 1.0). Examples: 1.0 -> 0, 25, 50, 75; 0.5 -> 0, 12, 25, 37 (floor of f*12.5, NOT f*floor("
    "12.5)); 2.0 -> 0, 50, 100; 0.32 (fps 6.25) -> 0, 8, 16, 24, 32, 39 (float32: 5*0.32*25 = 39.99999 -> 39). "
    "<|vision_eos|> at max(block) + 1 = v + max(t_off[-1], height/2 - 1, width/2 - 1) + 1: text after a video "
    "resumes after its largest temporal position (the 'max + 1' rule, unlike transformers 5.24 Qwen2-VL which "
    "advances by max(h, w) only).",
    "Rule 5 (video with audio, use_audio_in_video true). <|vision_bos|> and <|audio_bos|> BOTH get position s (the "
    "same value twice). With v = s+1: video tokens V = (v + t_off[f], v + h, v + w) as in rule 4 and audio tokens "
    "A_k = (v + k, v + k, v + k), k = 0 .. audio_tokens-1, so video and audio share one time origin v and one time "
    "scale (25 positions per second; audio token k is at k*40 ms). Chunking (get_chunked_index, 50 = "
    "int(position_id_per_seconds * seconds_per_chunk) positions = 2 s per chunk): walk the tokens of V (by their t "
    "value minus v) and of A (value k) separately with a chunk counter c = 1; at token i, if value >= c*50, close the "
    "current chunk before i and c += 1 (c advances by ONE per token, see oddity below). Then for j = 0 .. max(#video "
    "chunks, #audio chunks)-1 the sequence holds video chunk j (if it exists) followed by audio chunk j (if it "
    "exists); positions are the V / A values above, unchanged (chunking only reorders tokens, it never changes a "
    "value). The processor lays out input_ids with the same chunking (replace_video_with_audio_token), so token "
    "order and positions agree. Then <|audio_eos|> and <|vision_eos|> BOTH get e = (max over the three rows of the "
    "LAST APPENDED CHUNK) + 1, and text after the video starts at e + 1.",
    "Oddity A (eos below the block). e uses only the last appended chunk, which is the last audio chunk whenever the "
    "audio has at least as many chunks as the video. If the video's frames in that last chunk go further in time "
    "than the audio (video outlasts audio within the final chunk), e <= the block's maximum t: the two eos markers "
    "and the following text reuse positions already taken by video tokens (case "
    "text2_video_4x4x4_fps2_audio_mel240_text2_2chunks_video_longer: video t up to v+75, audio ends at v+59, e = "
    "v+60). Per video-with-audio segment the fixture records block_max (max position of its interleaved tokens), "
    "eos_position and eos_overlaps_block. If the video has more chunks the last chunk is video and e = its max + 1; "
    "if the audio outlasts the video e = last audio position + 1 (normal).",
    "Oddity B (chunk counter). get_chunked_index advances its chunk counter by one per token, not to floor(value/50)"
    "+1: when the t offsets fall behind the counter's chunk after jumping over a whole chunk (possible whenever the "
    "per-frame step exceeds 50, i.e. second_per_grid > 2 s, fps < 1), the next token(s) also close chunks, giving "
    "one-token video chunks, frames split across chunks and video tokens paired with audio chunk j of an earlier "
    "time span (case text1_video_3x2x4_fps0.667_audio_mel900_text1_split_frames: video t 0, 0, 75, 75, 150, 150 -> "
    "video chunks [2, 2, 1, 1], audio chunks [50, 50, 50, 50, 25], layout [[2,50],[2,50],[1,50],[1,50],[0,25]]: "
    "frame 2 (6 s) has one token before the 4-6 s audio chunk and one before the 6-8 s one). Positions stay the "
    "rule-5 values; only the interleaving order is odd, and processor and model agree on it.",
    "Oddity C (float32 vs float64). The processor chunks video offsets in float64 (f * second_per_grid * 25, not "
    "truncated) while the model chunks the float32-truncated ints; both agree except when float rounding straddles a "
    "chunk boundary, e.g. fps 2.6 (second_per_grid 0.769..): frame 39 is 749.99999 in float64 (still before the 750 "
    "boundary) but exactly 750 in float32 (after it), so the processor's token layout and the model's interleaving "
    "of the positions would disagree and positions would land on the wrong tokens (asserted in the generator; no "
    "such case in the fixture, it needs 40 frames). A builder that wants bit-exact t offsets must use float32: "
    "t_off = trunc(fl32(fl32(f * fl32(spg)) * 25)).",
    "Oddity D (no grids). If neither image_grid_thw nor video_grid_thw is given (text and standalone audio only), "
    "get_rope_index skips all of the above and returns position_ids = attention_mask.cumsum(-1) - 1 on all three "
    "rows (padded slots 1) with delta = max + 1 - sum(mask) (= 0). This gives the same values as "
    "rules 1-2 (case text3_audio_mel37_text2, hf_branch text_fallback).",
    "Counting. The number of modality items in a row is (#<|audio_bos|>) + (#images = <|vision_bos|> followed by "
    "<|IMAGE|>) + (#videos = <|vision_bos|> followed by <|VIDEO|>, or with use_audio_in_video by <|audio_bos|>, whose "
    "audio_bos is already in the audio count). Each step takes the earliest of the next <|IMAGE|>, <|VIDEO|>, "
    "<|AUDIO|> token; the text before it is (index - 1 - st) tokens (index - 2 - st for a video with audio: two "
    "markers). use_audio_in_video applies to every video of the call: all videos must then carry audio (mixing is "
    "not supported). A video with audio is recognised by its first <|VIDEO|> token, which always precedes its first "
    "<|AUDIO|> because video chunk 0 (frame 0, t 0) is never empty.",
    "rope_deltas = max(positions of the unmasked tokens, all rows) + 1 - (number of unmasked tokens); HF returns "
    "[B, 1], stored per row as [delta]. During decoding (compute_3d_position_ids with a cache) new tokens get "
    "cache_length + arange(new) + delta on all three rows.",
    "Padding. attention_mask == 0 tokens are dropped before the rules run, so the unmasked tokens get exactly the "
    "positions of the unpadded stream and the delta counts only unmasked tokens; masked slots hold 1 (position_ids "
    "is initialised with torch.ones in both branches; Qwen2-VL in transformers 5.24 leaves 0 there).",
    "Batch. image_idx, video_idx and audio_idx are NOT reset per row: image_grid_thw, video_grid_thw, audio_seqlens "
    "and second_per_grids are flat lists consumed in order row 0 first, then row 1, ... Each row's positions equal "
    "those of the row alone (asserted).",
    "HF source relied on (transformers 5.24.0, models/qwen2_5_omni/modeling_qwen2_5_omni.py): "
    "get_llm_pos_ids_for_vision lines 160-178; get_chunked_index 180-215; get_rope_index 217-504 (torch.ones init "
    "298; st_idx = llm_pos_ids_list[-1].max() + 1 at 327 and before every block; standalone audio 341-362 with "
    "audio_len = ((audio_seqlens[i] - 1) // 2 + 1 - 2) // 2 + 1 at 352; image 364-391 with t_index arange(grid_t) * "
    "1 * position_id_per_seconds at 378; video 393-422 with t_index at 407-409; video with audio 424-480: text_len = "
    "min_ed - st - 2 at 425, two bos at the same st_idx 430-433, t_index 442-444, t_ntoken_per_chunk = "
    "int(position_id_per_seconds * seconds_per_chunk) 449, chunk interleaving 450-467, two eos at the last chunk's "
    "max + 1 470-473; trailing text 482-485; delta 493; text fallback 497-504); Qwen2_5OmniAudioEncoder."
    "_get_feat_extract_output_lengths 909-915; Qwen2_5OmniThinkerModel.compute_3d_position_ids 1803-1845 and "
    "forward 1928-1931 (audio_feature_lengths = feature_attention_mask.sum(1)). processing_qwen2_5_omni.py: "
    "_get_feat_extract_output_lengths 112-117; _process_videos 222-226 (fps default 2.0, video_second_per_grid = "
    "temporal_patch_size / fps); replace_video_with_audio_token 270-304; get_chunked_index 306-337.",
    "mrope rotation: as Qwen2-VL (see mrope.json); Qwen2.5-Omni-7B uses mrope_section [16, 24, 24] for head_dim 128. "
    "Not part of this file.",
]


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    write_json("tmrope.json", gen_tmrope())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Multimodal stream positions: transformers' Qwen2-VL get_rope_index over posenc's stream builder.

    position_ids, deltas = posenc.get_rope_index(input_ids, mm_token_type_ids,
                                                 image_grid_thw, video_grid_thw, attention_mask)

Each run of equal token types (0 text, 1 image, 2 video) is one segment: text runs get (s, s, s),
an image or video run the next grid's (t, h, w) + start (h and w after spatial merging); text after
a vision run resumes at start + max(h, w) as transformers 5.24's Qwen2VLModel.get_rope_index does
(resume="transformers4": at (max so far) + 1, Qwen's original code). Padding (attention_mask 0)
gets 0. deltas = max + 1 - real tokens, per row: the next generated token sits at
cache_length + delta. The operator is torch.ops.posenc.qwen2_vl_rope_index (posenc/core/stream.h
states the rules).

    position_ids, deltas = posenc.get_rope_index_omni(input_ids, image_grid_thw, video_grid_thw,
                                                      attention_mask, use_audio_in_video,
                                                      audio_seqlens, second_per_grids)

Qwen2.5-Omni's TMRoPE, in transformers' own argument order (Qwen2_5OmniThinkerModel.get_rope_index);
the operator is torch.ops.posenc.qwen2_5_omni_rope_index.
"""

from __future__ import annotations

import torch

__all__ = ["get_rope_index", "get_rope_index_omni"]


def get_rope_index(
    input_ids: torch.Tensor,
    mm_token_type_ids: torch.Tensor | None = None,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    *,
    second_per_grid_ts: torch.Tensor | None = None,
    spatial_merge_size: int = 2,
    tokens_per_second: float = 2.0,
    image_token_id: int | None = None,
    video_token_id: int | None = None,
    resume: str = "transformers5",
    model: str = "qwen2_vl",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_ids [3, B, L] int64, deltas [B, 1]) as transformers' Qwen2-VL get_rope_index.

    mm_token_type_ids: 0 text, 1 image, 2 video per token (transformers 5); without it, derived
    from input_ids with image_token_id / video_token_id (transformers 4's way). second_per_grid_ts
    (Qwen2.5-VL) puts seconds * tokens_per_second on the t axis of each video; model="qwen2_5_vl"
    without it takes 1 second per grid step, as transformers' Qwen2_5_VLModel does (Qwen2-VL:
    one position per grid step).
    """
    if model not in ("qwen2_vl", "qwen2_5_vl"):
        raise ValueError(
            f"posenc.get_rope_index: model must be 'qwen2_vl' or 'qwen2_5_vl', got {model!r}"
        )
    if model == "qwen2_5_vl" and second_per_grid_ts is None and video_grid_thw is not None:
        second_per_grid_ts = torch.ones(len(video_grid_thw), dtype=torch.float32)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(
            f"posenc.get_rope_index: input_ids must be a [batch, length] tensor, got "
            f"{getattr(input_ids, 'shape', type(input_ids).__name__)}"
        )
    if resume not in ("transformers5", "transformers4"):
        raise ValueError(
            f"posenc.get_rope_index: resume must be 'transformers5' or "
            f"'transformers4', got {resume!r}"
        )
    if mm_token_type_ids is None:
        if image_token_id is None and video_token_id is None:
            raise ValueError(
                "posenc.get_rope_index: give mm_token_type_ids, or image_token_id / "
                "video_token_id to find the vision tokens in input_ids"
            )
        mm_token_type_ids = torch.zeros_like(input_ids)
        if image_token_id is not None:
            mm_token_type_ids = mm_token_type_ids.masked_fill(input_ids == image_token_id, 1)
        if video_token_id is not None:
            mm_token_type_ids = mm_token_type_ids.masked_fill(input_ids == video_token_id, 2)
    if mm_token_type_ids.shape != input_ids.shape:
        raise ValueError(
            f"posenc.get_rope_index: mm_token_type_ids must be {tuple(input_ids.shape)}"
            f", got {tuple(mm_token_type_ids.shape)}"
        )
    empty = input_ids.new_empty(0)
    position_ids, deltas = torch.ops.posenc.qwen2_vl_rope_index(
        mm_token_type_ids,
        empty if attention_mask is None else attention_mask,
        empty if image_grid_thw is None else image_grid_thw,
        empty if video_grid_thw is None else video_grid_thw,
        empty.double() if second_per_grid_ts is None else torch.as_tensor(second_per_grid_ts),
        int(spatial_merge_size),
        float(tokens_per_second),
        resume == "transformers5",
    )
    return position_ids.to(input_ids.dtype), deltas


def get_rope_index_omni(
    input_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    use_audio_in_video: bool = False,
    audio_seqlens: torch.Tensor | None = None,
    second_per_grids: torch.Tensor | None = None,
    *,
    image_token_id: int = 151655,
    video_token_id: int = 151656,
    audio_token_id: int = 151646,
    spatial_merge_size: int = 2,
    position_id_per_seconds: float = 25,
    seconds_per_chunk: float = 2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_ids [3, B, L], deltas [B, 1] int64) as transformers' Qwen2.5-Omni get_rope_index.

    The arguments are transformers' (Qwen2_5OmniThinkerModel.get_rope_index), in its order; the
    keywords are Qwen2.5-Omni-7B's config values. input_ids as the processor lays them out:
    <|vision_bos|> image/video tokens <|vision_eos|>, <|audio_bos|> audio tokens <|audio_eos|>,
    and with use_audio_in_video=True every video as <|vision_bos|> <|audio_bos|>, its video and
    audio tokens interleaved in 2 s chunks, <|audio_eos|> <|vision_eos|>. Grids, audio_seqlens
    (mel frames per audio) and second_per_grids (seconds per temporal grid step, one per video)
    are consumed in order across the batch. Padding (attention_mask 0) holds 1. With a grid:
    positions in input_ids.dtype, deltas = max + 1 - real tokens per row. Without
    image_grid_thw and video_grid_thw (None or empty): transformers' text branch, int64
    positions cumsum(mask) - 1 and deltas = (max over the row, padding's 1 included) + 1 - real
    tokens, as transformers computes them (1, not 0, for a one-token padded row); without
    attention_mask, every token is real (transformers fails there).

    One line (RuntimeError) where transformers would fail or silently mis-place positions: an
    item whose tokens do not match its grid's t*h*w/merge^2 (or its audio's token count from
    audio_seqlens), missing end markers, too few grids or audio_seqlens, a video without
    second_per_grids, an audio of fewer than 3 mel frames, a video without audio tokens while
    use_audio_in_video is set (transformers gives it text positions), audio tokens inside a
    video without it, image/video tokens without grids, a row with no real token when grids are
    given (transformers fails on it).
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(
            f"posenc.get_rope_index_omni: input_ids must be a [batch, length] "
            f"tensor, got {getattr(input_ids, 'shape', type(input_ids).__name__)}"
        )
    ids = {
        "image_token_id": image_token_id,
        "video_token_id": video_token_id,
        "audio_token_id": audio_token_id,
    }
    if len(set(ids.values())) != 3:
        raise ValueError(f"posenc.get_rope_index_omni: the token ids must differ, got {ids}")
    token_types = torch.zeros_like(input_ids, dtype=torch.long)
    token_types.masked_fill_(input_ids == image_token_id, 1)
    token_types.masked_fill_(input_ids == video_token_id, 2)
    token_types.masked_fill_(input_ids == audio_token_id, 3)
    empty = input_ids.new_empty(0, dtype=torch.long)
    no_grids = (image_grid_thw is None or image_grid_thw.numel() == 0) and (
        video_grid_thw is None or video_grid_thw.numel() == 0
    )
    position_ids, deltas = torch.ops.posenc.qwen2_5_omni_rope_index(
        token_types,
        empty if attention_mask is None else attention_mask,
        empty if image_grid_thw is None else image_grid_thw,
        empty if video_grid_thw is None else video_grid_thw,
        empty if audio_seqlens is None else torch.as_tensor(audio_seqlens),
        empty.double() if second_per_grids is None else torch.as_tensor(second_per_grids),
        bool(use_audio_in_video),
        int(spatial_merge_size),
        float(position_id_per_seconds),
        float(seconds_per_chunk),
    )
    return (position_ids if no_grids else position_ids.to(input_ids.dtype)), deltas

"""posenc.get_rope_index against transformers 5.24's own Qwen2VLModel.get_rope_index, called here
on the same token types and grids (images, videos, text between, left and right padding, several
rows drawing on one grid list), and against Qwen's transformers-4 rule where the two differ."""

import types

import pytest
import torch

import posenc

transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel  # noqa: E402


def _hf(token_types, image_grid_thw, video_grid_thw, attention_mask, merge=2):
    fake = types.SimpleNamespace(
        config=types.SimpleNamespace(vision_config=types.SimpleNamespace(spatial_merge_size=merge))
    )
    fake.get_vision_position_ids = lambda *a, **k: Qwen2VLModel.get_vision_position_ids(
        fake, *a, **k
    )
    input_ids = torch.zeros_like(token_types)
    return Qwen2VLModel.get_rope_index(
        fake, input_ids, token_types, image_grid_thw, video_grid_thw, attention_mask
    )


def _row(*parts):
    """parts: ("t", n) text, ("i", t, h, w) image, ("v", t, h, w) video, ("p", n) padding."""
    types_, mask, images, videos = [], [], [], []
    for p in parts:
        if p[0] in ("t", "p"):
            types_ += [0] * p[1]
            mask += [0 if p[0] == "p" else 1] * p[1]
        else:
            n = p[1] * (p[2] // 2) * (p[3] // 2)
            types_ += [1 if p[0] == "i" else 2] * n
            mask += [1] * n
            (images if p[0] == "i" else videos).append(list(p[1:]))
    return types_, mask, images, videos


CASES = {
    "image": [[("t", 3), ("i", 1, 4, 6), ("t", 5)]],
    "video": [[("t", 2), ("v", 3, 4, 4), ("t", 4)]],
    "long_video": [[("v", 9, 2, 4), ("t", 3), ("i", 1, 6, 2)]],
    "left_padding": [
        [("p", 4), ("t", 2), ("i", 1, 2, 2), ("t", 2)],
        [("t", 1), ("i", 1, 4, 4), ("t", 2), ("v", 2, 2, 2)],
    ],
    "right_padding": [[("t", 4), ("i", 1, 2, 4), ("p", 5)], [("t", 2), ("i", 1, 4, 2), ("t", 7)]],
    "text_only": [[("t", 7)]],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_get_rope_index_is_transformers(name):
    rows = [_row(*r) for r in CASES[name]]
    length = max(len(r[0]) for r in rows)
    assert all(len(r[0]) == length for r in rows), "test rows must have one length"
    token_types = torch.tensor([r[0] for r in rows])
    mask = torch.tensor([r[1] for r in rows])
    images = [g for r in rows for g in r[2]]
    videos = [g for r in rows for g in r[3]]
    image_grid_thw = torch.tensor(images) if images else None
    video_grid_thw = torch.tensor(videos) if videos else None
    want_pos, want_delta = _hf(token_types, image_grid_thw, video_grid_thw, mask)
    pos, delta = posenc.get_rope_index(
        torch.zeros_like(token_types), token_types, image_grid_thw, video_grid_thw, mask
    )
    assert torch.equal(pos, want_pos)
    assert torch.equal(delta.view(-1), want_delta.view(-1).to(delta.dtype))


def test_transformers4_rule_resumes_after_the_longest_axis():
    # a 9-frame video of 1 x 2 patches: transformers 5 resumes at start + max(h, w) = 0 + 2,
    # transformers 4 (Qwen's code) at max + 1 = 9
    token_types = torch.tensor([[2] * 18 + [0, 0]])
    grid = torch.tensor([[9, 2, 4]])
    p5, _ = posenc.get_rope_index(torch.zeros_like(token_types), token_types, None, grid)
    p4, d4 = posenc.get_rope_index(
        torch.zeros_like(token_types), token_types, None, grid, resume="transformers4"
    )
    assert p5[0, 0, 18].item() == 2 and p4[0, 0, 18].item() == 9
    assert d4.item() == 10 + 1 - 20


def test_token_ids_without_type_ids_and_bad_input():
    ids = torch.tensor([[5, 7, 9, 9, 9, 9, 8]])
    pos, _ = posenc.get_rope_index(ids, None, torch.tensor([[1, 4, 4]]), image_token_id=9)
    assert pos[:, 0, 2:6].tolist() == [[2, 2, 2, 2], [2, 2, 3, 3], [2, 3, 2, 3]]
    with pytest.raises(RuntimeError, match=r"makes 16"):
        posenc.get_rope_index(ids, None, torch.tensor([[1, 4, 2]]) * 2, image_token_id=9)
    with pytest.raises(RuntimeError, match=r"more image runs"):
        posenc.get_rope_index(ids, None, None, image_token_id=9)
    with pytest.raises(ValueError, match=r"mm_token_type_ids, or image_token_id"):
        posenc.get_rope_index(ids)


@pytest.mark.parametrize("seconds", [None, [0.08], [2 / 29.97], [1.0]])
def test_qwen2_5_vl_time_axis_is_transformers(seconds):
    # 25 fps: 0.08 s per grid step, 2 tokens per second: HF's float32 arithmetic puts grid step 25
    # at 4 (exact arithmetic: 3.999.. -> 3)
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    fake = types.SimpleNamespace(
        config=types.SimpleNamespace(
            vision_config=types.SimpleNamespace(spatial_merge_size=2, tokens_per_second=2)
        )
    )
    fake.get_vision_position_ids = lambda *a, **k: Qwen2_5_VLModel.get_vision_position_ids(
        fake, *a, **k
    )
    frames = 60
    token_types = torch.tensor([[0] * 3 + [2] * (frames * 2) + [0] * 4])
    grid = torch.tensor([[frames, 2, 4]])
    spg = None if seconds is None else torch.tensor(seconds, dtype=torch.float32)
    want_pos, want_delta = Qwen2_5_VLModel.get_rope_index(
        fake, torch.zeros_like(token_types), token_types, None, grid, spg, None
    )
    pos, delta = posenc.get_rope_index(
        torch.zeros_like(token_types),
        token_types,
        None,
        grid,
        second_per_grid_ts=spg,
        tokens_per_second=2,
        model="qwen2_5_vl",
    )
    assert torch.equal(pos, want_pos)
    assert torch.equal(delta.view(-1), want_delta.view(-1).to(delta.dtype))


@pytest.mark.parametrize("seconds", [1e30, float("inf"), float("nan"), -0.5])
def test_qwen2_5_vl_seconds_out_of_reach_are_one_line(seconds):
    # transformers' .long() turns a float past int64 into int64's minimum without a word: refused
    token_types = torch.tensor([[0] * 3 + [2] * 8 + [0] * 4])
    with pytest.raises(
        RuntimeError, match=r"second_per_grid_ts\[0\] must be finite|past the position limit"
    ):
        posenc.get_rope_index(
            torch.zeros_like(token_types),
            token_types,
            None,
            torch.tensor([[4, 2, 4]]),
            second_per_grid_ts=torch.tensor([seconds]),
            tokens_per_second=2,
            model="qwen2_5_vl",
        )


# ---- Qwen2.5-Omni: posenc.get_rope_index_omni against transformers' own get_rope_index ----------

_OMNI = dict(
    pad=151643,
    vbos=151652,
    veos=151653,
    abos=151647,
    aeos=151648,
    image=151655,
    video=151656,
    audio=151646,
)


def _omni_self():
    """transformers' Qwen2_5OmniThinkerModel.get_rope_index reads only config values and two
    helper methods of its self: a namespace with the default thinker config (plus the
    checkpoint's vision_start_token_id, which 5.24's config class lacks) serves as self."""
    from transformers import Qwen2_5OmniThinkerConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniPreTrainedModelForConditionalGeneration as base,
    )

    config = Qwen2_5OmniThinkerConfig(vision_start_token_id=_OMNI["vbos"])
    fake = types.SimpleNamespace(
        config=config, spatial_merge_size=config.vision_config.spatial_merge_size
    )
    fake.get_llm_pos_ids_for_vision = lambda *a: base.get_llm_pos_ids_for_vision(fake, *a)
    fake.get_chunked_index = lambda *a: base.get_chunked_index(fake, *a)
    return fake, base.get_rope_index


def _audio_tokens(mel):  # transformers' _get_feat_extract_output_lengths
    return ((mel - 1) // 2 + 1 - 2) // 2 + 1


def _chunks(values, per):  # transformers' get_chunked_index (the processor's layout)
    out, start, chunk = [], 0, 1
    for i, v in enumerate(values):
        if v >= chunk * per:
            out.append((start, i))
            start, chunk = i, chunk + 1
    return out + [(start, len(values))]


def _omni_row(*segs):
    """Qwen2_5OmniProcessor's layout. segs: ("t", n) text, ("p", n) padding, ("a", mel) audio,
    ("i", t, h, w) image, ("v", t, h, w, spg) video, ("va", t, h, w, spg, mel) video with audio.
    Returns ids, mask, images, videos, second_per_grids, audio mel lengths."""
    ids, mask, images, videos, spgs, mels = [], [], [], [], [], []
    for s in segs:
        if s[0] in ("t", "p"):
            ids += [_OMNI["pad"]] * s[1] if s[0] == "p" else [100 + q for q in range(s[1])]
            mask += [0 if s[0] == "p" else 1] * s[1]
            continue
        if s[0] == "a":
            body = [_OMNI["abos"]] + [_OMNI["audio"]] * _audio_tokens(s[1]) + [_OMNI["aeos"]]
            mels.append(s[1])
        elif s[0] == "i":
            body = [_OMNI["vbos"]] + [_OMNI["image"]] * (s[1] * (s[2] // 2) * (s[3] // 2))
            body += [_OMNI["veos"]]
            images.append(list(s[1:4]))
        else:
            t, h, w, spg = s[1:5]
            videos.append([t, h, w])
            spgs.append(spg)
            per_frame = (h // 2) * (w // 2)
            if s[0] == "v":
                body = [_OMNI["vbos"]] + [_OMNI["video"]] * (t * per_frame) + [_OMNI["veos"]]
            else:
                mels.append(s[5])
                na = _audio_tokens(s[5])
                offsets = (torch.arange(t) * torch.tensor(spg, dtype=torch.float32) * 25).long()
                vt = [o for o in offsets.tolist() for _ in range(per_frame)]
                vc, ac = _chunks(vt, 50), _chunks(list(range(na)), 50)
                body = [_OMNI["vbos"], _OMNI["abos"]]
                for j in range(max(len(vc), len(ac))):
                    if j < len(vc):
                        body += [_OMNI["video"]] * (vc[j][1] - vc[j][0])
                    if j < len(ac):
                        body += [_OMNI["audio"]] * (ac[j][1] - ac[j][0])
                body += [_OMNI["aeos"], _OMNI["veos"]]
        ids += body
        mask += [1] * len(body)
    return ids, mask, images, videos, spgs, mels


def _omni_batch(rows, left=True, dtype=torch.long):
    """(input_ids, image_grid_thw, video_grid_thw, attention_mask, audio_seqlens,
    second_per_grids): rows padded to one length, the lists flat in row order."""
    n = max(len(r[0]) for r in rows)
    ids, mask = [], []
    for r in rows:
        pad = n - len(r[0])
        ids.append([_OMNI["pad"]] * pad + r[0] if left else r[0] + [_OMNI["pad"]] * pad)
        mask.append([0] * pad + r[1] if left else r[1] + [0] * pad)
    flat = [[x for r in rows for x in r[k]] for k in range(2, 6)]
    images, videos, spgs, mels = flat
    return (
        torch.tensor(ids, dtype=dtype),
        torch.tensor(images) if images else None,
        torch.tensor(videos) if videos else None,
        torch.tensor(mask),
        torch.tensor(mels) if mels else None,
        torch.tensor(spgs, dtype=torch.float32) if spgs else None,
    )


def _omni_check(rows, use_audio_in_video=False, left=True, dtype=torch.long):
    ids, images, videos, mask, mels, spgs = _omni_batch(rows, left, dtype)
    fake, hf = _omni_self()
    want_pos, want_delta = hf(fake, ids, images, videos, mask, use_audio_in_video, mels, spgs)
    pos, delta = posenc.get_rope_index_omni(
        ids, images, videos, mask, use_audio_in_video, mels, spgs
    )
    assert pos.dtype == want_pos.dtype and delta.dtype == want_delta.dtype
    assert torch.equal(pos, want_pos), (pos, want_pos)
    assert torch.equal(delta, want_delta), (delta, want_delta)
    return pos, delta


OMNI_CASES = {
    "text_image": ([[("t", 3), ("i", 1, 4, 6), ("t", 2)]], False, True),
    "text_video_spg_0.5": ([[("t", 2), ("v", 3, 4, 4, 0.5), ("t", 2)]], False, True),
    "text_audio_image": ([[("t", 2), ("a", 37), ("t", 1), ("i", 1, 2, 2), ("t", 1)]], False, True),
    "audio_only_fallback": ([[("t", 2), ("a", 37), ("t", 1)]], False, True),
    "fallback_padded_delta": ([[("t", 1)], [("t", 4)]], False, True),
    "video_with_audio_eos_below_block": (
        [[("t", 2), ("va", 4, 2, 4, 1.0, 240), ("t", 2)]],
        True,
        True,
    ),
    "video_with_audio_split_frames": (
        [
            [("t", 1), ("va", 3, 2, 4, 3.0, 900), ("t", 1)],
            [("t", 3), ("a", 50), ("va", 3, 4, 2, 0.5, 100)],
        ],
        True,
        True,
    ),
    "left_padding": (
        [
            [("t", 2), ("i", 1, 2, 2), ("t", 1)],
            [("t", 1), ("v", 2, 2, 2, 1.0), ("t", 2), ("a", 20), ("i", 1, 4, 2)],
        ],
        False,
        True,
    ),
    "right_padding": (
        [[("t", 4), ("i", 1, 2, 4)], [("t", 2), ("i", 1, 4, 2), ("t", 7)]],
        False,
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(OMNI_CASES))
def test_get_rope_index_omni_is_transformers(name):
    segs, use_audio_in_video, left = OMNI_CASES[name]
    pos, delta = _omni_check([_omni_row(*r) for r in segs], use_audio_in_video, left)
    if name == "fallback_padded_delta":  # transformers' text branch counts padding's 1 in the max
        assert delta.view(-1).tolist() == [1, 0] and pos.dtype == torch.int64
    if name == "video_with_audio_eos_below_block":
        # video t reaches v + 75, its audio ends at v + 59: both eos markers at v + 60 (v = 3)
        assert pos[0, 0].max().item() == 78 and pos[0, 0, -4:].tolist() == [63, 63, 64, 65]


def test_get_rope_index_omni_keeps_the_ids_dtype_and_transformers_defaults():
    # int32 ids: positions in int32 (transformers' index_put fails with a mask there, not without)
    ids, grid = _omni_batch([_omni_row(("t", 2), ("i", 1, 2, 4), ("t", 1))], dtype=torch.int32)[:2]
    fake, hf = _omni_self()
    want, want_delta = hf(fake, ids, grid, None, None, False, None, None)
    pos, delta = posenc.get_rope_index_omni(ids, grid)
    assert pos.dtype == want.dtype == torch.int32 and torch.equal(pos, want)
    assert torch.equal(delta, want_delta)
    import inspect

    defaults = inspect.signature(posenc.get_rope_index_omni).parameters
    for key in (
        "image_token_id",
        "video_token_id",
        "audio_token_id",
        "position_id_per_seconds",
        "seconds_per_chunk",
    ):
        assert defaults[key].default == getattr(fake.config, key), key
    assert defaults["spatial_merge_size"].default == fake.spatial_merge_size


def test_get_rope_index_omni_random_batches_are_transformers():
    import random

    rng = random.Random(0)
    spgs = [1.0, 0.5, 2 / 6.25, 2 / 0.667, 2 / 2.6, 2 / 29.97, 3.0]
    for trial in range(100):
        use_audio_in_video = rng.random() < 0.4
        rows, described = [], []
        for _ in range(rng.randint(1, 3)):
            segs = [("t", rng.randint(1, 3))]
            for _ in range(rng.randint(0, 4)):
                kind = rng.choice("ivat")
                h, w, spg = 2 * rng.randint(1, 3), 2 * rng.randint(1, 3), rng.choice(spgs)
                if kind == "i":
                    segs.append(("i", 1, h, w))
                elif kind == "a":
                    segs.append(("a", rng.randint(3, 400)))
                elif kind == "t":
                    segs.append(("t", rng.randint(1, 3)))
                elif use_audio_in_video:
                    segs.append(("va", rng.randint(1, 6), h, w, spg, rng.randint(3, 600)))
                else:
                    segs.append(("v", rng.randint(1, 6), h, w, spg))
                if rng.random() < 0.6:
                    segs.append(("t", rng.randint(1, 2)))
            rows.append(_omni_row(*segs))
            described.append(segs)
        try:
            _omni_check(rows, use_audio_in_video, left=rng.random() < 0.5)
        except AssertionError as e:
            raise AssertionError(
                f"trial {trial}: rows {described}, use_audio_in_video {use_audio_in_video}"
            ) from e


def test_get_rope_index_omni_without_mask_is_all_real():
    ids, images, videos, _, mels, spgs = _omni_batch([_omni_row(("t", 2), ("a", 37), ("t", 1))])
    fake, hf = _omni_self()
    want, want_delta = hf(fake, ids, None, None, torch.ones_like(ids), False, mels, None)
    pos, delta = posenc.get_rope_index_omni(ids, audio_seqlens=mels)
    assert torch.equal(pos, want) and torch.equal(delta, want_delta)
    image = _omni_batch([_omni_row(("t", 2), ("i", 1, 2, 4), ("t", 1))])
    want, want_delta = hf(fake, image[0], image[1], None, None, False, None, None)
    pos, delta = posenc.get_rope_index_omni(image[0], image[1])
    assert torch.equal(pos, want) and torch.equal(delta, want_delta)


def _omni_call(segs, use_audio_in_video=False, **change):
    args = dict(
        zip(
            (
                "input_ids",
                "image_grid_thw",
                "video_grid_thw",
                "attention_mask",
                "audio_seqlens",
                "second_per_grids",
            ),
            _omni_batch([_omni_row(*segs)]),
        )
    )
    args.update(change)
    return posenc.get_rope_index_omni(use_audio_in_video=use_audio_in_video, **args)


def test_get_rope_index_omni_refuses_in_one_line():
    image = [("t", 2), ("i", 1, 2, 4), ("t", 1)]
    with pytest.raises(
        RuntimeError,
        match=r"a run of 2 image tokens at column 3, but "
        r"image_grid_thw\[0\] makes 4",
    ):
        _omni_call(image, image_grid_thw=torch.tensor([[1, 4, 4]]))
    with pytest.raises(
        RuntimeError,
        match=r"has an image at column 7 but image_grid_thw has only "
        r"0 rows",
    ):
        _omni_call([("t", 1), ("v", 1, 2, 2, 1.0)] + image, image_grid_thw=None)
    with pytest.raises(RuntimeError, match=r"image token at column 3 but image_grid_thw is empty"):
        _omni_call(image, image_grid_thw=None)
    with pytest.raises(RuntimeError, match=r"is not followed by its 1 end marker \(the row ends"):
        ids, grid = _omni_batch([_omni_row(*image)])[:2]
        posenc.get_rope_index_omni(ids[:, :-2], grid)
    audio = [("t", 1), ("a", 37), ("i", 1, 2, 2)]
    with pytest.raises(RuntimeError, match=r"audio at column 2 but audio_seqlens has 0 values"):
        _omni_call(audio, audio_seqlens=None)
    with pytest.raises(
        RuntimeError,
        match=r"a run of 9 audio tokens at column 2, but "
        r"audio_seqlens \(mel frames\)\[0\] makes 25",
    ):
        _omni_call(audio, audio_seqlens=torch.tensor([100]))
    video = [("t", 1), ("v", 2, 2, 2, 1.0), ("t", 1)]
    with pytest.raises(RuntimeError, match=r"video at column 2 but no second_per_grids"):
        _omni_call(video, second_per_grids=None)
    with pytest.raises(RuntimeError, match=r"has no audio tokens, but use_audio_in_video is set"):
        _omni_call(video, use_audio_in_video=True, audio_seqlens=torch.tensor([100]))
    with_audio = [("t", 1), ("va", 2, 2, 2, 1.0, 100), ("t", 1)]
    with pytest.raises(
        RuntimeError,
        match=r"holds audio tokens; a video with its audio needs "
        r"use_audio_in_video=True",
    ):
        _omni_call(with_audio)
    with pytest.raises(RuntimeError, match=r"audio_seqlens\[0\] = 2 mel frames make 0 audio"):
        _omni_call(with_audio, True, audio_seqlens=torch.tensor([2]))
    with pytest.raises(
        RuntimeError,
        match=r"holds 2 video and 25 audio tokens, but video_grid_"
        r"thw\[0\] makes 2 and audio_seqlens\[0\] 24",
    ):
        _omni_call(with_audio, True, audio_seqlens=torch.tensor([96]))
    with pytest.raises(RuntimeError, match=r"row 0 has no real token \(attention_mask all 0\)"):
        ids, grid, _, mask = _omni_batch([_omni_row(*image)])[:4]
        posenc.get_rope_index_omni(ids, grid, None, torch.zeros_like(mask))
    with pytest.raises(RuntimeError, match=r"image_grid_thw must be \[n, 3\]"):
        _omni_call(image, image_grid_thw=torch.tensor([[2, 4]]))
    with pytest.raises(RuntimeError, match=r"second_per_grids has 2 values for 1 videos"):
        _omni_call(video, second_per_grids=torch.tensor([1.0, 1.0]))
    with pytest.raises(ValueError, match=r"input_ids must be a \[batch, length\] tensor"):
        posenc.get_rope_index_omni(torch.tensor([1, 2, 3]))

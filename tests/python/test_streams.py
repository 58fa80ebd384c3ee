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
        config=types.SimpleNamespace(vision_config=types.SimpleNamespace(spatial_merge_size=merge)))
    fake.get_vision_position_ids = lambda *a, **k: Qwen2VLModel.get_vision_position_ids(fake, *a, **k)
    input_ids = torch.zeros_like(token_types)
    return Qwen2VLModel.get_rope_index(fake, input_ids, token_types, image_grid_thw,
                                       video_grid_thw, attention_mask)


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
    "left_padding": [[("p", 4), ("t", 2), ("i", 1, 2, 2), ("t", 2)],
                     [("t", 1), ("i", 1, 4, 4), ("t", 2), ("v", 2, 2, 2)]],
    "right_padding": [[("t", 4), ("i", 1, 2, 4), ("p", 5)],
                      [("t", 2), ("i", 1, 4, 2), ("t", 7)]],
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
    pos, delta = posenc.get_rope_index(torch.zeros_like(token_types), token_types, image_grid_thw,
                                       video_grid_thw, mask)
    assert torch.equal(pos, want_pos)
    assert torch.equal(delta.view(-1), want_delta.view(-1).to(delta.dtype))


def test_transformers4_rule_resumes_after_the_longest_axis():
    # a 9-frame video of 1 x 2 patches: transformers 5 resumes at start + max(h, w) = 0 + 2,
    # transformers 4 (Qwen's code) at max + 1 = 9
    token_types = torch.tensor([[2] * 18 + [0, 0]])
    grid = torch.tensor([[9, 2, 4]])
    p5, _ = posenc.get_rope_index(torch.zeros_like(token_types), token_types, None, grid)
    p4, d4 = posenc.get_rope_index(torch.zeros_like(token_types), token_types, None, grid,
                                   resume="transformers4")
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
    fake = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=types.SimpleNamespace(
        spatial_merge_size=2, tokens_per_second=2)))
    fake.get_vision_position_ids = lambda *a, **k: Qwen2_5_VLModel.get_vision_position_ids(
        fake, *a, **k)
    frames = 60
    token_types = torch.tensor([[0] * 3 + [2] * (frames * 2) + [0] * 4])
    grid = torch.tensor([[frames, 2, 4]])
    spg = None if seconds is None else torch.tensor(seconds, dtype=torch.float32)
    want_pos, want_delta = Qwen2_5_VLModel.get_rope_index(
        fake, torch.zeros_like(token_types), token_types, None, grid, spg, None)
    pos, delta = posenc.get_rope_index(torch.zeros_like(token_types), token_types, None, grid,
                                       second_per_grid_ts=spg, tokens_per_second=2,
                                       model="qwen2_5_vl")
    assert torch.equal(pos, want_pos)
    assert torch.equal(delta.view(-1), want_delta.view(-1).to(delta.dtype))

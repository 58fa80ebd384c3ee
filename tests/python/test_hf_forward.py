"""Every committed architecture's rotary class, *called* (its forward, not its attributes), against
posenc's tables.

test_hf_perturbed compares posenc with a rotary class's inv_freq and attention_scaling attributes;
a class whose forward computes something else (PhiMoE's: short_factor at every length, cos/sin
scaled by short_mscale / long_mscale, not the attention_scaling it reports) is only seen by
calling it. Here each committed config.json is given a block of each scaling type (as it is,
linear, dynamic, yarn, llama3, longrope with PhiMoE's mscales, yarn with every key, linear with
a partial factor, DeepSeek-style and Llama-3.1-style legacy blocks), its class is built by
transformers and called on positions 0..L-1 within and past the context (L 32, 200, 300, 5000
with max_position_embeddings 256: dynamic grows, longrope switches), and its cos must equal
posenc.hf_rope(config, layer_type, seq_len=L)'s frequencies and scaling laid out as the class
lays them (cat(t, t), interleaved, or per pair) - or posenc refuses the file.
"""

import copy
import inspect
import json
import os

import pytest
import torch

import posenc
import test_hf_perturbed as perturbed
from conftest import FIXTURES

transformers = pytest.importorskip("transformers")
from transformers import CONFIG_MAPPING  # noqa: E402

ARCH = os.path.join(FIXTURES, "hf_architectures")
LENGTHS = (32, 200, 300, 5000)
CONTEXT = 256


def _blocks(pairs):
    block = perturbed._v5_block
    return {
        "as_is": None,
        "linear": block({"rope_type": "linear", "factor": 3.0}),
        "dynamic": block({"rope_type": "dynamic", "factor": 2.0}),
        "yarn": block({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
        "llama3": block(
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ),
        "longrope": block(
            {
                "rope_type": "longrope",
                "original_max_position_embeddings": 64,
                "short_factor": [1.0 + 0.01 * i for i in range(pairs)],
                "long_factor": [1.0 + 0.5 * i for i in range(pairs)],
                "short_mscale": 1.1,
                "long_mscale": 1.1,
            }
        ),
        "yarn_every_key": block(
            {
                "rope_type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 64,
                "attention_factor": 0.9,
                "beta_fast": 16.0,
                "beta_slow": 2.0,
                "mscale": 0.707,
                "mscale_all_dim": 1.0,
                "truncate": False,
            }
        ),
        "linear_partial": block(
            {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.25}
        ),
        "legacy_yarn_mscale": perturbed.CHANGES["legacy_yarn_mscale"],
        "legacy_llama3": perturbed.CHANGES["legacy_llama3"],
    }


CASES = list(perturbed._rows())


@pytest.mark.parametrize(
    "model_type,table,rows", CASES, ids=[f"{mt}-{t['class']}" for mt, t, _ in CASES]
)
def test_rotary_forward_equals_posenc_or_is_refused(model_type, table, rows):
    cls = perturbed._rotary_class(model_type, table)
    if cls is None:
        pytest.skip(f"{table['class']} not importable")
    if any(isinstance(p, list) for r in rows for p in r.get("positions", [])):
        # a 2D/3D tower (Pixtral's forward reads flat patch ids as (row, column)): called on grid
        # positions against posenc by test_hf_towers.py and test_hf_parity.py, not on 0..L-1
        pytest.skip(f"{table['class']} is a vision tower: checked at grid positions")
    path = table.get("config_path", "")
    differs, called = [], 0
    for name, change in _blocks(len(rows[0]["inv_freq"])).items():
        with open(os.path.join(ARCH, model_type + ".config.json")) as f:
            config = json.load(f)
        node = config["text_config"] if path == "text_config" else config
        node["max_position_embeddings"] = CONTEXT
        if change is not None:
            change(node)
        try:
            loaded = CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(config))
            with torch.device("cpu"):
                emb = cls(config=getattr(loaded, path) if path else loaded)
        except Exception:
            continue  # transformers has no table: test_hf_perturbed asserts posenc refuses
        takes_layer_type = "layer_type" in inspect.signature(emb.forward).parameters
        for row in rows:
            layer_type = row.get("layer_type")
            for length in LENGTHS:
                positions = torch.arange(length)[None]
                kwargs = {"layer_type": layer_type} if layer_type and takes_layer_type else {}
                try:
                    cos = emb(torch.zeros(1, length, 8), positions, **kwargs)[0]
                except Exception:
                    continue  # a forward that needs more than (x, position_ids)
                try:
                    inv_freq, scaling, _ = posenc.hf_rope(
                        config, layer_type=layer_type, seq_len=length
                    )
                except RuntimeError:
                    continue  # refused: no table to differ
                called += 1
                per_pair = (positions[0, :, None].float() * inv_freq.float()).cos() * scaling
                layouts = [
                    torch.cat([per_pair, per_pair], -1),
                    per_pair.repeat_interleave(2, -1),
                    per_pair,
                ]
                got = cos.reshape(-1, cos.shape[-1])[:length].float()
                if not any(
                    got.shape == want.shape and torch.allclose(got, want, rtol=1e-6, atol=1e-6)
                    for want in layouts
                ):
                    differs.append(f"{name} {layer_type} L={length}")
    assert not differs, f"{model_type} {table['class']}: forward differs: {differs[:6]}"
    if called == 0:
        pytest.skip("no call both transformers and posenc answered")


def _mrope_cases():
    for mt, table, _rows in CASES:
        if table.get("config_path", "") in ("", "text_config"):
            yield mt, table


@pytest.mark.parametrize(
    "model_type,table", list(_mrope_cases()), ids=[f"{mt}-{t['class']}" for mt, t in _mrope_cases()]
)
def test_mrope_forward_on_three_axes_equals_posenc(model_type, table):
    """M-RoPE classes called on (t, h, w) positions that differ per axis, with the committed
    config.json as it is (no mrope_section: the class's default sections; no mrope_interleaved:
    the class's own layout): posenc.RotaryEmbedding must give the class's cos and sin (before,
    posenc took a file without sections for 1D RoPE and ignored Qwen3-VL's fixed interleaving)."""
    cls = perturbed._rotary_class(model_type, table)
    if cls is None:
        pytest.skip("not importable")
    path = table.get("config_path", "")
    with open(os.path.join(ARCH, model_type + ".config.json")) as f:
        config = json.load(f)
    try:
        loaded = CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(config))
        with torch.device("cpu"):
            emb = cls(config=getattr(loaded, path) if path else loaded)
    except Exception:
        pytest.skip("transformers cannot build it")
    if not isinstance(getattr(emb, "mrope_section", None), (list, tuple)):
        pytest.skip("not an M-RoPE class")
    try:
        ours = posenc.RotaryEmbedding.from_hf_config(config)
    except RuntimeError:
        pytest.skip("refused by posenc")
    if ours.resolved["config"].get("layout", "half") != "half":
        pytest.skip("pair-interleaved rotation: its tables are laid out otherwise")
    n = 12
    positions = torch.stack([torch.arange(n), torch.arange(n) // 3 + 5, torch.arange(n) % 3 + 9])[
        :, None, :
    ]
    try:
        cos, sin = emb(torch.zeros(1, n, 8), positions)
    except Exception:
        pytest.skip("the class's forward fails on these sections")
    if not ours.resolved["config"].get("mrope_section"):
        # a class whose sections posenc has not learned (Qwen4-Exp's cover a part of the pairs):
        # 3-axis positions are refused in one line, never 1D tables per axis
        with pytest.raises(ValueError, match="has no mrope_section"):
            ours(torch.zeros(1, n, 8), positions)
        return
    mine_cos, mine_sin = ours(torch.zeros(1, n, 8), positions)
    assert mine_cos.shape == cos.shape, (mine_cos.shape, cos.shape)
    assert torch.allclose(mine_cos, cos, atol=1e-6) and torch.allclose(mine_sin, sin, atol=1e-6)

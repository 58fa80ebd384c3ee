"""Composite configs (LLaVA, Qwen2-VL, Gemma 3, ... : a text model under text_config) in the
layouts a config.json is found in, against transformers' own config classes and rotary classes.

For every committed composite of tests/fixtures/hf_architectures whose rotary is built from
text_config, four variants of its config.json:
  flat       the text keys at the top level, no text_config (transformers 4's layout)
  flat_bare  the same without any RoPE key (rope_theta, rope_parameters, rope_scaling)
  flat_theta the same with a top-level rope_theta no class has as its default
  both       text_config kept, and a top-level rope_theta beside it
transformers loads each with the composite's config class (from_dict, as from_pretrained does) and
builds the text rotary class from get_text_config(); posenc.hf_rope resolves the same dict. Each
variant must give the class's inv_freq to the bit, or be refused: never a different table.
(Qwen2-VL's class builds text_config from top-level keys; LLaVA's ignores them and takes its own
defaults; both beside text_config: the top-level keys are not the text model's.)
"""

import copy
import glob
import importlib
import json
import os

import pytest
import torch

import posenc
from conftest import FIXTURES

transformers = pytest.importorskip("transformers")
from transformers import CONFIG_MAPPING  # noqa: E402

ARCH = os.path.join(FIXTURES, "hf_architectures")
VARIANTS = ["flat", "flat_bare", "flat_theta", "both"]


def _composites():
    for path in sorted(glob.glob(os.path.join(ARCH, "*.rotary.json"))):
        with open(path) as f:
            record = json.load(f)
        for table in record["tables"]:
            if table.get("config_path") == "text_config" and "layer_types" in table:
                yield record["model_type"], table
                break


def _variant(full, model_type, variant):
    if variant == "both":
        d = copy.deepcopy(full)
        d["rope_theta"] = 123456.0
        return d
    d = {k: v for k, v in full.items() if k != "text_config"}
    d.update({k: v for k, v in full["text_config"].items() if k != "model_type"})
    d["model_type"] = model_type
    if variant in ("flat_bare", "flat_theta"):
        for key in ("rope_parameters", "rope_scaling", "rope_theta"):
            d.pop(key, None)
    if variant == "flat_theta":
        d["rope_theta"] = 123456.0
    return d


def _rotary_class(model_type, table):
    for config_type in (model_type, table["config_model_type"]):
        module = CONFIG_MAPPING[config_type].__module__.replace("configuration_", "modeling_")
        try:
            return getattr(importlib.import_module(module), table["class"])
        except (ImportError, AttributeError):
            continue
    pytest.skip(f"{table['class']} not importable")


CASES = [(mt, t, v) for mt, t in _composites() for v in VARIANTS]


@pytest.mark.parametrize("model_type,table,variant", CASES, ids=[f"{mt}-{v}" for mt, _, v in CASES])
def test_composite_layouts_match_transformers_or_are_refused(model_type, table, variant):
    with open(os.path.join(ARCH, model_type + ".config.json")) as f:
        full = json.load(f)
    if not isinstance(full.get("text_config"), dict):
        pytest.skip("no text_config in the saved config")
    d = _variant(full, model_type, variant)
    try:
        text = CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(d)).get_text_config()
        with torch.device("cpu"):
            emb = _rotary_class(model_type, table)(config=text)
    except Exception as e:  # transformers itself cannot build it: nothing to match
        pytest.skip(f"transformers: {type(e).__name__}")
    for row in table["layer_types"]:
        lt = row["layer_type"]
        expected = getattr(emb, f"{lt}_inv_freq" if lt else "inv_freq", None)
        if not isinstance(expected, torch.Tensor):
            continue
        try:
            inv_freq, _, _ = posenc.hf_rope(d, layer_type=lt)
        except RuntimeError as e:
            assert "\n" not in str(e).strip() or "refused" in str(e)
            continue
        assert inv_freq.shape == expected.shape, (
            f"{model_type} {variant} {lt}: posenc {tuple(inv_freq.shape)}, "
            f"transformers {tuple(expected.shape)}"
        )
        assert torch.equal(inv_freq.to(expected.dtype), expected), (
            f"{model_type} {variant} {lt}: a different table"
        )


def test_flat_qwen2_vl_without_theta_takes_the_text_class_default():
    d = {
        "model_type": "qwen2_vl",
        "hidden_size": 1536,
        "num_attention_heads": 12,
        "max_position_embeddings": 32768,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    }
    inv_freq, _, resolved = posenc.hf_rope(d)
    assert resolved["config"]["rope_theta"] == 1e6
    assert resolved["model_type"] == "qwen2_vl_text"


def test_flat_llava_is_refused_with_one_line():
    d = {
        "model_type": "llava",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "rope_theta": 500000.0,
    }
    with pytest.raises(RuntimeError, match="'text_config' only"):
        posenc.hf_rope(d)

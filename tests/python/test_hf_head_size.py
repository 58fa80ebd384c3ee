"""The head size posenc's HF resolver takes for each model type, live against transformers.

The head size r0 (the size partial_rotary_factor multiplies, r = int(r0 * factor), inv_freq_i =
theta^(-2i/r)) comes from different keys per model type: head_dim else hidden_size /
num_attention_heads (Llama), qk_rope_head_dim (DeepSeek-V3's latent attention), kv_channels
(JetMoE), attention_head_dim (Zamba2), d_model / n_heads (DBRX), hidden_size /
decoder_num_attention_heads (Moonshine), rotary_dim (GPT-J), the trackers' memory attention.
tools/gen_hf_architectures.py's head_size_rule probes which keys size each model type's rotary
tables (each integer key of its default config.json changed in turn, the tables' widths compared)
and writes the answer as the typed column head_size of src/config/hf_generated_rules.inc; the
hand-written rows (src/config/hf_architectures.cpp) keep only the head sizes the probe cannot see.

Here: the committed column is what the probe gives with the installed transformers; posenc's
table for a file that changes the column's key is the model type's own rotary class's; the
column holds a rule's name, never a probed number; and the model types whose attention rotates
another part of the head than the rotary class's table says are refused or resolved as the
attention rotates (latent attention: qk_rope_head_dim; DeepSeek-V4: the trailing channels).
"""

import copy
import importlib
import json
import os

import pytest
import torch

import posenc
from conftest import FIXTURES, hf_generated_rules, hf_generator

transformers = pytest.importorskip("transformers")
from transformers import CONFIG_MAPPING  # noqa: E402

ARCH = os.path.join(FIXTURES, "hf_architectures")


def _config(model_type):
    with open(os.path.join(ARCH, model_type + ".config.json")) as f:
        return json.load(f)


def _their_inv_freq(model_type, file):
    """inv_freq of the model type's own rotary class (its modeling file's first that builds)
    built on the file as from_pretrained loads it."""
    gen = hf_generator()
    cfg_cls = CONFIG_MAPPING[model_type]
    config = cfg_cls.from_dict(copy.deepcopy(file))
    for cls in gen._config_rotary_classes(cfg_cls):
        try:
            emb = cls(config=config)
        except Exception:  # noqa: BLE001, S112 (another config's class: a tower's)
            continue
        inv = getattr(emb, "inv_freq", None)
        if isinstance(inv, torch.Tensor):
            return inv
    raise AssertionError(f"no rotary class of {model_type} builds on the file")


# One model type per rule the generator writes (all but the trackers' towers, whose per-axis
# tables tests/test_hf_architectures.cpp checks at their defaults).
RULES = {
    "head_dim": "llama",
    "qk_rope_head_dim": "deepseek_v3",
    "kv_channels": "jetmoe",
    "attention_head_dim": "zamba2",
    "d_model / n_heads": "dbrx",
    "hidden_size / decoder_num_attention_heads": "moonshine",
    "rotary_dim": "gptj",
    "memory_attention": "sam2_video",
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_committed_head_size_is_the_probes_answer(rule):
    gen = hf_generator()
    model_type = RULES[rule]
    row = next(r for r in hf_generated_rules()["rows"] if r["model_type"] == model_type)
    assert row.get("head_size") == rule
    assert gen.head_size_rule(CONFIG_MAPPING[model_type]) == rule


def _changed(model_type):
    """The model type's default file with the key(s) of its head-size rule changed (another
    head size than the default), as a user's config.json of another size carries them."""
    d = _config(model_type)
    if model_type == "llama":  # head_dim first, else hidden_size / num_attention_heads
        d.pop("head_dim")
        d["num_attention_heads"] = 64
    elif model_type == "hunyuan_v1_dense":  # head_dim None in its file: set it
        d["head_dim"] = 64
    elif model_type == "deepseek_v3":  # its class sets head_dim = qk_rope_head_dim
        d.pop("head_dim")
        d["qk_rope_head_dim"] = 32
    elif model_type == "longcat_flash":
        d["qk_rope_head_dim"] = d["head_dim"] = 32
    elif model_type == "jetmoe":
        d["kv_channels"] = 64
    elif model_type == "zamba2":
        d["attention_head_dim"] = 96
    elif model_type == "dbrx":
        d["d_model"] = 1024
    elif model_type == "moonshine":
        d["decoder_num_attention_heads"] = 4
    return d


# float32 inv_freq of either side (torch's vectorized pow, posenc's ladder) may differ by an ulp
# on another CPU; a table sized by another key differs in length
ULP_TOLERANCE = 1e-6


@pytest.mark.parametrize(
    "model_type",
    [
        "llama",
        "hunyuan_v1_dense",
        "deepseek_v3",
        "longcat_flash",
        "jetmoe",
        "zamba2",
        "dbrx",
        "moonshine",
    ],
)
def test_posenc_sizes_the_table_by_the_key_the_class_reads(model_type):
    file = _changed(model_type)
    theirs = _their_inv_freq(model_type, file)
    ours, _, resolution = posenc.hf_rope(copy.deepcopy(file), angle_dtype="float32")
    assert ours.numel() == theirs.numel(), (model_type, resolution["sources"]["head_dim"])
    assert torch.allclose(ours.float(), theirs.float(), rtol=ULP_TOLERANCE, atol=0)


def test_gptj_rotary_dim_sizes_its_table():
    file = _config("gptj")
    file["rotary_dim"] = 32
    config = CONFIG_MAPPING["gptj"].from_dict(copy.deepcopy(file))
    module = importlib.import_module("transformers.models.gptj.modeling_gptj")
    table = module.GPTJRotaryEmbedding(config=config).embed_positions  # [positions, rotary_dim]
    _, _, resolution = posenc.hf_rope(copy.deepcopy(file))
    assert resolution["rotary_dim"] == table.shape[-1] == 32


def test_llama_reads_head_dim_not_qk_rope_head_dim():
    # Llama's rotary class and attention take head_dim; a qk_rope_head_dim in its file is not
    # read (the generic rule, which an unknown model type still gets, would take it first)
    file = _config("llama")
    file["qk_rope_head_dim"] = 32
    theirs = _their_inv_freq("llama", file)
    ours, _, resolution = posenc.hf_rope(copy.deepcopy(file), angle_dtype="float32")
    assert ours.numel() == theirs.numel() == file["head_dim"] // 2
    assert resolution["sources"]["head_dim"] == "config.json: head_dim"


def test_a_latent_attention_rotates_qk_rope_head_dim_whatever_head_dim_says():
    # LongCat-Flash's rotary class sizes its table by head_dim, its attention splits off
    # qk_rope_head_dim channels to rotate: transformers fails where the two differ, posenc refuses
    file = _config("longcat_flash")
    file["head_dim"] = 96
    with pytest.raises(RuntimeError, match="qk_rope_head_dim"):
        posenc.hf_rope(copy.deepcopy(file))


def test_mistral4_without_head_dim_is_refused_because_its_class_sums_the_two_parts():
    # Mistral4Config without head_dim takes qk_nope_head_dim + qk_rope_head_dim (live below),
    # not its class default 128, which posenc filled before: 21 frequencies where the class
    # builds 8, without a word; likewise an absent partial_rotary_factor. posenc refuses both
    # where they differ from the defaults; with head_dim in the file, both read it.
    file = _config("mistral4")
    file.update(qk_nope_head_dim=32, qk_rope_head_dim=16, hidden_size=256, num_attention_heads=4)
    file.pop("head_dim", None)
    theirs = _their_inv_freq("mistral4", file)
    assert theirs.numel() * 2 == round((32 + 16) * file["rope_parameters"]["partial_rotary_factor"])
    with pytest.raises(RuntimeError, match="'head_dim' is absent, and the config class then takes"):
        posenc.hf_rope(copy.deepcopy(file), angle_dtype="float32")
    file["head_dim"] = 48
    theirs = _their_inv_freq("mistral4", file)
    ours, _, _ = posenc.hf_rope(copy.deepcopy(file), angle_dtype="float32")
    assert ours.numel() == theirs.numel() and torch.equal(ours.to(theirs.dtype), theirs)
    # an absent partial_rotary_factor: the class takes qk_rope_head_dim / head_dim (16 / 48 here,
    # not its default block's 0.5)
    del file["rope_parameters"]["partial_rotary_factor"]
    theirs = _their_inv_freq("mistral4", file)
    assert theirs.numel() == 8
    with pytest.raises(RuntimeError, match="'partial_rotary_factor' is absent, and the config"):
        posenc.hf_rope(copy.deepcopy(file), angle_dtype="float32")


def test_deepseek_v4_is_refused_because_it_rotates_the_trailing_channels():
    file = _config("deepseek_v4")
    with pytest.raises(RuntimeError, match="trailing"):
        posenc.hf_rope(copy.deepcopy(file), layer_type="main")
    # the reason, live: its apply_rotary_pos_emb leaves the leading channels and turns the last
    # head_dim x partial_rotary_factor in (2i, 2i + 1) pairs
    module = importlib.import_module("transformers.models.deepseek_v4.modeling_deepseek_v4")
    head, rope = 16, 4
    x = torch.randn(1, 1, 3, head)  # [B, H, N, D]
    angle = torch.tensor([0.0, 0.3, 1.1])[:, None] * torch.tensor([1.0, 0.5])  # [N, rope / 2]
    out = module.apply_rotary_pos_emb(x, angle.cos()[None], angle.sin()[None])
    assert torch.equal(out[..., : head - rope], x[..., : head - rope])
    even, odd = x[..., head - rope :: 2], x[..., head - rope + 1 :: 2]
    c, s = angle.cos(), angle.sin()
    torch.testing.assert_close(out[..., head - rope :: 2], even * c - odd * s)
    torch.testing.assert_close(out[..., head - rope + 1 :: 2], odd * c + even * s)


def test_the_head_size_column_holds_rule_names_never_a_probed_size():
    # a probe value must never reach the generated rules (the legacy-theta probe once put its
    # 123456 into 788 rows): the head-size probe sets head_dim and absent head keys to PROBE_HEAD
    # and doubles the others, and writes back only the name of the rule the widths showed
    gen = hf_generator()
    data = hf_generated_rules()
    assert gen.PROBE_HEAD in gen.PROBE_VALUES
    assert data["probe_values"] == sorted(set(gen.PROBE_VALUES))
    names = [r["head_size"] for r in data["rows"] if "head_size" in r]
    assert len(names) >= 200 and set(names) <= set(gen.HEAD_SIZES)
    for r in data["rows"]:
        for defaults in (r.get("defaults", {}), r.get("text_config_defaults", {})):
            assert defaults.get("head_dim") not in gen.PROBE_VALUES, r["model_type"]
    with pytest.raises(ValueError, match="expected one of"):
        gen.rules_inc([{"model_type": "llama", "head_size": gen.PROBE_HEAD}], "5")

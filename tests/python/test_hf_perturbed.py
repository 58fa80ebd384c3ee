"""Every committed architecture's config.json, changed the ways real files differ from what
transformers 5 saves, loaded by transformers' own config class and rotary class, against posenc.

tests/fixtures/hf_architectures holds each model type's config.json as save_pretrained writes it
(tools/gen_hf_architectures.py). Files in the wild are older or hand-written: a legacy
rope_scaling, a rope_theta at the top level, no head_dim, a block without rope_theta, a stray
Gemma-3 key. Each config class converts those its own way (GPT-NeoX reads rotary_emb_base, not
rope_theta; Cohere 2 MoE never reads rope_scaling; Gemma 3's blocks have their own thetas).
For every (model type, rotary class, layer type) and every change below, posenc.hf_rope must give
the class's inv_freq and attention scaling to the bit, or refuse: never a different table.

The few differences still open are listed in KNOWN (strict xfail: the test fails once one is
fixed, so the list cannot go stale). Where transformers' classes fail on a changed file, posenc
must refuse it too (a table where transformers has none is not a match).
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


def _pop(n, *keys):
    for k in keys:
        n.pop(k, None)


def _blocks(rp):
    if not isinstance(rp, dict):
        return []
    if "rope_type" in rp or "rope_theta" in rp:
        return [rp]
    return [v for v in rp.values() if isinstance(v, dict)]


def _legacy(kind):
    def change(n):
        _pop(n, "rope_parameters")
        n["rope_theta"] = 20000.0 if kind != "llama3" else 500000.0
        n["rope_scaling"] = {
            "linear": {"rope_type": "linear", "factor": 2.0},
            "legacy_type": {"type": "linear", "factor": 2.0},
            "dynamic": {"rope_type": "dynamic", "factor": 2.0},
            "llama3": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        }[kind]

    return change


def _v5_yarn(n):
    rp = n.get("rope_parameters")
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    if isinstance(rp, dict) and rp and all(isinstance(v, dict) for v in rp.values()):
        for v in rp.values():
            v.update(yarn)
    else:
        n["rope_parameters"] = {"rope_theta": 10000.0, **(rp or {}), **yarn}


def _legacy_yarn_mscale(n):
    # DeepSeek-style files: a legacy yarn block with mscale keys and both betas
    _pop(n, "rope_parameters")
    n["rope_theta"] = 10000.0
    n["rope_scaling"] = {
        "type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    }


def _v5_block(block):
    def change(n):
        rp = n.get("rope_parameters")
        if isinstance(rp, dict) and rp and all(isinstance(v, dict) for v in rp.values()):
            for v in rp.values():
                v.update(copy.deepcopy(block))
        else:
            n["rope_parameters"] = {"rope_theta": 10000.0, **(rp or {}), **copy.deepcopy(block)}

    return change


def _legacy_longrope(n, pairs):
    # Phi-3-style files: a legacy longrope ("su" in the oldest) block, one factor per frequency
    _pop(n, "rope_parameters")
    n["rope_theta"] = 10000.0
    n["original_max_position_embeddings"] = 4096
    n["max_position_embeddings"] = 131072
    n["rope_scaling"] = {
        "type": "longrope",
        "short_factor": [1.0 + 0.01 * i for i in range(pairs)],
        "long_factor": [1.0 + 0.5 * i for i in range(pairs)],
    }


def _v5_longrope_top_original(n, pairs):
    # a v5 longrope block, the original context at the top level (Phi-3.5's keys in a v5 file);
    # per-layer blocks each with factors for their own rotary size
    _v5_block(
        {
            "rope_type": "longrope",
            "short_factor": [1.0 + 0.01 * i for i in range(pairs)],
            "long_factor": [1.0 + 0.5 * i for i in range(pairs)],
        }
    )(n)
    rp = n["rope_parameters"]
    if all(isinstance(v, dict) for v in rp.values()) and isinstance(n.get("head_dim"), int):
        for block in rp.values():
            partial = block.get("partial_rotary_factor", n.get("partial_rotary_factor", 1.0))
            own = int(n["head_dim"] * partial) // 2
            block["short_factor"] = [1.0 + 0.01 * i for i in range(own)]
            block["long_factor"] = [1.0 + 0.5 * i for i in range(own)]
    n["original_max_position_embeddings"] = 4096
    n["max_position_embeddings"] = 131072


def _no_theta_in_block(n):
    _pop(n, "rope_theta")
    for b in _blocks(n.get("rope_parameters")):
        b.pop("rope_theta", None)


CHANGES = {
    "legacy_linear": _legacy("linear"),
    "legacy_type_key": _legacy("legacy_type"),
    "legacy_dynamic": _legacy("dynamic"),
    "legacy_llama3": _legacy("llama3"),
    "v5_yarn": _v5_yarn,
    "no_head_dim": lambda n: _pop(n, "head_dim"),
    "no_rope_keys": lambda n: _pop(n, "rope_parameters", "rope_theta", "rope_scaling"),
    "no_theta_in_block": _no_theta_in_block,
    "stray_rope_local_base_freq": lambda n: n.__setitem__("rope_local_base_freq", 7777.0),
    # head_dim as files carry it: null (saved from a None attribute), or another size beside the
    # key the class's attention reads (qk_rope_head_dim, kv_channels, d_model / n_heads)
    "null_head_dim": lambda n: n.__setitem__("head_dim", None),
    "other_head_dim": lambda n: n.__setitem__("head_dim", 96 if n.get("head_dim") != 96 else 80),
    # more files as they ship: Llama-2-style `rope_scaling: null` beside a top-level theta; a
    # DeepSeek-style legacy yarn block; v5 linear/dynamic blocks; a longer context
    "legacy_scaling_null": lambda n: (
        _pop(n, "rope_parameters"),
        n.update({"rope_theta": 30000.0, "rope_scaling": None}),
    ),
    "legacy_yarn_mscale": _legacy_yarn_mscale,
    "v5_linear": _v5_block({"rope_type": "linear", "factor": 3.0}),
    "v5_dynamic": _v5_block({"rope_type": "dynamic", "factor": 2.0}),
    "longer_context": lambda n: n.__setitem__(
        "max_position_embeddings", 4 * int(n.get("max_position_embeddings") or 2048)
    ),
    # every yarn key, a llama3 block, a yarn block without its original context, a default block
    # with a factor it does not take, a legacy longrope block (one factor per frequency)
    "v5_yarn_all_keys": _v5_block(
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 2048,
            "attention_factor": 0.9,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
            "truncate": False,
        }
    ),
    "v5_llama3": _v5_block(
        {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    ),
    "v5_yarn_no_original": _v5_block({"rope_type": "yarn", "factor": 4.0}),
    "v5_default_with_factor": _v5_block({"rope_type": "default", "factor": 4.0}),
    "legacy_longrope": _legacy_longrope,
    "v5_longrope_top_original": _v5_longrope_top_original,
    # the original context at the top level (as Phi-3's files carry it) beside a block without
    # one, or with another one: which wins is each config class's own conversion
    "legacy_yarn_top_original": lambda n: (
        _pop(n, "rope_parameters"),
        n.update(
            {
                "rope_theta": 10000.0,
                "original_max_position_embeddings": 1024,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
            }
        ),
    ),
    "v5_yarn_top_original": lambda n: (
        _v5_block({"rope_type": "yarn", "factor": 4.0})(n),
        n.__setitem__("original_max_position_embeddings", 1024),
    ),
    "v5_yarn_both_originals": lambda n: (
        _v5_block({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048})(
            n
        ),
        n.__setitem__("original_max_position_embeddings", 1024),
    ),
    # more keys where real files put them: a top-level partial factor beside a v5 block, a
    # context length missing, an integer theta, a v5 longrope block with the original context at
    # the top level (Phi-3.5's layout in a v5 file), a dynamic block with a top-level original
    "v5_yarn_top_partial": lambda n: (
        _v5_block({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024})(
            n
        ),
        n.__setitem__("partial_rotary_factor", 0.5),
    ),
    "v5_yarn_no_max_position": lambda n: (
        _v5_block({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024})(
            n
        ),
        _pop(n, "max_position_embeddings"),
    ),
    "v5_integer_theta": lambda n: _v5_block({"rope_type": "default", "rope_theta": 500000})(n),
    "v5_dynamic_top_original": lambda n: (
        _v5_block({"rope_type": "dynamic", "factor": 2.0})(n),
        n.__setitem__("original_max_position_embeddings", 1024),
    ),
    "v5_block_without_type": lambda n: _v5_block({"factor": 2.0})(n),
    "legacy_yarn_without_factor": lambda n: (
        _pop(n, "rope_parameters"),
        n.update(
            {
                "rope_theta": 10000.0,
                "rope_scaling": {"type": "yarn", "original_max_position_embeddings": 1024},
            }
        ),
    ),
    "legacy_llama3_top_original": lambda n: (
        _legacy("llama3")(n),
        n["rope_scaling"].pop("original_max_position_embeddings"),
        n.__setitem__("original_max_position_embeddings", 4096),
    ),
}
# changes that take the table's number of frequencies
NEEDS_PAIRS = {"legacy_longrope", "v5_longrope_top_original"}

# Errors of transformers' own classes on the committed fixtures themselves, whatever the change
# (not RoPE: Bamba-style time_step_limit lists, Cosmos 3 Edge's architecture validator).
UNRELATED = ("time_step_limit", "validate_architecture")

# (model type, layer type, change): posenc still resolves a different table (none today; the
# last six, dots3's absent head_dim and UltraBERT's default blocks, were generator defects).
KNOWN = set()


def _rows():
    for path in sorted(glob.glob(os.path.join(ARCH, "*.rotary.json"))):
        with open(path) as f:
            record = json.load(f)
        for table in record["tables"]:
            if table.get("config_path", "") not in ("", "text_config"):
                continue
            rows = [r for r in table.get("layer_types", []) if "inv_freq" in r]
            # a vision tower's per-axis ladder is checked on grid positions by test_hf_parity
            rows = [r for r in rows if r.get("rotary_dim") == 2 * len(r["inv_freq"])]
            if rows:
                yield record["model_type"], table, rows


def _rotary_class(model_type, table):
    for config_type in (model_type, table.get("config_model_type") or model_type):
        module = CONFIG_MAPPING[config_type].__module__.replace("configuration_", "modeling_")
        try:
            return getattr(importlib.import_module(module), table["class"])
        except (ImportError, AttributeError):
            continue
    return None


CASES = [(mt, t, rows, ch) for mt, t, rows in _rows() for ch in CHANGES]


@pytest.mark.parametrize(
    "model_type,table,rows,change", CASES, ids=[f"{mt}-{t['class']}-{ch}" for mt, t, _, ch in CASES]
)
def test_changed_configs_match_the_config_class_or_are_refused(model_type, table, rows, change):
    with open(os.path.join(ARCH, model_type + ".config.json")) as f:
        config = json.load(f)
    path = table.get("config_path", "")
    node = config["text_config"] if path == "text_config" else config
    if change in NEEDS_PAIRS:
        CHANGES[change](node, len(rows[0]["inv_freq"]))
    else:
        CHANGES[change](node)
    cls = _rotary_class(model_type, table)
    if cls is None:
        pytest.skip(f"{table['class']} not importable")
    try:
        loaded = CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(config))
        sub = getattr(loaded, path) if path else loaded
        with torch.device("cpu"):
            emb = cls(config=sub)
    except Exception as e:  # transformers itself refuses the file: so must posenc
        message = f"{type(e).__name__}: {e}"
        if any(u in message for u in UNRELATED):
            pytest.skip(f"transformers cannot load this fixture at all: {message[:80]}")
        resolved = []
        for row in rows:
            try:
                posenc.hf_rope(config, layer_type=row.get("layer_type"))
                resolved.append(str(row.get("layer_type")))
            except RuntimeError:
                pass
        assert not resolved, (
            f"{model_type} after {change}: transformers fails ({message[:120]}) "
            f"but posenc resolves {resolved}"
        )
        return
    differs = []
    for row in rows:
        lt = row.get("layer_type")
        expected = getattr(emb, f"{lt}_inv_freq" if lt else "inv_freq", None)
        if not isinstance(expected, torch.Tensor):
            continue
        try:
            inv_freq, scaling, _ = posenc.hf_rope(config, layer_type=lt)
        except RuntimeError:
            continue  # refused: no table to differ
        hf_scaling = float(
            getattr(emb, f"{lt}_attention_scaling" if lt else "attention_scaling", 1.0)
        )
        same = (
            inv_freq.shape == expected.shape
            and torch.equal(inv_freq.to(expected.dtype), expected)
            and abs(scaling - hf_scaling) <= 1e-12
        )
        if not same and (model_type, lt, change) not in KNOWN:
            differs.append(
                f"{lt}: posenc {inv_freq.numel()} frequencies "
                f"{inv_freq[:2].tolist()}, transformers {expected.numel()} "
                f"{expected[:2].tolist()}"
            )
        if (model_type, lt, change) in KNOWN and same:
            differs.append(f"{lt}: listed in KNOWN but now equal: take it off the list")
    assert not differs, f"{model_type} {table['class']} after {change}: " + "; ".join(differs)


# Files a hostile review found (each gave a different table before the fix beside it): the file's
# top-level partial_rotary_factor with the class's default block (Phi-2), GPT-NeoX keys on other
# types, a nested block without rope_theta beside a top-level one, rope_scaling beside
# rope_parameters, an empty rope_scaling, Gemma 3's flat scaling without rope_local_base_freq.
REVIEW = [
    (
        "phi",
        {
            "hidden_size": 2560,
            "num_attention_heads": 32,
            "partial_rotary_factor": 0.4,
            "rope_theta": 10000.0,
            "rope_scaling": None,
        },
        None,
    ),
    (
        "phi3",
        {
            "hidden_size": 3072,
            "num_attention_heads": 24,
            "partial_rotary_factor": 0.75,
            "rope_theta": 10000.0,
        },
        None,
    ),
    ("apertus", {"hidden_size": 4096, "num_attention_heads": 32, "rotary_pct": 0.5}, None),
    ("llama", {"hidden_size": 4096, "num_attention_heads": 32, "rotary_emb_base": 20000}, None),
    (
        "gemma3_text",
        {
            "hidden_size": 2560,
            "num_attention_heads": 8,
            "head_dim": 256,
            "rope_theta": 5e5,
            "rope_parameters": {
                "full_attention": {"rope_type": "default"},
                "sliding_attention": {"rope_type": "default"},
            },
        },
        "sliding_attention",
    ),
    (
        "gpt_neox",
        {
            "hidden_size": 6144,
            "num_attention_heads": 64,
            "rope_theta": 2e4,
            "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25},
        },
        None,
    ),
    (
        "cohere2_moe",
        {
            "hidden_size": 8192,
            "num_attention_heads": 64,
            "head_dim": 128,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
        None,
    ),
    (
        "glm4",
        {
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "head_dim": 128,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.5,
            },
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
        None,
    ),
    (
        "llama",
        {
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "rope_scaling": {},
            "rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4},
        },
        None,
    ),
    (
        "gemma3_text",
        {
            "hidden_size": 2560,
            "num_attention_heads": 8,
            "head_dim": 256,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        },
        "full_attention",
    ),
    (
        "gemma3_text",
        {
            "hidden_size": 2560,
            "num_attention_heads": 8,
            "head_dim": 256,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        },
        "sliding_attention",
    ),
    # second round: Llama 4 Scout's llama3 block (low = high = 1: no medium band), a block of the
    # file's own without the factor the class's default block carried, rope_scaling beside
    # rope_parameters, a per-layer yarn block's truncate and a top-level original context
    (
        "llama",
        {
            "hidden_size": 5120,
            "num_attention_heads": 40,
            "head_dim": 128,
            "rope_theta": 500000.0,
            "max_position_embeddings": 10485760,
            "rope_scaling": {
                "factor": 16.0,
                "high_freq_factor": 1.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
        },
        None,
    ),
    (
        "moonshine_streaming",
        {
            "hidden_size": 320,
            "num_attention_heads": 8,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        },
        None,
    ),
    (
        "mistral4",
        {
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 64,
            "head_dim": 128,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
        None,
    ),
    (
        "gemma3_text",
        {
            "hidden_size": 2560,
            "num_attention_heads": 8,
            "head_dim": 256,
            "max_position_embeddings": 32768,
            "rope_parameters": {
                "full_attention": {
                    "rope_type": "yarn",
                    "rope_theta": 1e6,
                    "factor": 8.0,
                    "original_max_position_embeddings": 2048,
                    "truncate": False,
                },
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        },
        "full_attention",
    ),
    (
        "glmasr",
        {
            "text_config": {
                "model_type": "llama",
                "hidden_size": 2048,
                "num_attention_heads": 16,
                "rope_theta": 30000.0,
            }
        },
        None,
    ),
    (
        "gemma3_text",
        {
            "hidden_size": 2560,
            "num_attention_heads": 8,
            "head_dim": 256,
            "max_position_embeddings": 32768,
            "original_max_position_embeddings": 2048,
            "rope_parameters": {
                "full_attention": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        },
        "full_attention",
    ),
]


def _class_of(model_type):
    with open(os.path.join(ARCH, model_type + ".rotary.json")) as f:
        record = json.load(f)
    for table in record["tables"]:
        if table.get("config_path", "") in ("", "text_config") and "layer_types" in table:
            return _rotary_class(model_type, table)
    return None


@pytest.mark.parametrize(
    "model_type,config,layer_type", REVIEW, ids=[f"{i}-{mt}" for i, (mt, _, _) in enumerate(REVIEW)]
)
def test_reviewed_files_match_or_are_refused(model_type, config, layer_type):
    config = dict(config, model_type=model_type)
    cls = _class_of(model_type)
    loaded = CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(config))
    if "text_config" in config:
        loaded = loaded.get_text_config()
    with torch.device("cpu"):
        emb = cls(config=loaded)
    expected = getattr(emb, f"{layer_type}_inv_freq" if layer_type else "inv_freq")
    try:
        inv_freq, _, _ = posenc.hf_rope(config, layer_type=layer_type)
    except RuntimeError:
        return  # refused
    assert inv_freq.shape == expected.shape and torch.equal(
        inv_freq.to(expected.dtype), expected
    ), (
        f"posenc {inv_freq[:2].tolist()} ({inv_freq.numel()}), "
        f"transformers {expected[:2].tolist()} ({expected.numel()})"
    )


def test_phimoe_longrope_equals_its_rotary_forward():
    """Phi-3.5-MoE's longrope (its released config's shape): PhimoeRotaryEmbedding.forward takes
    short_factor at every length and scales cos/sin by short_mscale / long_mscale, not by the
    longrope attention factor its attention_scaling attribute reports (1.19 where the forward
    uses 1.2432). posenc's tables must equal the forward's; files the class fails on, or whose
    mscales differ (a length-dependent scaling), are refused."""
    modeling = pytest.importorskip("transformers.models.phimoe.modeling_phimoe")
    with open(os.path.join(ARCH, "phimoe.config.json")) as f:
        config = json.load(f)
    head = config["hidden_size"] // config["num_attention_heads"]
    config.pop("rope_parameters", None)
    mscale = 1.243163121016122
    config.update(
        {
            "rope_theta": 10000.0,
            "max_position_embeddings": 131072,
            "rope_scaling": {
                "type": "longrope",
                "original_max_position_embeddings": 4096,
                "short_factor": [1.0 + 0.01 * i for i in range(head // 2)],
                "long_factor": [1.0 + 0.5 * i for i in range(head // 2)],
                "short_mscale": mscale,
                "long_mscale": mscale,
            },
        }
    )
    emb = modeling.PhimoeRotaryEmbedding(
        config=CONFIG_MAPPING["phimoe"].from_dict(copy.deepcopy(config))
    )
    for length in (16, 5000):  # within and past the original context
        positions = torch.arange(length)[None]
        cos, sin = emb(torch.zeros(1, length, head), positions)
        inv_freq, scaling, _ = posenc.hf_rope(config, seq_len=length)
        assert scaling == mscale
        mine_cos, mine_sin = posenc.rope_cos_sin(positions, inv_freq, scaling)
        assert torch.equal(mine_cos, cos) and torch.equal(mine_sin, sin), length
    for change, message in [
        ({"short_mscale": None}, "short_mscale' must be a number"),
        ({"long_mscale": 1.1}, "differ: model type 'phimoe''s rotary forward"),
    ]:
        bad = copy.deepcopy(config)
        bad["rope_scaling"].update(change)
        with pytest.raises(RuntimeError, match=message):
            posenc.hf_rope(bad)

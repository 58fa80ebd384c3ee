"""What a model type's rotary class reads, live: transformers' own rotary class and its own rotation
of q (rotate_half, rotate_every_two, view_as_complex), called here on config.json files that change
one key each, against posenc's table and rotation of the same file.

GPT-J's and CodeGen's tables hard-code theta 10000 and read no rope block; ESM's reads only the
top-level rope_theta; Llama 4 and DeepSeek-V2 turn (2i, 2i+1) pairs as complex numbers. posenc
must rotate q as the model does (frequencies and pair layout), or refuse the file where
transformers cannot build it; tools/gen_hf_architectures.py generates what posenc knows of this
(hf_generated_rules.inc, a typed table rendered from generated_rules.json: unread_keys, pair_layout,
rotary_gate, values_rejected), and the first tests check that none of its probe values leaked into
it and that the committed table is the generator's rendering of its rows.
"""

import copy
import importlib
import inspect
import json
import os

import pytest
import torch

import posenc
from conftest import FIXTURES, hf_generated_rules, hf_generator

transformers = pytest.importorskip("transformers")
from transformers import CONFIG_MAPPING  # noqa: E402

ARCH = os.path.join(FIXTURES, "hf_architectures")
POSITIONS = [0, 1, 2, 7, 100, 1023]


def test_no_probe_value_of_the_generator_is_in_the_generated_defaults():
    gen = hf_generator()
    rows = hf_generated_rules()["rows"]
    assert len(rows) >= 400
    leaked = [
        (r["model_type"], v) for r in rows for v in gen.numbers_in(r) if v in gen.PROBE_VALUES
    ]
    assert not leaked, leaked[:10]


def test_the_typed_table_is_the_generators_rendering_of_its_rows():
    # src/config/hf_generated_rules.inc is what tools/gen_hf_architectures.py renders from the rows
    # it writes to generated_rules.json (tests/test_hf_architectures.cpp checks the compiled table
    # against the same rows): neither file is edited by hand, and the renderer still takes every
    # row (a rule without a field in hf_generated_rules.h stops it)
    gen = hf_generator()
    data = hf_generated_rules()
    with open(gen.RULES_INC) as f:
        committed = f.read()
    assert gen.rules_inc(data["rows"], data["transformers"]) == committed
    # a rule the typed table has no field for is refused, not dropped
    with pytest.raises(ValueError, match="no field"):
        gen.rules_inc([{"model_type": "llama", "rope_theta_raise": True}], data["transformers"])
    with pytest.raises(ValueError, match="no field"):
        gen.rules_inc([{"model_type": "llama", "defaults": {"rope_thetaa": 1.0}}], "5")


def _config(model_type):
    with open(os.path.join(ARCH, model_type + ".config.json")) as f:
        return json.load(f)


def _module(model_type):
    cfg_cls = CONFIG_MAPPING[model_type]
    package, leaf = cfg_cls.__module__.rsplit(".", 1)
    return importlib.import_module(f"{package}.{leaf.replace('configuration_', 'modeling_', 1)}")


def _their_rotation(model_type, config, q, pos):
    """q [1, H, N, D] rotated by the model type's own rotary class and rotation function."""
    module = _module(model_type)
    cls = next(
        getattr(module, n)
        for n in sorted(dir(module))
        if n.endswith("RotaryEmbedding")
        and "Vision" not in n
        and "config" in inspect.signature(getattr(module, n).__init__).parameters
    )
    emb = cls(config=config)
    x = torch.zeros(1, q.shape[2], 8)
    out = emb(x, pos)
    if hasattr(module, "apply_rotary_emb"):  # view_as_complex: freqs_cis [B, N, r/2]
        fn = module.apply_rotary_emb
        for shaped, back in ((q.transpose(1, 2), lambda t: t.transpose(1, 2)), (q, lambda t: t)):
            try:
                got, _ = fn(shaped, shaped.clone(), out)
            except RuntimeError:
                continue
            if got.shape == shaped.shape:
                return back(got)
        raise AssertionError("apply_rotary_emb took neither [B, N, H, D] nor [B, H, N, D]")
    params = list(inspect.signature(module.apply_rotary_pos_emb).parameters)
    if params[:3] == ["tensor", "sin", "cos"]:  # GPT-J, CodeGen: (sin, cos) over q [B, N, H, r]
        sin, cos = out
        r = 2 * sin.shape[-1]
        t = q.transpose(1, 2)
        rotated = module.apply_rotary_pos_emb(t[..., :r], sin, cos)
        return torch.cat([rotated, t[..., r:]], dim=-1).transpose(1, 2)
    cos, sin = out
    return module.apply_rotary_pos_emb(q, q.clone(), cos, sin)[0]


def _our_rotation(config_dict, q, pos):
    rope = posenc.RotaryEmbedding.from_hf_config(config_dict)
    cos, sin = rope(q, pos)
    layout = rope._table(None).layout
    return posenc.apply_rotary_pos_emb(q, q.clone(), cos, sin, layout=layout)[0], layout


def _changed(d, key):
    d = copy.deepcopy(d)
    theta = float(
        d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta") or 10000.0
    )
    if key == "rope_theta":
        d["rope_theta"] = 2 * theta
        if isinstance(d.get("rope_parameters"), dict):
            d["rope_parameters"]["rope_theta"] = 2 * theta
    elif key == "rope_parameters":
        d["rope_parameters"] = {"rope_type": "linear", "factor": 3.0, "rope_theta": theta}
    elif key == "rope_scaling":
        d.pop("rope_parameters", None)
        d["rope_theta"] = theta
        d["rope_scaling"] = {"rope_type": "linear", "factor": 3.0}
    elif key == "partial_rotary_factor":
        d["partial_rotary_factor"] = 0.5
    return d


MODEL_TYPES = ["gptj", "codegen", "esm", "llama4_text", "deepseek_v2", "llama", "glm", "qwen2"]
KEYS = [None, "rope_theta", "rope_parameters", "rope_scaling", "partial_rotary_factor"]


@pytest.mark.parametrize("key", KEYS, ids=lambda k: k or "as_is")
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_q_rotated_as_the_models_own_code_rotates_it(model_type, key):
    file = _changed(_config(model_type), key) if key else _config(model_type)
    try:
        config = CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(file))
    except Exception as e:  # noqa: BLE001 (transformers cannot load it: nor may posenc)
        with pytest.raises((RuntimeError, ValueError)):
            posenc.RotaryEmbedding.from_hf_config(file)
        pytest.skip(f"transformers refuses the file: {type(e).__name__}")
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    torch.manual_seed(0)
    q = torch.randn(1, 2, len(POSITIONS), head)
    pos = torch.tensor([POSITIONS])
    theirs = _their_rotation(model_type, config, q, pos)
    try:
        ours, layout = _our_rotation(file, q, pos)
    except (RuntimeError, ValueError) as e:
        # ESM's config class validates a block its rotary class never reads, by its own rules
        if "validates the block by rules posenc does not mirror" in str(e):
            return
        pytest.fail(f"posenc refused a file transformers builds: {str(e).splitlines()[0]}")
    # float32 tables of either side (GPT-J's int64 arange / dim, posenc's ladder) may differ by an
    # ulp in a frequency: at position 1023 that is ~1e-4 of a radian; a wrong theta, scaling or
    # pair layout moves q by O(1)
    assert torch.allclose(ours, theirs, atol=2e-3, rtol=0), (
        model_type,
        key,
        layout,
        (ours - theirs).abs().max().item(),
    )

"""Every family patch() takes from the generated list (python/posenc/integrations/_families.py,
written by tools/gen_patch_families.py) re-checked with the generator's harness
(tools/patch_families.py): a small random causal LM of the family through transformers' own modeling
code, with and without patch(): logits equal to the bit, gradients within rtol 1e-5, posenc's
rotation called, transformers' given back by unpatch(). Families left out are refused in one line."""

import os
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.integrations import _families  # noqa: E402
from posenc.integrations import transformers as integration  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import patch_families as pf  # noqa: E402

GENERATED_FOR = _families.TRANSFORMERS
pytestmark = pytest.mark.skipif(
    transformers.__version__ != GENERATED_FOR,
    reason=f"the list was generated with transformers {GENERATED_FOR}",
)


@pytest.mark.parametrize("model_type", sorted(_families.CHECKED))
def test_listed_family_equals_transformers(model_type):
    entry = _families.CHECKED[model_type]
    assert integration.SUPPORTED[model_type] == entry
    with pf.quiet():
        why = pf.check(model_type, entry[1], entry[2])
    assert why is None, f"{model_type}: {why}"


def test_hand_checked_families_agree_with_the_generated_list():
    for model_type, entry in integration.HAND_CHECKED.items():
        if model_type in _families.CHECKED:
            assert _families.CHECKED[model_type] == entry, model_type


@pytest.mark.parametrize("model_type", sorted(_families.LEFT_OUT)[:12])
def test_a_family_left_out_is_refused_in_one_line(model_type):
    if model_type in integration.HAND_CHECKED:
        pytest.skip("checked by hand (tests/python/test_transformers_patch.py)")
    config = type("Config", (), {"model_type": model_type})()
    model = torch.nn.Module()
    model.config = config
    with pytest.raises(
        ValueError, match=f"model type '{model_type}' is not one posenc has checked"
    ) as e:
        integration.patch(model)
    assert "\n" not in str(e.value)


def test_the_harness_sees_a_wrong_layout():
    # the check can fail: a half-pair family patched as interleaved (the layout posenc's resolver
    # gives is checked first, so the refusal is the layout line) and an interleaved family as half
    half = next(t for t, e in sorted(_families.CHECKED.items()) if e[2] == "half")
    inter = next(t for t, e in sorted(_families.CHECKED.items()) if e[2] == "interleaved")
    for model_type, wrong in ((half, "interleaved"), (inter, "half")):
        entry = _families.CHECKED[model_type]
        with pf.quiet(), pytest.raises(ValueError, match="pair layout"):
            pf.check(model_type, entry[1], wrong)


def test_the_harness_sees_a_changed_table():
    # one frequency off by one float32 step changes the logits: the comparison is to the bit
    model_type = "olmo2" if "olmo2" in _families.CHECKED else sorted(_families.CHECKED)[0]
    entry = _families.CHECKED[model_type]
    original = integration.RotaryEmbedding.forward

    def nudged(self, *args, **kwargs):
        cos, sin = original(self, *args, **kwargs)
        return cos, torch.nextafter(sin, torch.full_like(sin, 2.0))

    integration.RotaryEmbedding.forward = nudged
    try:
        with pf.quiet():
            why = pf.check(model_type, entry[1], entry[2])
    finally:
        integration.RotaryEmbedding.forward = original
    assert why is not None and "logits differ" in why, why


@pytest.mark.parametrize(
    "model_type,layout,reason",
    [
        # OLMo 2 rotates in float32 (q * float32 tables), so its bfloat16 logits differ; Cohere's
        # module gives interleaved tables, so an unpatched model changes
        ("olmo2", "half", "the family rotates in another precision"),
        ("cohere", "interleaved", "an unpatched model of the family changes"),
        ("gpt_oss", "half", "an unpatched model of the family changes"),  # half-width tables
        # DeepSeek V3.2's apply_rotary_pos_emb is its indexer's (half pairs): patched as the
        # interleaved function, an unpatched model changes; its main attention calls
        # apply_rotary_pos_emb_interleave ("deinterleave", listed)
        ("deepseek_v32", "interleaved", "an unpatched model of the family changes"),
    ],
)
def test_the_harness_sees_families_equal_only_in_float32_or_only_when_patched(
    model_type, layout, reason
):
    model = pf.build(model_type)
    classes = pf.text_rotary_classes(model, pf.modeling_module(model_type))
    with pf.quiet():
        why = pf.check(model_type, classes, layout, model=model)
    assert why is not None and reason in why, why
    assert model_type in _families.LEFT_OUT or _families.CHECKED[model_type][2] != layout


def test_the_harness_sees_a_deinterleave_without_its_split():
    # DeepSeek V3's rotation of interleaved weights returns each head's pairs de-interleaved; the
    # half rotation alone (no split) rotates the wrong pairs and must show in the logits
    entry = _families.CHECKED["deepseek_v3"]
    assert entry[2] == "deinterleave"
    original = integration._rotation

    def no_split(layout):
        return original("half") if layout == "deinterleave" else original(layout)

    integration._rotation = no_split
    try:
        with pf.quiet():
            why = pf.check("deepseek_v3", entry[1], entry[2])
    finally:
        integration._rotation = original
    # the file's rotation is global: an unpatched sibling sees it first
    assert why is not None and ("logits differ" in why or "unpatched model" in why), why


def test_deepseek_v3_without_interleaved_weights_is_refused():
    # rope_interleave=False: its attention calls the half apply_rotary_pos_emb, which the listed
    # entry does not replace; posenc's resolver gives half pairs and patch() refuses in one line
    config = pf.small_config("deepseek_v3")
    config.rope_interleave = False
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(
        ValueError, match="apply_rotary_pos_emb_interleave rotates interleaved"
    ) as e:
        integration.patch(model)
    assert "\n" not in str(e.value)


def test_a_config_edited_after_construction_is_refused():
    # from_pretrained(..., rope_parameters={...}) sets the block on a built config, without the
    # partial factor its constructor fills in: transformers' module turns 8 pairs, the config
    # resolves to 2; patch() compares with the live module's frequencies and refuses
    config = pf.small_config("gpt_neox")
    config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    _refused_untouched(model, "differ from the module's own")


def _refused_untouched(model, match):
    """patch() refuses the model in one line and leaves its rotary modules as they were."""
    with pytest.raises(ValueError, match=match) as e:
        integration.patch(model)
    assert "\n" not in str(e.value)
    assert not any(isinstance(m, integration.RotaryEmbedding) for m in model.modules())


def test_float32_tables_stay_float32():
    import posenc

    config = pf.small_config("olmo2")
    x = torch.zeros(1, 3, 64, dtype=torch.bfloat16)
    positions = torch.arange(3)[None]
    kept = posenc.RotaryEmbedding.from_hf_config(
        config, table_order="transformers", table_dtype="float32"
    )(x, positions)
    cast = posenc.RotaryEmbedding.from_hf_config(config, table_order="transformers")(x, positions)
    assert kept[0].dtype == torch.float32 and cast[0].dtype == torch.bfloat16
    assert torch.equal(kept[0].to(torch.bfloat16), cast[0])
    with pytest.raises(ValueError, match="table_dtype must be 'input' or 'float32'"):
        posenc.RotaryEmbedding.from_hf_config(config, table_dtype="bfloat16")


def test_gemma4s_one_tensor_rotation_is_its_own_for_any_tables():
    # Gemma 4's apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim) is a global of its modeling file:
    # its vision tower calls it too (by keyword, on channel splits with its own tables), so posenc's
    # "half_one" rotation must give transformers' result to the bit for tables that are not
    # cat(t, t) and for strided x as well
    modeling = pf.modeling_module("gemma4")
    theirs = getattr(
        modeling, "_posenc_original_apply_rotary_pos_emb", modeling.apply_rotary_pos_emb
    )
    ours = integration._rotation("half_one")
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        x = torch.randn(2, 7, 3, 24, generator=g).to(dtype)  # [B, L, heads, D]
        cos = torch.randn(2, 7, 24, generator=g).to(dtype)  # any values, halves differ
        sin = torch.randn(2, 7, 24, generator=g).to(dtype)
        part = x[..., :8]  # a channel split: strided
        for args in ((x, cos, sin), (part, cos[..., :8], sin[..., :8])):
            want = theirs(x=args[0], cos=args[1], sin=args[2], unsqueeze_dim=2)
            got = ours(x=args[0], cos=args[1], sin=args[2], unsqueeze_dim=2)
            assert got.dtype == want.dtype and torch.equal(got, want), dtype
        xt = x.transpose(1, 2)  # [B, heads, L, D]
        assert torch.equal(ours(xt, cos, sin), theirs(xt, cos, sin))


def _equal_with_and_without_patch(model):
    import copy

    ids, packed = pf.inputs()
    want = [pf.run(model, ids), pf.run(model, ids, packed)]
    mine = integration.patch(copy.deepcopy(model))
    assert isinstance(mine.model.rotary_emb, integration.RotaryEmbedding)
    return pf.compare(want, [pf.run(mine, ids), pf.run(mine, ids, packed)])


def test_gemma4_with_its_own_global_head_size_and_from_a_saved_config():
    # transformers moves global_head_dim into per_layer_config (keyed by layer index) when it
    # builds or saves the config; posenc's resolver reads it there for the full-attention layers
    keys = dict(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        global_head_dim=64,
        layer_types=["sliding_attention", "full_attention"],
        vocab_size_per_layer_input=101,
        hidden_size_per_layer_input=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config = transformers.Gemma4TextConfig(**keys)
    config._attn_implementation = "eager"
    saved = transformers.Gemma4TextConfig.from_dict(config.to_dict())
    saved._attn_implementation = "eager"
    assert "global_head_dim" not in saved.to_dict()
    for c in (config, saved):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(c).eval()
        inv_freq = model.model.rotary_emb.full_attention_inv_freq  # the 64-wide heads' table:
        assert inv_freq.numel() == 32 and int(inv_freq.count_nonzero()) == 8  # proportional, 1/4
        why = _equal_with_and_without_patch(model)
        assert why is None, why


@pytest.mark.parametrize(
    "edit",
    [
        "phi3 longrope: max_position_embeddings raised after loading",
        "deepseek_v3 yarn: attention_factor set after loading",
    ],
)
def test_an_attention_scaling_the_config_no_longer_gives_is_refused(edit):
    # only the factor on cos and sin changes (inv_freq does not): patch() compares it as well
    if edit.startswith("phi3"):
        config = pf.small_config("phi3")
        config.max_position_embeddings, config.partial_rotary_factor = 64, 0.5
        config.rope_parameters = {
            "rope_type": "longrope",
            "short_factor": [1.0] * 4,
            "long_factor": [2.0] * 4,
            "rope_theta": 10000.0,
            "original_max_position_embeddings": 16,
        }
        config.original_max_position_embeddings = 16
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
        model.config.max_position_embeddings = 128
    else:
        config = pf.small_config("deepseek_v3")
        config.rope_parameters = {
            "rope_type": "yarn",
            "factor": 4.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 8,
            "beta_fast": 32,
            "beta_slow": 1,
            "rope_theta": 10000.0,
        }
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config)
        model.config.rope_parameters["attention_factor"] = 2.0
    _refused_untouched(model, "attention scaling .* differs from the module's own")


def test_deepseeks_deinterleave_rotation_is_its_own_for_any_tables():
    # DeepSeek V3's apply_rotary_pos_emb_interleave reads the first half of each table only;
    # posenc's replacement gives its result to the bit whatever the second half holds
    modeling = pf.modeling_module("deepseek_v3")
    theirs = getattr(
        modeling,
        "_posenc_original_apply_rotary_pos_emb_interleave",
        modeling.apply_rotary_pos_emb_interleave,
    )
    ours = integration._rotation("deinterleave")
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q = torch.randn(2, 4, 5, 8, generator=g).to(dtype)
        k = torch.randn(2, 1, 5, 8, generator=g).to(dtype)
        cos, sin = (torch.randn(2, 5, 8, generator=g).to(dtype) for _ in range(2))
        for got, want in zip(ours(q, k, cos, sin), theirs(q, k, cos, sin)):
            assert got.dtype == want.dtype and torch.equal(got, want), dtype


def test_phimoe_longrope_as_its_checkpoints_configure_it():
    # PhiMoE's module recomputes its frequencies from the config on every call and scales by the
    # config's mscale (Phi-3.5-MoE: long_mscale == short_mscale), not by its attention_scaling;
    # patched, short and long sequences (past original_max_position_embeddings) give its logits
    config = pf.small_config("phimoe")
    pairs = config.hidden_size // config.num_attention_heads // 2
    config.rope_parameters = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.1 * i for i in range(pairs)],
        "long_factor": [2.0 + 0.3 * i for i in range(pairs)],
        "short_mscale": 1.243163121016122,
        "long_mscale": 1.243163121016122,
        "original_max_position_embeddings": 8,
    }
    config.max_position_embeddings = 64
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    import copy

    patched = integration.patch(copy.deepcopy(model))
    for n in (5, 20):
        ids = torch.randint(3, pf.VOCAB, (2, n), generator=torch.Generator().manual_seed(n))
        assert torch.equal(pf.logits(patched, ids), pf.logits(model, ids)), n
    integration.unpatch(patched)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_phimoe_cast_after_patch_keeps_its_float32_frequencies(dtype):
    # PhiMoE's module recomputes float32 frequencies from the config on every call, whatever
    # model.to(dtype) did to its buffers: posenc's replacement must not turn at frequencies a
    # cast after patch() rounded (found by the review: bfloat16 logits off by 2e-3)
    import copy

    model = pf.build("phimoe")
    ids, packed = pf.inputs()
    with pf.quiet():
        want = pf.run(copy.deepcopy(model).to(dtype), ids, packed)
    patched = integration.patch(copy.deepcopy(model)).to(dtype)
    try:
        with pf.quiet():
            got = pf.run(patched, ids, packed)
    finally:
        integration.unpatch(patched)
    assert pf.compare([want], [got]) is None, pf.compare([want], [got])


def test_gemma4_per_layer_head_sizes_resolve_as_transformers_or_are_refused():
    # saved configs keep the head sizes in per_layer_config (by layer index): it wins over a
    # global_head_dim; the layers of one type must agree and layer_types must be given
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    import posenc

    base = dict(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        layer_types=["sliding_attention", "full_attention"] * 2,
    )
    config = transformers.Gemma4TextConfig(**base, global_head_dim=64).to_dict()
    config["global_head_dim"] = 128  # ignored by transformers once per_layer_config is there
    theirs = Gemma4TextRotaryEmbedding(transformers.Gemma4TextConfig.from_dict(config))
    ours = posenc.RotaryEmbedding.from_hf_config(config)
    for t in ("sliding_attention", "full_attention"):
        assert torch.equal(getattr(ours, f"{t}_inv_freq"), getattr(theirs, f"{t}_inv_freq")), t
    differ = dict(config, per_layer_config={"1": {"head_dim": 64}, "3": {"head_dim": 128}})
    with pytest.raises(RuntimeError, match="different head_dims .*not homogeneous"):
        posenc.RotaryEmbedding.from_hf_config(differ)
    untyped = {k: v for k, v in config.items() if k != "layer_types"}
    with pytest.raises(RuntimeError, match="'layer_types' is absent"):
        posenc.RotaryEmbedding.from_hf_config(untyped, layer_type="full_attention")
    # a sliding layers' override, the last layer forced to full attention, an override equal to
    # the base value: as transformers; a per-layer rotary key and a layer named twice: refused
    for per_layer, types in (
        (
            {
                "0": {"head_dim": 48},
                "2": {"head_dim": 48},
                "1": {"head_dim": 64},
                "3": {"head_dim": 64},
            },
            ["sliding_attention", "full_attention"] * 2,
        ),
        ({"3": {"head_dim": 64}}, ["sliding_attention"] * 4),
        ({"1": {"head_dim": 32}, "3": {"head_dim": 32}}, None),
    ):
        edited = dict(
            config, per_layer_config=per_layer, layer_types=types or config["layer_types"]
        )
        theirs = Gemma4TextRotaryEmbedding(transformers.Gemma4TextConfig.from_dict(edited))
        ours = posenc.RotaryEmbedding.from_hf_config(
            dict(edited, layer_types=config["layer_types"] if types is None else types)
        )
        for t in ("sliding_attention", "full_attention"):
            assert torch.equal(getattr(ours, f"{t}_inv_freq"), getattr(theirs, f"{t}_inv_freq"))
    for per_layer, match in (
        (
            {
                "1": {"head_dim": 64, "partial_rotary_factor": 0.5},
                "3": {"head_dim": 64, "partial_rotary_factor": 0.5},
            },
            "sets a rotary parameter per layer",
        ),
        ({"3": {"head_dim": 64}, "03": {"head_dim": 64}}, "names layer 3 twice"),
    ):
        with pytest.raises(RuntimeError, match=match):
            posenc.RotaryEmbedding.from_hf_config(dict(config, per_layer_config=per_layer))


def test_a_model_whose_dynamic_tables_grew_is_refused():
    # dynamic NTK grows transformers' frequencies when the model runs past max_position_embeddings
    # (and keeps them, in float32); posenc's module starts from the config: patch before such use
    config = pf.small_config("llama")
    config.max_position_embeddings = 16
    config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    import copy

    fresh = integration.patch(copy.deepcopy(model))  # before use: taken
    integration.unpatch(fresh)
    pf.logits(
        model, torch.randint(3, pf.VOCAB, (1, 20), generator=torch.Generator().manual_seed(2))
    )
    _refused_untouched(model, "dynamic tables have grown")


# The rotations of families whose tables or precision are not Llama's, each against the family's
# own function for any tables (random values, so a table read in another order shows), q and k of
# different head counts, in every dtype: results to the bit, gradients as the harness's (rtol 1e-5).
OWN_ROTATIONS = [
    ("gpt_oss", "half_pairs"),  # tables [B, N, W/2], first/second halves
    ("cohere", "interleaved_float"),  # repeat_interleave tables, q = q.float() first
    ("cohere2", "interleaved_float"),
    ("modernbert-decoder", "half_float"),  # q.float() * cos per product, tables in x's dtype
    ("ernie4_5", "interleaved_f32"),  # q.float() * cos per product, float32 tables
    ("olmo2", "half_f32"),  # q * float32 tables
]


@pytest.mark.parametrize("model_type,layout", OWN_ROTATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_a_familys_rotation_is_its_own_for_any_tables(model_type, layout, dtype):
    assert _families.CHECKED[model_type][2] == layout
    modeling = pf.modeling_module(model_type)
    theirs = getattr(
        modeling, "_posenc_original_apply_rotary_pos_emb", modeling.apply_rotary_pos_emb
    )
    ours = integration._rotation(layout)
    rotation = integration.ROTATIONS[layout]
    g = torch.Generator().manual_seed(3)
    width = 8 if rotation.tables == "pairs" else 16  # the family's table width
    table_dtype = torch.float32 if rotation.float32_tables else dtype
    cos = torch.randn(2, 5, width, generator=g).to(table_dtype)
    sin = torch.randn(2, 5, width, generator=g).to(table_dtype)
    q0 = torch.randn(2, 4, 5, 16, generator=g).to(dtype)
    k0 = torch.randn(2, 2, 5, 16, generator=g).to(dtype)
    results = []
    for function in (theirs, ours):
        q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
        q_embed, k_embed = function(q, k, cos, sin)
        (q_embed.float().square().sum() + 3 * k_embed.float().sum()).backward()
        results.append((q_embed.detach(), k_embed.detach(), q.grad, k.grad))
    for want, got in zip(*results):
        assert got.dtype == want.dtype and got.shape == want.shape
    for want, got in zip(results[0][:2], results[1][:2]):
        assert torch.equal(got, want), (model_type, dtype, (got - want).abs().max())
    for want, got in zip(results[0][2:], results[1][2:]):
        assert torch.allclose(got.double(), want.double(), rtol=1e-5, atol=1e-7), (
            model_type,
            dtype,
            (got.double() - want.double()).abs().max(),
        )


@pytest.mark.parametrize("model_type", ["gpt_oss", "cohere", "cohere2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_patched_familys_module_returns_its_tables(model_type, dtype):
    # the module's contract: the tables transformers' module returns, in its order, width and dtype
    # (gpt-oss: one value per pair; Cohere: t0 t0 t1 t1 ...)
    import copy

    model = pf.build(model_type)
    theirs = model.model.rotary_emb
    mine = integration.patch(copy.deepcopy(model))
    try:
        ours = mine.model.rotary_emb
        assert isinstance(ours, integration.RotaryEmbedding)
        assert ours.config.to_dict() == theirs.config.to_dict()
        x = torch.zeros(1, dtype=dtype)
        positions = torch.tensor([[0, 1, 2, 7, 300], [5, 4, 3, 2, 1]])
        for want, got in zip(theirs(x, positions), ours(x, positions)):
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    finally:
        integration.unpatch(mine)

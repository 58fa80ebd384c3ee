"""Small randomly initialised models of each supported family, run through transformers' own
modeling code with and without posenc.integrations.transformers.patch(): logits equal (the
rotation and the tables are equal to the bit in float32, so the logits are too) and gradients
equal (rtol 1e-5: posenc's backward is the adjoint rotation, autograd's the formula's)."""

import copy
import importlib

import pytest
import torch

transformers = pytest.importorskip("transformers")

import posenc  # noqa: E402
from posenc.integrations.transformers import SUPPORTED, patch, unpatch  # noqa: E402

COMMON = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    intermediate_size=96,
    vocab_size=101,
    max_position_embeddings=256,
    pad_token_id=0,
)

FAMILIES = {
    "llama": lambda: transformers.LlamaConfig(**COMMON, head_dim=16),
    "llama-llama3": lambda: transformers.LlamaConfig(
        **COMMON,
        head_dim=16,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    "llama-yarn": lambda: transformers.LlamaConfig(
        **COMMON,
        head_dim=16,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    # keys Llama's code does not read: its default rope takes the whole head, rotate_half pairs
    "llama-unread-keys": lambda: transformers.LlamaConfig(
        **COMMON, head_dim=16, partial_rotary_factor=0.5, rope_interleave=True
    ),
    "mistral": lambda: transformers.MistralConfig(**COMMON, head_dim=16),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON),
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=16),
    "gemma3_text": lambda: transformers.Gemma3TextConfig(
        **COMMON, head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"]
    ),
    "phi3-longrope": lambda: transformers.Phi3Config(
        **COMMON,
        original_max_position_embeddings=8,
        partial_rotary_factor=0.5,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0, 1.1, 1.2, 1.3],
            "long_factor": [1.5, 2.0, 3.0, 4.0],
        },
    ),
    "glm": lambda: transformers.GlmConfig(**COMMON, head_dim=16, partial_rotary_factor=0.5),
    "qwen2_vl": lambda: transformers.Qwen2VLConfig(
        text_config=dict(
            COMMON,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3],
            },
        ),
        vision_config=dict(depth=1, embed_dim=32, num_heads=2, hidden_size=64, mlp_ratio=2),
    ),
}


def build(name):
    config = FAMILIES[name]()
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    if name == "qwen2_vl":
        return transformers.Qwen2VLForConditionalGeneration(config).eval()
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def run(model, ids, positions=None):
    model.zero_grad()
    out = model(input_ids=ids, position_ids=positions)
    out.logits.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), grads


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_patched_model_equals_transformers(name):
    model = build(name)
    assert model.config.model_type in SUPPORTED
    torch.manual_seed(1)
    ids = torch.randint(1, 101, (2, 13))
    packed = torch.tensor(
        [list(range(13)), list(range(6)) + list(range(7))]
    )  # two sequences in a row
    if name == "qwen2_vl":  # M-RoPE: (t, h, w) per token, as for a 1 x 3 x 4 grid after text
        t = torch.arange(13)
        packed = torch.stack(
            [t, torch.where(t < 1, t, 1 + (t - 1) // 4), torch.where(t < 1, t, 1 + (t - 1) % 4)]
        )
        packed = packed[:, None].expand(3, 2, 13)
    want = [run(model, ids), run(model, ids, packed)]
    patched = patch(copy.deepcopy(model))
    assert any(isinstance(m, posenc.RotaryEmbedding) for m in patched.modules())
    modeling = importlib.import_module(SUPPORTED[model.config.model_type][0])
    assert hasattr(modeling.apply_rotary_pos_emb, "posenc_layout")  # posenc's rotation is in
    try:
        got = [run(patched, ids), run(patched, ids, packed)]
    finally:
        unpatch(patched)
    for (lw, gw), (lg, gg) in zip(want, got):
        assert torch.equal(lw, lg), (lw - lg).abs().max()
        assert gw.keys() == gg.keys()
        for key in gw:
            torch.testing.assert_close(gg[key], gw[key], rtol=1e-5, atol=1e-7, msg=key)


def test_long_context_past_the_original_is_equal_too():
    model = build("phi3-longrope")  # 8-token original context: 13 tokens take the long factors
    ids = torch.randint(1, 101, (1, 13))
    want = model(input_ids=ids).logits
    got = patch(copy.deepcopy(model))(input_ids=ids).logits
    unpatch(model)
    assert torch.equal(want, got)


def test_a_wrong_layout_would_be_seen():
    # the comparison can fail: GLM's interleaved pairs rotated as halves change the logits
    from posenc.integrations import transformers as integration

    model = build("glm")
    ids = torch.randint(1, 101, (1, 9))
    want = model(input_ids=ids).logits
    patched = patch(copy.deepcopy(model))
    modeling = importlib.import_module(SUPPORTED["glm"][0])
    modeling.apply_rotary_pos_emb = integration._rotation("half")
    try:
        assert not torch.equal(want, patched(input_ids=ids).logits)
    finally:
        unpatch(patched)


def test_models_of_the_family_that_were_not_patched_are_unchanged():
    # the rotation is a global of the modeling file: a GLM model left unpatched goes through
    # posenc's rotation while another is patched, and must compute what it computed before
    ids = torch.randint(1, 101, (2, 9))
    other = build("glm")
    with torch.no_grad():
        before = other(input_ids=ids).logits
    patched = patch(build("glm"))
    try:
        modeling = importlib.import_module(SUPPORTED["glm"][0])
        assert hasattr(modeling.apply_rotary_pos_emb, "posenc_layout")
        with torch.no_grad():
            assert torch.equal(other(input_ids=ids).logits, before)
        second = patch(build("glm"))
        unpatch(second)  # another patched GLM model remains: posenc's rotation stays in
        assert hasattr(modeling.apply_rotary_pos_emb, "posenc_layout")
        with torch.no_grad():
            assert torch.equal(patched(input_ids=ids).logits, before)
    finally:
        unpatch(patched)
    assert not hasattr(modeling.apply_rotary_pos_emb, "posenc_layout")


@pytest.mark.parametrize("name", ["llama", "glm", "phi3-longrope"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=str)
def test_dtype_casts_before_and_after_patch_equal_transformers(name, dtype):
    # transformers' inv_freq buffers follow model.to(dtype) (bfloat16-rounded frequencies); so do
    # posenc's, whether the cast comes before patch() or after it
    ids = torch.randint(1, 101, (1, 13))
    theirs = build(name).to(dtype)
    with torch.no_grad():
        want = theirs(input_ids=ids).logits
    for cast_first in (True, False):
        model = build(name)
        model = patch(model.to(dtype)) if cast_first else patch(model).to(dtype)
        try:
            with torch.no_grad():
                got = model(input_ids=ids).logits
        finally:
            unpatch(model)
        assert got.dtype == want.dtype
        assert torch.equal(got, want), (cast_first, (got.double() - want.double()).abs().max())


def test_transformers_init_weights_leaves_a_patched_model_as_it_was():
    # _init_weights recomputes any *RotaryEmbedding with an original_inv_freq by transformers'
    # own functions: posenc's module keeps its construction-time table under another name
    ids = torch.randint(1, 101, (1, 7))
    model = build("llama")
    with torch.no_grad():
        want = model(input_ids=ids).logits
    patched = patch(copy.deepcopy(model))
    try:
        patched.apply(patched._init_weights)
        for name, p in model.named_parameters():  # _init_weights re-drew the weights: restore them
            patched.get_parameter(name).data.copy_(p.data)
        with torch.no_grad():
            assert torch.equal(patched(input_ids=ids).logits, want)
    finally:
        unpatch(patched)


def test_a_model_built_on_the_meta_device_is_refused_in_one_line():
    # a model built under torch.device("meta") (from_pretrained's empty init, before its weights
    # and buffers are materialized) has no frequencies to compare posenc's with, and a module
    # built there would keep garbage after to_empty(): refused until the model is materialized
    config = FAMILIES["llama"]()
    config._attn_implementation = "eager"
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match="on the meta device") as e:
        patch(model)
    assert "\n" not in str(e.value)
    assert not any(isinstance(m, posenc.RotaryEmbedding) for m in model.modules())


def test_a_config_posencs_resolver_refuses_is_a_one_line_value_error():
    # the resolver's refusal (a RuntimeError from its operator) reaches patch()'s caller as the
    # ValueError patch() documents, naming the module, the model left as it was
    model = build("llama")
    model.config.rope_parameters["rope_type"] = "no_such_type"
    with pytest.raises(ValueError, match="model.rotary_emb: .*unknown rope_type") as e:
        patch(model)
    assert "\n" not in str(e.value)
    assert not any(isinstance(m, posenc.RotaryEmbedding) for m in model.modules())


def test_float64_angles_refuse_a_cast_buffer_in_one_line():
    model = patch(build("llama"), angle_dtype="float64").to(torch.bfloat16)
    try:
        with pytest.raises(ValueError, match="angle_dtype 'float64' needs float64 frequencies"):
            model(input_ids=torch.randint(1, 101, (1, 5)))
    finally:
        unpatch(model)


def test_unchecked_family_is_refused_in_one_line():
    # NanoChat's rotate_half turns by -angle (posenc's resolver refuses it): the line gives the reason
    config = transformers.CONFIG_MAPPING["nanochat"]()
    model = torch.nn.Module()
    model.config = config
    with pytest.raises(
        ValueError, match="model type 'nanochat' is not one posenc has checked"
    ) as e:
        patch(model)
    assert "flips the signs" in str(e.value) and "\n" not in str(e.value)


def test_unpatch_restores_transformers():
    from transformers.models.llama import modeling_llama

    original = modeling_llama.apply_rotary_pos_emb
    model = patch(build("llama"))
    assert modeling_llama.apply_rotary_pos_emb is not original
    unpatch(model)
    assert modeling_llama.apply_rotary_pos_emb is original
    assert not any(isinstance(m, posenc.RotaryEmbedding) for m in model.modules())


@pytest.mark.parametrize("section", [[3, 3, 2], [4, 1, 3], [2, 3, 3]], ids=str)
def test_interleaved_mrope_sections_are_transformers_or_refused(section):
    # Qwen3.5's text rotary (Qwen3_5TextRotaryEmbedding.recomposition_frequencies) lays its M-RoPE
    # sections out by clamped slices: h at pairs 1, 4, ... below 3 s_h, w at 2, 5, ... below
    # 3 s_w, t the rest. posenc's interleave deals the sections round-robin, the same pairs for
    # [3, 3, 2] (and Qwen's [11, 11, 10], [24, 20, 20]) but not for [4, 1, 3] (w at 2, 5 there,
    # 2, 4, 6 in the deal) or [2, 3, 3]: such a model gave other logits (1.2e-2 apart) for
    # positions whose axes differ (found by the peers review); refused now, in one line (by the
    # resolver, src/config/hf_resolve_steps.cpp record_sections; patch() also compares the two
    # modules' tables on such positions)
    config = transformers.Qwen3_5TextConfig(
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        num_hidden_layers=1,
        intermediate_size=32,
        vocab_size=101,
        layer_types=["full_attention"],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": section,
            "partial_rotary_factor": 0.25,  # 16 rotary dimensions: 8 pairs
        },
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():  # attention far from uniform: the positions reach the logits
        for n, p in model.named_parameters():
            if "q_proj" in n or "k_proj" in n:
                p.mul_(8)
    ids = torch.randint(1, 101, (1, 9))
    t = torch.arange(9)
    positions = torch.stack([t, 40 + 3 * t, 90 - 5 * t])[:, None]  # [3, B, N], the axes apart
    with torch.no_grad():
        want = model(input_ids=ids, position_ids=positions).logits
    if section != [3, 3, 2]:
        with pytest.raises(ValueError, match=r"^posenc.patch: .*mrope_section .*not patched$"):
            patch(copy.deepcopy(model))
        # the resolver itself refuses them (posenc.RotaryEmbedding from the config, the CLI's)
        with pytest.raises(RuntimeError, match="clamped slices"):
            posenc.RotaryEmbedding.from_hf_config(config)
        return
    patched = patch(copy.deepcopy(model))
    try:
        with torch.no_grad():
            got = patched(input_ids=ids, position_ids=positions).logits
    finally:
        unpatch(patched)
    assert torch.equal(got, want), (got - want).abs().max()

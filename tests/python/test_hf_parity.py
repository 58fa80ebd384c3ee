"""posenc's Python path against transformers' own rotary code.

1. Every committed architecture (tests/fixtures/hf_architectures, written by
   tools/gen_hf_architectures.py from transformers 5.24.0's rotary classes): posenc.RotaryEmbedding
   built from <model_type>.config.json gives that class's inv_freq, attention_scaling and cos/sin
   to the bit (angle_dtype float32), or is refused with a reason; never a different table.
2. Live: transformers' rotary modules and apply_rotary_pos_emb, called here, on configs of every
   rope_type, against posenc's.
"""

import glob
import importlib
import json
import os

import pytest
import torch

import posenc
from conftest import FIXTURES

ARCH = os.path.join(FIXTURES, "hf_architectures")
# float32 tables are torch's vectorized math at the ATen CPU capability the generator ran at:
# to the bit there, else within tests/test_hf_architectures.cpp's bound (4 eps (1 + |p| max f))
with open(os.path.join(ARCH, "index.json")) as _f:
    BITS_HOLD = (
        json.load(_f).get("aten_cpu_capability", "AVX2") == torch.backends.cpu.get_cpu_capability()
    )


def _rows():
    for path in sorted(glob.glob(os.path.join(ARCH, "*.rotary.json"))):
        model_type = os.path.basename(path)[: -len(".rotary.json")]
        with open(path) as f:
            rotary = json.load(f)
        for table in rotary["tables"]:
            for row in table.get("layer_types", []):
                yield model_type, table, row


def _config(model_type, path):
    """The (sub-)config the class was built from (text_config: the root, as posenc reads it)."""
    with open(os.path.join(ARCH, model_type + ".config.json")) as f:
        node = json.load(f)
    if path in ("", "text_config"):
        return node
    for part in path.split("."):
        node = node[part]
    return node


def _compare(model_type, table, row):
    config = _config(model_type, table.get("config_path", ""))
    if "error" in row or "cos" not in row:  # transformers' own class failed: posenc must refuse
        try:
            posenc.RotaryEmbedding.from_hf_config(config, layer_type=row.get("layer_type"))
        except (RuntimeError, ValueError):
            return "refused", "unprobed"
        return "different", "resolved a table no fixture checks"
    try:
        rope = posenc.RotaryEmbedding.from_hf_config(config, layer_type=row.get("layer_type"))
    except (RuntimeError, ValueError) as e:
        return "refused", str(e).splitlines()[0]
    positions = row["positions"]
    if not positions:
        return "skipped", "no positions probed"
    if "cos" not in row:
        return "skipped", "no cos/sin probed"
    # a vision tower's (row, column) or (t, row, column) per patch: [A, 1, N] position ids
    grid = isinstance(positions[0], list)
    pos = torch.tensor(positions).T[:, None] if grid else torch.tensor(positions)[None]
    cos, sin = rope(torch.zeros(1, dtype=torch.float32), pos, layer_type=row.get("layer_type"))
    f = len(row["cos"][0])
    layout = rope._table(row.get("layer_type")).layout  # posenc's; transformers' when probed
    if row.get("layout", layout) != layout:
        return "different", f"layout {layout} vs transformers' {row['layout']}"
    pick = (lambda t: t[..., :f]) if layout == "half" else (lambda t: t[..., 0::2][..., :f])
    if cos.shape[-1] != 2 * f and cos.shape[-1] != row.get("rotary_dim", 2 * f):
        return "different", f"width {cos.shape[-1]} vs {2 * f}"
    want_cos = torch.tensor(row["cos"], dtype=torch.float32)
    want_sin = torch.tensor(row["sin"], dtype=torch.float32)
    got_cos, got_sin = pick(cos[0]), pick(sin[0])
    if got_cos.shape != want_cos.shape:
        return "different", f"shape {tuple(got_cos.shape)} vs {tuple(want_cos.shape)}"
    if row.get("returns") == "complex" or not BITS_HOLD:
        # Llama 4, DeepSeek-V2: torch.polar(1, p f), whose cos and sin are not torch's vectorized
        # cos and sin: the angles are posenc's to the bit, the cosines within 4 float32 eps
        # (1 + |p| max f) (tests/test_hf_architectures.cpp's bound at another CPU capability);
        # so are all rows at a capability other than the fixtures' (BITS_HOLD)
        f_max = max(abs(v) for v in row.get("inv_freq", [1.0]))
        bound = torch.tensor(
            [4 * 2.0**-23 * (1 + max(map(abs, p if grid else [p])) * f_max) for p in positions]
        )[:, None]
        if not (
            ((got_cos - want_cos).abs() <= bound).all()
            and ((got_sin - want_sin).abs() <= bound).all()
        ):
            return "different", f"cos/sin differ by {(got_cos - want_cos).abs().max().item()}"
    elif not (torch.equal(got_cos, want_cos) and torch.equal(got_sin, want_sin)):
        return "different", f"cos/sin differ by {(got_cos - want_cos).abs().max().item()}"
    if (
        "attention_scaling" in row
        and abs(rope._table(row.get("layer_type")).attention_scaling - row["attention_scaling"])
        > 1e-7
    ):
        return "different", "attention_scaling"
    return "identical", ""


def test_every_committed_architecture_is_identical_or_refused():
    outcomes = {}
    for model_type, table, row in _rows():
        outcome, why = _compare(model_type, table, row)
        outcomes.setdefault(outcome, []).append(
            (model_type, table["class"], row.get("layer_type"), why)
        )
    counts = {k: len(v) for k, v in outcomes.items()}
    print(f"[hf_parity] {counts}")
    assert not outcomes.get("different"), outcomes.get("different")[:10]
    assert counts.get("identical", 0) >= 300, counts


# ---- live transformers code -------------------------------------------------------------------
transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama  # noqa: E402

ROPE_PARAMETERS = [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 64,
    },
    {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
]


def llama_config(rope_parameters, **kw):
    base = dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=2,
        intermediate_size=96,
        vocab_size=101,
        max_position_embeddings=128,
        rope_parameters=dict(rope_parameters),
    )
    base.update(kw)
    return transformers.LlamaConfig(**base)


@pytest.mark.parametrize("params", ROPE_PARAMETERS, ids=lambda p: p["rope_type"])
def test_rotary_module_equals_transformers(params):
    config = llama_config(params)
    theirs = modeling_llama.LlamaRotaryEmbedding(config)
    ours = posenc.RotaryEmbedding.from_hf_config(config)
    x = torch.zeros(1, dtype=torch.float32)
    # lengths in and past the context: dynamic grows its frequencies, and resets below the context
    for n in [5, 100, 300, 40, 129, 500, 20]:
        pos = torch.arange(n)[None].expand(2, n)
        c1, s1 = theirs(x, pos)
        c2, s2 = ours(x, pos)
        assert torch.equal(c1, c2) and torch.equal(s1, s2), (params["rope_type"], n)
        assert ours.attention_scaling == pytest.approx(theirs.attention_scaling, rel=1e-7)


@pytest.mark.parametrize("model_type", ["hunyuan_v1_dense", "hunyuan_v1_moe"])
def test_hunyuan_dynamic_with_alpha_equals_its_class(model_type):
    # HunYuan's class reads 'dynamic' + alpha as ntk_alpha (a fixed base): no growth past the context
    config = transformers.AutoConfig.for_model(
        model_type,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=1,
        intermediate_size=96,
        vocab_size=101,
        max_position_embeddings=32,
        rope_parameters={
            "rope_type": "dynamic",
            "rope_theta": 10000.0,
            "alpha": 1000.0,
            "factor": 1.0,
        },
    )
    modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    cls = next(getattr(modeling, n) for n in dir(modeling) if n.endswith("RotaryEmbedding"))
    theirs = cls(config)
    assert theirs.rope_type == "ntk_alpha"
    ours = posenc.RotaryEmbedding.from_hf_config(config)
    x = torch.zeros(1, dtype=torch.float32)
    for n in [5, 100, 20]:
        pos = torch.arange(n)[None]
        c1, s1 = theirs(x, pos)
        c2, s2 = ours(x, pos)
        assert torch.equal(c1, c2) and torch.equal(s1, s2), n


def test_longrope_switches_tables_as_transformers_does():
    config = transformers.Phi3Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
        intermediate_size=96,
        vocab_size=101,
        max_position_embeddings=256,
        original_max_position_embeddings=64,
        partial_rotary_factor=0.5,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0, 1.1, 1.2, 1.3],
            "long_factor": [1.5, 2.0, 3.0, 4.0],
        },
        pad_token_id=0,
    )
    from transformers.models.phi3 import modeling_phi3

    theirs = modeling_phi3.Phi3RotaryEmbedding(config)
    ours = posenc.RotaryEmbedding.from_hf_config(config)
    x = torch.zeros(1)
    for n in [10, 64, 65, 200, 30]:
        pos = torch.arange(n)[None]
        c1, s1 = theirs(x, pos)
        c2, s2 = ours(x, pos)
        assert torch.equal(c1, c2) and torch.equal(s1, s2), n


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str
)
def test_apply_rotary_pos_emb_equals_transformers(dtype):
    torch.manual_seed(0)
    config = llama_config(ROPE_PARAMETERS[0])
    rope = modeling_llama.LlamaRotaryEmbedding(config)
    b, n = 2, 11
    q = torch.randn(b, n, 4, 16).transpose(1, 2).to(dtype)
    k = torch.randn(b, n, 2, 16).transpose(1, 2).to(dtype)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 7]])
    cos, sin = rope(q, pos)  # packed sequences: positions restart inside a row
    a = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    p = posenc.apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.ops.posenc.apply_rotary_route(q, k, cos, sin, 1, "half") == "fused"
    assert torch.equal(a[0], p[0]) and torch.equal(a[1], p[1])


def test_glm_interleaved_partial_equals_transformers():
    from transformers.models.glm import modeling_glm

    torch.manual_seed(1)
    config = transformers.GlmConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=1,
        intermediate_size=96,
        vocab_size=101,
        partial_rotary_factor=0.5,
    )
    theirs = modeling_glm.GlmRotaryEmbedding(config)
    ours = posenc.RotaryEmbedding.from_hf_config(config)
    q, k = torch.randn(2, 4, 7, 16), torch.randn(2, 2, 7, 16)
    pos = torch.arange(7)[None].expand(2, 7)
    c1, s1 = theirs(q, pos)
    c2, s2 = ours(q, pos)
    a = modeling_glm.apply_rotary_pos_emb(q, k, c1, s1)
    p = posenc.apply_rotary_pos_emb(q, k, c2, s2, layout="interleaved")
    assert ours._table(None).layout == "interleaved" and ours.rotary_dim == 8
    assert torch.equal(a[0], p[0]) and torch.equal(a[1], p[1])


# ---- rotary-embedding-torch (lucidrains): the interleaved layout, partial rotary --------------
def test_rotary_embedding_torch_interleaved_layout():
    rotary_embedding_torch = pytest.importorskip("rotary_embedding_torch")
    torch.manual_seed(2)
    rotary = rotary_embedding_torch.RotaryEmbedding(dim=32)
    q, k = torch.randn(2, 4, 9, 64), torch.randn(2, 2, 9, 64)
    want_q, want_k = rotary.rotate_queries_or_keys(q), rotary.rotate_queries_or_keys(k)
    freqs = rotary(torch.arange(9))  # [N, 32]: each frequency twice, (2i, 2i+1)
    cos, sin = freqs.cos()[None], freqs.sin()[None]
    got_q, got_k = posenc.apply_rotary_pos_emb(q, k, cos, sin, layout="interleaved")
    assert torch.ops.posenc.apply_rotary_route(q, k, cos, sin, 1, "interleaved") == "fused"
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)

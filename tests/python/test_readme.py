"""The README's Python quick start runs as written: its code block is read from README.md and
executed with the names it leaves to the reader (q, k, cos, sin, x, position_ids, config, posemb,
the Qwen2-VL stream, n, v) bound to small real values; each line's claim is then checked
against the peer's own code: transformers' apply_rotary_pos_emb, rotary module, modeling code
(logits patched = unpatched) and get_rope_index, timm's resample_abs_pos_embed, and SDPA over
the plan's parts for plan.attention."""

import os
import re
import shutil

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama  # noqa: E402

import posenc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def quick_start_code() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme.split("## Python quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, f"expected one python block in the quick start, found {len(blocks)}"
    return blocks[0]


def test_the_readme_python_quick_start_runs_as_written(tmp_path, monkeypatch):
    # the config path the README names, from the committed fixture (Llama 3.1 8B's config.json)
    (tmp_path / "Llama-3.1-8B").mkdir()
    shutil.copy(
        os.path.join(ROOT, "tests", "fixtures", "hf_configs", "llama-3.1-8b.json"),
        tmp_path / "Llama-3.1-8B" / "config.json",
    )
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    b, h, n, d = 2, 8, 12, 128
    positions = torch.arange(n)[None].expand(b, n)
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    cos, sin = posenc.rope_cos_sin(positions.float(), inv_freq)
    ns = {
        "q": torch.randn(b, h, n, d),
        "k": torch.randn(b, h, n, d),
        "v": torch.randn(b, h, n, d),
        "cos": cos,
        "sin": sin,
        "n": n,
        "x": torch.randn(b, n, 64),
        "position_ids": positions,
        "config": transformers.LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            vocab_size=100,
        ),
        "posemb": torch.randn(1, 1 + 16 * 16, 32),
        "input_ids": torch.zeros(1, 8, dtype=torch.long),
        "mm_token_type_ids": torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0]]),
        "image_grid_thw": torch.tensor([[1, 4, 4]]),
    }
    # the diffusers line: a tiny Wan 2.1 video transformer (diffusers' own class, random weights)
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    ns["transformer"] = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=16,
        ffn_dim=32,
        num_layers=2,
        rope_max_seq_len=32,
    )
    wan_inputs = {
        "hidden_states": torch.randn(1, 4, 3, 8, 6),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": torch.randn(1, 5, 16),
    }
    with torch.no_grad():
        wan_want = ns["transformer"](**wan_inputs).sample
    q0, k0, posemb0 = ns["q"], ns["k"], ns["posemb"]
    exec(compile(quick_start_code(), "README.md (Python quick start)", "exec"), ns)

    # line 1: transformers' own function, to the bit
    want_q, want_k = modeling_llama.apply_rotary_pos_emb(q0, k0, cos, sin)
    assert torch.equal(ns["q"], want_q) and torch.equal(ns["k"], want_k)
    # the rotary module from config.json: llama3 scaling, theta 5e5, as transformers computes it
    hf_config = transformers.LlamaConfig.from_pretrained(str(tmp_path / "Llama-3.1-8B"))
    hf_rope = modeling_llama.LlamaRotaryEmbedding(hf_config)
    want_cos, want_sin = hf_rope(ns["x"], positions)
    assert torch.equal(ns["cos"], want_cos) and torch.equal(ns["sin"], want_sin)
    # patch(): the model's rotary embedding is posenc's, its logits those of the model unpatched
    model = ns["model"]
    assert type(model.model.rotary_emb).__module__.startswith("posenc")
    ids = torch.randint(0, 100, (2, 10))
    with torch.no_grad():
        patched = model(ids).logits
        posenc.integrations.transformers.unpatch(model)
        assert not type(model.model.rotary_emb).__module__.startswith("posenc")
        assert torch.equal(patched, model(ids).logits)
    # diffusers' patch(): the rotary module is posenc's, the output diffusers' to the bit
    transformer = ns["transformer"]
    assert type(transformer.rope).__module__.startswith("posenc")
    with torch.no_grad():
        assert torch.equal(transformer(**wan_inputs).sample, wan_want)
    posenc.integrations.diffusers.unpatch(transformer)
    assert not type(transformer.rope).__module__.startswith("posenc")
    # timm's resample_abs_pos_embed, to the bit
    timm_pos = pytest.importorskip("timm.layers.pos_embed")
    assert torch.equal(ns["posemb"], timm_pos.resample_abs_pos_embed(posemb0, (24, 24)))
    # Qwen2-VL's get_rope_index, as transformers' own
    from test_streams import _hf

    want_pos, want_delta = _hf(ns["mm_token_type_ids"], ns["image_grid_thw"], None, None)
    assert torch.equal(ns["pos"], want_pos)
    assert torch.equal(ns["deltas"].view(-1), want_delta.view(-1).to(ns["deltas"].dtype))
    # the last line's comment: the fused call equals SDPA over the plan's parts
    plan = ns["plan"]
    qr, kr = plan.rotate(ns["q"], ns["k"])
    want = F.scaled_dot_product_attention(qr, kr, ns["v"], attn_mask=plan.bias(8))
    torch.testing.assert_close(ns["y"], want, rtol=1e-5, atol=1e-5)

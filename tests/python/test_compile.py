"""torch.compile and torch.export over posenc's operators: no graph break, no recompilation across
sequence lengths (dynamic shapes), backward included; an exported module saves and loads."""

import io

import pytest
import torch

import posenc

CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


YARN = dict(
    CONFIG,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    },
)


class Block(torch.nn.Module):
    def __init__(self, config=CONFIG):
        super().__init__()
        self.rope = posenc.RotaryEmbedding.from_hf_config(config)
        self.qk = torch.nn.Linear(64, 64 + 32)

    def forward(self, x, position_ids):
        b, n, _ = x.shape
        q, k = self.qk(x).split([64, 32], dim=-1)
        q = q.view(b, n, 4, 16).transpose(1, 2)
        k = k.view(b, n, 2, 16).transpose(1, 2)
        cos, sin = self.rope(x, position_ids)
        q, k = posenc.apply_rotary_pos_emb(q, k, cos, sin)
        return (q.sum(1) * k.sum(1)).sum(-1)


@pytest.mark.parametrize("config", [CONFIG, YARN], ids=["default", "yarn"])
def test_compile_fullgraph_dynamic_no_recompile_with_backward(config):
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block(config)
    eager = Block(config)
    eager.load_state_dict(block.state_dict())
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in [5, 9, 17]:
            x = torch.randn(2, n, 64, requires_grad=True)
            pos = torch.arange(n)[None].expand(2, n)
            y = compiled(x, pos)
            y.sum().backward()
            gx = x.grad.clone()
            x.grad = None
            ye = eager(x, pos)
            ye.sum().backward()
            torch.testing.assert_close(y, ye, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(gx, x.grad, rtol=1e-5, atol=1e-5)


def test_export_saves_and_loads():
    torch.manual_seed(0)
    block = Block().eval()
    n = torch.export.Dim("n", min=2, max=200)
    x, pos = torch.randn(1, 8, 64), torch.arange(8)[None]
    program = torch.export.export(block, (x, pos), dynamic_shapes=({1: n}, {1: n}))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    for length in (8, 31):
        x, pos = torch.randn(1, length, 64), torch.arange(length)[None]
        torch.testing.assert_close(loaded.module()(x, pos), block(x, pos))
    names = {node.target for node in program.graph.nodes if node.op == "call_function"}
    assert torch.ops.posenc.apply_rotary.default in names
    assert torch.ops.posenc.rope_cos_sin.default in names

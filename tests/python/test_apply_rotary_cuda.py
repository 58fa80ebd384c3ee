"""posenc.apply_rotary_pos_emb on CUDA tensors against transformers' own apply_rotary_pos_emb run
live on the same device, compared as bits (-0.0 and +0.0 differ): Llama's half layout with GQA
heads and packed-sequence positions, GLM's interleaved partial rotary, float32 / bfloat16 /
float16 (float64: the reference on CUDA), out of place, in place, and the gradients of q and k.

On CUDA the operator runs rope_rotate's CUDA kernel in its eager-rounding instantiation
(src/kernels/cuda/rope_cuda.cu, kRoundEach: every product and the sum rounded to the storage type,
no fused multiply-add), which is what makes these equal. The same tests run on the CPU (its
fused kernel) so they are exercised on every machine; the CUDA ones skip without a device. The
CPU emulator checks the CUDA kernel's route bit for bit too (tests/cuda_emu/test_rotary_emu.cpp).
"""

import pytest
import torch

import posenc

# the peer runs live: a GPU machine without transformers (scripts/gpu.sh) skips the file
transformers = pytest.importorskip("transformers")
modeling_glm = pytest.importorskip("transformers.models.glm.modeling_glm")
modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    ),
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _bits(t):
    """The tensor's bits as integers of its width (on the CPU)."""
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16}
    return t.detach().cpu().contiguous().view(ints[t.element_size()])


def _same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _llama(device, dtype):
    config = transformers.LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=1,
        intermediate_size=96,
        vocab_size=101,
    )
    rope = modeling_llama.LlamaRotaryEmbedding(config).to(device)
    b, n = 2, 11
    q = (torch.randn(b, n, 4, 16) * 3).transpose(1, 2).to(device, dtype)
    k = (torch.randn(b, n, 2, 16) * 3).transpose(1, 2).to(device, dtype)
    pos = torch.tensor([list(range(11)), [3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 7]], device=device)
    cos, sin = rope(q, pos)  # in q's dtype, as the model passes them
    return q, k, (cos, sin), (cos, sin), modeling_llama.apply_rotary_pos_emb, "half"


def _glm(device, dtype):
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
    rope = modeling_glm.GlmRotaryEmbedding(config).to(device)
    q = (torch.randn(2, 4, 7, 16) * 3).to(device, dtype)
    k = (torch.randn(2, 2, 7, 16) * 3).to(device, dtype)
    pos = torch.arange(7, device=device)[None].expand(2, 7)
    # GLM's tables hold each frequency in halves (cat(freqs, freqs)); its apply_rotary_pos_emb
    # re-interleaves them, posenc's tables for GLM are interleaved already (test_hf_parity.py)
    ours = posenc.RotaryEmbedding.from_hf_config(config)
    return q, k, rope(q, pos), ours(q, pos), modeling_glm.apply_rotary_pos_emb, "interleaved"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("model", [_llama, _glm], ids=["llama", "glm_interleaved_partial"])
def test_apply_rotary_pos_emb_equals_transformers_to_the_bit(model, dtype, device):
    torch.manual_seed(0)
    q, k, (cos_theirs, sin_theirs), (cos, sin), theirs, layout = model(device, dtype)
    assert cos.device == q.device and cos.dtype == dtype
    route = posenc.apply_rotary_route(q, k, cos, sin, layout=layout)
    if device == "cuda" and dtype == torch.float64:
        assert route.why_not("fused").startswith("float64")
    else:
        assert route.taken == "fused", route
    want_q, want_k = theirs(q, k, cos_theirs, sin_theirs)
    got_q, got_k = posenc.apply_rotary_pos_emb(q, k, cos, sin, layout=layout)
    assert got_q.device == q.device
    assert _same_bits(got_q, want_q) and _same_bits(got_k, want_k)
    q_in, k_in = q.clone(), k.clone()
    posenc.apply_rotary_pos_emb_(q_in, k_in, cos, sin, layout=layout)
    assert _same_bits(q_in, want_q) and _same_bits(k_in, want_k)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES[:3], ids=str)
def test_gradients_equal_transformers_to_the_bit(dtype, device):
    torch.manual_seed(1)
    q, k, _, (cos, sin), theirs, layout = _llama(device, dtype)
    grads = []
    for rotate in (theirs, lambda *a: posenc.apply_rotary_pos_emb(*a, layout=layout)):
        q1, k1 = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
        a, b = rotate(q1, k1, cos, sin)
        probe = torch.Generator(device=device).manual_seed(2)
        ga = torch.randn(a.shape, generator=probe, device=device).to(dtype)
        gb = torch.randn(b.shape, generator=probe, device=device).to(dtype)
        grads.append(torch.autograd.grad((a, b), (q1, k1), (ga, gb)))
    assert _same_bits(grads[0][0], grads[1][0]) and _same_bits(grads[0][1], grads[1][1])

"""posenc.integrations.uni2ts.patch on Moirai-MoE encoders (uni2ts 2.0's TransformerEncoder with
use_moe=True, built with the arguments of uni2ts/model/moirai_moe/module.py MoiraiMoEModule, tiny,
random weights, no downloads): the patched outputs equal uni2ts' own to the bit (torch.equal).

Why to the bit: uni2ts' MoEFeedForward (uni2ts/module/ffn.py) routes each token to the
num_experts_per_token=2 of 32 experts nearest it, a hard torch.topk on torch.cdist(x, centroid).
posenc's fused attention is ~2e-7 from uni2ts' SDPA (within its documented 1e-6), and for a token
near a tie that picks another expert: outputs 6.5e-2 apart in one of 128 encoders (the hostile
review), 0.28 of outputs of size 3.6 in the centroid_scale=1e-5 case below before the fix
(centroids close together, so near-ties are common; the other cases were 5e-7 to 1e-6
apart). patch() now sends every attention of a model holding MoEFeedForward down its path equal
to uni2ts to the bit (posenc's rotation of uni2ts' rows, uni2ts' bias, mask and SDPA);
test_moe_attention_never_takes_the_fused_kernel checks that path.
"""

import copy
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from posenc.integrations import uni2ts as posenc_uni2ts

pytest.importorskip("jaxtyping")
transformer = pytest.importorskip("uni2ts.module.transformer")
norm = pytest.importorskip("uni2ts.module.norm")
position = pytest.importorskip("uni2ts.module.position")
torch_util = pytest.importorskip("uni2ts.common.torch_util")


def _moe_encoder(seed, d_model, centroid_scale):
    """MoiraiMoEModule's encoder (its TransformerEncoder arguments), centroids drawn (uni2ts
    leaves the buffer torch.empty until a checkpoint fills it)."""
    torch.manual_seed(seed)
    encoder = transformer.TransformerEncoder(
        d_model,
        2,
        num_heads=None,
        pre_norm=True,
        attn_dropout_p=0.0,
        dropout_p=0.0,
        norm_layer=norm.RMSNorm,
        activation=F.silu,
        use_moe=True,
        use_glu=True,
        use_qk_norm=True,
        var_attn_bias_layer=partial(position.BinaryAttentionBias),
        time_qk_proj_layer=partial(
            position.QueryKeyProjection,
            proj_layer=position.RotaryProjection,
            kwargs=dict(max_len=128),
            partial_factor=(0.0, 0.5),
        ),
        shared_var_attn_bias=False,
        shared_time_qk_proj=True,
        d_ff=64,
    )
    with torch.no_grad():
        encoder.centroid.normal_().mul_(centroid_scale)
    return encoder.eval()


def _inputs(d_model, packing):
    """Row 0: two series of 2 variates x 10 patches; row 1: one univariate series of 40."""
    sample = torch.tensor([[1] * 20 + [2] * 20, [1] * 40])
    time = torch.stack([torch.arange(10).repeat(4), torch.arange(40)])
    variate = torch.tensor([[0] * 10 + [1] * 10 + [0] * 10 + [1] * 10, [0] * 40])
    if packing == "bidirectional":
        mask = torch_util.packed_attention_mask(sample)
    else:
        mask = torch_util.packed_causal_attention_mask(sample, time)
    return torch.randn(2, 40, d_model), mask, variate, time


CASES = [
    (0, 64, 1.0, "bidirectional"),
    (1, 64, 1.0, "causal"),
    (2, 128, 1.0, "bidirectional"),
    (3, 128, 1.0, "causal"),
    (6, 64, 1e-3, "bidirectional"),
    (0, 64, 1e-5, "causal"),  # the fused kernel flipped experts here: 0.28 apart before the fix
]


@pytest.mark.parametrize("seed, d_model, centroid_scale, packing", CASES)
def test_moe_encoder_patched_equal_to_the_bit(seed, d_model, centroid_scale, packing):
    ref = _moe_encoder(seed, d_model, centroid_scale)
    model = copy.deepcopy(ref)
    assert len(posenc_uni2ts.patch(model)) == 2
    x, mask, variate, time = _inputs(d_model, packing)
    with torch.no_grad():
        want = ref(x, mask, var_id=variate, time_id=time)
        got = model(x, mask, var_id=variate, time_id=time)
    assert torch.equal(got, want), (got - want).abs().max().item()
    posenc_uni2ts.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(x, mask, var_id=variate, time_id=time), want)


def test_moe_encoder_patched_input_gradients_equal_to_the_bit():
    ref = _moe_encoder(0, 64, 1e-5)
    model = copy.deepcopy(ref)
    posenc_uni2ts.patch(model)
    x, mask, variate, time = _inputs(64, "causal")
    seed = torch.randn(2, 40, 64)
    grads = []
    for m in (ref, model):
        xi = x.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(m(xi, mask, var_id=variate, time_id=time), xi, seed)
        grads.append(grad)
    assert torch.equal(grads[1], grads[0])


def test_moe_attention_never_takes_the_fused_kernel(monkeypatch):
    model = _moe_encoder(0, 64, 1.0)
    posenc_uni2ts.patch(model)

    def fused(*args, **kwargs):
        raise AssertionError("a Moirai-MoE attention took posenc's fused kernel")

    monkeypatch.setattr(posenc_uni2ts, "positional_attention", fused)
    x, mask, variate, time = _inputs(64, "bidirectional")
    with torch.no_grad():
        model(x, mask, var_id=variate, time_id=time)
    posenc_uni2ts.unpatch(model)
    assert not any("_posenc_uni2ts_exact" in m.__dict__ for m in model.modules())

"""posenc.sinusoidal_table against transformers' own sinusoidal tables: XLM/DistilBERT's
create_sinusoidal_embeddings (interleaved) and Marian's MarianSinusoidalPositionalEmbedding
(sines, then cosines), and the operator under PyTorch's checks."""

import math

import pytest
import torch

import posenc

distilbert = pytest.importorskip("transformers.models.distilbert.modeling_distilbert")
marian = pytest.importorskip("transformers.models.marian.modeling_marian")


@pytest.mark.parametrize("n_pos,dim", [(512, 768), (64, 32), (1, 2), (100, 6)])
def test_interleaved_equals_distilberts_table(n_pos, dim):
    want = torch.empty(n_pos, dim)
    distilbert._create_sinusoidal_embeddings(n_pos, dim, want)
    got = posenc.sinusoidal_table(n_pos, dim, dtype=torch.float32)
    # both are float64 formulas rounded once to float32 (numpy's p / 10000^(2i/d), posenc's
    # p * 10000^(-2i/d)): equal but where the float64 values straddle a float32 rounding point
    differ = got != want
    assert differ.sum().item() <= max(1, got.numel() // 10000), differ.sum()
    ulp = torch.finfo(torch.float32).eps * want.abs().clamp_min(1e-30)
    assert ((got - want).abs() <= ulp).all()


@pytest.mark.parametrize("n_pos,dim", [(512, 512), (64, 32), (10, 6)])
def test_concat_equals_marians_table(n_pos, dim):
    module = marian.MarianSinusoidalPositionalEmbedding(n_pos, dim)
    want = module.create_weight()
    got = posenc.sinusoidal_table(n_pos, dim, layout="concat", dtype=torch.float32)
    differ = got != want
    assert differ.sum().item() <= max(1, got.numel() // 10000), differ.sum()
    ulp = torch.finfo(torch.float32).eps * want.abs().clamp_min(1e-30)
    assert ((got - want).abs() <= ulp).all()


def test_fractional_positions_and_the_formula_by_hand():
    t = torch.tensor([[0.0, 0.5], [2.25, 1e4]], dtype=torch.float64)  # [2, 2]: any leading shape
    got = posenc.sinusoidal_table(t, 4, base=100.0)
    assert got.shape == (2, 2, 4) and got.dtype == torch.float64
    for idx in [(0, 1), (1, 0), (1, 1)]:
        p = t[idx].item()
        want = [math.sin(p), math.cos(p), math.sin(p / 10.0), math.cos(p / 10.0)]  # 100^(-2/4)
        assert torch.allclose(got[idx], torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)


def test_bad_input_is_one_line_and_opcheck():
    with pytest.raises(RuntimeError, match="dim must be positive and even, got 5"):
        posenc.sinusoidal_table(4, 5)
    with pytest.raises(RuntimeError, match="unknown layout 'mae'"):
        posenc.sinusoidal_table(4, 4, layout="mae")
    with pytest.raises(RuntimeError, match="base must be positive, got -1"):
        posenc.sinusoidal_table(4, 4, base=-1.0)
    with pytest.raises(ValueError, match="a length must be >= 0, got -3"):
        posenc.sinusoidal_table(-3, 4)
    positions = torch.arange(7, dtype=torch.float64).requires_grad_()
    torch.library.opcheck(torch.ops.posenc.sinusoidal_table, (positions, 8), {"layout": "concat"})
    # the table's gradient with respect to fractional positions (timestamps) is the formula's
    assert torch.autograd.gradcheck(
        lambda p: posenc.sinusoidal_table(p, 6, base=10.0),
        (positions.detach()[:4].clone().requires_grad_(),),
    )

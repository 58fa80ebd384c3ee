"""Every torch.ops.posenc operator has a fake kernel, and the fake promises what the real one returns.

torch.compile and torch.export trace an operator with fake tensors (shapes, dtypes, strides and a
device, no values), so each operator needs either its own fake kernel (torch.library.register_fake
in python/posenc/_meta.py, which also registers it for the Meta dispatch key) or a
CompositeImplicitAutograd kernel (it decomposes into operators that have theirs). A
CompositeExplicitAutograd kernel is not enough: it runs the real C++ code on fake tensors, which
fails where the code reads values (the two stream operators did until they got fakes).

The operators are enumerated from the dispatcher (torch._C._dispatch_get_all_op_names), so a new
operator without a fake fails here; and each is run under FakeTensorMode on the example call of
test_operator_entry.py (or the one below for operators with fewer than two tensor arguments), its
results compared with the real call's: shapes, dtypes and strides of every tensor, and the other
results (the route explainers' strings, hf_rope's scaling) equal.
"""

import json
import re

import pytest
import torch
from torch._library.simple_registry import singleton
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

import posenc
from test_operator_entry import EXAMPLES

OPS = torch.ops.posenc

# One valid call for each operator that test_operator_entry.py leaves out (fewer than two tensors).
SINGLE_TENSOR_EXAMPLES = {
    "sinusoidal_table": lambda: [torch.arange(5.0), 8, 10000.0, "interleaved"],
    "hf_rope": lambda: [
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_attention_heads": 4,
                "rope_theta": 10000.0,
                "max_position_embeddings": 128,
            }
        )
    ],
    "patch_grid_bands": lambda: [4, True, 224.0, 10000.0, False],
    "patch_grid_rope": lambda: [[3, 4], torch.linspace(1.0, 8.0, 4)],
    "resample_grid_table": lambda: [torch.randn(1 + 16, 8), [4, 4], [6, 5], 1],
    "axial_sincos_table": lambda: [torch.rand(6, 2), 8],
    "patch_grid_coords": lambda: [[3, 4]],
    "dinov3_periods": lambda: [16],
}


def all_operators():
    return sorted(
        n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("posenc::")
    )


def has_fake(name: str) -> bool:
    qualified = f"posenc::{name}"
    return singleton.find(
        qualified
    ).fake_impl.kernel is not None or torch._C._dispatch_has_kernel_for_dispatch_key(
        qualified, "Meta"
    )


def decomposes(name: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        f"posenc::{name}", "CompositeImplicitAutograd"
    )


def test_every_operator_has_a_fake_kernel():
    names = all_operators()
    assert "apply_rotary" in names and "qwen2_vl_rope_index" in names
    missing = [n for n in names if not (has_fake(n) or decomposes(n))]
    assert not missing, f"operators without a fake kernel (python/posenc/_meta.py): {missing}"
    # the stream operators have their own fakes (their composite kernel reads values)
    assert has_fake("qwen2_vl_rope_index") and has_fake("qwen2_5_omni_rope_index")


def test_every_operator_has_an_example_here():
    examples = {**EXAMPLES, **SINGLE_TENSOR_EXAMPLES}
    missing = [n for n in all_operators() if n not in examples]
    assert not missing, (
        f"operators without an example call (test_operator_entry.EXAMPLES or "
        f"SINGLE_TENSOR_EXAMPLES here): {missing}"
    )


# The route explainers (a str naming the kernel a call would take and why) read the tables' values
# (do a pair's two members hold the same value? is a float64 table exact in float32?, at::equal in
# src/bindings/rotary.cpp; positional_attention_route reads its arguments' storage there):
# inspection, not traced; under FakeTensorMode they stop with a RuntimeError (torch's
# DataDependentOutputException, or "data is not allocated" for a storage read), never a made-up
# answer.
READS_VALUES = {"apply_rotary_route", "apply_rotary_backward_route", "positional_attention_route"}


def _flat(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


@pytest.mark.parametrize("name", sorted({**EXAMPLES, **SINGLE_TENSOR_EXAMPLES}))
def test_the_fake_promises_what_the_real_call_returns(name):
    if not hasattr(OPS, name):
        pytest.skip(f"posenc::{name} is not registered in this build")
    example = {**EXAMPLES, **SINGLE_TENSOR_EXAMPLES}[name]
    want = _flat(getattr(OPS, name)(*example()))
    mode = FakeTensorMode()
    args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in example()]
    if name in READS_VALUES:
        assert isinstance(want[0], str), (name, want)
        with mode, pytest.raises(RuntimeError) as info:
            getattr(OPS, name)(*args)
        assert isinstance(info.value, DataDependentOutputException) or (
            "data is not allocated" in str(info.value)
        ), (name, info.value)
        return
    with mode:
        got = _flat(getattr(OPS, name)(*args))
    assert len(got) == len(want), (name, len(got), len(want))
    for i, (w, g) in enumerate(zip(want, got)):
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor), (name, i, type(g))
            assert (g.shape, g.dtype, g.device) == (w.shape, w.dtype, w.device), (name, i, g, w)
            if w.numel() > 1:
                assert g.stride() == w.stride(), (name, i, g.stride(), w.stride())
        else:
            assert g == w, (name, i, g, w)


def test_the_stream_fakes_refuse_what_the_kernels_refuse_without_values():
    types, mask, images, videos = (
        torch.zeros(2, 5, dtype=torch.long),
        torch.ones(2, 5, dtype=torch.long),
        torch.zeros(0, 3, dtype=torch.long),
        torch.zeros(0, 3, dtype=torch.long),
    )
    seconds = torch.zeros(0, dtype=torch.float64)
    mode = FakeTensorMode()
    fake = [mode.from_tensor(t) for t in (types, mask, images, videos, seconds)]
    cases = [
        ([fake[0].float(), *fake[1:]], "token types must be integers (0 text, 1 image, 2 video)"),
        ([fake[0][0], *fake[1:]], "token types must be [batch, length]"),
        ([fake[0], fake[1][:, :3], *fake[2:]], "attention_mask must be (2, 5), got (2, 3)"),
        ([fake[0], fake[1].float(), *fake[2:]], "attention_mask must be bool or integer"),
    ]
    for args, message in cases:
        with mode, pytest.raises(RuntimeError, match=re.escape(message)):
            OPS.qwen2_vl_rope_index(*args)
    # all on meta: the shapes; a meta tensor among CPU ones: one line naming it
    position_ids, deltas = OPS.qwen2_vl_rope_index(
        *[t.to("meta") for t in (types, mask, images, videos, seconds)]
    )
    assert position_ids.shape == (3, 2, 5) and deltas.shape == (2, 1)
    assert position_ids.dtype == deltas.dtype == torch.long
    with pytest.raises(RuntimeError, match="attention_mask is on meta, which holds no values"):
        OPS.qwen2_vl_rope_index(types, mask.to("meta"), images, videos, seconds)


def test_get_rope_index_compiles_with_the_stream_fakes():
    types = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0]])
    grid = torch.tensor([[1, 4, 4]])
    want = posenc.get_rope_index(types, types, grid)
    compiled = torch.compile(
        lambda ids, t, g: posenc.get_rope_index(ids, t, g), fullgraph=True, backend="eager"
    )
    got = compiled(types, types, grid)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

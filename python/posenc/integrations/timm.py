"""posenc inside a loaded timm model: its axial RoPE tables computed by posenc's operators.

    model = timm.create_model("eva02_tiny_patch14_224.mim_in22k", pretrained=True)
    posenc.integrations.timm.patch(model)      # every RotaryEmbeddingCat / RotaryEmbedding
    logits = model(images)                     # the same logits, to the bit

Each timm.layers RotaryEmbeddingCat or RotaryEmbedding submodule (EVA-02's and the ViT-RoPE
models' `rope`) is replaced by posenc.timm's module of the same class built from its settings
(RotaryEmbeddingCat.from_timm): the tables come from torch.ops.posenc.patch_grid_rope and equal
timm's to the bit, so the model's outputs are timm's. The rotation stays timm's own
apply_rot_embed_cat (no module-level function is replaced, so other models in the process are
untouched). A rotary module posenc does not compute (RotaryEmbeddingMixed's learned frequencies,
DINOv3's, MRoPE), one that augments its coordinates in training, or one whose cached table is
not what its settings give (cast through a lower precision and back, e.g. .half().float()) is
left as it is and named in the returned report; patch(..., strict=True) refuses such a model
with one line instead. The model may be cast or moved before patch() (posenc's module takes
the timm module's bands and cache dtypes and device: .double(), .half(), .bfloat16() give
timm's logits) or after it (posenc's module casts as timm's does).

unpatch(model) puts the original modules back in the model's present state: each kept timm
module follows every cast and move (.half(), .double(), .to(device)) and grid change
(update_feat_shape, set_input_size) made to its replacement while patched, and takes its
train/eval mode, so it is the module the model would hold had it never been patched.
"""

from __future__ import annotations

from typing import Dict, List

import torch

from .. import timm as _ptimm

__all__ = ["patch", "unpatch"]

_ORIGINAL = _ptimm._ORIGINAL  # where the replaced module is kept


def _timm_classes():
    from timm.layers import pos_embed_sincos as t  # imported on use: timm is optional
    return t


def _replacement(module: torch.nn.Module):
    t = _timm_classes()
    if type(module) is t.RotaryEmbeddingCat:
        cls = _ptimm.RotaryEmbeddingCat
    elif type(module) is t.RotaryEmbedding:
        cls = _ptimm.RotaryEmbedding
    else:
        return None, f"{type(module).__name__} (not computed by posenc)"
    if getattr(module, "aug_active", False):
        return None, f"{type(module).__name__} augments its coordinates in training"
    try:
        return cls.from_timm(module), None
    except ValueError as e:  # a cache posenc would not give: one line, from_timm's
        return None, str(e).split(": ", 1)[1]


def _rotary_modules(model: torch.nn.Module):
    t = _timm_classes()
    kinds = tuple(getattr(t, n) for n in ("RotaryEmbeddingCat", "RotaryEmbedding",
                                          "RotaryEmbeddingMixed", "RotaryEmbeddingDinoV3",
                                          "RotaryEmbeddingMRope") if hasattr(t, n))
    for name, module in model.named_modules():
        if isinstance(module, kinds) and not isinstance(module, (_ptimm.RotaryEmbeddingCat,
                                                                 _ptimm.RotaryEmbedding)):
            yield name, module


def _set(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, module)


def patch(model: torch.nn.Module, strict: bool = False) -> Dict[str, List[str]]:
    """Replace the model's timm rotary modules by posenc's; returns {"patched": [...],
    "left": ["name: why", ...]}. strict=True: a module left as it is raises ValueError (nothing
    is replaced then)."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"posenc.integrations.timm.patch: expected an nn.Module, got "
                         f"{type(model).__name__}")
    plan, left = [], []
    for name, module in list(_rotary_modules(model)):
        new, why = _replacement(module)
        if new is None:
            left.append(f"{name}: {why}")
        else:
            plan.append((name, module, new))
    if strict and left:
        raise ValueError(f"posenc.integrations.timm.patch: {type(model).__name__} has rotary "
                         f"modules posenc does not compute: {'; '.join(left)}")
    for name, module, new in plan:
        # kept, but not as a submodule (no state_dict keys); it follows new's casts and grids
        object.__setattr__(new, _ORIGINAL, module)
        _set(model, name, new)
    return {"patched": [name for name, _, _ in plan], "left": left}


def unpatch(model: torch.nn.Module) -> List[str]:
    """Put back the modules patch() replaced, in the model's present state (dtype, device,
    grid, train/eval); returns their names."""
    restored = []
    for name, module in list(model.named_modules()):
        original = module.__dict__.get(_ORIGINAL)
        if original is not None:
            object.__delattr__(module, _ORIGINAL)  # no longer follows: the model holds it again
            original.train(module.training)
            _set(model, name, original)
            restored.append(name)
    return restored

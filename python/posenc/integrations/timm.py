"""posenc inside a loaded timm model: its RoPE tables computed by posenc's operators.

    model = timm.create_model("eva02_tiny_patch14_224.mim_in22k", pretrained=True)
    posenc.integrations.timm.patch(model)      # every rotary module timm.layers defines
    logits = model(images)                     # the same logits, to the bit

Each timm.layers rotary submodule (the model's `rope`) is replaced by posenc.timm_layers's module of the
same class built from its settings and state (from_timm), so the model's outputs are timm's:

    RotaryEmbeddingCat, RotaryEmbedding   EVA-02, ViT-RoPE: axial tables from
                                          torch.ops.posenc.patch_grid_rope
    RotaryEmbeddingMixed                  RoPE-Mixed (vit_*_rope_mixed_*): the module's own
                                          learned freqs parameter (shared: the same state_dict,
                                          gradients reach it), tables from
                                          torch.ops.posenc.rope_mixed_cos_sin
    RotaryEmbeddingDinoV3                 DINOv3 (vit_*_dinov3*): tables from
                                          torch.ops.posenc.rope_periods_cos_sin
    RotaryEmbeddingMRope                  interleaved MRoPE: torch.ops.posenc.rope_cos_sin

Modules that augment their coordinates in training (shift / jitter / rescale_coords) are computed
too, with timm's random draws in timm's order: the same seed gives timm's tables and logits in
train mode. The rotation stays timm's own apply_rot_embed_cat (no module-level function is
replaced, so other models in the process are untouched).

Left as it is and named in the returned report (patch(..., strict=True) refuses such a model with
one line instead): a module on the meta device (patch after loading), a subclass of these
classes, an axial RotaryEmbeddingCat / RotaryEmbedding that augments float64 bands (timm's float64
training tables), a cached table or grid that is not what
its settings give (cast through a lower precision and back, e.g. .half().float(), or edited), an
MRoPE section whose channel order posenc's interleave does not give, an MRoPE module already cast
to float64 (timm's float64 tables, which rope_cos_sin rounds to float32). The model may be cast or
moved before patch() (posenc's module takes the timm module's buffer dtypes and device: .double(),
.half(), .bfloat16() give timm's logits) or after it (posenc's module casts as timm's does; an
MRoPE module cast to float64 after patch() raises one line at its forward).

unpatch(model) puts the original modules back in the model's present state: each kept timm
module follows every cast and move (.half(), .double(), .to(device)) and grid change
(update_feat_shape, set_input_size) made to its replacement while patched, and takes its
train/eval mode, so it is the module the model would hold had it never been patched (RoPE-Mixed's
freqs is the same parameter throughout: what training changed while patched stays).
"""

from __future__ import annotations

import torch

from .. import timm_layers as _ptimm

__all__ = ["patch", "unpatch"]

_ORIGINAL = _ptimm._ORIGINAL  # where the replaced module is kept


# timm's class name -> posenc's (the same contract, timm's signatures)
_CLASSES = (
    ("RotaryEmbeddingCat", _ptimm.RotaryEmbeddingCat),
    ("RotaryEmbedding", _ptimm.RotaryEmbedding),
    ("RotaryEmbeddingMixed", _ptimm.RotaryEmbeddingMixed),
    ("RotaryEmbeddingDinoV3", _ptimm.RotaryEmbeddingDinoV3),
    ("RotaryEmbeddingMRope", _ptimm.RotaryEmbeddingMRope),
)


def _timm_classes():
    from timm.layers import pos_embed_sincos as t  # imported on use: timm is optional

    return t


def _replacement(module: torch.nn.Module):
    t = _timm_classes()
    cls = next((ours for name, ours in _CLASSES if type(module) is getattr(t, name, None)), None)
    if cls is None:
        return None, f"{type(module).__name__} (not computed by posenc)"
    if any(t.is_meta for t in (*module.parameters(), *module.buffers())):
        return None, (
            f"{type(module).__name__}'s tables are on the meta device (not materialised); "
            f"patch the model after loading it"
        )
    try:
        return cls.from_timm(module), None
    except ValueError as e:  # a cache or section posenc would not give: one line, from_timm's
        return None, str(e).split(": ", 1)[1]


def _rotary_modules(model: torch.nn.Module):
    t = _timm_classes()
    kinds = tuple(getattr(t, n) for n, _ in _CLASSES if hasattr(t, n))
    ours = tuple(cls for _, cls in _CLASSES)
    for name, module in model.named_modules():
        if isinstance(module, kinds) and not isinstance(module, ours):
            yield name, module


def _set(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, module)


def patch(model: torch.nn.Module, strict: bool = False) -> dict[str, list[str]]:
    """Replace the model's timm rotary modules by posenc's; returns {"patched": [...],
    "left": ["name: why", ...]}. strict=True: a module left as it is raises ValueError (nothing
    is replaced then)."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(
            f"posenc.integrations.timm.patch: expected an nn.Module, got {type(model).__name__}"
        )
    plan, left = [], []
    for name, module in list(_rotary_modules(model)):
        new, why = _replacement(module)
        if new is None:
            left.append(f"{name}: {why}")
        else:
            plan.append((name, module, new))
    if strict and left:
        raise ValueError(
            f"posenc.integrations.timm.patch: {type(model).__name__} has rotary "
            f"modules posenc does not compute: {'; '.join(left)}"
        )
    for name, module, new in plan:
        # kept, but not as a submodule (no state_dict keys); it follows new's casts and grids
        object.__setattr__(new, _ORIGINAL, module)
        _set(model, name, new)
    return {"patched": [name for name, _, _ in plan], "left": left}


def unpatch(model: torch.nn.Module) -> list[str]:
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

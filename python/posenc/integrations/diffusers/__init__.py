"""posenc inside a loaded diffusers transformer: its rotary module and its attention processors'
rotation computed by posenc.

    transformer = WanTransformer3DModel.from_pretrained(...)
    report = posenc.integrations.diffusers.patch(transformer)   # {"patched": [...], "left": [...]}
    video = pipe(...)                                            # the same output, to the bit
    posenc.integrations.diffusers.unpatch(transformer)           # diffusers' own objects back

What is replaced is read from one table (_registry.FAMILIES, one Family per diffusers rotary
module class; each family module of this package registers its own at import):
  - each submodule whose type is a family's rotary class -> posenc's module built by the
    family's `replace` from the module's own settings; it computes the same positions and the
    same cos/sin tables on the same device path (float64 where diffusers computes float64,
    float32 where it falls back), checked against the module's own tables when it is built;
  - each attention module's processor whose class a family lists -> posenc's processor: the same
    attention, the rotation through posenc's fused operator torch.ops.posenc.apply_rotary (its
    __call__ names every parameter diffusers' does: diffusers' Attention drops keyword arguments
    a processor does not name, image_rotary_emb among them).
Nothing global is replaced (no module-level function of diffusers), so other models in the
process are untouched. The families and their verdicts are in docs/diffusers.md.

A rotary module no family computes (a class whose name says rotary/RoPE/PosEmbed), a module the
family refuses (a setting posenc does not reproduce, tables that are not what its settings give),
or a processor that rotates (its __call__ takes a rotary table) but is not listed is named in the
report's "left" list, and its model keeps diffusers' object there; patch(..., strict=True) refuses
such a model with one ValueError line before anything in it is changed.

unpatch(transformer) puts back the very objects patch() replaced, in the model's present state:
a kept rotary module follows every cast and move made to its replacement (it is kept on the
replacement, not registered: no state_dict keys), takes its train/eval mode, and a kept
processor takes the attention backend and parallel config set on its replacement meanwhile.

diffusers is imported on first use; posenc imports without it.
"""

from __future__ import annotations

import importlib
import inspect
import re

import torch

__all__ = [
    "patch",
    "unpatch",
    "FAMILY_MODULES",
    "get_3d_rotary_pos_embed",
    "get_resize_crop_region_for_grid",
    "apply_rotary_emb",
]

# The family modules of this package, imported on first use (each registers its Family).
_FAMILY_MODULES = (
    "_wan",
    "_skyreels_v2",
    "_hunyuan_video",
    "_hunyuan_video15",
    "_flux",
    "_flux2",
    "_cogvideox",
    "_ltx",
    "_ltx2",
    "_cosmos",
    "_mochi",
    "_qwenimage",
    "_wan_animate",
    "_sana_video",
    "_chronoedit",
    "_flux3",
    "_krea2",
    "_hunyuan_video_framepack",
    "_flux_like",
    "_hunyuanimage",
    "_motif_video",
)
FAMILY_MODULES = _FAMILY_MODULES
# CogVideoX's pipeline-side table builders under diffusers' names (no diffusers import needed)
from ._cogvideox_tables import get_3d_rotary_pos_embed, get_resize_crop_region_for_grid  # noqa: E402

# diffusers' embeddings.apply_rotary_emb (use_real=True) through posenc's operator, to the bit
from ._common import apply_rotary_emb  # noqa: E402

_ORIGINAL = "_posenc_diffusers_original"  # as _common.ORIGINAL (kept here: no diffusers import)
# where a replaced processor is kept on its replacement (apart from _ORIGINAL: a processor may be
# an nn.Module, which named_modules() visits too)
_ORIGINAL_PROCESSOR = "_posenc_diffusers_original_processor"
# processor settings diffusers sets on a processor instance (set_attention_backend, context
# parallel): carried back to the original on unpatch
_PROCESSOR_SETTINGS = ("_attention_backend", "_parallel_config")
# a submodule that looks rotary by its class name (reported when no family computes it)
_ROTARY_NAME = re.compile(r"Rotary|RoPE|Rope|PosEmbed")
_loaded = False


def _load_families():
    """Imports diffusers and the family modules once; returns the registry module."""
    global _loaded
    try:
        importlib.import_module("diffusers")
    except ImportError as e:
        raise ValueError(
            f"posenc.integrations.diffusers: diffusers is not importable ({e})"
        ) from None
    from . import _registry

    if not _loaded:
        for name in _FAMILY_MODULES:
            importlib.import_module(f"{__name__}.{name}")
        _loaded = True
    return _registry


def _rotates(processor) -> bool:
    """Whether a processor's __call__ takes a rotary table (diffusers passes it by name)."""
    try:
        parameters = inspect.signature(processor.__call__).parameters
    except (TypeError, ValueError):
        return False
    return any("rotary" in p or p == "freqs_cis" for p in parameters)


def _processor_of(module: torch.nn.Module):
    """An attention module's processor: diffusers' Attention classes (set_processor) and those
    holding a plain `processor` attribute without it (MochiAttention)."""
    if hasattr(module, "set_processor") or "processor" in vars(module):
        return getattr(module, "processor", None)
    return None


def _set(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, module)


def _plan(model: torch.nn.Module, registry):
    """(rotary replacements, processor replacements, left, count already posenc's): everything
    built, nothing changed."""
    by_processor = {}
    for family in registry.FAMILIES:
        by_processor.update(family.processors)
    modules, processors, left, already = [], [], [], 0
    for name, module in model.named_modules():
        if _ORIGINAL in module.__dict__:  # posenc's, from an earlier patch()
            already += 1
            continue
        family = registry.family_of(module)
        if family is not None:
            try:
                modules.append((name, module, family.replace(module)))
            except ValueError as e:
                why = str(e).split(": ", 1)[-1]
                left.append(f"{name or 'the model'}: {type(module).__name__} ({why})")
        elif (
            _ROTARY_NAME.search(type(module).__name__)
            and not list(module.children())
            and not type(module).__module__.startswith("posenc.")
        ):
            left.append(f"{name or 'the model'}: {type(module).__name__} (not computed by posenc)")
        processor = _processor_of(module)
        if processor is None:
            continue
        if getattr(processor, _ORIGINAL_PROCESSOR, None) is not None:
            already += 1
            continue
        factory = by_processor.get(registry.qualified_name(processor))
        if factory is not None:
            try:
                processors.append((name, module, processor, factory(processor)))
            except ValueError as e:
                why = str(e).split(": ", 1)[-1]
                left.append(f"{name}.processor: {type(processor).__name__} ({why})")
        elif _rotates(processor):
            left.append(
                f"{name}.processor: {type(processor).__name__} (its rotation is not "
                f"computed by posenc)"
            )
    return modules, processors, left, already


def patch(transformer: torch.nn.Module, strict: bool = False) -> dict[str, list[str]]:
    """Replace the transformer's rotary modules and rotating processors by posenc's; returns
    {"patched": [names], "left": ["name: why", ...]}. strict=True: anything left raises
    ValueError (nothing is replaced then)."""
    if not isinstance(transformer, torch.nn.Module):
        raise ValueError(
            f"posenc.integrations.diffusers.patch: expected an nn.Module, got "
            f"{type(transformer).__name__}"
        )
    registry = _load_families()
    modules, processors, left, already = _plan(transformer, registry)
    if not modules and not processors and not left and not already:
        left.append(
            f"{type(transformer).__name__}: no rotary module or processor posenc computes "
            f"(families: {', '.join(f.name for f in registry.FAMILIES)})"
        )
    if strict and left:
        raise ValueError(
            f"posenc.integrations.diffusers.patch: {type(transformer).__name__} has "
            f"what posenc does not compute: {'; '.join(left)}"
        )
    for name, module, new in modules:
        object.__setattr__(new, _ORIGINAL, module)  # kept, not registered; follows new's casts
        new.train(module.training)
        _set(transformer, name, new)
    for _name, attention, processor, new in processors:
        # kept on the replacement, not registered (an nn.Module processor's weights are its
        # replacement's too: no second set of state_dict keys)
        object.__setattr__(new, _ORIGINAL_PROCESSOR, processor)
        attention.processor = new  # an nn.Module processor is registered in its place
    return {
        "patched": [n for n, _, _ in modules] + [f"{n}.processor" for n, *_ in processors],
        "left": left,
    }


def unpatch(transformer: torch.nn.Module) -> list[str]:
    """Put back the objects patch() replaced, in the model's present state; returns their names."""
    if not isinstance(transformer, torch.nn.Module):
        raise ValueError(
            f"posenc.integrations.diffusers.unpatch: expected an nn.Module, got "
            f"{type(transformer).__name__}"
        )
    restored = []
    for name, module in list(transformer.named_modules()):
        original = module.__dict__.get(_ORIGINAL)
        if original is not None:
            object.__delattr__(module, _ORIGINAL)  # no longer follows: the model holds it again
            original.train(module.training)
            _set(transformer, name, original)
            restored.append(name)
            continue
        processor = _processor_of(module)
        original = getattr(processor, _ORIGINAL_PROCESSOR, None) if processor is not None else None
        if original is not None:
            for setting in _PROCESSOR_SETTINGS:
                if setting in vars(processor):
                    setattr(original, setting, getattr(processor, setting))
            if isinstance(original, torch.nn.Module):  # its weights are shared; its mode is not
                original.train(processor.training)
            object.__delattr__(processor, _ORIGINAL_PROCESSOR)
            module.processor = original
            restored.append(f"{name}.processor")
    return restored

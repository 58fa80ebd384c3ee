"""The table of diffusers families posenc computes: one Family per rotary module class.

Each family module of this package (_wan.py, _flux.py, _ltx.py, ...) describes what posenc
replaces in a loaded diffusers transformer of its family and registers it here at import;
patch() / unpatch() (this package's __init__) read only this table, never a family's name.

    Family(name="wan",
           rotary_class="diffusers.models.transformers.transformer_wan.WanRotaryPosEmbed",
           replace=WanRotaryPosEmbed.from_diffusers,          # diffusers' module -> posenc's
           processors={"diffusers.models.transformers.transformer_wan.WanAttnProcessor":
                       WanAttnProcessor.from_diffusers})       # where the processor rotates

`replace(module)` returns posenc's module computing the same tables from the module's own
settings and state, or raises ValueError with one line saying why posenc cannot (a setting it
does not reproduce); patch() then refuses the model before anything in it is changed.
`processors` maps a diffusers attention-processor class to a factory of posenc's processor
(the same attention, the rotation through posenc's operator); empty where the rotation is
applied outside a processor (then the rotary module's replacement is the whole patch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable

import torch

__all__ = ["Family", "FAMILIES", "register", "qualified_name"]


@dataclass(frozen=True)
class Family:
    name: str  # posenc's short name of the family ("wan", "ltx2", ...), used in reports
    rotary_class: str  # diffusers' rotary module class, qualified ("diffusers.models....Class")
    replace: Callable[[torch.nn.Module], torch.nn.Module]
    processors: Mapping[str, Callable[[object], object]] = field(default_factory=dict)


FAMILIES: list[Family] = []
_BY_CLASS: dict[str, Family] = {}


def qualified_name(obj_or_type) -> str:
    """'module.Class' of an object's type (or of a type)."""
    cls = obj_or_type if isinstance(obj_or_type, type) else type(obj_or_type)
    return f"{cls.__module__}.{cls.__qualname__}"


def register(family: Family) -> Family:
    """Adds a family to the table; a second family for the same rotary class is a bug."""
    if family.rotary_class in _BY_CLASS:
        raise RuntimeError(
            f"posenc.integrations.diffusers: {family.rotary_class} is registered "
            f"twice ({_BY_CLASS[family.rotary_class].name}, {family.name})"
        )
    FAMILIES.append(family)
    _BY_CLASS[family.rotary_class] = family
    return family


def family_of(module: torch.nn.Module):
    """The Family whose rotary class is exactly the module's type, or None."""
    return _BY_CLASS.get(qualified_name(module))

"""torch.compile's on-disk caches must not replay a graph cached by another posenc build.

A graph cached while posenc's operators had other schemas (a posenc upgrade, or a rebuild with a
new argument) replays that build's calls: compiled attention gave 1.09 where eager gives 3.38
until posenc tagged the caches. posenc's import joins a digest of every posenc schema and of the
fakes' source to torch.compiler.config.cache_key_tag (python/posenc/_library.py).
"""

from __future__ import annotations

import hashlib
import os

import torch

import posenc
from posenc import _library


def _expected_tag() -> str:
    schemas = sorted(
        str(s) for s in torch._C._jit_get_all_schemas() if s.name.startswith("posenc::")
    )
    with open(os.path.join(os.path.dirname(posenc.__file__), "_meta.py"), "rb") as f:
        fakes = f.read()
    return "posenc-" + hashlib.sha256("\n".join(schemas).encode() + fakes).hexdigest()[:16]


def test_the_compile_caches_are_tagged_with_posencs_schemas():
    assert len([s for s in torch._C._jit_get_all_schemas() if s.name.startswith("posenc::")]) > 30
    assert _expected_tag() in torch.compiler.config.cache_key_tag


def test_a_users_own_tag_is_kept_and_posencs_added_once():
    saved = torch.compiler.config.cache_key_tag
    try:
        torch.compiler.config.cache_key_tag = "mine"
        _library._tag_compile_caches()
        _library._tag_compile_caches()
        assert torch.compiler.config.cache_key_tag == "mine+" + _expected_tag()
    finally:
        torch.compiler.config.cache_key_tag = saved

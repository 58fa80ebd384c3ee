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
    digest = hashlib.sha256("\n".join(schemas).encode() + fakes).hexdigest()[:16]
    return f"posenc-{digest}-{torch.backends.cpu.get_cpu_capability().lower()}"


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


_PROBE = """
import sys
import torch
import posenc
sys.path.insert(0, sys.argv[1])
from test_compile import CONFIG, Block
torch.manual_seed(0)
block = Block(CONFIG)
eager = Block(CONFIG)
eager.load_state_dict(block.state_dict())
compiled = torch.compile(block, fullgraph=True, dynamic=True)
for n in [5, 9]:
    x = torch.randn(2, n, 64, requires_grad=True)
    pos = torch.arange(n)[None].expand(2, n)
    y = compiled(x, pos)
    y.sum().backward()
    gx, x.grad = x.grad.clone(), None
    ye = eager(x, pos)
    ye.sum().backward()
    torch.testing.assert_close(y, ye, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx, x.grad, rtol=1e-5, atol=1e-5)
print("ok", torch.backends.cpu.get_cpu_capability())
"""


def test_a_graph_cached_under_another_aten_capability_is_not_replayed(tmp_path):
    """Inductor picks its vector ISA from ATEN_CPU_CAPABILITY, which torch 2.15's cache key
    misses: entries written at one level and read at another gave wrong numbers or crashed the
    interpreter. posenc's tag names the level; 'default' and 'avx2' exist on every CPU of ours."""
    import subprocess
    import sys

    package = os.path.dirname(os.path.dirname(posenc.__file__))
    path = os.pathsep.join(p for p in [package, os.environ.get("PYTHONPATH", "")] if p)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=path)
    here = os.path.dirname(__file__)
    for level in ["avx2", "default", "avx2"]:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, here],
            env=dict(env, ATEN_CPU_CAPABILITY=level),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0 and "ok" in done.stdout, (level, done.stderr[-2000:])

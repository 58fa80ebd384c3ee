"""Loads libposenc_ops (the operators registered with TORCH_LIBRARY(posenc)) into torch.ops.

The library sits in this package (pip install) or where POSENC_OPS_LIBRARY points (a build tree:
build/libposenc_ops.so). Beside it, libposenc_ops.json names the torch it was compiled against;
another torch is refused with one line before the library is loaded (a C++ ABI mismatch would
otherwise fail with undefined symbols, or worse, not at all).
"""

from __future__ import annotations

import hashlib
import json
import os

import torch

_LOADED: str | None = None


def library_path() -> str:
    """Where libposenc_ops.so is taken from."""
    env = os.environ.get("POSENC_OPS_LIBRARY")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libposenc_ops.so")


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _mapped(file_id: tuple[int, int]) -> bool:
    """Whether this process has the file mapped (loaded by ctypes, or linked by an extension):
    dlopen knows a file by device and inode, so a second load of it is the same library."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or fields[4] == "0":
                    continue
                major, minor = (int(x, 16) for x in fields[3].split(":"))
                if (os.makedev(major, minor), int(fields[4])) == file_id:
                    return True
    except (OSError, ValueError):
        return False
    return False


def _refuse_another_copy(path: str) -> None:
    """A second copy of the library (another build or install) would register the same operators
    again, which aborts the process: refuse it here in one line instead. The same file under
    another name (a symlink, a hard link, loaded by ctypes) is the same library to dlopen, which
    knows it by device and inode, and is let through. A copy loaded after this one (a
    torch.ops.load_library after the import) registers nothing itself and says so in one line
    (src/bindings/registration.h)."""
    ours = _file_id(path)
    if not torch._C._dispatch_has_kernel("posenc::apply_rotary") or ours is None or _mapped(ours):
        return
    name = os.path.basename(path)
    other = next(
        (p for p in getattr(torch.ops, "loaded_libraries", ()) if os.path.basename(p) == name), None
    )
    if other is not None:
        raise ImportError(
            f"posenc: another copy of its operator library is already loaded ({other}); "
            f"loading {path} too would register every operator twice (one process, one posenc)"
        )
    raise ImportError(
        f"posenc: its operators are already registered in this process (by another copy of "
        f"the library, or a program linking it); loading {path} would register them twice"
    )


def load() -> str:
    """Loads the operators once; returns the library's path. Raises ImportError (one line)."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    path = library_path()
    if not os.path.isfile(path):
        raise ImportError(
            f"posenc: its operator library {path} is missing "
            "(pip install --no-build-isolation ./python, or set POSENC_OPS_LIBRARY)"
        )
    info_path = os.path.splitext(path)[0] + ".json"
    try:
        with open(info_path, encoding="utf-8") as f:
            built_for = json.load(f)["torch_version"]
    except (OSError, ValueError, KeyError) as e:
        raise ImportError(
            f"posenc: cannot read {info_path} (which torch the operators need): {e}"
        ) from None
    if _public(built_for) != _public(torch.__version__):
        raise ImportError(
            f"posenc: its operators were built against torch {built_for} but torch "
            f"{torch.__version__} is installed; rebuild posenc (pip install --no-build-isolation ./python)"
        )
    _refuse_another_copy(path)
    try:
        torch.ops.load_library(path)
    except OSError as e:
        raise ImportError(f"posenc: cannot load {path}: {e}") from None
    _tag_compile_caches()
    _LOADED = path
    return path


def _tag_compile_caches() -> None:
    """torch.compile's on-disk caches (FX graph, AOTAutograd: /tmp/torchinductor_<user> unless
    TORCHINDUCTOR_CACHE_DIR) key a graph by its code, which names posenc's operators but not their
    schemas or fakes: a graph cached by another posenc build replays that build's calls (other
    arguments, other outputs) and gives silently wrong results. A digest of every posenc schema and
    of the fakes' source joins torch.compiler.config.cache_key_tag, so another build misses.
    ATen's CPU capability joins it too: a graph cached under another ATEN_CPU_CAPABILITY (inductor
    picks its vector ISA from it, and torch 2.15's cache key misses that) gave wrong numbers
    (test_compile's backward, avx512 entries read at avx2) or crashed the interpreter (avx2 entries
    read at avx512)."""
    schemas = sorted(
        str(s) for s in torch._C._jit_get_all_schemas() if s.name.startswith("posenc::")
    )
    with open(os.path.join(os.path.dirname(__file__), "_meta.py"), "rb") as f:
        fakes = f.read()
    digest = hashlib.sha256("\n".join(schemas).encode() + fakes).hexdigest()[:16]
    capability = torch.backends.cpu.get_cpu_capability().lower()
    tag = f"posenc-{digest}-{capability}"
    current = torch.compiler.config.cache_key_tag
    if tag not in current:
        torch.compiler.config.cache_key_tag = f"{current}+{tag}" if current else tag

"""The package's own contract: one-line refusal of a torch it was not built for, or a missing
library, before anything is loaded."""

import json
import os
import shutil
import subprocess
import sys

import posenc._library as library

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(library.__file__)))


def _import_in_child(lib):
    env = dict(os.environ, POSENC_OPS_LIBRARY=lib, PYTHONPATH=PYTHON_DIR)
    return subprocess.run(
        [sys.executable, "-c", "import posenc"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_another_torch_is_refused_in_one_line(tmp_path):
    lib = tmp_path / "libposenc_ops.so"
    shutil.copy(library.library_path(), lib)
    (tmp_path / "libposenc_ops.json").write_text(json.dumps({"torch_version": "2.9.1+cpu"}))
    r = _import_in_child(str(lib))
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: posenc: its operators were built against torch 2.9.1+cpu")
    assert "rebuild posenc" in last


def test_a_missing_library_is_one_line(tmp_path):
    r = _import_in_child(str(tmp_path / "nowhere.so"))
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode != 0 and "its operator library" in last and "is missing" in last


def test_a_second_copy_of_the_library_is_one_line_not_an_abort(tmp_path):
    # Two copies at two paths (a build tree and an install): the second would register every
    # operator again, which aborts the interpreter from C++. It is refused in one line instead.
    lib = tmp_path / "libposenc_ops.so"
    shutil.copy(library.library_path(), lib)
    shutil.copy(
        os.path.splitext(library.library_path())[0] + ".json", tmp_path / "libposenc_ops.json"
    )
    code = f"import torch; torch.ops.load_library({str(lib)!r}); import posenc"
    env = dict(os.environ, POSENC_OPS_LIBRARY=library.library_path(), PYTHONPATH=PYTHON_DIR)
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 1, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "ImportError: posenc: another copy of its operator library is already loaded"
    )
    # The same path loaded first is the same copy: no refusal.
    code = (
        f"import torch; torch.ops.load_library({library.library_path()!r}); import posenc; "
        "print(posenc.apply_rotary_pos_emb)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_same_file_under_another_name_or_loader_is_let_through(tmp_path):
    # dlopen knows a file by device and inode: a hard link, or the file loaded by ctypes first,
    # is the same library (no second registration), so posenc imports.
    lib = library.library_path()
    link = tmp_path / "libposenc_ops.so"
    try:
        os.link(lib, link)
    except OSError:  # another filesystem: a symbolic link is the same file as well
        os.symlink(lib, link)
    env = dict(os.environ, POSENC_OPS_LIBRARY=lib, PYTHONPATH=PYTHON_DIR)
    for first in (f"torch.ops.load_library({str(link)!r})", f"ctypes.CDLL({lib!r})"):
        code = f"import ctypes, torch; {first}; import posenc; print(posenc.apply_rotary_pos_emb)"
        r = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, (first, r.stderr[-2000:])

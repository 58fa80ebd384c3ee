"""tools/check_layers.py refuses an upward include, relative or through posenc/, and a base name
shared by files in two layers (but a functional core and its module), over a small tree.

The layers (lowest first): functional < core, io < kernels, modalities < encoders < nn < config <
bindings < draw < train < cli. Each case writes a few files into a temporary tree shaped like
posenc's (src/<layer>/, include/posenc/<layer>/, modalities/<name>/) and runs the tool on it with
--root in a subprocess, as CTest runs it; the last case runs it on this repository (CTest's
`layers` does too).
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "check_layers.py")


def run_tool(root):
    return subprocess.run(
        [sys.executable, TOOL, "--root", str(root)], capture_output=True, text=True, check=False
    )


def write_tree(root, files):
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


# Files every case starts from: a header per layer the cases include.
BASE = {
    "include/posenc/core/positions.h": "#pragma once\n",
    "include/posenc/nn/attention.h": "#pragma once\n",
    "src/kernels/cpu/attention_cpu.h": "#pragma once\n",
    "src/kernels/dispatch/attention_fused_operator.h": "#pragma once\n",
    "src/bindings/registration.h": "#pragma once\n",
    "modalities/vision/images.h": '#pragma once\n#include "posenc/core/positions.h"\n',
}


@pytest.mark.parametrize(
    ("files", "ok"),
    [
        # downward and sideways, relative and through posenc/: accepted
        (
            {"src/kernels/attention_fused.cpp": '#include "dispatch/attention_fused_operator.h"\n'},
            True,
        ),
        ({"src/kernels/dispatch/x.cpp": '#include "../cpu/attention_cpu.h"\n'}, True),
        (
            {"src/bindings/x.cpp": '#include "../kernels/dispatch/attention_fused_operator.h"\n'},
            True,
        ),
        ({"src/bindings/x.cpp": '#include "registration.h"\n'}, True),
        ({"src/train/x.cpp": '#include "vision/images.h"\n'}, True),
        ({"src/nn/x.cpp": '#include "posenc/core/positions.h"\n'}, True),
        ({"src/core/x.cpp": '#include "posenc/version.h"\n'}, True),  # generated in build/
        # upward through a relative path (the include src/kernels/attention_fused.cpp had)
        ({"src/kernels/attention_fused.cpp": '#include "../bindings/registration.h"\n'}, False),
        ({"src/kernels/dispatch/x.cpp": '#include "../../bindings/registration.h"\n'}, False),
        # upward through posenc/ and through the modalities' include path
        ({"src/kernels/x.cpp": '#include "posenc/nn/attention.h"\n'}, False),
        ({"src/core/x.cpp": '#include "vision/images.h"\n'}, False),
        ({"modalities/text/x.h": '#include "posenc/nn/attention.h"\n'}, False),
        # a quoted include the tool cannot find (the compiler would not either), a folder that is
        # no layer
        ({"src/kernels/x.cpp": '#include "../ops/attention_fused.h"\n'}, False),
        ({"src/ops/x.cpp": '#include "posenc/core/positions.h"\n'}, False),
    ],
)
def test_an_upward_include_is_refused(tmp_path, files, ok):
    write_tree(tmp_path, {**BASE, **files})
    result = run_tool(tmp_path)
    assert (result.returncode == 0) == ok, result.stdout + result.stderr
    if not ok:
        assert result.stdout.startswith(next(iter(files))), result.stdout


def test_the_refusal_names_the_line_and_both_layers(tmp_path):
    write_tree(
        tmp_path, {**BASE, "src/kernels/attention_fused.cpp": '// x\n#include "../nn/y.h"\n'}
    )
    (tmp_path / "src/nn").mkdir(parents=True, exist_ok=True)
    (tmp_path / "src/nn/y.h").write_text("#pragma once\n")
    result = run_tool(tmp_path)
    assert result.returncode == 1
    assert (
        'src/kernels/attention_fused.cpp:2: kernels includes "../nn/y.h" (src/nn/y.h, layer nn'
        in (result.stdout)
    )


@pytest.mark.parametrize(
    ("files", "ok"),
    [
        # a header and its source in one layer (include/posenc/<layer>/ and src/<layer>/<sub>/)
        (
            {
                "include/posenc/kernels/cpu_capability.h": "#pragma once\n",
                "src/kernels/cpu/cpu_capability.cpp": "",
            },
            True,
        ),
        # a functional core and its module, listed in CORE_AND_MODULE
        (
            {
                "include/posenc/functional/rope.h": "#pragma once\n",
                "src/functional/rope.cpp": "",
                "include/posenc/encoders/rope.h": "#pragma once\n",
                "src/encoders/rope.cpp": "",
            },
            True,
        ),
        # the operator bindings beside the module (BASE's include/posenc/nn/attention.h): the
        # names src/bindings/attention.cpp and src/nn/attention.cpp had
        ({"src/bindings/attention.cpp": ""}, False),
        ({"src/nn/attention.cpp": "", "src/bindings/attention.cpp": ""}, False),
        # a listed name in a third layer, a core and module pair that is not listed
        (
            {
                "include/posenc/functional/rope.h": "#pragma once\n",
                "include/posenc/encoders/rope.h": "#pragma once\n",
                "src/nn/rope.cpp": "",
            },
            False,
        ),
        (
            {
                "include/posenc/functional/alibi.h": "#pragma once\n",
                "include/posenc/encoders/alibi.h": "#pragma once\n",
            },
            False,
        ),
        # the same name in a modality and in a layer of the library
        ({"modalities/text/positions.cpp": ""}, False),
    ],
)
def test_a_base_name_in_two_layers_is_refused(tmp_path, files, ok):
    write_tree(tmp_path, {**BASE, **files})
    result = run_tool(tmp_path)
    assert (result.returncode == 0) == ok, result.stdout + result.stderr
    if not ok:
        name = os.path.splitext(os.path.basename(next(iter(files))))[0]
        line = next(x for x in result.stdout.splitlines() if x.startswith(f"base name '{name}'"))
        for relative in files:
            assert relative in line, line


def test_this_repository_has_no_upward_include():
    result = subprocess.run([sys.executable, TOOL], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout

"""pytest setup: the posenc package from python/, its operators from the build tree.

CTest (tests/CMakeLists.txt) sets POSENC_OPS_LIBRARY to the library it built; run by hand:
    POSENC_OPS_LIBRARY=build/libposenc_ops.so ~/.cache/posenc/venv/bin/python -m pytest tests/python
"""

import importlib
import json
import os
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
if not os.environ.get("POSENC_OPS_LIBRARY"):
    candidate = os.path.join(ROOT, "build", "libposenc_ops.so")
    if os.path.isfile(candidate):
        os.environ["POSENC_OPS_LIBRARY"] = candidate

# torchvision 0.29 (imported by timm) was built for torch 2.14: its compiled ops are never used.
warnings.filterwarnings("ignore", message=".*torchvision.*")
warnings.filterwarnings("ignore", category=UserWarning, module="torchvision")

FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def hf_generator():
    """tools/gen_hf_architectures.py as a module (the generator of the HF rules and fixtures)."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        return importlib.import_module("gen_hf_architectures")
    finally:
        sys.path.pop(0)


def hf_generated_rules():
    """The generator's rows as committed: tests/fixtures/hf_architectures/generated_rules.json."""
    with open(os.path.join(FIXTURES, "hf_architectures", "generated_rules.json")) as f:
        return json.load(f)

"""pytest setup: the posenc package from python/, its operators from the build tree.

CTest (tests/CMakeLists.txt) sets POSENC_OPS_LIBRARY to the library it built; run by hand:
    POSENC_OPS_LIBRARY=build/libposenc_ops.so ~/.cache/posenc/venv/bin/python -m pytest tests/python
"""

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

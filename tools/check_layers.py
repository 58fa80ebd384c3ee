#!/usr/bin/env python3
"""No upward include: each layer of posenc includes only itself and the layers below it.

    functional  <  core, io  <  kernels  <  encoders  <  nn  <  config  <  ops  <  draw  <  train  <  cli

(ops: the operators in PyTorch's dispatcher, over the kernels and the config resolver.)
(posenc/version.h is below everything; the umbrella posenc/posenc.h sits with config.) A file in
src/<layer>/ or include/posenc/<layer>/ that includes "posenc/<higher layer>/..." is listed, with
its line, and the exit code is 1. Standard library only; CTest runs it (layers).
"""

import os
import re
import sys

ORDER = [
    "functional",
    "core|io",
    "kernels",
    "encoders",
    "nn",
    "config",
    "ops",
    "draw",
    "train",
    "cli",
]
RANK = {
    "functional": 0,
    "io": 1,
    "core": 1,
    "kernels": 2,
    "encoders": 3,
    "nn": 4,
    "config": 5,
    "ops": 6,
    "draw": 7,
    "train": 8,
    "cli": 9,
    "version.h": -1,
    "posenc.h": 5,
}
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
INCLUDE = re.compile(r'^\s*#\s*include\s+"posenc/([a-z_]+(?:\.h)?)')


def layer_of(path):
    parts = os.path.relpath(path, ROOT).split(os.sep)
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[:2] == ["include", "posenc"] and len(parts) > 3:
        return parts[2]
    return None


def main():
    bad = []
    for top in ("src", os.path.join("include", "posenc")):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if not name.endswith((".h", ".cpp", ".cu", ".cuh", ".inc")):
                    continue
                path = os.path.join(folder, name)
                layer = layer_of(path)
                if layer is None:
                    continue
                if layer not in RANK:  # a new folder is placed in the order, not skipped
                    bad.append(
                        f"{os.path.relpath(path, ROOT)}: folder '{layer}' is no layer of "
                        f"tools/check_layers.py's order"
                    )
                    continue
                for number, line in enumerate(open(path, encoding="utf-8"), 1):
                    m = INCLUDE.match(line)
                    if m and RANK.get(m.group(1), 99) > RANK[layer]:
                        bad.append(
                            f"{os.path.relpath(path, ROOT)}:{number}: {layer} includes "
                            f"posenc/{m.group(1)} (a layer above it)"
                        )
    if bad:
        print("\n".join(bad))
        print(f"{len(bad)} upward includes; layers, lowest first: {', '.join(ORDER)}")
        return 1
    print("no upward include (layers, lowest first: " + ", ".join(ORDER) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())

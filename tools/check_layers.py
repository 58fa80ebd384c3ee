#!/usr/bin/env python3
"""No upward include, no base name in two layers: each layer of posenc includes only itself and
the layers below it, and names its files so that no other layer has a file of the same base name.

    functional  <  core, io  <  kernels, modalities  <  encoders  <  nn  <  config  <  bindings
                <  draw  <  train  <  cli

(kernels: the CPU and CUDA kernels with their dispatcher entry points, src/kernels/dispatch/;
modalities: modalities/<name>/, data into tokens and positions over core and io; bindings: the
Python-facing operators of libposenc_ops, over the kernels and the config resolver.)
(posenc/version.h is below everything; the umbrella posenc/posenc.h sits with config.)

Every quoted include of a file in src/<layer>/, include/posenc/<layer>/ or modalities/ is
resolved to the file it names, as the compiler finds it: next to the including file first
("../kernels/cpu/attention_cpu.h", "registration.h"), then on the include path (include/ for
"posenc/...", modalities/ for "vision/images.h"). A file that includes one of a higher layer is
listed with its line, and the exit code is 1; so is a quoted include that resolves to no file
(a typo or a moved file the compiler would also miss, unless a build directory generates it:
posenc/version.h).

A base name (the file name without its extension) belongs to one layer: src/bindings/attention.cpp
(the Python operators) beside src/nn/attention.cpp (the module) paired the wrong header with the
wrong source for a reader. A header and its source share their name within a layer
(include/posenc/kernels/cpu_capability.h + src/kernels/cpu/cpu_capability.cpp); across layers only
the functional core and its thin module do (STYLE.md 3), for the encoders CORE_AND_MODULE lists.
A name in two layers otherwise is listed with its files, and the exit code is 1.

Standard library only; CTest runs it (layers); tests/python/test_check_layers.py holds it to
refusing an upward include, relative or not, and a base name shared across layers.

    python3 tools/check_layers.py [--root DIR]     (DIR: the tree to check, default this one)
"""

import argparse
import os
import re
import sys

ORDER = [
    "functional",
    "core|io",
    "kernels|modalities",
    "encoders",
    "nn",
    "config",
    "bindings",
    "draw",
    "train",
    "cli",
]
RANK = {layer: rank for rank, group in enumerate(ORDER) for layer in group.split("|")}
RANK_OF_TOP_HEADER = {"version.h": -1, "posenc.h": RANK["config"]}
GENERATED = {os.path.join("include", "posenc", "version.h")}  # cmake/version.h.in, in build/
TOPS = ("src", os.path.join("include", "posenc"), "modalities")
INCLUDE_PATH = ("include", "modalities")  # as the targets' include directories
SOURCES = (".h", ".cpp", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# Base names the functional layer and the encoders layer share, by design (STYLE.md 3, "functional
# core, thin module"): the math as functions in include/posenc/functional/X.h + src/functional/X.cpp,
# the module calling them in include/posenc/encoders/X.h + src/encoders/X.cpp, for the same encoder.
CORE_AND_MODULE = {
    "rope": "rope_apply and the scalings; the Rope module",
    "rope_fractional": "LTX-2's fractional tables; the RopeFractional module",
    "sinusoidal": "the sinusoidal tables; the Sinusoidal module",
    "time": "the real-time tables (float64 seconds); the time encoders",
}
DEFAULT_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def layer_of(relative):
    """The layer of a path relative to the root (a layer name, a top header's rank, or None)."""
    parts = relative.split(os.sep)
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[:2] == ["include", "posenc"] and len(parts) > 2:
        return parts[2] if len(parts) > 3 or parts[2] in RANK_OF_TOP_HEADER else None
    if parts[0] == "modalities" and len(parts) > 2:
        return "modalities"
    return None


def rank_of(layer):
    return RANK_OF_TOP_HEADER[layer] if layer in RANK_OF_TOP_HEADER else RANK.get(layer)


def resolve(root, including, name):
    """The file a quoted include names, relative to root (None: no such file)."""
    candidates = [os.path.join(os.path.dirname(including), name)]
    candidates += [os.path.join(root, folder, name) for folder in INCLUDE_PATH]
    for candidate in candidates:
        relative = os.path.relpath(os.path.normpath(candidate), root)
        if os.path.isfile(candidate) or relative in GENERATED:
            return relative
    return None


def check(root):
    """The upward (or unresolvable) includes under root, one line each."""
    bad = []
    for top in TOPS:
        for folder, _, files in sorted(os.walk(os.path.join(root, top))):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, root)
                layer = layer_of(relative)
                if layer is None or layer in RANK_OF_TOP_HEADER:
                    continue
                if layer not in RANK:  # a new folder is placed in the order, not skipped
                    bad.append(
                        f"{relative}: folder '{layer}' is no layer of tools/check_layers.py's order"
                    )
                    continue
                with open(path, encoding="utf-8") as source:
                    lines = list(source)
                for number, line in enumerate(lines, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = resolve(root, path, m.group(1))
                    if target is None:
                        bad.append(
                            f'{relative}:{number}: "{m.group(1)}" resolves to no file (next to '
                            f"{relative} or under {', '.join(INCLUDE_PATH)})"
                        )
                        continue
                    target_layer = layer_of(target)
                    target_rank = rank_of(target_layer) if target_layer is not None else None
                    if target_rank is None:
                        bad.append(
                            f'{relative}:{number}: "{m.group(1)}" is {target}, in no layer of '
                            f"tools/check_layers.py's order"
                        )
                    elif target_rank > RANK[layer]:
                        bad.append(
                            f'{relative}:{number}: {layer} includes "{m.group(1)}" ({target}, '
                            f"layer {target_layer}: a layer above it)"
                        )
    return bad


def core_and_module_files(name):
    """The four files a functional core and its module may share the base name `name` in."""
    return {
        os.path.join("include", "posenc", "functional", name + ".h"),
        os.path.join("src", "functional", name + ".cpp"),
        os.path.join("include", "posenc", "encoders", name + ".h"),
        os.path.join("src", "encoders", name + ".cpp"),
    }


def shared_base_names(root):
    """The base names under root that files in more than one layer share, one line each."""
    by_name = {}
    for top in TOPS:
        for folder, _, files in sorted(os.walk(os.path.join(root, top))):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                relative = os.path.relpath(os.path.join(folder, name), root)
                layer = layer_of(relative)
                if layer is not None:
                    by_name.setdefault(os.path.splitext(name)[0], []).append((relative, layer))
    bad = []
    for name, files in sorted(by_name.items()):
        layers = {layer for _, layer in files}
        if len(layers) < 2:
            continue
        if name in CORE_AND_MODULE and {path for path, _ in files} <= core_and_module_files(name):
            continue
        listed = ", ".join(f"{path} ({layer})" for path, layer in sorted(files))
        bad.append(
            f"base name '{name}' in {len(layers)} layers: {listed}; rename the files that are a "
            f"different thing (a functional core and its module: CORE_AND_MODULE)"
        )
    return bad


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=DEFAULT_ROOT, help="the tree to check (default: posenc)")
    args = parser.parse_args(argv)
    layers = ", ".join(ORDER)
    root = os.path.abspath(args.root)
    bad = check(root)
    shared = shared_base_names(root)
    if bad or shared:
        print("\n".join(bad + shared))
        print(
            f"{len(bad)} upward or unresolved includes, {len(shared)} base names in several "
            f"layers; layers, lowest first: {layers}"
        )
        return 1
    print(f"no upward include, no base name in two layers (layers, lowest first: {layers})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

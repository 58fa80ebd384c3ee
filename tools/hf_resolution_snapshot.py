#!/usr/bin/env python3
"""Every HF resolution posenc gives, as one digest per case: to show that a change of the resolver
(src/config/hf_*) or of its generated rules leaves every answer as it was.

A case is a config.json posenc.hf_rope resolves, with a layer type and an angle dtype:
  - every committed architecture fixture (tests/fixtures/hf_architectures/<model_type>.config.json)
    and each sub-config one of its rotary classes is built from (a tower's vision_config, ...);
  - each of those changed by every change of tests/python/test_hf_perturbed.py (CHANGES: legacy
    rope_scaling blocks, absent keys, null head_dim, yarn without its original context, ...) and
    with each key posenc fills from the class's defaults left out, one at a time and all at once;
  - a minimal config for every model type of the pinned transformers (index.json), changed the same
    ways;
  - each of those for no layer type and for each layer type the file has a block for, at float32
    and float64 angles.
The answer is the whole resolution (values, sources, warnings, ignored keys), inv_freq's bits and
the attention scaling, or the refusal's line; a case's digest is the SHA-1 of that answer.

    PYTHONPATH=python POSENC_OPS_LIBRARY=build/libposenc_ops.so ~/.cache/posenc/venv/bin/python \\
        tools/hf_resolution_snapshot.py --out /tmp/before.tsv
    ... (change the resolver, rebuild) ... --out /tmp/after.tsv
    ~/.cache/posenc/venv/bin/python tools/hf_resolution_snapshot.py --compare /tmp/before.tsv /tmp/after.tsv

--without-sources leaves out where each value came from (for a change that rewords a source only).
--compare prints the number of cases, how many give the same answer, and the first that differ
(rerun one with --show CASE to see its answer). Needs transformers only for the changes' module.
"""

import argparse
import copy
import glob
import hashlib
import importlib
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
ARCH = os.path.join(ROOT, "tests", "fixtures", "hf_architectures")
# keys posenc fills from the model type's config class when a file leaves them out
FILLED_KEYS = (
    "rope_theta",
    "head_dim",
    "max_position_embeddings",
    "partial_rotary_factor",
    "rope_interleave",
    "rope_parameters",
)


def changes():
    """test_hf_perturbed's CHANGES (name -> function changing a config dict in place)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    try:
        module = importlib.import_module("test_hf_perturbed")
    finally:
        sys.path.pop(0)
    out = dict(module.CHANGES)
    out["legacy_longrope"] = lambda n: module._legacy_longrope(n, 32)
    out["v5_longrope_top_original"] = lambda n: module._v5_longrope_top_original(n, 32)
    for key in FILLED_KEYS:
        out["without_" + key] = lambda n, key=key: n.pop(key, None)
    out["without_filled_keys"] = lambda n: [n.pop(k, None) for k in FILLED_KEYS]
    return out


def sub_config(root, path):
    node = root
    for part in path.split(".") if path else []:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            return None
        node = node[part]
    return node


def bases():
    """(name, config dict) of every fixture config and sub-config, and a minimal config per type."""
    with open(os.path.join(ARCH, "index.json")) as f:
        types = [r["model_type"] for r in json.load(f)["model_types"]]
    for path in sorted(glob.glob(os.path.join(ARCH, "*.config.json"))):
        mt = os.path.basename(path)[: -len(".config.json")]
        with open(path) as f:
            root = json.load(f)
        paths = {""}
        rotary = os.path.join(ARCH, mt + ".rotary.json")
        if os.path.exists(rotary):
            with open(rotary) as f:
                paths |= {t.get("config_path", "") for t in json.load(f)["tables"]}
        for p in sorted(paths):
            node = sub_config(root, p)
            if node is not None:
                yield f"{mt}:{p or '.'}", node
    for mt in types:
        yield (
            f"minimal:{mt}",
            {"model_type": mt, "hidden_size": 256, "num_attention_heads": 4, "head_dim": 64},
        )


def layer_types(config):
    out = {""}
    for c in (config, config.get("text_config") if isinstance(config, dict) else None):
        if isinstance(c, dict):
            for key in ("rope_parameters", "rope_scaling"):
                block = c.get(key)
                if isinstance(block, dict):
                    out |= {k for k, v in block.items() if isinstance(v, dict)}
    return sorted(out)


def answer(posenc, config, layer_type, dtype, sources=True):
    try:
        inv_freq, scaling, resolution = posenc.hf_rope(
            copy.deepcopy(config), layer_type=layer_type or None, angle_dtype=dtype
        )
    except Exception as e:  # a refusal: its line is the answer
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if not sources:  # where each value came from left out (a change of wording only)
        resolution.pop("sources", None)
    bits = inv_freq.contiguous().numpy().tobytes().hex()
    return json.dumps(resolution, sort_keys=True) + f"\n{bits}\n{float(scaling)!r}"


def cases():
    named = changes()
    for name, base in bases():
        for change_name, change in [("as_is", None), *named.items()]:
            config = copy.deepcopy(base)
            if change is not None:
                try:
                    change(config)
                    if isinstance(config.get("text_config"), dict):
                        change(config["text_config"])
                except Exception:
                    continue
            for lt in layer_types(config):
                for dtype in ("float32", "float64"):
                    yield f"{name}|{change_name}|{lt}|{dtype}", config, lt, dtype


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write 'case<TAB>digest' lines here")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--show", help="print one case's answer")
    ap.add_argument(
        "--without-sources",
        action="store_true",
        help="leave each value's source out of the answer (values, warnings and refusals only)",
    )
    args = ap.parse_args()
    if args.compare:
        before, after = ({}, {})
        for path, table in zip(args.compare, (before, after), strict=True):
            with open(path) as f:
                for line in f:
                    case, digest = line.rstrip("\n").split("\t")
                    table[case] = digest
        same = sum(1 for c in before if after.get(c) == before[c])
        differ = [c for c in before if c in after and after[c] != before[c]]
        missing = set(before) ^ set(after)
        print(
            f"{len(before)} cases before, {len(after)} after: {same} identical, "
            f"{len(differ)} differ, {len(missing)} in one only"
        )
        for c in differ[:20]:
            print("differs:", c)
        return 0 if not differ and not missing else 1
    import posenc  # noqa: PLC0415 (the operators' library is needed only to resolve)

    out = open(args.out, "w") if args.out else None
    n = 0
    for case, config, lt, dtype in cases():
        if args.show and case != args.show:
            continue
        text = answer(posenc, config, lt, dtype, sources=not args.without_sources)
        if args.show:
            print(text)
            return 0
        out.write(f"{case}\t{hashlib.sha1(text.encode()).hexdigest()}\n")
        n += 1
    if out:
        out.close()
    print(f"{n} cases written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

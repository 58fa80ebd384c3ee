#!/usr/bin/env python3
"""Writes python/posenc/integrations/_families.py: the transformers families patch() takes beyond
the hand-checked ones, each found equal by tools/patch_families.py's harness (a small random causal
LM of the family through transformers' own code, with and without patch(): logits equal to the bit,
gradients within rtol 1e-5), and the reason each other family with a rotary class is left out.

    V/bin/python tools/gen_patch_families.py            # from the repository root; ~2 min
    V/bin/python tools/gen_patch_families.py --only llama,olmo2 --verbose   # prints only
    V/bin/python tools/gen_patch_families.py --update deepseek_v3,minicpm3  # re-examines these,
                                                                  # keeps the file's other rows

V: the venv scripts/setup.sh makes (~/.cache/posenc/venv: torch 2.15.0, transformers 5.24.0) with
the package importable (POSENC_OPS_LIBRARY=build/libposenc_ops.so, PYTHONPATH=python).
"""

import argparse
import inspect
import os
import pprint
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import patch_families as pf  # noqa: E402

OUT = os.path.join("python", "posenc", "integrations", "_families.py")


def causal_lm_types_with_rotary():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            modeling = pf.modeling_module(model_type)
        except Exception:  # noqa: BLE001 - a family whose file does not import here
            continue
        if any(k.endswith("RotaryEmbedding") for k in dir(modeling)):
            types.append(model_type)
    return types


def examine(model_type, verbose=False):
    """(entry, None) when the family passes, (None, why) when not."""
    try:
        modeling = pf.modeling_module(model_type)
        if not callable(getattr(modeling, "apply_rotary_pos_emb", None)):
            return None, "its modeling file has no apply_rotary_pos_emb"
        with pf.quiet():
            model = pf.build(model_type)
        classes = pf.text_rotary_classes(model, modeling)
        if not classes:
            return None, "no rotary module taking a config in its causal LM"
    except Exception as e:  # noqa: BLE001 - any failure leaves the family out, with its reason
        if verbose:
            traceback.print_exc()
        return (
            None,
            f"a small model does not build: {type(e).__name__}: {str(e).splitlines()[0][:120]}",
        )
    reasons = []
    # rotations in float32 (OLMo, Ernie 4.5) are tried last: a family that passes in its tables'
    # dtype is listed so
    layouts = [
        "half",
        "interleaved",
        "half_f32",
        "interleaved_f32",
        "half_fresh",
        "half_pairs",
        "half_float",
        "interleaved_float",
    ]
    if next(iter(inspect.signature(modeling.apply_rotary_pos_emb).parameters)) == "x":
        layouts = ["half_one"]  # Gemma 4's: one tensor rotated per call
    if callable(getattr(modeling, "apply_rotary_pos_emb_interleave", None)):
        layouts.insert(2, "deinterleave")  # DeepSeek V3's interleaved weights
    for layout in layouts:
        entry = (modeling.__name__, classes, layout)
        try:
            with pf.quiet():
                why = pf.check(model_type, classes, layout, model=model)
        except Exception as e:  # noqa: BLE001
            if verbose:
                traceback.print_exc()
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:240]}"
        if why is None:
            return entry, None
        reasons.append((layout, why))
    # the layout posenc's resolver does not give is refused by patch() itself: the other one's
    # reason is the family's
    telling = [(layout, w) for layout, w in reasons if "pair layout, but" not in w] or reasons
    # one line in patch()'s refusal: each reason once (the layouts that failed alike named
    # together), at most MAX_REASON characters
    merged = {}
    for layout, why in telling:
        merged.setdefault(why, []).append(layout)
    text = "; ".join(f"{'/'.join(ls)}: {why}" for why, ls in merged.items())
    return None, text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


MAX_REASON = 400


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated model types (prints, writes nothing)")
    ap.add_argument(
        "--update", help="comma-separated model types re-examined; the file's other rows kept"
    )
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    import transformers

    import posenc.integrations.transformers as integration

    passed, left = {}, {}
    if args.update:
        from posenc.integrations import _families

        if _families.TRANSFORMERS != transformers.__version__:
            sys.exit(
                f"--update: the file is from transformers {_families.TRANSFORMERS}, this is "
                f"{transformers.__version__}: regenerate it whole"
            )
        passed, left = dict(_families.CHECKED), dict(_families.LEFT_OUT)
        types = args.update.split(",")
        for model_type in types:
            passed.pop(model_type, None)
            left.pop(model_type, None)
    else:
        types = args.only.split(",") if args.only else causal_lm_types_with_rotary()
    start = time.time()
    for model_type in types:
        t = time.time()
        entry, why = examine(model_type, args.verbose)
        print(
            f"{model_type:28s} {time.time() - t:5.1f}s  {'ok ' + entry[2] if entry else why}",
            flush=True,
        )
        if entry is not None:
            passed[model_type] = entry
        else:
            left[model_type] = why
    print(f"{len(passed)} of {len(passed) + len(left)} families equal; {time.time() - start:.0f}s")
    if args.only:
        return
    hand = set(integration.HAND_CHECKED)
    with open(OUT, "w") as f:
        f.write(
            '"""Generated by tools/gen_patch_families.py from transformers '
            f"{transformers.__version__}: do not edit.\n\n"
            "CHECKED: model_type -> (modeling file, text rotary classes, pairs its\n"
            "apply_rotary_pos_emb rotates), each family's small random causal LM equal with and\n"
            "without patch(): logits to the bit and gradients rtol 1e-5 in float32, bfloat16,\n"
            "float16 and float64, the rotation reaching the logits, an unpatched sibling\n"
            "unchanged (tools/patch_families.py: check).\n"
            "LEFT_OUT: every other causal LM family with a rotary class, and why.\n"
            '"""\n\n'
        )
        f.write(f"TRANSFORMERS = {transformers.__version__!r}\n\n")
        f.write("CHECKED = " + pprint.pformat(passed, width=100, sort_dicts=True) + "\n\n")
        f.write("LEFT_OUT = " + pprint.pformat(left, width=100, sort_dicts=True) + "\n")
    print(
        f"wrote {OUT} ({len(passed)} checked, {len(left)} left out; "
        f"{len(hand & set(passed))} of the hand-checked families among them)"
    )


if __name__ == "__main__":
    main()

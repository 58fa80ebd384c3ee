#!/usr/bin/env python3
"""docs/hf_architectures.md: the supported-architectures table, from the committed fixtures.

One row per rotary table of tests/fixtures/hf_architectures/ (a model type's rotary class, per layer
type): the rope type its default config.json names, the rotary size and pair layout transformers'
own class uses, where posenc takes the head size from (src/config/hf_architectures.cpp's row, else
the generated head_size of src/config/hf_generated_rules.inc, else the generic rule) and the
verdict: "identical" (the CTest entry hf_architectures checks inv_freq and cos/sin bit for bit
with float32 angles) or "refused" with the reason from refusals.json.

    python3 tools/hf_architectures_table.py          # writes docs/hf_architectures.md
    python3 tools/hf_architectures_table.py --check  # exit 1 when the file is not what it would write

Standard library only (the fixtures hold every number; no transformers needed).
"""

import argparse
import json
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "hf_architectures")
TABLE = os.path.join(ROOT, "src", "config", "hf_architectures.cpp")
OUT = os.path.join(ROOT, "docs", "hf_architectures.md")

HEAD = {
    "kGeneric": "generic",
    "kHeadDim": "head_dim (not qk_rope_head_dim)",
    "kGlobalHeadDim": "global_head_dim on full layers",
    "kKvChannels": "kv_channels",
    "kAttentionHeadDim": "attention_head_dim",
    "kDModelPerHead": "d_model / n_heads",
    "kDecoderHeads": "hidden_size / decoder heads",
    "kRotaryDim": "rotary_dim",
    "kMemoryAttention": "memory attention heads",
}


# generated_rules.json's head_size names (the generator's HEAD_SIZES) -> HfHeadSize
GENERATED_HEAD = {
    "qk_rope_head_dim": "kGeneric",
    "head_dim": "kHeadDim",
    "kv_channels": "kKvChannels",
    "attention_head_dim": "kAttentionHeadDim",
    "d_model / n_heads": "kDModelPerHead",
    "hidden_size / decoder_num_attention_heads": "kDecoderHeads",
    "rotary_dim": "kRotaryDim",
    "memory_attention": "kMemoryAttention",
}


def rows_of_table():
    """model_type -> head size rule: the C++ table's designated-initializer rows
    {.model_type = "type", .head = H::kRule, ...} where they write one, else the generated
    head_size (generated_rules.json); a model type with neither takes the generic rule."""
    with open(os.path.join(FIXTURES, "generated_rules.json")) as f:
        out = {
            r["model_type"]: HEAD[GENERATED_HEAD[r["head_size"]]]
            for r in json.load(f)["rows"]
            if "head_size" in r
        }
    text = open(TABLE).read()
    designated = r'\{\.model_type = "([^"]+)",\s*\.head = H::(k\w+),'
    out.update({m.group(1): HEAD[m.group(2)] for m in re.finditer(designated, text)})
    return out


def rope_type(config, path, layer_type):
    node = config
    for part in [p for p in path.split(".") if p]:
        node = node.get(part, {}) if isinstance(node, dict) else {}
    if path in ("", "text_config") and not any(
        k in config for k in ("rope_parameters", "rope_scaling", "rope_theta")
    ):
        node = config.get("text_config", node) if path == "" else node
    block = node.get("rope_parameters") or node.get("rope_scaling") or {}
    if layer_type and isinstance(block.get(layer_type), dict):
        block = block[layer_type]
    if not isinstance(block, dict):
        return "default"
    kind = block.get("rope_type") or block.get("type") or "default"
    if "mrope_section" in block:
        kind += " + mrope_section"
    return kind


def render():
    index = json.load(open(os.path.join(FIXTURES, "index.json")))
    refusals = json.load(open(os.path.join(FIXTURES, "refusals.json")))["refusals"]
    rules = rows_of_table()
    lines, identical, refused, unprobed = [], 0, 0, []
    for entry in index["model_types"]:
        mt = entry["model_type"]
        stem = os.path.join(FIXTURES, mt)
        if not os.path.exists(stem + ".rotary.json"):
            continue
        config = json.load(open(stem + ".config.json"))
        for table in json.load(open(stem + ".rotary.json"))["tables"]:
            for row in table.get("layer_types", []):
                if "cos" not in row or "error" in row:
                    layer = f" ({row['layer_type']})" if row.get("layer_type") else ""
                    unprobed.append(
                        f"| {mt} | {table['class']}{layer} | {row.get('error', 'no output')} |"
                    )
                    continue
                key = f"{mt}/{table['class']}" + (
                    f":{row['layer_type']}" if row["layer_type"] else ""
                )
                sub = table["config_model_type"]
                head = rules.get(sub, rules.get(mt, "generic"))
                if key in refusals:
                    verdict = "refused: " + refusals[key]["reason"]
                    refused += 1
                else:
                    verdict = "identical"
                    identical += 1
                where = table["config_path"] or "config"
                layer = f" ({row['layer_type']})" if row["layer_type"] else ""
                lines.append(
                    f"| {mt} | {table['class']}{layer} | {where} | "
                    f"{rope_type(config, table['config_path'], row['layer_type'])} | {row['rotary_dim']} | "
                    f"{row.get('layout', '-')} | {head} | {verdict} |"
                )
    none = sum(1 for e in index["model_types"] if e.get("skipped") == "no rotary class")
    head = [
        "# Supported architectures",
        "",
        f"Every model type of transformers {index['transformers']} whose modeling code has a rotary",
        "embedding class, resolved by posenc from its default `config.json` (as `save_pretrained` writes it)",
        "and compared with that model's own rotary class: `inv_freq`, `attention_scaling` and cos/sin at",
        f"positions {', '.join(str(p) for p in index['positions'])}; a vision tower's at (row, column) patch",
        f"positions {', '.join(str(tuple(p)) for p in index['grid_positions'])}, at (t, row, column)",
        f"{', '.join(str(tuple(p)) for p in index.get('grid3_positions', []))} where its model gives three axes",
        "(MiniMax-M3), and DINOv3's at the patch centres in [-1, 1] of a 3 x 5 patch image (eval mode).",
        "",
        f"**{identical + refused} rotary tables: {identical} identical** (bit for bit with `--angle-dtype float32`;",
        f"inv_freq within 1e-6 relative in float64), **{refused} refused** with the reason below, **0 different**.",
        "Each identical table is checked again on the same config.json with every key whose value is its",
        "config class's default for an absent key removed (`src/config/hf_generated_rules.inc`, generated): posenc",
        "fills them as transformers does.",
        f"The {none} model types without a rotary class (BERT, GPT-2, T5, ...) are refused by name; a model",
        "type posenc has not checked resolves by the generic rule with a warning naming it.",
        "",
        "Reproduce: `ctest --test-dir build -R hf_architectures` (fixtures: `tests/fixtures/hf_architectures/`,",
        "written by `tools/gen_hf_architectures.py`; with a newer transformers,",
        "`python3 tools/gen_hf_architectures.py --check` lists the model types whose numbers changed).",
        "This page: `python3 tools/hf_architectures_table.py`.",
        "",
        "Columns: *config* is where the rotary class takes its config from (a tower's sub-config is",
        "resolved as its own config.json); *rotary dim* and *layout* are transformers' (`half`: pairs",
        "(i, i + r/2), `interleaved`: (2i, 2i + 1)); *head size* is posenc's rule, probed from the model",
        "type's rotary classes where the generator could (generic: `qk_rope_head_dim` > `head_dim` >",
        "`hidden_size / num_attention_heads`).",
        "",
        "| model type | rotary class (layer type) | config | rope type | rotary dim | layout | head size | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    tail = [
        "",
        "## Not checked",
        "",
        "Rotary tables whose class the generator could not run on the default config (transformers' own",
        "code fails on it, or the class has no table for that layer type). posenc refuses each of them",
        "rather than resolve it unchecked: the model types by a 'not checked' row of",
        "`src/config/hf_architectures.cpp` (or their text model's), the layer types without a RoPE",
        "table by the per-layer lookup (a `null` entry or no entry in `rope_parameters`).",
        "",
        "| model type | rotary class (layer type) | why |",
        "| --- | --- | --- |",
    ] + unprobed
    return "\n".join(head + lines + tail) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = render()
    if args.check:
        current = open(OUT).read() if os.path.exists(OUT) else ""
        if current != text:
            print(
                f"{os.path.relpath(OUT, ROOT)} is stale: run python3 tools/hf_architectures_table.py"
            )
            return 1
        return 0
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Reads a posenc run folder's tensor files the way a Python user would, and checks their layout.

    python3 tools/check_run_files.py RUN_FOLDER

- weights.pt: torch.load(..., weights_only=True) gives {name: tensor} (a model state_dict).
- checkpoint.pt: torch.load(..., weights_only=True) gives {"format", "model", "optimizer", "step",
  "elapsed", "log_window", "config", "checksum"}; "optimizer" is torch.optim.AdamW's state_dict
  layout, so a Python AdamW over tensors of the same shapes loads it and takes a step.

Exit 0 when every check passes, 1 when one fails, 77 when this Python has no torch (CTest reads
77 as "skipped"). The C++ suite checks the same files' pickle opcodes without Python.
"""

import json
import sys


def fail(message):
    print(f"check_run_files: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        import torch
    except ImportError:
        print("check_run_files: skipped: no torch in this Python", file=sys.stderr)
        sys.exit(77)
    folder = sys.argv[1]

    weights = torch.load(f"{folder}/weights.pt", weights_only=True)
    if not isinstance(weights, dict) or not weights:
        fail(f"weights.pt: expected a non-empty dict, got {type(weights).__name__}")
    for name, tensor in weights.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            fail(f"weights.pt: entry {name!r} is not name -> tensor")

    ckpt = torch.load(f"{folder}/checkpoint.pt", weights_only=True)
    expected = {
        "format",
        "model",
        "optimizer",
        "step",
        "elapsed",
        "log_window",
        "config",
        "checksum",
    }
    if json.loads(ckpt.get("config", "{}")).get("train", {}).get("ema_decay", 0):
        expected.add("ema")  # the weight average, by parameter name
        if not set(ckpt["ema"]) <= set(weights):
            fail("checkpoint.pt: ema tensors are not named as weights.pt's")
    if set(ckpt) != expected:
        fail(f"checkpoint.pt: keys {sorted(ckpt)}, expected {sorted(expected)}")
    if ckpt["format"] != "posenc-checkpoint-1":
        fail(f"checkpoint.pt: format {ckpt['format']!r}")
    if set(ckpt["model"]) != set(weights):
        fail("checkpoint.pt: model tensors differ in names from weights.pt")
    json.loads(ckpt["config"])
    if not isinstance(ckpt["step"], int) or ckpt["step"] <= 0:
        fail(f"checkpoint.pt: step {ckpt['step']!r}")

    optimizer = ckpt["optimizer"]
    state, groups = optimizer["state"], optimizer["param_groups"]
    params = []
    for group in groups:
        shapes = []
        for index in group["params"]:
            if index not in state:
                fail(f"checkpoint.pt: no optimizer state for parameter {index}")
            shapes.append(state[index]["exp_avg"].shape)
        params.append({"params": [torch.zeros(s, requires_grad=True) for s in shapes]})
    adamw = torch.optim.AdamW(params)
    adamw.load_state_dict(optimizer)  # raises on a layout Python's AdamW does not accept
    for group in adamw.param_groups:
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    adamw.step()
    steps = {float(s["step"]) for s in adamw.state_dict()["state"].values()}
    print(
        f"check_run_files: {folder}: weights.pt {len(weights)} tensors; checkpoint.pt step "
        f"{ckpt['step']}, {len(state)} AdamW states in {len(groups)} groups loaded by "
        f"torch.optim.AdamW (optimizer steps {sorted(steps)})"
    )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The main job's model in Python PyTorch, side by side with `posenc train` (issue 16).

Same model, data, optimizer and threads as configs/vit_fashion.yaml's rope_2d run:
  Fashion-MNIST 28x28 -> /255 -> normalize (0.2860, 0.3530) -> random horizontal flip
  -> 7x7 patches (a 4x4 grid, 49 values each) -> Linear(49, D)
  -> L pre-norm blocks: x + out(SDPA(rope(q), rope(k), v)) ; x + fc2(gelu(fc1(ln(x))))
     D 96, 3 heads (head_dim 32), 4 blocks, MLP ratio 2 (--dim, --heads, --layers, --mlp-ratio;
     the same values are passed to posenc with --set, so both sides train the same model)
     axial 2D RoPE (timm's axial layout as posenc's rope_2d): head_dim 32 = 16 pairs, rotated as
     two halves (x[i], x[i + 16]); pairs 0..7 turn with the row, 8..15 with the column, each
     axis with its own ladder theta^(-2j/16), j = 0..7, theta = 100
  -> final LayerNorm -> mean over tokens -> Linear(D, 10); 305,098 parameters at the defaults.
  Cross-entropy with label smoothing 0.1; AdamW(lr 2e-3, betas 0.9/0.999, eps 1e-8) with weight
  decay 0.05 on matrices only, gradient clipping at norm 1.0, batch 128.
--precision bf16: the Python forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)
(eager and compiled), posenc with train.precision=bf16 (the same autocast, src/train/precision.h);
parameters, AdamW and clipping in float32 on both sides.
Measured: steps/s over the steps after a warm-up, for Python eager, Python torch.compile (on the
model) and `posenc train ... --stop-after` (from its metrics.csv's elapsed_s column), with the
same number of threads. Only speed is compared; the learning-rate schedule is held constant here.

  pip install torch numpy
  python3 tools/side_by_side.py --posenc build/posenc --threads 2 --steps 300 --rounds 3
Run it alone on the machine: anything else running changes the ratios.
"""

import argparse
import csv
import gzip
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    dims = magic & 0xFF
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def axial_rope_tables(grid, head_dim, theta):
    """cos/sin [N, head_dim/2] for a grid x grid patch grid, row-major tokens."""
    pairs = head_dim // 2
    per_axis = pairs // 2
    inv = theta ** (-torch.arange(per_axis, dtype=torch.float64) * 2 / pairs)
    rows = torch.arange(grid, dtype=torch.float64).repeat_interleave(grid)
    cols = torch.arange(grid, dtype=torch.float64).repeat(grid)
    angles = torch.cat([rows[:, None] * inv, cols[:, None] * inv], dim=1)  # [N, pairs]
    return angles.cos().float(), angles.sin().float()


def rotate(x, cos, sin):
    # x [B, H, N, Dh] in halves: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(nn.Module):
    def __init__(self, dim, heads, mlp_ratio):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, int(mlp_ratio * dim))
        self.fc2 = nn.Linear(int(mlp_ratio * dim), dim)

    def forward(self, x, cos, sin):
        b, n, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v)
        x = x + self.out(y.transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, patch=7, dim=128, heads=4, layers=4, mlp_ratio=2, classes=10, theta=100):
        super().__init__()
        self.patch = patch
        self.embed = nn.Linear(patch * patch, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        cos, sin = axial_rope_tables(28 // patch, dim // heads, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens):  # [B, N, p*p]
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.head(self.norm(x).mean(1))


def patchify(images, p):  # [B, 1, S, S] -> [B, (S/p)^2, p*p]
    b, _, s, _ = images.shape
    g = s // p
    return images.view(b, g, p, g, p).permute(0, 1, 3, 2, 4).reshape(b, g * g, p * p)


def python_steps_per_second(
    model, images, labels, steps, warmup, batch, seed, smoothing, precision="float32"
):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
        lr=2e-3,
    )
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(images.shape[0], generator=gen)
    start = None
    for step in range(steps):
        if step == warmup:
            start = time.perf_counter()
        idx = order[step * batch : (step + 1) * batch]
        x = images[idx].float().div_(255).unsqueeze(1)
        flip = torch.rand(batch, generator=gen) < 0.5
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)
        x = (x - MEAN) / STD
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = F.cross_entropy(model(patchify(x, 7)), labels[idx], label_smoothing=smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()  # as posenc reads the loss every step
    return (steps - warmup) / (time.perf_counter() - start)


# Python eager's step by category, as posenc's --profile prints its own (src/train/profile.cpp):
# each op's self time (torch.profiler, CPU) filed under its own name's category, else its innermost
# ancestor's (AddmmBackward0's sum and transposes are the matmul's); the rest of the wall time (the
# Python interpreter, autograd engine, dispatch) as one line.
CATEGORIES = [  # first match wins
    ("layer norms", ("layer_norm",)),
    ("loss", ("cross_entropy", "log_softmax", "nll_loss")),
    ("gradient clipping", ("clip_grad", "_foreach_norm", "linalg_vector_norm")),
    ("optimizer step", ("Optimizer.step", "_foreach_", "adamw", "lerp")),
    ("matmuls", ("addmm", "aten::mm", "bmm", "matmul", "linear", "AddmmBackward", "MmBackward")),
    ("attention", ("scaled_dot_product", "_flash_attention", "_efficient_attention", "softmax")),
    ("GELU", ("gelu",)),
]


OTHER = "other ops (rotary, residual adds, reshapes, copies, means, data)"


def category(name):
    lowered = name.lower()
    for label, keys in CATEGORIES:
        if any(k.lower() in lowered for k in keys):
            return label
    return OTHER


def python_profile(model, images, labels, steps, batch, smoothing, precision="float32"):
    """ms per step by category over `steps` profiled steps (after 10 unprofiled)."""
    import torch.profiler as tp

    python_steps_per_second(model, images, labels, 12, 2, batch, 1, smoothing, precision)
    with tp.profile(activities=[tp.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        python_steps_per_second(model, images, labels, steps + 1, 1, batch, 2, smoothing, precision)
        wall = (time.perf_counter() - start) * 1e3 / steps
    per = {}
    for e in prof.events():  # each op's self time, filed as posenc files it: its own name, else
        names, parent = [e.name], e.cpu_parent  # its innermost ancestor's that has a category
        while parent is not None:
            names.append(parent.name)
            parent = parent.cpu_parent
        label = next((category(n) for n in names if category(n) != OTHER), OTHER)
        per[label] = per.get(label, 0.0) + e.self_cpu_time_total / 1e3 / steps
    seen = sum(per.values())
    rows = sorted(per.items(), key=lambda kv: -kv[1]) + [
        ("outside ops (interpreter, autograd engine, dispatch)", max(wall - seen, 0.0))
    ]
    print(f"Python eager, {steps} steps profiled: {wall:.1f} ms per step (profiler on)")
    print("| category | ms/step | share |")
    print("|---|---:|---:|")
    for label, ms in rows:
        print(f"| {label} | {ms:.1f} | {100 * ms / wall:.1f}% |")


def posenc_steps_per_second(binary, config, threads, steps, warmup, model_sets):
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            binary,
            "train",
            config,
            "--out",
            out,
            "--quiet",
            "--stop-after",
            str(steps),
            "--set",
            f"train.threads={threads}",
            "--set",
            "train.log_every=50",
            "--set",
            "train.eval_every=1000",
        ] + model_sets
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "metrics.csv")) as f:
            rows = {int(float(r["step"])): float(r["elapsed_s"]) for r in csv.DictReader(f)}
    first = min(s for s in rows if s >= warmup)
    last = max(rows)
    return (last - first) / (rows[last] - rows[first])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--posenc", default="build/posenc", help="the posenc binary ('' to skip)")
    ap.add_argument(
        "--baseline",
        default="",
        help="another posenc binary (an earlier build) run alongside, for before/after",
    )
    ap.add_argument("--config", default="configs/vit_fashion.yaml")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--dim", type=int, default=96)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--mlp-ratio", type=float, default=2.0)
    ap.add_argument("--label-smoothing", type=float, default=0.1)
    ap.add_argument(
        "--precision",
        choices=["float32", "bf16"],
        default="float32",
        help="bf16: Python under torch.autocast('cpu', torch.bfloat16), posenc with "
        "train.precision=bf16",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        help="profile Python eager over this many steps by category (as `posenc train "
        "--profile`) and exit",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds in alternating order; the median per trainer is reported",
    )
    args = ap.parse_args()
    if args.steps <= args.warmup:
        sys.exit("side_by_side: --steps must exceed --warmup")
    torch.set_num_threads(args.threads)
    images = torch.from_numpy(
        load_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz")).copy()
    )
    labels = torch.from_numpy(
        load_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz")).copy()
    ).long()
    # Rounds in alternating order (eager, compiled, posenc, then reversed, ...), median per
    # trainer: a VM's speed drifts within minutes, and back-to-back alternation spreads it.
    shape = dict(dim=args.dim, heads=args.heads, layers=args.layers, mlp_ratio=args.mlp_ratio)
    model_sets = []
    for key, value in [
        ("model.dim", args.dim),
        ("model.num_heads", args.heads),
        ("model.num_layers", args.layers),
        ("model.mlp_ratio", args.mlp_ratio),
        ("task.label_smoothing", args.label_smoothing),
        ("train.precision", args.precision),
    ]:
        model_sets += ["--set", f"{key}={value}"]
    torch.manual_seed(0)
    eager = ViT(**shape)
    params = sum(p.numel() for p in eager.parameters())
    if args.profile:
        python_profile(
            eager, images, labels, args.profile, 128, args.label_smoothing, args.precision
        )
        return
    trainers = [
        (
            "Python eager",
            lambda: python_steps_per_second(
                eager,
                images,
                labels,
                args.steps,
                args.warmup,
                128,
                0,
                args.label_smoothing,
                args.precision,
            ),
        )
    ]
    if not args.no_compile:
        torch.manual_seed(0)
        compiled = torch.compile(ViT(**shape))
        trainers.append(
            (
                "Python torch.compile",
                lambda: python_steps_per_second(
                    compiled,
                    images,
                    labels,
                    args.steps,
                    args.warmup,
                    128,
                    0,
                    args.label_smoothing,
                    args.precision,
                ),
            )
        )
    if args.posenc:
        trainers.append(
            (
                "posenc train",
                lambda: posenc_steps_per_second(
                    args.posenc, args.config, args.threads, args.steps, args.warmup, model_sets
                ),
            )
        )
    if args.baseline:
        trainers.append(
            (
                "posenc train (baseline build)",
                lambda: posenc_steps_per_second(
                    args.baseline, args.config, args.threads, args.steps, args.warmup, model_sets
                ),
            )
        )
    measured = {name: [] for name, _ in trainers}
    for r in range(args.rounds):
        for name, run in trainers if r % 2 == 0 else trainers[::-1]:
            measured[name].append(run())
    results = [(name, sorted(v)[len(v) // 2]) for name, v in measured.items()]
    print(
        "all rounds (steps/s): "
        + "; ".join(f"{name} " + ", ".join(f"{x:.2f}" for x in v) for name, v in measured.items())
    )
    load = os.getloadavg()[0]
    print(
        f"model: {params} parameters; precision {args.precision}; {args.threads} threads; "
        f"steps {args.warmup}..{args.steps}; median of {args.rounds} rounds; "
        f"torch {torch.__version__}; load average before the last run {load:.2f}"
    )
    print("| trainer | steps/s | posenc / this |")
    print("|---|---:|---:|")
    mine = dict(results).get("posenc train")
    for name, sps in results:
        ratio = f"{mine / sps:.2f}x" if mine else "-"
        print(f"| {name} | {sps:.2f} | {ratio} |")


if __name__ == "__main__":
    main()

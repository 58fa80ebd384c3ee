"""Packed time-series attention on the CPU (Moirai-2's recipe): posenc's fused attention with the
block-diagonal sample mask and the binary variate bias computed inside the tiles, against SDPA with
the materialized bias + mask and against FlexAttention (compiled) with the same score_mod /
block_mask; forward, and forward + backward, side by side in one process, as ratios (no timed
assertions). FlexAttention has no CPU backward in torch 2.15 (flex_attention raises
NotImplementedError "FlexAttention does not support backward on CPU" for inputs that require
grad): its fwd+bwd row says so, and it is timed on the forward.

    POSENC_OPS_LIBRARY=$(find build -name libposenc_ops.so | head -1) PYTHONPATH=python \
      ~/.cache/posenc/venv/bin/python tools/bench_packed_attention.py [--threads 2] [--repeat 3] \
      [--mask samples|moirai2]

Shape: 64 series of 128..896 patches (mean 512; lengths drawn with seed 0) packed into 16 rows of
2,048 tokens (4 series a row, the run lengths differ per row), each series 4 variates (contiguous
runs); H = 4 heads of D = 64 (Moirai-2 small's head size; RoPE is left out: it is the same O(N D)
pass for every contender). q, k, v [B, H, N, D] float32; the learned variate bias [2, H] (row 0
different variates, row 1 the same: uni2ts' BinaryAttentionBias) receives a gradient in every
contender.

Masks (--mask):
  samples   a block per series (uni2ts' packed_attention_mask: Moirai 1, or Moirai-2 with one
            variate per series), the series' variates contiguous runs of it
  moirai2   Moirai-2's packed_causal_attention_mask with several variates: each series packed
            variate-major (variate 0's patches at time_id 0..T-1, then variate 1's, ...; T = the
            series' length / 4, the variates' lengths differing by at most one), key j visible to
            query i when same series and time_id[j] <= time_id[i] (causal in time across the
            variates, not in token order); posenc takes it as causal_ids=time_id, FlexAttention
            as mask_mod, SDPA materialized

Contenders, each out = attention(q, k, v) under no_grad ("forward"), or with q, k, v and the weight
requiring grad, then out.backward(grad) ("fwd+bwd"):
  sdpa    F.scaled_dot_product_attention with attn_mask = the variate bias materialized
          (uni2ts' ~ind * w[0] + ind * w[1], [B, H, N, N]) + -inf outside the samples
          (uni2ts' packed_attention_mask): O(N^2) memory
  flex    torch.nn.attention.flex_attention under torch.compile, score_mod adding
          where(variate equal, w[1, h], w[0, h]), block_mask from mask_mod sample equal
          (create_block_mask, 128 x 128 blocks: the blocks outside every sample are skipped)
  posenc  posenc.positional_attention(q, k, v, sample_ids=..., variate_ids=..., variate_bias=w
          [, causal_ids=time_ids]): the tiled CPU kernel, tiles outside the samples skipped (and,
          with causal_ids, tiles whose keys all lie later in time than their queries), O(N) extra
          memory
Times are medians of --repeat calls after one warm-up (the contenders interleaved call by call, so
a change of load hits them alike). "peak MB" is each contender's own peak resident memory above its
inputs for that pass, measured in a fresh child process (--peak-of NAME PASS; VmHWM), so the
contenders do not share an allocator's cache. Outputs and the variate bias's gradient are compared
with SDPA's.
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import posenc

HEADS, HEAD_DIM, ROWS, TOKENS, SERIES_PER_ROW, VARIATES = 4, 64, 16, 2048, 4, 4


def packed_batch(seed=0):
    """sample_ids, variate_ids, time_ids [ROWS, TOKENS]: 4 series per row, lengths 128..896
    summing to TOKENS, each series split into VARIATES contiguous runs, each run's time ids
    0, 1, ... (Moirai-2's variate-major packing)."""
    g = torch.Generator().manual_seed(seed)
    samples, variates, times = [], [], []
    for _ in range(ROWS):
        while True:
            lengths = torch.randint(128, 897, (SERIES_PER_ROW - 1,), generator=g)
            last = TOKENS - int(lengths.sum())
            if 128 <= last <= 896:
                break
        lengths = torch.cat([lengths, torch.tensor([last])])
        samples.append(torch.repeat_interleave(torch.arange(SERIES_PER_ROW), lengths))
        runs = [torch.diff(torch.linspace(0, int(n), VARIATES + 1).long()) for n in lengths]
        variates.append(torch.cat([torch.arange(VARIATES).repeat_interleave(r) for r in runs]))
        times.append(torch.cat([torch.arange(int(n)) for r in runs for n in r]))
    return torch.stack(samples), torch.stack(variates), torch.stack(times)


def inputs():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(ROWS, HEADS, TOKENS, HEAD_DIM, generator=g) for _ in range(3))
    grad = torch.randn(ROWS, HEADS, TOKENS, HEAD_DIM, generator=g)
    weight = torch.randn(2, HEADS, generator=g)
    return q, k, v, grad, weight


def contenders(sample_ids, variate_ids, time_ids, mask):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    in_time = mask == "moirai2"

    def sdpa(q, k, v, w):
        same = (variate_ids[:, :, None] == variate_ids[:, None, :])[:, None]  # [B, 1, N, N]
        bias = ~same * w[0].view(1, -1, 1, 1) + same * w[1].view(1, -1, 1, 1)  # uni2ts' form
        visible = sample_ids[:, :, None] == sample_ids[:, None, :]
        if in_time:  # uni2ts' packed_causal_attention_mask
            visible = visible & (time_ids[:, None, :] <= time_ids[:, :, None])
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias.masked_fill(~visible[:, None], -torch.inf)
        )

    def mask_mod(b, h, q_idx, kv_idx):
        same = sample_ids[b, q_idx] == sample_ids[b, kv_idx]
        if in_time:
            return same & (time_ids[b, kv_idx] <= time_ids[b, q_idx])
        return same

    block_mask = create_block_mask(mask_mod, ROWS, None, TOKENS, TOKENS, device="cpu")
    flex_compiled = torch.compile(flex_attention, dynamic=False)

    def flex(q, k, v, w):
        def score_mod(score, b, h, q_idx, kv_idx):
            same = variate_ids[b, q_idx] == variate_ids[b, kv_idx]
            return score + torch.where(same, w[1, h], w[0, h])

        return flex_compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)

    def ours(q, k, v, w):
        return posenc.positional_attention(
            q,
            k,
            v,
            sample_ids=sample_ids,
            variate_ids=variate_ids,
            variate_bias=w,
            causal_ids=time_ids if in_time else None,
        )

    return {"sdpa": sdpa, "flex": flex, "posenc": ours}


def fwd_bwd(fn, q, k, v, grad, weight):
    leaves = [t.detach().requires_grad_() for t in (q, k, v, weight)]
    out = fn(*leaves)
    out.backward(grad)
    return out.detach(), [t.grad for t in leaves]


def forward(fn, q, k, v, grad, weight):
    with torch.no_grad():
        return fn(q, k, v, weight), None


PASSES = {"forward": forward, "fwd+bwd": fwd_bwd}
NO_CPU_BACKWARD = {"flex"}  # FlexAttention: "does not support backward on CPU" (torch 2.15)


def machine():
    flags = subprocess.run(
        "grep -o -w -E 'avx512f|avx512_bf16' /proc/cpuinfo | sort -u | xargs",
        shell=True,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    aten = torch.backends.cpu.get_cpu_capability()
    return f"{platform.processor() or platform.machine()}, {flags or 'no avx512f'}, ATen {aten}; {load}"


def status_kb(field):
    """A field of /proc/self/status in kB (VmRSS: resident now, VmHWM: its peak)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def reset_peak_rss():
    """Sets VmHWM to the current resident size (Linux: "5" to /proc/self/clear_refs), so that the
    peak measured next is the pass's own, not the set-up's (getrusage's ru_maxrss cannot be reset
    and is inherited across exec)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_of(name, pass_name, threads, mask):
    """One contender's peak resident memory above its inputs for one pass, in MB (a child)."""
    torch.set_num_threads(threads)
    q, k, v, grad, weight = inputs()
    fn = contenders(*packed_batch(), mask)[name]
    run = PASSES[pass_name]
    if name == "flex":  # compile first: the compiler's own memory is not the attention's
        run(fn, q, k, v, grad, weight)
    reset_peak_rss()
    base = status_kb("VmRSS")
    run(fn, q, k, v, grad, weight)
    print(f"{(status_kb('VmHWM') - base) / 1024:.0f}")


def main():
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--mask", choices=("samples", "moirai2"), default="samples")
    p.add_argument("--peak-of", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.peak_of:
        return peak_of(*args.peak_of, args.threads, args.mask)
    torch.set_num_threads(args.threads)
    sample_ids, variate_ids, time_ids = packed_batch()
    q, k, v, grad, weight = inputs()
    runs = contenders(sample_ids, variate_ids, time_ids, args.mask)
    visible = sample_ids[:, :, None] == sample_ids[:, None, :]
    if args.mask == "moirai2":
        visible = visible & (time_ids[:, None, :] <= time_ids[:, :, None])
    pairs = int(visible.sum())
    print(f"torch {torch.__version__}, {args.threads} threads; {machine()}")
    print(
        f"{ROWS * SERIES_PER_ROW} series (128..896 patches, mean {ROWS * TOKENS / (ROWS * SERIES_PER_ROW):.0f}) "
        f"packed in [{ROWS}, {TOKENS}] tokens, {VARIATES} variates each; mask {args.mask}; "
        f"H={HEADS}, D={HEAD_DIM}, "
        f"float32; visible pairs {pairs / (ROWS * TOKENS * TOKENS):.1%} of N^2; "
        f"ms = median of {args.repeat} after a warm-up"
    )
    print(
        "| pass | contender | ms | contender / posenc | peak MB above inputs | "
        "max abs(out - sdpa's) | max abs(d variate_bias - sdpa's) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for pass_name, run in PASSES.items():
        names = [n for n in runs if not (pass_name == "fwd+bwd" and n in NO_CPU_BACKWARD)]
        results, times = {}, {name: [] for name in names}
        for name in names:  # warm-up (flex compiles here)
            results[name] = run(runs[name], q, k, v, grad, weight)
        for _ in range(args.repeat):
            for name in names:
                start = time.perf_counter()
                run(runs[name], q, k, v, grad, weight)
                times[name].append(time.perf_counter() - start)
        out_ref, grads_ref = results["sdpa"]
        ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
        for name in runs:
            if name not in names:
                print(
                    f"| {pass_name} | {name} | not supported on the CPU (torch {torch.__version__}) "
                    "| | | | |"
                )
                continue
            child = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--peak-of",
                    name,
                    pass_name,
                    "--threads",
                    str(args.threads),
                    "--mask",
                    args.mask,
                ],
                capture_output=True,
                text=True,
                check=False,
                env=os.environ,
            )
            peak = child.stdout.strip().splitlines()[-1] if child.returncode == 0 else "failed"
            out, grads = results[name]
            dw = "" if grads is None else f"{(grads[3] - grads_ref[3]).abs().max().item():.1e}"
            print(
                f"| {pass_name} | {name} | {ms[name]:.0f} | {ms[name] / ms['posenc']:.2f}x | "
                f"{peak} | {(out - out_ref).abs().max().item():.1e} | {dw} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

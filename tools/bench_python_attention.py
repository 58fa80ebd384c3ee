"""posenc.alibi_attention (the bias computed on the fly) against PyTorch's scaled_dot_product_attention
with the ALiBi bias materialized as its mask (what a user writes: BLOOM, MPT) and without any bias,
side by side in one process, as ratios (no timed assertions); and the bias memory each holds.

    POSENC_OPS_LIBRARY=build/libposenc_ops.so PYTHONPATH=python \
      ~/.cache/posenc/venv/bin/python tools/bench_python_attention.py [--threads 2] [--repeat 10]

Shape: q, k, v [1, 16, N, 64] float32, causal; times are medians of --repeat calls.
"""

import argparse

import torch
import torch.nn.functional as F

import posenc
from bench_util import median_ms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    heads, dim = 16, 64
    slopes = posenc.alibi_slopes(heads)
    print(f"torch {torch.__version__}, {args.threads} threads; ms are medians of {args.repeat}")
    print(
        "| N | pass | SDPA no bias ms | SDPA + materialized ALiBi ms | posenc ALiBi ms | "
        "posenc / no bias | materialized / posenc | bias memory (materialized vs posenc) |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---|")
    for n in args.lengths:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, heads, n, dim, generator=g) for _ in range(3))
        pos = torch.arange(n, dtype=torch.float32)
        d = pos[:, None] - pos[None, :]
        bias = (-slopes[:, None, None] * d).masked_fill(d < 0, float("-inf"))  # [H, N, N]

        def run(kind, backward):
            qq, kk, vv = (t.detach().requires_grad_(backward) for t in (q, k, v))
            if kind == "none":
                out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
            elif kind == "bias":
                out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=bias)
            else:
                out = posenc.alibi_attention(qq, kk, vv, slopes, causal=True)
            if backward:
                out.sum().backward()

        for backward in (False, True):
            t_none = median_ms(lambda: run("none", backward), args.repeat, 2)
            t_bias = median_ms(lambda: run("bias", backward), args.repeat, 2)
            t_ours = median_ms(lambda: run("posenc", backward), args.repeat, 2)
            mem = f"{bias.numel() * 4 / 2**20:.0f} MiB vs {slopes.numel() * 4} B"
            print(
                f"| {n} | {'fwd+bwd' if backward else 'fwd'} | {t_none:.1f} | {t_bias:.1f} | "
                f"{t_ours:.1f} | {t_ours / t_none:.2f}x | {t_bias / t_ours:.2f}x | {mem} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

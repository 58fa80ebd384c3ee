"""posenc.apply_rotary_pos_emb against transformers' own apply_rotary_pos_emb (eager) and the same
function under torch.compile, side by side in one process, as ratios (no timed assertions).

    POSENC_OPS_LIBRARY=build/libposenc_ops.so PYTHONPATH=python \
      ~/.cache/posenc/venv/bin/python tools/bench_python_rotary.py [--threads 2] [--repeat 30]

Shapes: Llama-style q [B, 32, N, 128], k [B, 8, N, 128] (grouped-query), the projections' view
as transformers makes it ([B, N, H, D] transposed). Times are medians of --repeat calls. Each
forward+backward call starts with no gradient in q and k (no accumulation into the last call's).

glibc moves its mmap threshold as large blocks are freed, so whether a 32 MiB result is a fresh
mapping (page faults on every call) or reused heap depended on what ran before: the float32 rows
moved between runs. The script pins the threshold (MALLOC_MMAP_THRESHOLD_, glibc's largest
value, 32 MiB, what a long-running process drifts to) by starting itself again with it set.
"""

import argparse
import os
import sys

import torch

import posenc
from bench_util import median_ms
from transformers.models.llama import modeling_llama

MMAP_THRESHOLD = str(32 << 20)


def main():
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = MMAP_THRESHOLD
        os.execv(sys.executable, [sys.executable] + sys.argv)
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    hf = modeling_llama.apply_rotary_pos_emb
    compiled = torch.compile(hf, fullgraph=True, dynamic=False)
    print(f"torch {torch.__version__}, {args.threads} threads; ms are medians of {args.repeat}; "
          f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}")
    print("| dtype | B x N | pass | HF eager ms | HF compiled ms | posenc ms | eager/posenc | compiled/posenc |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for dtype in (torch.float32, torch.bfloat16):
        for b, n in ((1, 2048), (4, 512)):
            q = torch.randn(b, n, 32 * 128).view(b, n, 32, 128).transpose(1, 2).to(dtype)
            k = torch.randn(b, n, 8 * 128).view(b, n, 8, 128).transpose(1, 2).to(dtype)
            inv = 1.0 / (10000 ** (torch.arange(0, 128, 2).float() / 128))
            cos, sin = posenc.rope_cos_sin(torch.arange(n)[None].expand(b, n), inv)
            cos, sin = cos.to(dtype), sin.to(dtype)
            ours = lambda: posenc.apply_rotary_pos_emb(q, k, cos, sin)  # noqa: E731
            rows = {"forward": (lambda: hf(q, k, cos, sin), lambda: compiled(q, k, cos, sin), ours)}
            qg, kg = q.detach().requires_grad_(), k.detach().requires_grad_()

            def backward(f):
                def run():
                    qg.grad, kg.grad = None, None
                    a, c = f(qg, kg, cos, sin)
                    torch.autograd.backward((a, c), (a, c))
                return run

            rows["fwd+bwd"] = (backward(hf), backward(compiled),
                               backward(posenc.apply_rotary_pos_emb))
            for name, (e, c, o) in rows.items():
                te, tc, to = (median_ms(f, args.repeat) for f in (e, c, o))
                print(f"| {str(dtype).replace('torch.', '')} | {b} x {n} | {name} | {te:.2f} | "
                      f"{tc:.2f} | {to:.2f} | {te / to:.2f}x | {tc / to:.2f}x |")


if __name__ == "__main__":
    main()

"""posenc.apply_rotary_pos_emb against transformers' own apply_rotary_pos_emb (eager) and the same
function under torch.compile, side by side in one process, as ratios (no timed assertions).

    POSENC_OPS_LIBRARY=build/libposenc_ops.so PYTHONPATH=python \
      ~/.cache/posenc/venv/bin/python tools/bench_python_rotary.py [--threads 2] [--repeat 30]

Shapes: Llama-style q [B, 32, N, 128], k [B, 8, N, 128] (grouped-query), the projections' view
as transformers makes it ([B, N, H, D] transposed). Times are medians of --repeat calls. Each
forward+backward call starts with no gradient in q and k (no accumulation into the last call's).
"fwd+bwd" backpropagates dense gradients (the results themselves); "fwd+sum bwd" is
`(a.sum() + b.sum()).backward()`, whose gradients are expanded scalars (stride 0): the backward
makes them dense once and stays on the fused kernel (apply_rotary_backward_route says so).

Large tensors are fresh mappings from the kernel on every call (PyTorch's CPU allocator does not
cache), so with 4 KiB pages the float32 rows measured page faults more than arithmetic, and
varied 2x between runs with the machine's memory state. The script starts itself again with
THP_MEM_ALLOC_ENABLE=1 (PyTorch's CPU allocator asks for transparent huge pages, 2 MiB), where
the rows repeat within ~10% and all three contenders run ~3x faster; --small-pages measures
with 4 KiB pages instead.
"""

import argparse
import os
import sys

import torch
from transformers.models.llama import modeling_llama

import posenc
from bench_util import median_ms


def main():
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument(
        "--small-pages",
        action="store_true",
        help="4 KiB pages (THP_MEM_ALLOC_ENABLE=0): page faults in every row",
    )
    args = p.parse_args()
    want = "0" if args.small_pages else "1"  # read by the allocator when the process starts
    if os.environ.get("THP_MEM_ALLOC_ENABLE", "0") != want:
        os.environ["THP_MEM_ALLOC_ENABLE"] = want
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    torch.set_num_threads(args.threads)
    hf = modeling_llama.apply_rotary_pos_emb
    compiled = torch.compile(hf, fullgraph=True, dynamic=False)
    print(
        f"torch {torch.__version__}, {args.threads} threads; ms are medians of {args.repeat}; "
        f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', '0')}"
    )
    print(
        "| dtype | B x N | pass | HF eager ms | HF compiled ms | posenc ms | eager/posenc | compiled/posenc |"
    )
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

            def sum_backward(f):
                def run():
                    qg.grad, kg.grad = None, None
                    a, c = f(qg, kg, cos, sin)
                    (a.sum() + c.sum()).backward()

                return run

            rows["fwd+bwd"] = (
                backward(hf),
                backward(compiled),
                backward(posenc.apply_rotary_pos_emb),
            )
            rows["fwd+sum bwd"] = (
                sum_backward(hf),
                sum_backward(compiled),
                sum_backward(posenc.apply_rotary_pos_emb),
            )
            for name, (e, c, o) in rows.items():
                te, tc, to = (median_ms(f, args.repeat) for f in (e, c, o))
                print(
                    f"| {str(dtype).replace('torch.', '')} | {b} x {n} | {name} | {te:.2f} | "
                    f"{tc:.2f} | {to:.2f} | {te / to:.2f}x | {tc / to:.2f}x |"
                )


if __name__ == "__main__":
    main()

"""A video DiT's 3D RoPE on the CPU: posenc's rotation operator against diffusers' own Wan code (eager)
and the same code under torch.compile, side by side in one process, as ratios (no timed assertions).

    POSENC_OPS_LIBRARY=$(find build -name libposenc_ops.so | head -1) PYTHONPATH=python \
      ~/.cache/posenc/venv/bin/python tools/bench_diffusers_rope.py [--threads 2] [--repeat 10]

Shape: Wan 2.1 1.3B at 480 x 832, 81 frames: 21 x 30 x 52 = 32,760 patch tokens, 12 heads of 128, q and
k [1, N, H, D] as WanAttnProcessor has them (after unflatten(2, (heads, -1))). Tables: diffusers'
WanRotaryPosEmbed (float64 ladders rounded to float32, [1, N, 1, D] repeat_interleave'd), the same
tables for every contender (posenc takes the per-pair half, freqs[..., 0::2]).

Contenders, each rotating q and k:
  eager     WanAttnProcessor.__call__'s own closure apply_rotary_emb (diffusers 0.42.1,
            models/transformers/transformer_wan.py lines 104-115), copied verbatim below
  compiled  that function under torch.compile(fullgraph=True, dynamic=False)
  posenc    torch.ops.posenc.rope_rotate_qk(q, k, cos, sin, "interleaved") (posenc.rope_rotate_qk)
Rows: forward; fwd+bwd with dense gradients (the results themselves); fwd+sum bwd, whose gradients
are expanded scalars (stride 0). Times are medians of --repeat calls; each backward call starts with
no gradient in q and k. "equal" says whether posenc's forward equals eager's to the bit.

As tools/bench_python_rotary.py, the script starts itself again with THP_MEM_ALLOC_ENABLE=1 (the CPU
allocator's transparent huge pages: 200 MB tensors are fresh mappings on every call).
"""

import argparse
import os
import platform
import subprocess
import sys

import torch
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

import posenc
from bench_util import median_ms


# diffusers 0.42.1, src/diffusers/models/transformers/transformer_wan.py, WanAttnProcessor.__call__,
# lines 104-115, verbatim (a closure there; module-level here so that torch.compile and we share it)
def apply_rotary_emb(
    hidden_states: torch.Tensor,
    freqs_cos: torch.Tensor,
    freqs_sin: torch.Tensor,
):
    x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(hidden_states)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(hidden_states)


def diffusers_qk(q, k, freqs_cos, freqs_sin):
    # query = apply_rotary_emb(query, *rotary_emb); key = apply_rotary_emb(key, *rotary_emb)
    return apply_rotary_emb(q, freqs_cos, freqs_sin), apply_rotary_emb(k, freqs_cos, freqs_sin)


def machine():
    grep = "grep -o -w avx512f /proc/cpuinfo | head -1"
    avx512 = subprocess.run(
        grep, shell=True, capture_output=True, text=True, check=False
    ).stdout.strip()
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    avx512 = avx512 or "no avx512f"
    aten = torch.backends.cpu.get_cpu_capability()
    return f"{platform.processor() or platform.machine()}, {avx512}, ATen {aten}; {load}"


def main():
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--frames", type=int, default=21, help="latent frames (patch grid t)")
    p.add_argument("--height", type=int, default=30, help="patch rows")
    p.add_argument("--width", type=int, default=52, help="patch columns")
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args()
    if os.environ.get("THP_MEM_ALLOC_ENABLE", "0") != "1":  # read when the process starts
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    torch.set_num_threads(args.threads)
    heads, head_dim = 12, 128
    rope = WanRotaryPosEmbed(head_dim, (1, 2, 2), max_seq_len=1024)
    freqs_cos, freqs_sin = rope(torch.empty(1, 1, args.frames, 2 * args.height, 2 * args.width))
    n = freqs_cos.shape[1]
    cos, sin = (
        freqs_cos[0, :, 0, 0::2].contiguous(),
        freqs_sin[0, :, 0, 0::2].contiguous(),
    )  # [N, 64]
    compiled = torch.compile(diffusers_qk, fullgraph=True, dynamic=False)
    print(f"torch {torch.__version__}, {args.threads} threads; {machine()}")
    print(
        f"Wan 3D RoPE, q and k [1, {n}, {heads}, {head_dim}]; ms are medians of {args.repeat}; "
        f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE')}"
    )
    print(
        "| dtype | pass | eager ms | compiled ms | posenc ms | eager/posenc | compiled/posenc | equal |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        q = torch.randn(1, n, heads, head_dim).to(dtype)
        k = torch.randn(1, n, heads, head_dim).to(dtype)

        def ours(q, k, freqs_cos, freqs_sin):
            return posenc.rope_rotate_qk(q, k, cos, sin, "interleaved")

        with torch.no_grad():
            equal = all(
                torch.equal(a, b)
                for a, b in zip(
                    diffusers_qk(q, k, freqs_cos, freqs_sin), ours(q, k, freqs_cos, freqs_sin)
                )
            )
        qg, kg = q.detach().requires_grad_(), k.detach().requires_grad_()

        def forward(f, q=q, k=k):
            def run():
                with torch.no_grad():
                    f(q, k, freqs_cos, freqs_sin)

            return run

        def backward(f, qg=qg, kg=kg):
            def run():
                qg.grad, kg.grad = None, None
                a, b = f(qg, kg, freqs_cos, freqs_sin)
                torch.autograd.backward((a, b), (a, b))

            return run

        def sum_backward(f, qg=qg, kg=kg):
            def run():
                qg.grad, kg.grad = None, None
                a, b = f(qg, kg, freqs_cos, freqs_sin)
                (a.sum() + b.sum()).backward()

            return run

        for row, wrap in (
            ("forward", forward),
            ("fwd+bwd", backward),
            ("fwd+sum bwd", sum_backward),
        ):
            te, tc, to = (median_ms(wrap(f), args.repeat) for f in (diffusers_qk, compiled, ours))
            print(
                f"| {name} | {row} | {te:.1f} | {tc:.1f} | {to:.1f} | {te / to:.2f}x | {tc / to:.2f}x | "
                f"{'yes' if equal else 'no'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

"""The polynomial tables of posenc's fused GELU (src/kernels/cpu/gelu_rows.h), fitted here.

GELU and its derivative through two even-symmetric tails of the normal distribution, a = |x|:

    Q(a) = Phi(-a) = erfc(a / sqrt 2) / 2              gelu(x)  = relu(x) - a Q(a)
    S(a) = Phi(-a) - a phi(a) = gelu'(-a)              gelu'(x) = S(a) if x < 0, else 1 - S(a)

(gelu(x) = x Phi(x) and Phi(x) = 1 - Q(a) for x >= 0, Q(a) for x < 0; gelu'(x) + gelu'(-x) = 1.)
Each tail is a piecewise polynomial over 8 intervals of u = a k: interval n (0..6) covers
u in [n - 1/2, n + 1/2] (interval 0: [0, 1/2]), evaluated by Horner in t = u - n; interval 7 (u
past 6.5, up to the clamp a <= 7 / k) is zero: Q and |S| are below 4e-8 there. The kernel
finds n and t with two fused multiply-adds: w = fma(a, k, 1.5 * 2^23) rounds a k to the nearest
integer n (ties to even, n in w's low mantissa bits: the table index), t = fma(a, k, 1.5 * 2^23 -
w) = a k - n rounded once.

Fit: per interval, Lawson's iteratively reweighted least squares (the weighted minimax
polynomial) on 402 Chebyshev points, the error weighted by 1 / max(|f|, 1e-7) (absolute where the
tail is large, relative where it is small, so the tail's sign and first digits hold past 1e-7),
the coefficients rounded to float32 one at a time with the rest refitted. The float64 reference
is math.erfc / math.exp (relative error ~1e-16). The errors printed are those of the float32
evaluation (the kernel's operations, simulated in float64 with one rounding to float32 each)
over 400,001 points of a in [0, 7].

    python tools/gen_gelu_polynomials.py > src/kernels/cpu/gelu_tables.h   # needs numpy only
    clang-format -i src/kernels/cpu/gelu_tables.h

writes the C++ header of the tables that gelu_rows.h evaluates.
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32
MAGIC = 1.5 * 2**23
FLOOR = 1e-7  # below this size of the tail, the error is weighted relatively
INTERVALS = 8  # the vector table width (AVX2 permutes 8 lanes)


def tail_q(a: float) -> float:
    return 0.5 * math.erfc(a / math.sqrt(2.0))


def tail_s(a: float) -> float:
    return tail_q(a) - a * math.exp(-0.5 * a * a) / math.sqrt(2.0 * math.pi)


def lawson(basis: np.ndarray, y: np.ndarray, weight: np.ndarray, iters: int = 300) -> np.ndarray:
    """The coefficients c minimizing max |basis c - y| weight (Lawson's algorithm)."""
    lam = np.full(len(y), 1.0 / len(y))
    c = np.zeros(basis.shape[1])
    for _ in range(iters):
        sw = np.sqrt(lam) * weight
        c = np.linalg.lstsq(basis * sw[:, None], y * sw, rcond=None)[0]
        err = np.abs(basis @ c - y) * weight
        lam = lam * err
        lam /= lam.sum()
    return c


def fit_interval(fun, k: float, degree: int, n: int) -> list[float]:
    lo, hi = (-0.5 if n > 0 else 0.0), 0.5
    count = 400
    j = np.arange(count)
    ts = (lo + hi) / 2 + (hi - lo) / 2 * np.cos((2 * j + 1) * np.pi / (2 * count))
    ts = np.concatenate([ts, [lo, hi]])
    basis = np.vander(ts, degree + 1, increasing=True)
    y = np.array([fun((n + t) / k) for t in ts])
    weight = 1.0 / np.maximum(np.abs(y), FLOOR)
    coefficients: list[float] = []
    for m in range(degree + 1):
        rest = y - basis[:, :m] @ np.array(coefficients) if m else y
        c = lawson(basis[:, m:], rest, weight)
        coefficients.append(float(F32(c[0])))
    return coefficients


def evaluate(table: list[list[float]], k: float, cap: float, a: np.ndarray) -> np.ndarray:
    """The kernel's float32 evaluation of the tail at a (float32), simulated."""
    ac = np.minimum(a, F32(cap)).astype(np.float64)
    u = ac * k  # exact: a product of two float32 values fits a float64
    n = np.rint(u)  # fma(a, k, MAGIC) - MAGIC: round to nearest, ties to even
    t = (u - n).astype(F32).astype(np.float64)  # fma(a, k, MAGIC - w)
    out = np.zeros_like(t)
    for i in range(INTERVALS):
        sel = n == i
        r = np.full(sel.sum(), table[i][-1])
        for c in reversed(table[i][:-1]):
            r = (r * t[sel] + c).astype(F32).astype(np.float64)
        out[sel] = r
    return out


def build(name: str, fun, cut: float, degree: int):
    k = float(F32((INTERVALS - 1.5) / cut))
    cap = float(F32((INTERVALS - 1) / k))
    table = [fit_interval(fun, k, degree, n) for n in range(INTERVALS - 1)]
    table.append([0.0] * (degree + 1))
    a = np.linspace(0.0, 7.0, 400001).astype(F32)
    got = evaluate(table, k, cap, a)
    want = np.array([fun(float(v)) for v in a])
    err = np.abs(got - want)
    inside = a < (INTERVALS - 1.5) / k
    small = inside & (np.abs(want) < 1e-3)
    print(
        f"// {name}: degree {degree}, k = {str(F32(k))}, clamp a <= {str(F32(cap))} "
        f"(zero past a = {6.5 / k:.4f}, where |{name}| <= {abs(fun(6.5 / k)):.2e})"
    )
    print(
        f"//   float32 evaluation: max |error| {err.max():.3e} (at a = {a[err.argmax()]:.4f}); "
        f"max relative error where |{name}| < 1e-3: "
        f"{(err[small] / np.abs(want[small])).max():.2e}; "
        f"sign changes: {int((got * want < 0).sum())}"
    )
    return k, cap, table


def emit(symbol: str, k: float, cap: float, table: list[list[float]]) -> None:
    degree = len(table[0]) - 1
    print(f"constexpr float k{symbol}Scale = {str(F32(k))}f;")
    print(f"constexpr float k{symbol}Clamp = {str(F32(cap))}f;")
    print(f"constexpr int k{symbol}Degree = {degree};")
    print(f"// k{symbol}[j][n]: the coefficient of t^j on interval n (lanes 8..15: zero)")
    print(f"alignas(64) constexpr float k{symbol}[{degree + 1}][16] = {{")
    for j in range(degree + 1):
        row = ", ".join(f"{str(F32(table[n][j]))}f" for n in range(INTERVALS))
        print(f"    {{{row}, 0, 0, 0, 0, 0, 0, 0, 0}},")
    print("};")


HEADER = """\
// Generated by tools/gen_gelu_polynomials.py (numpy {numpy}); do not edit, regenerate:
//   python tools/gen_gelu_polynomials.py > src/kernels/cpu/gelu_tables.h
//   clang-format -i src/kernels/cpu/gelu_tables.h
// The fused GELU's two tails of the normal distribution as piecewise polynomials (gelu_rows.h;
// the math and the fit: the script's docstring), a = |x|, u = a k, n = round(u), t = u - n:
//   Q(a) = erfc(a / sqrt 2) / 2 = Phi(-a)           gelu(x)  = relu(x) - a Q(a)
//   S(a) = Q(a) - a exp(-a^2 / 2) / sqrt(2 pi)      gelu'(x) = x < 0 ? S(a) : 1 - S(a)
//   tail(a) = sum_j k<Tail>[j][n] t^j (Horner), a clamped to k<Tail>Clamp (interval 7: zero)"""


def main() -> None:
    print(HEADER.format(numpy=np.__version__))
    q = build("Q", tail_q, cut=5.4, degree=6)
    s = build("S", tail_s, cut=6.0, degree=7)
    print("#pragma once")
    print()
    print("namespace posenc::detail {")
    print()
    emit("GeluQ", *q)
    print()
    emit("GeluS", *s)
    print()
    print("}  // namespace posenc::detail")


if __name__ == "__main__":
    main()

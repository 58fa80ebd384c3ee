"""Shared timing for the side-by-side Python benchmarks (tools/bench_python_*.py): medians of
repeated calls after warm-up, so one slow call (a page fault, a thread wake-up) does not decide."""

import statistics
import time


def median_ms(fn, repeat, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)

"""How ``tensorpress.compress`` / ``decompress`` scale with threads (``workers=``).

For each array and codec: the median GB/s (input bytes / s) of ``--repeat`` compress
and decompress calls with 1, 2, 4, ... threads up to the machine's cores, the speed-up
over one thread, and the CPU time (all threads) over one thread's: on cores that other
jobs share the wall time says little, the CPU time whether threads added work; then
the geometric means per thread count.
The bytes do not depend on the threads (checked: every run's stream must equal the
one-thread stream). Arrays: synthetic float32 arrays of ``--size-mib`` MiB made with
a fixed seed (a smooth 3-D field, a ReLU activation, Gaussian gradients), or the
``.npy`` files of ``--corpus-dir`` of at least ``--min-mib`` MiB.

    python benchmarks/thread_scaling.py [--codecs block,sz] [--size-mib 64] [--rel 1e-2]
    python benchmarks/thread_scaling.py --corpus-dir benchmarks/.cache/corpus-v1
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import tensorpress as tp

SEED = 0


def synthetic(size_mib: int) -> dict[str, np.ndarray]:
    """Three float32 arrays of about ``size_mib`` MiB each."""
    g = np.random.default_rng(SEED)
    n = size_mib * 2**20 // 4
    side = round(n ** (1 / 3))
    blur = 8  # two box blurs of this width along every axis: a smooth field
    field = g.standard_normal((side + 2 * blur,) * 3)
    for axis in (0, 1, 2, 0, 1, 2):
        c = np.cumsum(field, axis=axis)
        m = field.shape[axis]
        field = (np.take(c, range(blur, m), axis) - np.take(c, range(m - blur), axis)) / blur
    field = (field / field.std()).astype(np.float32)
    relu = np.maximum(np.cumsum(g.standard_normal(n).astype(np.float32)) * 0.01, 0.0)
    grads = (1e-3 * g.standard_normal(n)).astype(np.float32)
    return {"smooth_field": field, "relu_walk": relu.astype(np.float32), "gauss_grad": grads}


def from_corpus(corpus_dir: Path, min_mib: float) -> dict[str, np.ndarray]:
    out = {}
    for path in sorted(corpus_dir.glob("*.npy")):
        x = np.load(path)
        if x.dtype.kind == "f" and x.nbytes >= min_mib * 2**20:
            out[path.stem] = x
    return out


def thread_counts(cores: int) -> list[int]:
    counts, t = [], 1
    while t < cores:
        counts.append(t)
        t *= 2
    return counts + [cores]


def cpu_seconds() -> float:
    """CPU seconds this process has used, all its threads and the kernel's work for it."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn, repeat: int) -> tuple[float, float, object]:
    """(median wall seconds, median CPU seconds, last result) of ``repeat`` calls after one
    warm-up. On a machine whose cores other jobs share, the wall time says little; the
    CPU time says whether more threads did more work."""
    out = fn()
    times, cpu = [], []
    for _ in range(repeat):
        c0, t0 = cpu_seconds(), time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        cpu.append(cpu_seconds() - c0)
    return statistics.median(times), statistics.median(cpu), out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--codecs", default="block", help="comma-separated (default block)")
    p.add_argument("--rel", type=float, default=1e-2)
    p.add_argument("--size-mib", type=int, default=64, help="synthetic arrays' MiB")
    p.add_argument("--corpus-dir", type=Path, default=None)
    p.add_argument("--min-mib", type=float, default=4.0, help="smallest corpus array used")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--max-threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    if args.repeat < 1 or args.size_mib < 1 or args.max_threads < 1:
        p.error("--repeat, --size-mib and --max-threads must be >= 1")
    arrays = (
        from_corpus(args.corpus_dir, args.min_mib) if args.corpus_dir else synthetic(args.size_mib)
    )
    if not arrays:
        p.error(f"no float array of at least {args.min_mib} MiB in {args.corpus_dir}")
    counts = thread_counts(args.max_threads)
    print(
        f"tensorpress {tp.__version__}, numpy {np.__version__}, {os.cpu_count()} cores; "
        f"rel {args.rel:g}; median of {args.repeat}; GB = 1e9 bytes"
    )
    print(f"{'array':18} {'MiB':>6} {'codec':6} {'threads':>7} {'ratio':>7} "
          f"{'comp GB/s':>9} {'dec GB/s':>8} {'comp x':>6} {'dec x':>6} "
          f"{'comp cpu':>8} {'dec cpu':>7}")  # fmt: skip
    speedups: dict[tuple[str, int], list[tuple[float, ...]]] = {}
    failed = False
    for name, x in arrays.items():
        for codec in args.codecs.split(","):
            one = None
            for t in counts:

                def enc(t=t, x=x, codec=codec):
                    return tp.compress(x, codec=codec, rel=args.rel, workers=t)

                tc, cc, blob = timed(enc, args.repeat)
                dec = lambda t=t, blob=blob: tp.decompress(blob, workers=t)  # noqa: E731
                td, cd, _ = timed(dec, args.repeat)
                if one is None:
                    one = (tc, td, cc, cd, blob)
                elif blob != one[4]:
                    failed = True
                    print(f"!! {name} {codec}: {t} threads wrote other bytes than 1 thread")
                ratios = (one[0] / tc, one[1] / td, cc / one[2], cd / one[3])
                speedups.setdefault((codec, t), []).append(ratios)
                print(
                    f"{name:18} {x.nbytes / 2**20:>6.1f} {codec:6} {t:>7} "
                    f"{x.nbytes / len(blob):>7.2f} {x.nbytes / tc / 1e9:>9.3f} "
                    f"{x.nbytes / td / 1e9:>8.3f} {ratios[0]:>6.2f} {ratios[1]:>6.2f} "
                    f"{ratios[2]:>8.2f} {ratios[3]:>7.2f}",
                    flush=True,
                )
    print("\ngeometric means over arrays: speed-up over one thread (wall time), and CPU time")
    print("over one thread's (above 1: the threads did more work in all):")
    for (codec, t), rows in speedups.items():
        g = [math.exp(statistics.fmean(math.log(r[k]) for r in rows)) for k in range(4)]
        print(
            f"  {codec:6} {t:>3} threads: compress {g[0]:.2f}x, decompress {g[1]:.2f}x; "
            f"CPU time compress {g[2]:.2f}x, decompress {g[3]:.2f}x"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

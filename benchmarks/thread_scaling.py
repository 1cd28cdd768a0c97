"""How ``tensorpress.compress`` / ``decompress`` scale with threads (``workers=``).

For each array and codec: the median GB/s (input bytes / s) of ``--repeat`` compress
and decompress calls with 1, 2, 4, ... threads up to the machine's cores, and the
speed-up over one thread; then the geometric mean of the speed-ups per thread count.
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


def timed(fn, repeat: int) -> tuple[float, object]:
    """(median seconds, last result) of ``repeat`` calls after one warm-up."""
    out = fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


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
          f"{'comp GB/s':>9} {'dec GB/s':>8} {'comp x':>6} {'dec x':>6}")  # fmt: skip
    speedups: dict[tuple[str, int], list[tuple[float, float]]] = {}
    failed = False
    for name, x in arrays.items():
        for codec in args.codecs.split(","):
            one = None
            for t in counts:

                def enc(t=t, x=x, codec=codec):
                    return tp.compress(x, codec=codec, rel=args.rel, workers=t)

                tc, blob = timed(enc, args.repeat)
                td, _ = timed(lambda t=t, blob=blob: tp.decompress(blob, workers=t), args.repeat)
                if one is None:
                    one = (tc, td, blob)
                elif blob != one[2]:
                    failed = True
                    print(f"!! {name} {codec}: {t} threads wrote other bytes than 1 thread")
                sc, sd = one[0] / tc, one[1] / td
                speedups.setdefault((codec, t), []).append((sc, sd))
                print(
                    f"{name:18} {x.nbytes / 2**20:>6.1f} {codec:6} {t:>7} "
                    f"{x.nbytes / len(blob):>7.2f} {x.nbytes / tc / 1e9:>9.3f} "
                    f"{x.nbytes / td / 1e9:>8.3f} {sc:>6.2f} {sd:>6.2f}",
                    flush=True,
                )
    print("\ngeometric mean speed-up over one thread:")
    for (codec, t), pairs in speedups.items():
        gc = math.exp(statistics.fmean(math.log(a) for a, _ in pairs))
        gd = math.exp(statistics.fmean(math.log(b) for _, b in pairs))
        print(f"  {codec:6} {t:>3} threads: compress {gc:.2f}x, decompress {gd:.2f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

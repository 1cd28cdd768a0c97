"""The ``demo`` command: a built-in scientific field and activation, compressed and checked."""

from __future__ import annotations

import time

import numpy as np

from .bench import BENCH_PLOT_HINT, DEFAULT_RELS
from .errors import EXIT_OK, EXIT_VIOLATION


def demo_field(n: int = 96, seed: int = 0) -> np.ndarray:
    """A smooth 3-d scientific field: a Gaussian random field with a k^-11/3 spectrum."""
    rng = np.random.default_rng(seed)
    k = np.fft.fftfreq(n)
    kk = np.sqrt(k[:, None, None] ** 2 + k[None, :, None] ** 2 + k[None, None, :] ** 2)
    kk[0, 0, 0] = np.inf
    amp = kk ** (-11.0 / 6.0)
    noise = rng.standard_normal((n, n, n)) + 1j * rng.standard_normal((n, n, n))
    field = np.fft.ifftn(noise * amp).real
    return (field / field.std()).astype(np.float32)


def demo_activation(seed: int = 0) -> np.ndarray:
    """A ReLU activation of a small random conv layer on smooth inputs, (32, 16, 32, 32),
    computed with numpy so that the demo runs without torch."""
    rng = np.random.default_rng(seed)
    windows = np.lib.stride_tricks.sliding_window_view
    x = rng.standard_normal((32, 3, 36, 36)).astype(np.float32)
    x = windows(x, (5, 5), axis=(2, 3)).mean(axis=(-2, -1))  # 5x5 average pool, stride 1
    w = (rng.standard_normal((16, 3, 3, 3)) / 5.0).astype(np.float32)
    x = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))  # 3x3 convolution, padding 1
    y = np.einsum("nchwij,kcij->nkhw", windows(x, (3, 3), axis=(2, 3)), w, optimize=True)
    return np.maximum(y, 0.0, dtype=np.float32)


def run_demo(args) -> int:
    """``tensorpress demo``: exit 1 if a tensorpress codec broke its bound."""
    from .. import compress, decompress
    from .peers import available_peers

    rels = args.rel or list(DEFAULT_RELS)
    peers = [p for p in available_peers() if p.lossy]
    datasets = {"field 96^3": demo_field(), "activation": demo_activation()}
    print(
        f"{'dataset':<12} {'codec':<12} {'rel':>7} {'ratio':>8} {'max err/bound':>13} "
        f"{'PSNR dB':>8} {'comp MB/s':>9} {'dec MB/s':>8}"
    )
    violations = 0
    for name, x in datasets.items():
        span = float(x.max() - x.min())
        for rel in rels:
            bound = rel * span
            runs = [
                ("tp sz", lambda a, r=rel: compress(a, rel=r), decompress),
                ("tp block", lambda a, r=rel: compress(a, rel=r, codec="block"), decompress),
            ]
            runs += [
                (
                    p.name,
                    lambda a, p=p, b=bound: p.compress(a, b),
                    lambda z, p=p, like=x: p.decompress(z, like),
                )
                for p in peers
            ]
            for codec, enc, dec in runs:
                dec(enc(x))  # untimed: compiles (or loads) the kernels this very call needs
                t0 = time.perf_counter()
                blob = enc(x)
                t1 = time.perf_counter()
                y = dec(blob)
                t2 = time.perf_counter()
                err = float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max())
                ok = err <= bound
                violations += (not ok) and codec.startswith("tp ")
                mse = float(np.mean((x.astype(np.float64) - y) ** 2))
                psnr = 20 * np.log10(span) - 10 * np.log10(mse) if mse > 0 else float("inf")
                print(
                    f"{name:<12} {codec:<12} {rel:>7.0e} {x.nbytes / len(blob):>8.2f} "
                    f"{err / bound:>12.3f}{' ' if ok else '!'} {psnr:>8.1f} "
                    f"{x.nbytes / 1e6 / (t1 - t0):>9.1f} {x.nbytes / 1e6 / (t2 - t1):>8.1f}"
                )
    print(
        "bound held on every element"
        if not violations
        else f"BOUND VIOLATED in {violations} run(s)"
    )
    if not peers:
        print(f"(install the bench extra to see SZ3 and ZFP beside it: {BENCH_PLOT_HINT})")
    return EXIT_VIOLATION if violations else EXIT_OK

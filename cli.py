"""The ``tensorpress`` command: ``--version``, ``info FILE`` and ``demo``."""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="tensorpress", description="Error-bounded compression of arrays and tensors."
    )
    parser.add_argument("--version", action="version", version=f"tensorpress {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_info = sub.add_parser("info", help="describe a compressed file")
    p_info.add_argument("file", help="a file written by tensorpress")
    p_info.add_argument("--json", action="store_true", help="print JSON")
    p_demo = sub.add_parser(
        "demo", help="compress a built-in scientific field and activation tensor, verify, report"
    )
    p_demo.add_argument(
        "--rel",
        type=float,
        action="append",
        help="value-range relative bound (repeatable; default 1e-2, 1e-3, 1e-4)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "info":
            return _info(args.file, args.json)
        if args.command == "demo":
            return _demo(args.rel or [1e-2, 1e-3, 1e-4])
    except (OSError, ValueError, TypeError) as exc:
        print(f"tensorpress: error: {exc}", file=sys.stderr)
        return 2
    parser.print_help()
    return 0


def _info(path: str, as_json: bool) -> int:
    from . import info

    with open(path, "rb") as f:
        meta = info(f.read())
    if as_json:
        print(json.dumps(meta, indent=2))
        return 0
    bound = meta["bound"]
    rows = [
        ("format version", meta["format_version"]),
        ("codec", json.dumps(meta["config"])),
        ("dtype / shape", f"{meta['dtype']} {tuple(meta['shape'])} ({meta['order']} order)"),
        (
            "bound",
            "lossless"
            if bound is None
            else f"{bound['mode']}={bound['value']:g} (absolute tolerance {bound['tolerance']:g})"
            if bound["mode"] != "pw_rel"
            else f"pw_rel={bound['value']:g}",
        ),
        ("chunks", f"{meta['chunks']} of {meta['chunk_rows']} rows"),
        (
            "size",
            f"{meta['original_bytes']} -> {meta['compressed_bytes']} bytes "
            f"(ratio {meta['ratio']:.2f})",
        ),
        ("written by", meta["writer"]),
    ]
    for k, v in rows:
        print(f"{k:>15}: {v}")
    return 0


# -- demo ------------------------------------------------------------------------


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
    """A ReLU activation of a small random conv layer on smooth inputs, (32, 16, 32, 32)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.nn.functional.avg_pool2d(torch.randn(32, 3, 36, 36, generator=g), 5, 1)
    w = torch.randn(16, 3, 3, 3, generator=g) / 5.0
    return torch.relu(torch.nn.functional.conv2d(x, w, padding=1)).numpy()


def _demo(rels: list[float]) -> int:
    from . import compress, decompress

    peers = _peers()
    datasets = {"field 96^3": demo_field(), "activation": demo_activation()}
    print(
        f"{'dataset':<12} {'codec':<12} {'rel':>7} {'ratio':>8} {'max err/bound':>13} "
        f"{'PSNR dB':>8} {'comp MB/s':>9} {'dec MB/s':>8}"
    )
    violations = 0
    for x in datasets.values():  # load the compiled kernels before timing anything
        for predictor in ("lorenzo", "linear"):
            decompress(compress(x[:2], rel=rels[0], predictor=predictor))
        decompress(compress(x[:2], rel=rels[0], codec="block"))
    for name, x in datasets.items():
        span = float(x.max() - x.min())
        for rel in rels:
            bound = rel * span
            runs = [
                ("tp sz", lambda a, r=rel: compress(a, rel=r), decompress),
                ("tp block", lambda a, r=rel: compress(a, rel=r, codec="block"), decompress),
            ]
            runs += [(peer, *fns(bound)) for peer, fns in peers.items()]
            for codec, enc, dec in runs:
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
                    f"{name:<12} {codec:<12} {rel:>7.0e} {x.nbytes / _size(blob):>8.2f} "
                    f"{err / bound:>12.3f}{' ' if ok else '!'} {psnr:>8.1f} "
                    f"{x.nbytes / 1e6 / (t1 - t0):>9.1f} {x.nbytes / 1e6 / (t2 - t1):>8.1f}"
                )
    print(
        "bound held on every element"
        if not violations
        else f"BOUND VIOLATED in {violations} run(s)"
    )
    if not peers:
        print("(install tensorpress[bench] to see SZ3 and ZFP beside it)")
    return 1 if violations else 0


def _size(blob) -> int:
    return len(blob[2]) if isinstance(blob, tuple) else len(blob)


def _peers() -> dict:
    """Installed peer compressors: name -> (absolute bound -> (encode, decode))."""
    peers = {}
    try:
        from pysz import sz, szConfig, szErrorBoundMode

        def sz3(bound):
            cfg = szConfig()
            cfg.errorBoundMode = szErrorBoundMode.ABS
            cfg.absErrorBound = bound

            def enc(a):
                return a.dtype, a.shape, sz.compress(np.ascontiguousarray(a), cfg)[0]

            return enc, lambda blob: sz.decompress(blob[2], blob[0], blob[1])[0]

        peers["SZ3"] = sz3
    except ImportError:
        pass
    try:
        import zfpy

        peers["ZFP"] = lambda bound: (
            lambda a: zfpy.compress_numpy(a, tolerance=bound),
            zfpy.decompress_numpy,
        )
    except ImportError:
        pass
    return peers


if __name__ == "__main__":
    sys.exit(main())

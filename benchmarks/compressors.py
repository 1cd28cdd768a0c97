"""Compressor benchmark: tensorpress against SZ3, ZFP and lossless baselines.

For every corpus array (see ``corpus.py``) and every value-range-relative bound
``rel`` (absolute bound ``eb = rel * (max - min)``, computed in float64) this runs

  tp-sz/1       tensorpress ``codec="sz"``, one worker thread
  tp-sz/all     tensorpress ``codec="sz"``, all cores (``workers=None``)
  sz3           SZ3 (pysz) default algorithm (interpolation + Lorenzo), ABS bound eb
  sz3-interp    SZ3 interpolation predictor
  sz3-lorenzo   SZ3 Lorenzo + regression predictors
  zfp           ZFP (zfpy) fixed-accuracy mode, tolerance eb

and, once per array, the lossless baselines ``zstd-3`` (zstandard level 3 on the raw
bytes) and ``fpzip`` (lossless). Peers that are not installed are skipped with a note.

Reported per array: compression ratio, max abs error (float64; ``!! VIOLATION`` when
it exceeds eb), PSNR in dB w.r.t. the value range, compress and decompress speed in
MB/s (1 MB = 1e6 bytes of input, median of ``--repeat`` runs). Then a geometric-mean
summary per codec and bound, and tensorpress relative to SZ3 (default algorithm).

    python benchmarks/compressors.py                 # full run
    python benchmarks/compressors.py --quick         # smoke run, a few seconds
    python benchmarks/compressors.py --datasets aero,tf_attn_probs --bounds 1e-3
    python benchmarks/compressors.py --markdown --json results.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

try:
    from corpus import CATEGORIES, NAMES, load_corpus
except ImportError:  # imported as benchmarks.compressors
    from benchmarks.corpus import CATEGORIES, NAMES, load_corpus

DEFAULT_BOUNDS = (1e-2, 1e-3, 1e-4)
DEFAULT_REPEAT = 5
QUICK_DATASETS = ("aero", "smooth_2d", "kolmogorov_grf")
REFERENCE = "sz3"  # tensorpress is compared against this row
LOSSLESS = "lossless"
CATEGORY_ORDER = ("real", "simulated", "dl")


# --------------------------------------------------------------------------- codecs


@dataclass
class Codec:
    name: str
    family: str
    lossy: bool
    encode: Callable[[np.ndarray, float, float], Any]  # (x, rel, eb) -> blob
    decode: Callable[[Any, tuple, np.dtype], np.ndarray]  # (blob, shape, dtype) -> array


def _nbytes(blob: Any) -> int:
    return int(blob.nbytes) if hasattr(blob, "nbytes") else len(blob)


def _tensorpress_codecs(notes: list[str]) -> list[Codec]:
    try:
        import tensorpress as tp
    except ImportError as exc:
        notes.append(f"tensorpress not importable ({exc}): tensorpress rows skipped")
        return []
    if not (hasattr(tp, "compress") and hasattr(tp, "decompress")):
        notes.append(
            "tensorpress.compress/decompress not available in this version: "
            "tensorpress rows skipped"
        )
        return []

    def encode(x, rel, eb, workers):
        return tp.compress(x, rel=rel, codec="sz", workers=workers)

    def decode(blob, shape, dtype, workers):
        return tp.decompress(blob, workers=workers)

    return [
        Codec(
            f"tp-sz/{label}",
            "tensorpress",
            True,
            partial(encode, workers=w),
            partial(decode, workers=w),
        )
        for label, w in (("1", 1), ("all", None))
    ]


def _sz3_codecs(notes: list[str]) -> list[Codec]:
    try:
        import pysz
    except ImportError:
        notes.append("pysz not installed: SZ3 rows skipped")
        return []

    def encode(x, rel, eb, algo):
        conf = pysz.szConfig(x.shape)
        conf.cmprAlgo = algo
        # The default mode is ABS with absErrorBound = 1e-3, whatever relErrorBound says:
        # set the mode and the bound explicitly.
        conf.errorBoundMode = pysz.szErrorBoundMode.ABS
        conf.absErrorBound = eb
        blob, _ratio = pysz.sz.compress(x, conf)
        return blob  # a uint8 view of exactly the compressed bytes

    def decode(blob, shape, dtype):
        out, _conf = pysz.sz.decompress(blob, dtype, shape)
        return out

    algos = pysz.szAlgorithm
    return [
        Codec(name, "sz3", True, partial(encode, algo=algo), decode)
        for name, algo in (
            ("sz3", algos.INTERP_LORENZO),
            ("sz3-interp", algos.INTERP),
            ("sz3-lorenzo", algos.LORENZO_REG),
        )
    ]


def _zfp_codecs(notes: list[str]) -> list[Codec]:
    try:
        import zfpy
    except ImportError:
        notes.append("zfpy not installed: ZFP rows skipped")
        return []

    def encode(x, rel, eb):
        return zfpy.compress_numpy(x, tolerance=eb)

    def decode(blob, shape, dtype):
        return zfpy.decompress_numpy(blob)

    return [Codec("zfp", "zfp", True, encode, decode)]


def _lossless_codecs(notes: list[str]) -> list[Codec]:
    codecs = []
    try:
        import zstandard
    except ImportError:
        notes.append("zstandard not installed: zstd rows skipped")
    else:
        cctx = zstandard.ZstdCompressor(level=3)
        dctx = zstandard.ZstdDecompressor()

        def zstd_decode(blob, shape, dtype):
            return np.frombuffer(dctx.decompress(blob), dtype=dtype).reshape(shape)

        codecs.append(
            Codec("zstd-3", "zstd", False, lambda x, rel, eb: cctx.compress(x), zstd_decode)
        )
    try:
        import fpzip
    except ImportError:
        notes.append("fpzip not installed: fpzip rows skipped")
    else:

        def fpzip_decode(blob, shape, dtype):
            # fpzip always hands back a 4-d array (leading axes of length 1).
            return fpzip.decompress(blob, order="C").reshape(shape)

        codecs.append(
            Codec(
                "fpzip",
                "fpzip",
                False,
                lambda x, rel, eb: fpzip.compress(x, precision=0, order="C"),
                fpzip_decode,
            )
        )
    return codecs


def make_codecs(notes: list[str]) -> list[Codec]:
    return (
        _tensorpress_codecs(notes)
        + _sz3_codecs(notes)
        + _zfp_codecs(notes)
        + _lossless_codecs(notes)
    )


# --------------------------------------------------------------------------- measuring


def _bound_label(rel: float | None) -> str:
    if rel is None:
        return LOSSLESS
    mantissa, exponent = f"{rel:.6e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


_warmed: set[tuple[str, str, int, str]] = set()


def _warm_up(codec: Codec, name: str, x: np.ndarray, rel: float | None, eb: float | None) -> None:
    """Run the codec once, untimed, on a small crop of ``x`` at the same bound.

    Takes just-in-time compilation, lazy imports and first-touch allocations out of
    the timings (they matter most with ``--repeat 1``).
    """
    key = (codec.name, name, x.ndim, _bound_label(rel))
    if key in _warmed:
        return
    _warmed.add(key)
    shape = list(x.shape)
    while math.prod(shape) > 1 << 16:
        axis = shape.index(max(shape))
        shape[axis] = max(1, shape[axis] // 2)
    crop = np.ascontiguousarray(x[tuple(slice(0, n) for n in shape)])
    try:
        codec.decode(codec.encode(crop, rel, eb), crop.shape, crop.dtype)
    except Exception:  # noqa: BLE001 - the measured run reports the failure
        pass


def measure(codec: Codec, name: str, x: np.ndarray, rel: float | None, repeat: int) -> dict:
    """Compress and decompress ``x`` ``repeat`` times each; return one result record."""
    lo, hi = float(x.min()), float(x.max())
    value_range = hi - lo
    eb = None if rel is None else rel * value_range
    rec: dict[str, Any] = {
        "dataset": name,
        "category": CATEGORIES.get(name, "?"),
        "shape": list(x.shape),
        "mb": x.nbytes / 1e6,
        "codec": codec.name,
        "family": codec.family,
        "bound": _bound_label(rel),
        "rel": rel,
        "abs_bound": eb,
        "flags": [],
    }
    _warm_up(codec, name, x, rel, eb)
    try:
        blob, ctimes = None, []
        for _ in range(repeat):
            blob = None
            t0 = time.perf_counter()
            blob = codec.encode(x, rel, eb)
            ctimes.append(time.perf_counter() - t0)
        size = _nbytes(blob)
        y, dtimes = None, []
        for _ in range(repeat):
            y = None
            t0 = time.perf_counter()
            y = codec.decode(blob, x.shape, x.dtype)
            dtimes.append(time.perf_counter() - t0)
        del blob
    except Exception as exc:  # noqa: BLE001 - one failing codec must not stop the run
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["flags"].append("FAILED")
        return rec

    y = np.asarray(y)
    rec["compressed_bytes"] = size
    rec["ratio"] = x.nbytes / size
    rec["compress_mbs"] = x.nbytes / 1e6 / statistics.median(ctimes)
    rec["decompress_mbs"] = x.nbytes / 1e6 / statistics.median(dtimes)
    if y.shape != x.shape:
        rec["flags"].append(f"SHAPE {y.shape}")
        return rec
    if y.dtype != x.dtype:
        rec["flags"].append(f"DTYPE {y.dtype}")
    diff = np.abs(y.astype(np.float64) - x.astype(np.float64))
    max_err = float(diff.max())
    mse = float(np.mean(np.square(diff)))
    rec["max_abs_err"] = max_err
    rec["psnr_db"] = (
        20 * math.log10(value_range) - 10 * math.log10(mse) if mse > 0 and value_range > 0 else None
    )
    if rel is None:
        exact = y.dtype == x.dtype and np.array_equal(
            y.view(np.uint8).reshape(-1), x.view(np.uint8).reshape(-1)
        )
        if not exact:
            rec["flags"].append("NOT LOSSLESS")
    else:
        rec["err_over_bound"] = max_err / eb if eb > 0 else None
        if not max_err <= eb:  # also catches NaN
            rec["flags"].append("VIOLATION")
    return rec


# --------------------------------------------------------------------------- printing


class Table:
    """A streaming text table: aligned columns, or Markdown with ``markdown=True``."""

    def __init__(self, title: str, columns: Sequence[tuple[str, int, str]], markdown: bool):
        self.title = title
        self.columns = [(head, max(width, len(head)), align) for head, width, align in columns]
        self.markdown = markdown

    def _line(self, cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(width) if align == ">" else cell.ljust(width)
            for cell, (_, width, align) in zip(cells, self.columns, strict=True)
        ]
        return f"| {' | '.join(parts)} |" if self.markdown else "  ".join(parts).rstrip()

    def header(self) -> None:
        if self.markdown:
            print(f"\n### {self.title}\n")
            print(self._line([head for head, _, _ in self.columns]))
            rules = [
                "-" * (width - 1) + (":" if align == ">" else "-")
                for _, width, align in self.columns
            ]
            print(f"| {' | '.join(rules)} |")
        else:
            print(f"\n== {self.title} ==")
            print(self._line([head for head, _, _ in self.columns]))
            print(self._line(["-" * width for _, width, _ in self.columns]))
        sys.stdout.flush()

    def row(self, *cells: str) -> None:
        print(self._line(cells), flush=True)


def _f(value: float | None, spec: str) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf"
    return format(value, spec)


def _flag_text(rec: dict) -> str:
    return ("!! " + ", ".join(rec["flags"])) if rec["flags"] else ""


def _row_cells(rec: dict, lossy: bool) -> list[str]:
    if "error" in rec:
        blanks = ["-"] * (6 if lossy else 3)
        return [rec["dataset"], rec["codec"], *blanks, f"!! {rec['error']}"]
    speed = [_f(rec["compress_mbs"], ".1f"), _f(rec["decompress_mbs"], ".1f")]
    if not lossy:
        return [rec["dataset"], rec["codec"], _f(rec["ratio"], ".3f"), *speed, _flag_text(rec)]
    return [
        rec["dataset"],
        rec["codec"],
        _f(rec["ratio"], ".2f"),
        _f(rec.get("max_abs_err"), ".3g"),
        _f(rec.get("err_over_bound"), ".3f"),
        "inf" if rec.get("max_abs_err") == 0 else _f(rec.get("psnr_db"), ".1f"),
        *speed,
        _flag_text(rec),
    ]


def _dataset_table(title: str, lossy: bool, name_width: int, markdown: bool) -> Table:
    cols = [("dataset", name_width, "<"), ("codec", 11, "<"), ("ratio", 7, ">")]
    if lossy:
        cols += [("max err", 9, ">"), ("err/eb", 6, ">"), ("PSNR dB", 7, ">")]
    cols += [("comp MB/s", 9, ">"), ("dec MB/s", 8, ">"), ("flag", 4, "<")]
    return Table(title, cols, markdown)


def _geomean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(records: list[dict], codec_order: list[str], bound_order: list[str]) -> list[dict]:
    rows = []
    for bound in bound_order:
        for codec in codec_order:
            recs = [r for r in records if r["codec"] == codec and r["bound"] == bound]
            if not recs:
                continue
            ok = [r for r in recs if "error" not in r]
            psnrs = [r["psnr_db"] for r in ok if r.get("psnr_db") is not None]
            errs = [r["err_over_bound"] for r in ok if r.get("err_over_bound") is not None]
            row = {
                "codec": codec,
                "bound": bound,
                "n": len(ok),
                "failed": len(recs) - len(ok),
                "ratio": _geomean([r["ratio"] for r in ok]),
                "compress_mbs": _geomean([r["compress_mbs"] for r in ok]),
                "decompress_mbs": _geomean([r["decompress_mbs"] for r in ok]),
                "psnr_db_mean": statistics.fmean(psnrs) if psnrs else None,
                "worst_err_over_bound": max(errs) if errs else None,
                "flagged": sum(1 for r in recs if r["flags"]),
            }
            for cat in CATEGORY_ORDER:
                row[f"ratio_{cat}"] = _geomean([r["ratio"] for r in ok if r["category"] == cat])
            rows.append(row)
    return rows


def compare_to_reference(records: list[dict], bounds: list[str]) -> list[dict]:
    """Geometric means of tensorpress / SZ3 per dataset (datasets where both ran)."""
    ref = {
        (r["dataset"], r["bound"]): r
        for r in records
        if r["codec"] == REFERENCE and "error" not in r
    }
    rows = []
    for bound in bounds:
        for codec in ("tp-sz/1", "tp-sz/all"):
            pairs = [
                (r, ref[(r["dataset"], bound)])
                for r in records
                if r["codec"] == codec
                and r["bound"] == bound
                and "error" not in r
                and (r["dataset"], bound) in ref
            ]
            if not pairs:
                continue
            rows.append(
                {
                    "codec": codec,
                    "bound": bound,
                    "n": len(pairs),
                    "ratio": _geomean([a["ratio"] / b["ratio"] for a, b in pairs]),
                    "compress_speed": _geomean(
                        [a["compress_mbs"] / b["compress_mbs"] for a, b in pairs]
                    ),
                    "decompress_speed": _geomean(
                        [a["decompress_mbs"] / b["decompress_mbs"] for a, b in pairs]
                    ),
                }
            )
    return rows


# --------------------------------------------------------------------------- main


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for module in ("tensorpress", "pysz", "zfpy", "fpzip", "zstandard"):
        try:
            from importlib.metadata import version

            out[module] = version(module)
        except Exception:  # noqa: BLE001 - not installed
            out[module] = "not installed"
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark tensorpress against SZ3, ZFP, zstd and fpzip on the corpus."
    )
    p.add_argument(
        "--quick", action="store_true", help=f"smoke run: {', '.join(QUICK_DATASETS)}, 1 repetition"
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help=f"timed runs per measurement, median reported "
        f"(default {DEFAULT_REPEAT}; 1 with --quick)",
    )
    p.add_argument(
        "--datasets", default=None, help=f"comma-separated subset of: {', '.join(NAMES)}"
    )
    p.add_argument(
        "--bounds",
        default=None,
        help="comma-separated value-range-relative bounds (default 1e-2,1e-3,1e-4)",
    )
    p.add_argument(
        "--codecs",
        default=None,
        help="comma-separated subset of codec names (default: all available)",
    )
    p.add_argument("--markdown", action="store_true", help="print tables as Markdown")
    p.add_argument(
        "--json", metavar="PATH", default=None, help="also write all results to PATH as JSON"
    )
    args = p.parse_args(argv)
    if args.datasets:
        args.datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
        unknown = [d for d in args.datasets if d not in NAMES]
        if unknown:
            p.error(f"unknown dataset(s) {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    else:
        args.datasets = list(QUICK_DATASETS) if args.quick else list(NAMES)
    try:
        args.bounds = (
            [float(b) for b in args.bounds.split(",") if b.strip()]
            if args.bounds
            else list(DEFAULT_BOUNDS)
        )
    except ValueError:
        p.error(f"--bounds must be comma-separated numbers, got {args.bounds!r}")
    if any(not (0 < b < 1) for b in args.bounds):
        p.error("--bounds must lie in (0, 1)")
    if args.repeat is None:
        args.repeat = 1 if args.quick else DEFAULT_REPEAT
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.codecs:
        args.codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    md = args.markdown
    started = time.perf_counter()
    notes: list[str] = []
    codecs = make_codecs(notes)
    if args.codecs:
        known = {c.name for c in codecs}
        for name in args.codecs:
            if name not in known:
                notes.append(f"codec {name!r} is unknown or not available: skipped")
        codecs = [c for c in codecs if c.name in args.codecs]
    lossy = [c for c in codecs if c.lossy]
    lossless = [c for c in codecs if not c.lossy]

    corpus = load_corpus(args.datasets, verbose=True)
    total_mb = sum(x.nbytes for x in corpus.values()) / 1e6
    name_width = max(len(n) for n in corpus)
    versions = _versions()

    print("Compressor benchmark (float32 arrays; MB = 1e6 bytes of input)")
    print(
        f"{len(corpus)} datasets, {total_mb:.1f} MB; bounds rel = "
        f"{', '.join(_bound_label(b) for b in args.bounds)} of the value range; "
        f"median of {args.repeat} run(s); {os.cpu_count()} cores for tp-sz/all"
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    for note in notes:
        print(f"note: {note}")
    sys.stdout.flush()

    records: list[dict] = []
    if lossless:
        table = _dataset_table("lossless baselines", False, name_width, md)
        table.header()
        for name, x in corpus.items():
            for codec in lossless:
                rec = measure(codec, name, x, None, args.repeat)
                records.append(rec)
                table.row(*_row_cells(rec, False))
    if lossy:
        for rel in args.bounds:
            table = _dataset_table(
                f"rel = {_bound_label(rel)} (eb = rel * value range)", True, name_width, md
            )
            table.header()
            for name, x in corpus.items():
                for codec in lossy:
                    rec = measure(codec, name, x, rel, args.repeat)
                    records.append(rec)
                    table.row(*_row_cells(rec, True))

    bound_order = [_bound_label(b) for b in args.bounds] + [LOSSLESS]
    summary = summarize(records, [c.name for c in codecs], bound_order)
    table = Table(
        "geometric means over datasets (ratio per category: real / simulated / dl)",
        [
            ("codec", 11, "<"),
            ("bound", 8, "<"),
            ("n", 2, ">"),
            ("ratio", 7, ">"),
            ("real", 7, ">"),
            ("sim", 7, ">"),
            ("dl", 7, ">"),
            ("comp MB/s", 9, ">"),
            ("dec MB/s", 8, ">"),
            ("mean PSNR", 9, ">"),
            ("worst err/eb", 12, ">"),
            ("flagged", 7, ">"),
        ],
        md,
    )
    table.header()
    for row in summary:
        flagged = str(row["flagged"]) + (" !!" if row["flagged"] else "")
        table.row(
            row["codec"],
            row["bound"],
            str(row["n"]),
            _f(row["ratio"], ".2f"),
            *(_f(row[f"ratio_{cat}"], ".2f") for cat in CATEGORY_ORDER),
            _f(row["compress_mbs"], ".1f"),
            _f(row["decompress_mbs"], ".1f"),
            _f(row["psnr_db_mean"], ".1f"),
            _f(row["worst_err_over_bound"], ".3f"),
            flagged,
        )

    comparison = compare_to_reference(records, [_bound_label(b) for b in args.bounds])
    if comparison:
        table = Table(
            f"tensorpress / SZ3 ({REFERENCE}, default algorithm): "
            "geometric means of per-dataset ratios",
            [
                ("codec", 9, "<"),
                ("bound", 6, "<"),
                ("n", 2, ">"),
                ("ratio x", 7, ">"),
                ("comp speed x", 12, ">"),
                ("dec speed x", 11, ">"),
            ],
            md,
        )
        table.header()
        for row in comparison:
            table.row(
                row["codec"],
                row["bound"],
                str(row["n"]),
                _f(row["ratio"], ".3f"),
                _f(row["compress_speed"], ".3f"),
                _f(row["decompress_speed"], ".3f"),
            )
    else:
        print(f"\n(no tensorpress / {REFERENCE} comparison: one of them did not run)")

    flagged = [r for r in records if r["flags"]]
    elapsed = time.perf_counter() - started
    print()
    for note in notes:
        print(f"note: {note}")
    if flagged:
        print(f"!! {len(flagged)} flagged result(s):")
        for r in flagged:
            print(f"!!   {r['dataset']} {r['codec']} {r['bound']}: {', '.join(r['flags'])}")
    else:
        print("no bound violations, no failures")
    print(f"total time {elapsed:.0f} s")

    if args.json:
        payload = {
            "meta": {
                "versions": versions,
                "cpu_count": os.cpu_count(),
                "repeat": args.repeat,
                "bounds": args.bounds,
                "datasets": list(corpus),
                "notes": notes,
                "seconds": elapsed,
            },
            "results": records,
            "summary": summary,
            "tensorpress_vs_sz3": comparison,
        }
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=1, allow_nan=False, default=str)
        print(f"results written to {args.json}")
    return (
        1 if any("VIOLATION" in r["flags"] or "NOT LOSSLESS" in r["flags"] for r in records) else 0
    )


if __name__ == "__main__":
    sys.exit(main())

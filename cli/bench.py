"""The ``bench`` command: tensorpress codecs and installed peers side by side, and its plot."""

from __future__ import annotations

import math
import os
import statistics
import sys
import time

import numpy as np

from .errors import EXIT_OK, EXIT_VIOLATION, UserError, require_input
from .output import emit_json, fmt, json_safe, print_table
from .verify import ErrorCheck

DEFAULT_RELS = (1e-2, 1e-3, 1e-4)
BENCH_PLOT_HINT = 'pip install "tensorpress[bench]"'


class _TpCodec:
    """A tensorpress codec with the peers' interface (absolute bound)."""

    lossy = True

    def __init__(self, codec: str, workers: int | None):
        self.name, self.codec, self.workers = f"tp {codec}", codec, workers

    def compress(self, x, abs_bound):
        from .. import compress

        return compress(x, abs=abs_bound, codec=self.codec, workers=self.workers)

    def decompress(self, blob, like):
        from .. import decompress

        return decompress(blob, workers=self.workers)


def bench_codecs(workers: int | None) -> list:
    """tensorpress's sz and block codecs, then the installed peers."""
    from .peers import available_peers

    return [_TpCodec("sz", workers), _TpCodec("block", workers), *available_peers()]


def _leading(ds, max_bytes: int) -> np.ndarray:
    """The first rows of ``ds`` that fit in ``max_bytes`` (at least one row)."""
    shape = tuple(ds.shape)
    if not shape:
        return np.asarray(ds[()])
    row_bytes = max(1, math.prod(shape[1:]) * np.dtype(ds.dtype).itemsize)
    rows = max(1, min(shape[0], max_bytes // row_bytes))
    return np.array(ds[:rows], order="C")  # a writable copy, not a view of a memory map


def _is_scale(ds) -> bool:
    """Whether ``ds`` (an h5py dataset, or a dataset opened from a compressed file) is a
    dimension scale: coordinates, which compress copies exactly, are not benchmarked."""
    import h5py

    from ..formats.hdf5 import is_scale

    source = getattr(ds, "source", ds)
    return isinstance(source, h5py.Dataset) and is_scale(source)


class Missing:
    """The missing cells of a benchmarked array (formats/missing.py): ``spec`` finds them,
    ``marks`` maps them to the NaN markers tensorpress's codecs keep exact and clamps
    into the valid range, as ``compress`` does."""

    def __init__(self, x: np.ndarray, spec, name: str):
        from ..formats.missing import scan

        self.spec = spec
        self.marks = scan(x, max(1, len(x)), spec, name) if x.ndim else None
        bounded = (spec.lo, spec.hi) != (None, None)
        if (
            self.marks is not None
            and bounded
            and (None in (spec.lo, spec.hi) or spec.lo <= spec.hi)
        ):
            self.marks.valid = (spec.lo, spec.hi)


def _missing_of(ds, x: np.ndarray, name: str) -> Missing | None:
    """The :class:`Missing` cells of ``x`` (leading rows of dataset ``ds``), None when its
    attributes mark none."""
    from ..formats.missing import spec_of

    spec = spec_of(getattr(ds, "source", ds))
    return None if spec is None else Missing(x, spec, name)


def valid_span(x: np.ndarray, missing: Missing | None) -> float:
    """max - min of the finite valid cells of ``x`` (float64); 0 when there are none."""
    if missing is not None:
        x = x[~missing.spec.mask(x)]
    finite = x[np.isfinite(x)]
    return float(finite.astype(np.float64).max() - finite.min()) if finite.size else 0.0


def _timed(codec, x: np.ndarray, eb: float, repeat: int) -> tuple:
    """(blob, decoded, compress seconds, decompress seconds), medians of ``repeat`` runs."""
    warm = x[: max(1, min(len(x), 8))] if x.ndim else x
    codec.decompress(codec.compress(warm, eb), warm)  # jit, lazy imports: untimed
    t_c, t_d = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        blob = codec.compress(x, eb)
        t1 = time.perf_counter()
        y = codec.decompress(blob, x)
        t2 = time.perf_counter()
        t_c.append(t1 - t0)
        t_d.append(t2 - t1)
    return blob, y, statistics.median(t_c), statistics.median(t_d)


def bench_one(codec, x: np.ndarray, rel: float, span: float, repeat: int, missing=None) -> dict:
    """Compress and decompress ``x`` ``repeat`` times; errors against rel * span (float64).

    ``missing`` (:class:`Missing`): the PSNR and the max error cover valid cells only and
    missing cells must come back bit for bit; tensorpress's codecs get them marked, as
    ``compress`` gives them, peers as they are."""
    eb = rel * span
    row = {"codec": codec.name, "rel": rel, "abs_bound": eb}
    marks = missing.marks if missing is not None and isinstance(codec, _TpCodec) else None
    data = marks.substitute(x) if marks else x
    try:
        blob, y, tc, td = _timed(codec, data, eb, repeat)
    except (ValueError, TypeError, RuntimeError) as exc:
        return {**row, "error": " ".join(str(exc).split())}
    if marks is not None:
        y = np.array(y)  # writable
        marks.restore(y)
    check = ErrorCheck({"mode": "abs", "value": eb, "tolerance": eb} if codec.lossy else None)
    check.update(x, y, None if missing is None else missing.spec)
    res = check.result()
    nbytes = len(blob)
    return {
        **row,
        "ratio": x.nbytes / nbytes,
        "bits_per_value": 8 * nbytes / x.size,
        "psnr_db": res["psnr_db"],
        "max_error": res["max_abs_error"] if not res["nonfinite_changed"] else math.inf,
        "max_error_over_bound": _over(res["max_abs_error"], eb, res["nonfinite_changed"]),
        # the bound's: a peer's values just outside the valid range are within it
        "violations": res["violations"] - res["left_valid_range"] if codec.lossy else 0,
        "nonfinite_changed": res["nonfinite_changed"],
        "compress_mb_s": x.nbytes / 1e6 / tc if tc > 0 else None,
        "decompress_mb_s": x.nbytes / 1e6 / td if td > 0 else None,
    }


def _over(error: float, bound: float, nonfinite_changed: int) -> float:
    """error / bound; inf when a NaN/Inf changed or a zero bound was exceeded."""
    if nonfinite_changed:
        return math.inf
    if bound > 0:
        return error / bound
    return 0.0 if error == 0 else math.inf


def run_bench(args) -> int:
    """``tensorpress bench``: exit 1 if a tensorpress codec broke its bound."""
    from ..formats.reader import open_source

    require_input(args.file)
    if args.plot:
        _require_matplotlib()
    rels = args.rel or list(DEFAULT_RELS)
    codecs = bench_codecs(args.workers)
    rows, datasets = [], []
    with open_source(args.file, dtype=args.dtype, shape=args.shape) as source:
        names = [
            n
            for n in source
            if np.dtype(source[n].dtype).kind == "f" and source[n].shape and source[n].size
        ]
        scales = [n for n in names if _is_scale(source[n])]
        names = [n for n in names if n not in scales]
        if not names:
            raise UserError(f"{args.file} has no floating-point dataset with elements to benchmark")
        total = len(names) * len(rels) * len(codecs)
        from tqdm import tqdm

        bar = tqdm(
            total=total,
            desc="bench",
            unit="run",
            file=sys.stderr,
            disable=True if args.quiet else None,
            leave=False,
        )
        with bar:
            for name in names:
                x = _leading(source[name], args.max_bytes)
                missing = _missing_of(source[name], x, name)
                if missing is not None:  # markers are bits of native floats
                    x = x.astype(x.dtype.newbyteorder("="), copy=False)
                span = valid_span(x, missing)
                datasets.append(
                    {"name": name, "shape": list(x.shape), "dtype": str(x.dtype), "bytes": x.nbytes}
                )
                for rel in rels:
                    for codec in codecs:
                        bar.set_postfix_str(f"{name} {codec.name} rel {rel:g}")
                        rows.append(
                            {
                                "dataset": name,
                                **bench_one(codec, x, rel, span, args.repeat, missing),
                            }
                        )
                        bar.update()
    bad = [r for r in rows if r["codec"].startswith("tp ") and r.get("violations")]
    doc = {
        "file": args.file,
        "rels": rels,
        "max_bytes": args.max_bytes,
        "repeat": args.repeat,
        "workers": args.workers or os.cpu_count(),
        "codecs": [c.name for c in codecs],
        "datasets": datasets,
        "scales_skipped": scales,
        "rows": rows,
        "ok": not bad,
    }
    if args.plot:
        plot_rate_distortion(rows, args.plot, title=os.path.basename(args.file))
        doc["plot"] = args.plot
    if args.json:
        emit_json(json_safe(doc))
    elif not args.quiet:
        _print_bench(doc)
    return EXIT_VIOLATION if bad else EXIT_OK


def _print_bench(doc: dict) -> None:
    shapes = "; ".join(
        f"{d['name']} {'x'.join(map(str, d['shape'])) or 'scalar'} {d['dtype']}"
        for d in doc["datasets"]
    )
    print(
        f"{doc['file']}: {shapes} (first {doc['max_bytes'] / 2**20:.0f} MiB of each at most); "
        f"tensorpress with {doc['workers']} worker(s), peers single-threaded; "
        f"median of {doc['repeat']} run(s); MB = 1e6 bytes"
    )
    if doc["scales_skipped"]:
        skipped = ", ".join(doc["scales_skipped"])
        print(f"skipped dimension scales (coordinates, which compress keeps exact): {skipped}")
    rows = []
    for r in doc["rows"]:
        if "error" in r:
            rows.append([r["dataset"], f"{r['rel']:g}", r["codec"], "-", "-", "-", "-", "-"])
            rows[-1].append(f"skipped: {r['error']}")
            continue
        flag = "!" if r["max_error_over_bound"] > 1 else ""
        rows.append(
            [
                r["dataset"],
                f"{r['rel']:g}",
                r["codec"],
                fmt(r["ratio"], ".2f"),
                fmt(r["psnr_db"], ".1f"),
                fmt(r["max_error_over_bound"], ".3f") + flag,
                fmt(r["compress_mb_s"], ".1f" if r["compress_mb_s"] < 10 else ".0f"),
                fmt(r["decompress_mb_s"], ".1f" if r["decompress_mb_s"] < 10 else ".0f"),
                "NaN/Inf changed" if r["nonfinite_changed"] else "bound exceeded" if flag else "",
            ]
        )
    print_table(
        [
            "dataset",
            "rel",
            "codec",
            "ratio",
            "PSNR dB",
            "max err/bound",
            "comp MB/s",
            "dec MB/s",
            "note",
        ],
        rows,
    )
    if "plot" in doc:
        print(f"rate-distortion plot: {doc['plot']}")
    if not doc["ok"]:
        print("BOUND VIOLATED by a tensorpress codec")


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError(f"--plot needs matplotlib: {BENCH_PLOT_HINT}") from None


def plot_rate_distortion(rows: list[dict], path: str, title: str = "") -> None:
    """Bits per value against PSNR, one line per codec, one panel per dataset (PNG)."""
    _require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["dataset"] for r in rows))
    cols = min(3, len(names))
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.8 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for codec in dict.fromkeys(r["codec"] for r in rows):
            pts = sorted(
                (r["bits_per_value"], r["psnr_db"])
                for r in rows
                if r["dataset"] == name
                and r["codec"] == codec
                and "error" not in r
                and r["psnr_db"] is not None
                and math.isfinite(r["psnr_db"])
            )
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=codec)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("bits per value")
        ax.set_ylabel("PSNR (dB)")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(f"rate-distortion: {title}")
    fig.tight_layout()
    tmp = f"{path}.tmp-{os.getpid()}.png"
    try:
        fig.savefig(tmp, dpi=100)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)

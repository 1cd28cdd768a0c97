"""The ``tensorpress`` command: compress, decompress, info, verify, bench, demo.

    tensorpress compress INPUT OUTPUT (--abs E | --rel E | --pw-rel E) [--codec sz]
                [--chunk 4M] [--set NAME:MODE=E ...] [--dtype float32 --shape 100,500,500]
    tensorpress decompress INPUT OUTPUT
    tensorpress info FILE
    tensorpress verify ORIGINAL COMPRESSED
    tensorpress bench FILE [--rel E ...] [--max-bytes 64M] [--plot rd.png]
    tensorpress demo

Every command takes ``--json`` (one JSON document on stdout) and ``--quiet``;
those that write take ``--force`` and ``--workers N``. Exit status: 0 on
success, 1 when ``verify`` (or ``bench``/``demo`` for tensorpress's own codecs)
finds an element outside its bound, 2 for an error (one line on stderr,
``tensorpress: error: ...``), 130 when interrupted (no output is left behind).
Set ``TENSORPRESS_TRACEBACK=1`` to see the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np

EXIT_OK, EXIT_VIOLATION, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
MODES = {"abs": "abs", "rel": "rel", "pw_rel": "pw_rel", "pw-rel": "pw_rel"}
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
DEFAULT_RELS = (1e-2, 1e-3, 1e-4)
VERIFY_BLOCK_BYTES = 4 << 20  # original bytes compared at a time by verify
BENCH_PLOT_HINT = 'pip install "tensorpress[bench]"'


class UserError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line: ``tensorpress: error: ...``."""

    def error(self, message: str):
        print(
            f"tensorpress: error: {message} (see: {self.prog} --help)", file=sys.stderr, flush=True
        )
        raise SystemExit(EXIT_ERROR)


# -- argument types ------------------------------------------------------------------


def parse_bytes(text: str) -> int:
    """``"4M"`` -> 4194304: a byte count with an optional K/M/G/T suffix (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", text)
    if not m or float(m.group(1)) * UNITS[m.group(2).lower()] < 1:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: give bytes, e.g. 4194304, 4M, 512K or 1G"
        )
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def parse_shape(text: str) -> tuple[int, ...]:
    """``"100,500,500"`` (or ``100x500x500``) -> (100, 500, 500)."""
    parts = re.split(r"[,x\s]+", text.strip().strip("()[]").strip())
    try:
        shape = tuple(int(p) for p in parts if p != "")
    except ValueError:
        shape = ()
    if not shape or any(n < 0 for n in shape):
        raise argparse.ArgumentTypeError(
            f"invalid shape {text!r}: give sizes separated by commas, e.g. 100,500,500"
        )
    return shape


def parse_float_dtype(text: str) -> str:
    """``float32``/``float64`` (also ``f4``, ``<f8``, ``double``) for raw inputs."""
    try:
        dtype = np.dtype(text)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind != "f" or dtype.itemsize not in (4, 8):
        raise argparse.ArgumentTypeError(
            f"raw input type {text!r} is not supported: give float32 or float64 "
            "(integer data takes no error bound)"
        )
    return f"float{dtype.itemsize * 8}"


def parse_workers(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"invalid worker count {text!r}: give an integer >= 1")
    return n


def parse_bound_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"invalid bound {text!r}: give a finite number >= 0")
    return value


def parse_positive_rel(text: str) -> float:
    value = parse_bound_value(text)
    if value == 0:
        raise argparse.ArgumentTypeError("invalid bound 0: bench needs bounds > 0")
    return value


def parse_override(text: str) -> tuple[str, dict]:
    """``"temperature:abs=0.01"`` -> ("temperature", {"abs": 0.01})."""
    name, _, spec = text.rpartition(":")
    mode, _, value = spec.partition("=")
    mode = MODES.get(mode.strip().lower())
    if not name or mode is None or not value:
        raise argparse.ArgumentTypeError(
            f"invalid --set {text!r}: give NAME:MODE=VALUE with MODE abs, rel or pw_rel, "
            "e.g. temperature:abs=0.01"
        )
    return name.strip("/"), {mode: parse_bound_value(value)}


def _check_bound(bound: dict) -> dict:
    """Validate a bound dict with tensorpress's own rules (ValueError says what to do)."""
    from .compress import ErrorBound

    ErrorBound.from_kwargs(**bound)
    return bound


def _check_codec(name: str) -> str:
    from .compress import available_codecs
    from .compress.registry import codec_class

    bounded = [c for c in available_codecs() if codec_class(c).bounded]
    if name not in bounded:
        raise UserError(f"unknown codec {name!r}: use one of {', '.join(bounded)}")
    return name


# -- the parser ----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(
        prog="tensorpress",
        description="Error-bounded compression of arrays and tensors.",
        epilog="Exit status: 0 success; 1 verify (or bench, demo) found an element outside "
        "its bound; 2 an error; 130 interrupted. 'tensorpress COMMAND --help' for a command.",
    )
    parser.add_argument("--version", action="version", version=f"tensorpress {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def common(p, *, writes: bool = False, workers: bool = False):
        p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
        p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no table")
        if writes:
            p.add_argument("-f", "--force", action="store_true", help="overwrite OUTPUT")
        if workers:
            p.add_argument(
                "--workers",
                type=parse_workers,
                default=None,
                metavar="N",
                help="worker threads (default: all cores); the output does not depend on it",
            )

    def raw_options(p):
        p.add_argument(
            "--dtype", type=parse_float_dtype, help="raw input: float32 or float64 (little-endian)"
        )
        p.add_argument(
            "--shape", type=parse_shape, help="raw input: sizes in C order, e.g. 100,500,500"
        )

    p = sub.add_parser(
        "compress",
        help="compress an HDF5, .npy or raw file",
        description="Compress every floating-point dataset of INPUT (HDF5, .npy or raw binary) "
        "under an error bound into OUTPUT (.h5 for HDF5, otherwise a .tp container).",
    )
    p.add_argument("input", metavar="INPUT")
    p.add_argument("output", metavar="OUTPUT")
    bound = p.add_mutually_exclusive_group(required=True)
    bound.add_argument("--abs", type=parse_bound_value, metavar="E", help="|x - y| <= E")
    bound.add_argument(
        "--rel", type=parse_bound_value, metavar="E", help="|x - y| <= E * (max - min)"
    )
    bound.add_argument(
        "--pw-rel",
        dest="pw_rel",
        type=parse_bound_value,
        metavar="E",
        help="|x - y| <= E * |x|, signs kept",
    )
    p.add_argument("--codec", default="sz", help="error-bounded codec (default: sz)")
    p.add_argument(
        "--chunk",
        type=parse_bytes,
        default=None,
        metavar="BYTES",
        help="input bytes per chunk, e.g. 4M (default: the format's)",
    )
    p.add_argument(
        "--set",
        type=parse_override,
        action="append",
        default=[],
        metavar="NAME:MODE=E",
        help="another bound for one dataset, e.g. temperature:abs=0.01 (repeatable)",
    )
    raw_options(p)
    common(p, writes=True, workers=True)

    p = sub.add_parser("decompress", help="restore a compressed file")
    p.add_argument("input", metavar="INPUT")
    p.add_argument(
        "output", metavar="OUTPUT", help=".h5 for HDF5 input; .npy or raw (.f32, .f64, ...)"
    )
    common(p, writes=True, workers=True)

    p = sub.add_parser("info", help="describe a compressed file")
    p.add_argument("file", metavar="FILE", help="a file written by tensorpress")
    common(p)

    p = sub.add_parser(
        "verify",
        help="check a compressed file against its original",
        description="Compare every dataset chunk by chunk; exit 1 if an element violates "
        "its stored bound or a NaN/Inf changed.",
    )
    p.add_argument("original", metavar="ORIGINAL")
    p.add_argument("compressed", metavar="COMPRESSED")
    raw_options(p)
    common(p)

    p = sub.add_parser(
        "bench",
        help="compare codecs on a file's float datasets",
        description="tensorpress's sz and block codecs and the installed peers (SZ3 via pysz, "
        "ZFP via zfpy, zstd) on the same data: ratio, PSNR, max error / bound, MB/s.",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--rel",
        type=parse_positive_rel,
        action="append",
        metavar="E",
        help="value-range relative bound (repeatable; default 1e-2, 1e-3, 1e-4)",
    )
    p.add_argument(
        "--max-bytes",
        type=parse_bytes,
        default=parse_bytes("64M"),
        metavar="BYTES",
        help="use at most this many leading bytes of each dataset (default 64M)",
    )
    p.add_argument(
        "--repeat", type=parse_workers, default=3, metavar="N", help="timed runs (median)"
    )
    p.add_argument("--plot", metavar="PNG", help="write a rate-distortion plot (matplotlib)")
    raw_options(p)
    common(p, workers=True)

    p = sub.add_parser(
        "demo", help="compress a built-in scientific field and activation tensor, verify, report"
    )
    p.add_argument(
        "--rel",
        type=float,
        action="append",
        help="value-range relative bound (repeatable; default 1e-2, 1e-3, 1e-4)",
    )
    return parser


COMMANDS: dict[str, Callable] = {}


def _command(fn):
    COMMANDS[fn.__name__.lstrip("_")] = fn
    return fn


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_OK
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("tensorpress: interrupted; no output was written", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except (UserError, OSError, ValueError, TypeError, KeyError, RuntimeError) as exc:
        if os.environ.get("TENSORPRESS_TRACEBACK"):
            raise
        msg = error_message(exc)
        source = getattr(args, "input", None) or getattr(args, "file", None)
        if isinstance(exc, OSError) and "open file" in msg and source and source not in msg:
            msg = f"{source}: {msg}"  # h5py does not name the file it could not open
        print(f"tensorpress: error: {msg}", file=sys.stderr, flush=True)
        return EXIT_ERROR


def error_message(exc: BaseException) -> str:
    """One line that says what went wrong (and, where it helps, what to do)."""
    from .formats import ChecksumError, TruncatedError

    if isinstance(exc, FileExistsError):
        what = exc.filename or str(exc).split(" exists")[0]
        msg = f"{what} exists: pass --force to overwrite it"
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        msg = f"{exc.filename}: {exc.strerror[0].lower()}{exc.strerror[1:]}"
    elif isinstance(exc, KeyError):
        msg = f"{exc.args[0] if exc.args else exc}"
    else:
        msg = str(exc) or type(exc).__name__
    if isinstance(exc, ChecksumError) and "checksum" not in msg.lower():
        msg = f"checksum mismatch: {msg}"
    if isinstance(exc, TruncatedError) and "truncated" not in msg.lower():
        msg = f"truncated file: {msg}"
    return " ".join(msg.split())


# -- output helpers ------------------------------------------------------------------


def _fmt(value, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return format(value, spec)


def print_table(headers: list[str], rows: list[list], *, file=None) -> None:
    """Columns padded to their widest cell; numbers right-aligned, text left-aligned."""
    file = file or sys.stdout
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    number = re.compile(r"(inf|nan|[-+]?[\d.]+(e[-+]?\d+)?)(!| [kMG]?B)?|-")
    right = [
        bool(cells) and all(number.fullmatch(r[i]) for r in cells) for i in range(len(headers))
    ]

    def line(row):
        return "  ".join(
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right, strict=True)
        ).rstrip()

    print(line(headers), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for row in cells:
        print(line(row), file=file)


def _emit_json(doc) -> None:
    print(json.dumps(doc, indent=2, default=_json_default, allow_nan=False))


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (tuple, set)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def bound_text(bound: dict | None) -> str:
    if not bound:
        return "lossless"
    text = f"{bound['mode']}={bound['value']:g}"
    tol = bound.get("tolerance")
    if bound["mode"] == "rel" and tol is not None:
        text += f" (abs {tol:.4g})"
    return text


def codec_text(codec) -> str:
    """The codec's name (its full config is in the --json output); ``copied`` if none."""
    if not codec:
        return "copied"
    return str(codec.get("id", "?")) if isinstance(codec, dict) else str(codec)


class Progress:
    """A tqdm bar per dataset (bytes), on stderr; off with ``quiet`` or off a TTY."""

    def __init__(self, quiet: bool):
        self.disable = True if quiet else None  # None: tqdm turns itself off on a non-TTY
        self.bar = None
        self.name = None
        self.done = 0

    def __call__(self, name: str, done_bytes: int, total_bytes: int) -> None:
        if name != self.name or done_bytes == 0:
            self.close()
            from tqdm import tqdm

            self.name, self.done = name, 0
            self.bar = tqdm(
                total=total_bytes,
                desc=name,
                unit="B",
                unit_scale=True,
                unit_divisor=1000,
                file=sys.stderr,
                disable=self.disable,
                leave=False,
                dynamic_ncols=True,
            )
        self.bar.update(done_bytes - self.done)
        self.done = done_bytes

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- compress / decompress -----------------------------------------------------------


def _require_input(path: str) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    if os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory", path)


def _require_output(path: str, force: bool) -> None:
    if os.path.exists(path) and not force:
        raise FileExistsError(17, "File exists", path)
    if os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory", path)


def report_dict(r) -> dict:
    """A DatasetReport as a JSON-ready dict (bytes, seconds)."""
    return {
        "name": r.name,
        "compressed": bool(r.compressed),
        "shape": list(r.shape),
        "dtype": str(r.dtype),
        "codec": r.codec,
        "bound": r.bound,
        "original_bytes": int(r.original_bytes),
        "stored_bytes": int(r.stored_bytes),
        "ratio": _finite_or_none(r.original_bytes / r.stored_bytes if r.stored_bytes else None),
        "seconds": float(r.seconds),
    }


def _summary(command: str, args, reports: list, seconds: float) -> dict:
    original = sum(int(r.original_bytes) for r in reports)
    stored = sum(int(r.stored_bytes) for r in reports)
    return {
        "command": command,
        "input": args.input,
        "output": args.output,
        "input_bytes": os.path.getsize(args.input),
        "output_bytes": os.path.getsize(args.output),
        "original_bytes": original,
        "stored_bytes": stored,
        "ratio": _finite_or_none(original / stored if stored else None),
        "seconds": seconds,
        "mb_per_s": _finite_or_none(original / 1e6 / seconds if seconds > 0 else None),
        "workers": args.workers or os.cpu_count(),
        "datasets": [report_dict(r) for r in reports],
    }


def _print_summary(doc: dict) -> None:
    rows = []
    for d in doc["datasets"]:
        rows.append(
            [
                d["name"],
                "x".join(map(str, d["shape"])) or "scalar",
                d["dtype"],
                codec_text(d["codec"]),
                bound_text(d["bound"]) if d["compressed"] else "-",
                size_text(d["original_bytes"]),
                size_text(d["stored_bytes"]),
                _fmt(d["ratio"] if d["original_bytes"] else None, ".2f"),
                rate_text(d["original_bytes"], d["seconds"]),
            ]
        )
    print_table(
        ["dataset", "shape", "dtype", "codec", "bound", "original", "stored", "ratio", "MB/s"],
        rows,
    )
    original, stored = size_text(doc["original_bytes"]), size_text(doc["stored_bytes"])
    sizes = (
        f"{original} -> {stored} stored"
        if doc["command"] == "compress"
        else f"{stored} stored -> {original}"
    )
    print(
        f"{doc['command']}ed {len(doc['datasets'])} dataset(s): {sizes} "
        f"(ratio {_fmt(doc['ratio'], '.2f')}) in {doc['seconds']:.2f} s "
        f"({rate_text(doc['original_bytes'], doc['seconds'])} MB/s, {doc['workers']} worker(s)); "
        f"wrote {doc['output']} ({size_text(doc['output_bytes'])})"
    )


def size_text(nbytes: int) -> str:
    """Bytes for people: ``512 B``, ``12.3 kB``, ``4.56 MB``, ``1.07 GB`` (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def rate_text(nbytes: int, seconds: float) -> str:
    """MB/s (1e6 bytes per second), or ``-`` when too little was timed to say."""
    if seconds <= 0 or nbytes == 0:
        return "-"
    rate = nbytes / 1e6 / seconds
    return f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"


@_command
def _compress(args) -> int:
    from .formats import compress_file

    bound = _check_bound(
        {k: getattr(args, k) for k in ("abs", "rel", "pw_rel") if getattr(args, k) is not None}
    )
    overrides = {}
    for key, value in args.set:
        overrides[key] = _check_bound(value)
    codec = _check_codec(args.codec)
    _require_input(args.input)
    _require_output(args.output, args.force)
    kwargs = {} if args.chunk is None else {"chunk_bytes": args.chunk}
    t0 = time.perf_counter()
    with Progress(args.quiet or False) as progress:
        reports = compress_file(
            args.input,
            args.output,
            bound,
            overrides=overrides or None,
            codec=codec,
            workers=args.workers,
            dtype=args.dtype,
            shape=args.shape,
            overwrite=args.force,
            progress=progress,
            **kwargs,
        )
    doc = _summary("compress", args, reports, time.perf_counter() - t0)
    doc["bound"] = bound
    doc["overrides"] = overrides
    if args.json:
        _emit_json(doc)
    elif not args.quiet:
        _print_summary(doc)
    return EXIT_OK


@_command
def _decompress(args) -> int:
    from .formats import decompress_file

    _require_input(args.input)
    _require_output(args.output, args.force)
    t0 = time.perf_counter()
    with Progress(args.quiet) as progress:
        reports = decompress_file(
            args.input,
            args.output,
            workers=args.workers,
            overwrite=args.force,
            progress=progress,
        )
    doc = _summary("decompress", args, reports, time.perf_counter() - t0)
    if args.json:
        _emit_json(doc)
    elif not args.quiet:
        _print_summary(doc)
    return EXIT_OK


# -- info ----------------------------------------------------------------------------


@_command
def _info(args) -> int:
    from .formats import MAGIC

    path = args.file
    _require_input(path)
    with open(path, "rb") as f:
        head = f.read(len(MAGIC))
    if head == MAGIC:
        return _info_container(path, args.json)
    import h5py

    if h5py.is_hdf5(path):
        return _info_hdf5(path, args.json)
    raise UserError(f"{path} is not a tensorpress file (neither a .tp container nor an HDF5 file)")


def _info_container(path: str, as_json: bool) -> int:
    import mmap

    from . import info

    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # no need to read it all
    try:
        meta = info(memoryview(mm))
    finally:
        try:
            mm.close()
        except BufferError:  # an exception still refers to the buffer: let gc close it
            pass
    if as_json:
        _emit_json(meta)
        return EXIT_OK
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
    return EXIT_OK


def _info_hdf5(path: str, as_json: bool) -> int:
    from .formats import describe_file

    datasets = describe_file(path)
    original = sum(int(d["original_bytes"]) for d in datasets)
    stored = sum(int(d["stored_bytes"]) for d in datasets)
    doc = {
        "file": path,
        "kind": "hdf5",
        "file_bytes": os.path.getsize(path),
        "original_bytes": original,
        "stored_bytes": stored,
        "ratio": _finite_or_none(original / stored if stored else None),
        "datasets": [{**d, "ratio": _finite_or_none(d.get("ratio"))} for d in datasets],
    }
    if as_json:
        _emit_json(doc)
        return EXIT_OK
    rows = [
        [
            d["name"],
            "x".join(map(str, d["shape"])) or "scalar",
            d["dtype"],
            codec_text(d["codec"]) if d["compressed"] else "copied",
            bound_text(d["bound"]) if d["compressed"] else "-",
            size_text(d["original_bytes"]),
            size_text(d["stored_bytes"]),
            _fmt(_finite_or_none(d.get("ratio")) if d["original_bytes"] else None, ".2f"),
            _fmt(d.get("format_version"), "d"),
        ]
        for d in datasets
    ]
    print(f"{path}: HDF5, {len(datasets)} dataset(s)")
    print_table(
        ["dataset", "shape", "dtype", "codec", "bound", "original", "stored", "ratio", "format"],
        rows,
    )
    print(
        f"total: {size_text(original)} -> {size_text(stored)} stored "
        f"(ratio {_fmt(doc['ratio'], '.2f')}); file {size_text(doc['file_bytes'])}"
    )
    return EXIT_OK


# -- verify --------------------------------------------------------------------------


def row_blocks(shape: tuple, itemsize: int, block_bytes: int, align: int = 1) -> Iterator[tuple]:
    """Index tuples that cover an array of ``shape`` in leading-axis slabs of ~block_bytes.

    A 0-d array is one block ``()``; an empty one has no blocks. ``align``: the
    slab height is a multiple of it (the rows of one compressed chunk).
    """
    if not shape:
        yield ()
        return
    if math.prod(shape) == 0:
        return
    row_bytes = max(1, math.prod(shape[1:]) * itemsize)
    rows = max(1, block_bytes // row_bytes)
    if align > 1:
        rows = max(align, rows // align * align)
    for start in range(0, shape[0], rows):
        yield (slice(start, min(start + rows, shape[0])),)


class ErrorCheck:
    """Accumulates error statistics and bound violations over slabs of one dataset.

    ``bound``: the stored bound dict (mode, value, tolerance) or None (the data
    must match exactly). abs/rel: |x - y| <= tolerance; pw_rel: |x - y| <=
    tolerance * |x| and the same sign. NaN and +/-Inf must come back as they were.
    Errors are computed in float64.
    """

    def __init__(self, bound: dict | None):
        self.bound = bound
        self.count = 0
        self.violations = 0
        self.nonfinite_changed = 0
        self.max_abs = 0.0
        self.sse = 0.0
        self.finite = 0
        self.lo, self.hi = math.inf, -math.inf

    def update(self, x: np.ndarray, y: np.ndarray) -> None:
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            raise UserError(f"shapes differ: {x.shape} in the original, {y.shape} compressed")
        self.count += x.size
        if x.dtype.kind not in "fc" or y.dtype.kind not in "fc":
            self.violations += int(np.count_nonzero(x != y))
            return
        x = x.astype(np.float64, copy=False).ravel()
        y = y.astype(np.float64, copy=False).ravel()
        fx, fy = np.isfinite(x), np.isfinite(y)
        both = fx & fy
        # Non-finite on either side: the two must be identical (NaN matches NaN).
        odd = ~both
        if odd.any():
            xo, yo = x[odd], y[odd]
            changed = int(np.count_nonzero(~((xo == yo) | (np.isnan(xo) & np.isnan(yo)))))
            self.nonfinite_changed += changed
            self.violations += changed
        if fx.any():
            xf = x[fx]
            self.lo, self.hi = min(self.lo, float(xf.min())), max(self.hi, float(xf.max()))
        xb, yb = x[both], y[both]
        if xb.size == 0:
            return
        d = np.abs(xb - yb)
        self.max_abs = max(self.max_abs, float(d.max()))
        self.sse += float(np.dot(d, d))
        self.finite += d.size
        if self.bound is None:
            bad = d != 0
        elif self.bound["mode"] == "pw_rel":
            bad = (d > self.bound["tolerance"] * np.abs(xb)) | (np.sign(xb) != np.sign(yb))
        else:
            bad = d > self.bound["tolerance"]
        self.violations += int(np.count_nonzero(bad))

    def result(self) -> dict:
        span = self.hi - self.lo if self.hi >= self.lo else None
        if span is None or self.finite == 0:
            max_rel = psnr = None
        else:
            max_rel = self.max_abs / span if span > 0 else (0.0 if self.max_abs == 0 else None)
            mse = self.sse / self.finite
            psnr = (
                math.inf
                if mse == 0
                else 20 * math.log10(span) - 10 * math.log10(mse)
                if span > 0
                else None
            )
        return {
            "elements": self.count,
            "max_abs_error": self.max_abs,
            "max_rel_error": max_rel,
            "psnr_db": psnr,
            "value_range": span,
            "nonfinite_changed": self.nonfinite_changed,
            "violations": self.violations,
        }


@_command
def _verify(args) -> int:
    from .formats import describe_file, open_source
    from .formats import open as open_compressed

    _require_input(args.original)
    _require_input(args.compressed)
    ratios = _stored_ratios(args.compressed, describe_file)
    results = []
    with (
        open_source(args.original, dtype=args.dtype, shape=args.shape) as original,
        open_compressed(args.compressed) as compressed,
        Progress(args.quiet) as progress,
    ):
        for name in list(dict.fromkeys([*original, *compressed])):
            results.append(_verify_one(name, original, compressed, progress))
            results[-1]["ratio"] = ratios.get(name)
    failed = [r["name"] for r in results if r["status"] != "ok"]
    doc = {
        "original": args.original,
        "compressed": args.compressed,
        "ok": not failed,
        "failed": failed,
        "datasets": results,
    }
    if args.json:
        _emit_json(_json_safe(doc))
    elif not args.quiet:
        _print_verify(doc)
    elif failed:
        print(f"tensorpress: bound violated in {', '.join(failed)}", file=sys.stderr)
    return EXIT_VIOLATION if failed else EXIT_OK


def _stored_ratios(path: str, describe_file) -> dict:
    import h5py

    if not h5py.is_hdf5(path):
        from .formats import MAGIC

        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise UserError(f"{path} is not a tensorpress file (neither .tp nor HDF5)")
    return {d["name"]: _finite_or_none(d.get("ratio")) for d in describe_file(path)}


def _verify_one(name: str, original, compressed, progress) -> dict:
    out = {"name": name, "shape": None, "bound": None, "ratio": None}
    if name not in compressed or name not in original:
        where = "the compressed file" if name not in compressed else "the original"
        return {**out, "status": f"missing from {where}"}
    src, dst = original[name], compressed[name]
    shape, dtype = tuple(src.shape), np.dtype(src.dtype)
    out["shape"] = list(shape)
    bound = dst.bound if dst.compressed else None
    out["bound"] = bound
    if tuple(dst.shape) != shape:
        return {**out, "status": f"shape {tuple(dst.shape)} != original {shape}"}
    check = ErrorCheck(bound)
    total = math.prod(shape) * dtype.itemsize
    align = _chunk_rows(dst)
    progress(name, 0, total)
    done = 0
    for index in row_blocks(shape, dtype.itemsize, VERIFY_BLOCK_BYTES, align):
        x = np.asarray(src[index])
        check.update(x, dst[index])
        done += x.nbytes
        progress(name, done, total)
    res = check.result()
    status = "ok"
    if res["violations"]:
        what = "bound" if bound else "exact copy"
        status = f"FAIL: {res['violations']} element(s) outside the {what}"
    return {**out, **res, "status": status}


def _chunk_rows(ds) -> int:
    """Rows per compressed chunk of ``ds`` (1 if plain or unknown), to slice along chunks."""
    rows = getattr(ds, "chunk_rows", None)
    if rows is None:  # not (yet) public: the container header of the dataset's reader
        header = getattr(getattr(ds, "reader", None), "header", None)
        rows = getattr(header, "chunk_rows", None)
    return int(rows) if rows else 1


def _json_safe(obj):
    """Replace inf/nan floats (not JSON) by None."""
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _print_verify(doc: dict) -> None:
    rows = []
    for r in doc["datasets"]:
        rows.append(
            [
                r["name"],
                bound_text(r["bound"]) if r.get("bound") else "exact",
                _fmt(r.get("max_abs_error"), ".3g"),
                _fmt(r.get("max_rel_error"), ".3g"),
                _fmt(r.get("psnr_db"), ".1f"),
                _fmt(r.get("ratio"), ".2f"),
                r.get("violations", "-"),
                r["status"],
            ]
        )
    print_table(
        ["dataset", "bound", "max abs err", "max rel err", "PSNR dB", "ratio", "bad", "status"],
        rows,
    )
    if doc["ok"]:
        print(f"ok: all {len(doc['datasets'])} dataset(s) within their bounds")
    else:
        print(f"FAILED: {', '.join(doc['failed'])}")


# -- bench ---------------------------------------------------------------------------


class _TpCodec:
    """A tensorpress codec with the peers' interface (absolute bound)."""

    lossy = True

    def __init__(self, codec: str, workers: int | None):
        self.name, self.codec, self.workers = f"tp {codec}", codec, workers

    def compress(self, x, abs_bound):
        from . import compress

        return compress(x, abs=abs_bound, codec=self.codec, workers=self.workers)

    def decompress(self, blob, like):
        from . import decompress

        return decompress(blob, workers=self.workers)


def bench_codecs(workers: int | None) -> list:
    """tensorpress's sz and block codecs, then the installed peers."""
    from .compress.peers import available_peers

    return [_TpCodec("sz", workers), _TpCodec("block", workers), *available_peers()]


def _leading(ds, max_bytes: int) -> np.ndarray:
    """The first rows of ``ds`` that fit in ``max_bytes`` (at least one row)."""
    shape = tuple(ds.shape)
    if not shape:
        return np.asarray(ds[()])
    row_bytes = max(1, math.prod(shape[1:]) * np.dtype(ds.dtype).itemsize)
    rows = max(1, min(shape[0], max_bytes // row_bytes))
    return np.array(ds[:rows], order="C")  # a writable copy, not a view of a memory map


def bench_one(codec, x: np.ndarray, rel: float, span: float, repeat: int) -> dict:
    """Compress and decompress ``x`` ``repeat`` times; errors against rel * span (float64)."""
    eb = rel * span
    row = {"codec": codec.name, "rel": rel, "abs_bound": eb}
    try:
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
    except (ValueError, TypeError, RuntimeError) as exc:
        return {**row, "error": " ".join(str(exc).split())}
    check = ErrorCheck({"mode": "abs", "value": eb, "tolerance": eb} if codec.lossy else None)
    check.update(x, y)
    res = check.result()
    nbytes = len(blob)
    tc, td = statistics.median(t_c), statistics.median(t_d)
    return {
        **row,
        "ratio": x.nbytes / nbytes,
        "bits_per_value": 8 * nbytes / x.size,
        "psnr_db": res["psnr_db"],
        "max_error": res["max_abs_error"] if not res["nonfinite_changed"] else math.inf,
        "max_error_over_bound": _over(res["max_abs_error"], eb, res["nonfinite_changed"]),
        "violations": res["violations"] if codec.lossy else 0,
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


@_command
def _bench(args) -> int:
    from .formats import open_source

    _require_input(args.file)
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
                finite = x[np.isfinite(x)]
                span = float(finite.astype(np.float64).max() - finite.min()) if finite.size else 0
                datasets.append(
                    {"name": name, "shape": list(x.shape), "dtype": str(x.dtype), "bytes": x.nbytes}
                )
                for rel in rels:
                    for codec in codecs:
                        bar.set_postfix_str(f"{name} {codec.name} rel {rel:g}")
                        rows.append(
                            {"dataset": name, **bench_one(codec, x, rel, span, args.repeat)}
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
        "rows": rows,
        "ok": not bad,
    }
    if args.plot:
        plot_rate_distortion(rows, args.plot, title=os.path.basename(args.file))
        doc["plot"] = args.plot
    if args.json:
        _emit_json(_json_safe(doc))
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
                _fmt(r["ratio"], ".2f"),
                _fmt(r["psnr_db"], ".1f"),
                _fmt(r["max_error_over_bound"], ".3f") + flag,
                _fmt(r["compress_mb_s"], ".1f" if r["compress_mb_s"] < 10 else ".0f"),
                _fmt(r["decompress_mb_s"], ".1f" if r["decompress_mb_s"] < 10 else ".0f"),
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


@_command
def _demo(args) -> int:
    from . import compress, decompress
    from .compress.peers import available_peers

    rels = args.rel or list(DEFAULT_RELS)
    peers = [p for p in available_peers() if p.lossy]
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
            runs += [
                (
                    p.name,
                    lambda a, p=p, b=bound: p.compress(a, b),
                    lambda z, p=p, like=x: p.decompress(z, like),
                )
                for p in peers
            ]
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


if __name__ == "__main__":
    sys.exit(main())

"""The command line: argument types (sizes in bytes, shapes, dtypes, bounds) and the parser."""

from __future__ import annotations

import argparse
import math
import re
import sys

import numpy as np

from .errors import EXIT_ERROR

MODES = {"abs": "abs", "rel": "rel", "pw_rel": "pw_rel", "pw-rel": "pw_rel", "psnr": "psnr"}
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


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


def positive_int(what: str):
    """An argument type: an integer >= 1; the error names ``what`` it counts."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}: give an integer >= 1")
        return n

    parse.__name__ = what.replace(" ", "_")
    return parse


parse_workers = positive_int("worker count")
parse_repeat = positive_int("repeat count")


def parse_bound_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"invalid bound {text!r}: give a finite number >= 0")
    return value


def parse_rel(text: str, given: str | None = None) -> float:
    """A value-range relative bound; above 1 it is accepted (as ``tp.compress`` accepts
    it: SZ3's rel has no ceiling), with a warning, since it allows every value to come
    back as any other of its range: most likely a percentage meant as a fraction.
    ``given``: the option as the warning names it (default ``--rel TEXT``)."""
    value = parse_bound_value(text)
    if value > 1:
        print(
            f"tensorpress: warning: {given or '--rel ' + text} allows errors of {value:g} "
            f"times the value range, so any value may come back as any other: --rel takes "
            f"a fraction ({value / 100:g} for {value:g}%), --abs an absolute bound",
            file=sys.stderr,
        )
    return value


def parse_positive_rel(text: str) -> float:
    value = parse_rel(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"invalid bound {text!r}: give a number > 0")
    return value


def parse_psnr(text: str) -> float:
    """A PSNR target in dB: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"invalid PSNR {text!r}: give a finite number of dB > 0, e.g. 60"
        )
    return value


def parse_override(text: str) -> tuple[str, dict]:
    """``"temperature:abs=0.01"`` -> ("temperature", {"abs": 0.01}); ``psnr=60`` too."""
    name, _, spec = text.rpartition(":")
    mode, _, value = spec.partition("=")
    mode = MODES.get(mode.strip().lower())
    if not name or mode is None or not value:
        raise argparse.ArgumentTypeError(
            f"invalid --set {text!r}: give NAME:MODE=VALUE with MODE abs, rel, pw_rel or "
            "psnr, e.g. temperature:abs=0.01"
        )
    if mode == "rel":
        return name.strip("/"), {mode: parse_rel(value, f"--set {text}")}
    parse = parse_psnr if mode == "psnr" else parse_bound_value
    return name.strip("/"), {mode: parse(value)}


# -- the parser ----------------------------------------------------------------------


def _common(p, *, writes: bool = False, workers: bool = False) -> None:
    """Options every subcommand takes; ``writes``: it writes OUTPUT; ``workers``: it
    runs threads."""
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
            help="worker threads (default: all cores); for a .zarr OUTPUT, Dask worker "
            "processes (default: one per core, up to 8); the output does not depend on it",
        )


def _raw_options(p) -> None:
    """How a raw binary input is read: its dtype and shape."""
    p.add_argument(
        "--dtype", type=parse_float_dtype, help="raw input: float32 or float64 (little-endian)"
    )
    p.add_argument(
        "--shape", type=parse_shape, help="raw input: sizes in C order, e.g. 100,500,500"
    )


def codec_help() -> str:
    """The registered codecs and what each does with the data, from their declared
    capabilities (bounded, lossy, dtypes): ``sz (error-bounded: abs/rel/pw_rel;
    float16/32/64), ...``."""
    from .. import available_codecs, get_codec

    parts = []
    for name in available_codecs():
        codec = get_codec(name)
        if codec.bounded:
            what = f"error-bounded: {'/'.join(codec.bound_modes)}"
        elif codec.lossy:
            what = (
                "lossy, no bound, --bits N per value" if "bits" in codec.parameters() else "lossy"
            )
        else:
            what = "lossless, no bound"
        floats = [d.removeprefix("float") for d in codec.dtypes if d.startswith("float")]
        kinds = (
            "any numeric dtype" if len(codec.dtypes) > len(floats) else "float" + "/".join(floats)
        )
        parts.append(f"{name} ({what}; {kinds})")
    return ", ".join(parts)


def _add_compress(sub) -> None:
    p = sub.add_parser(
        "compress",
        help="compress an HDF5 (netCDF-4), .npy, .npz or raw file",
        description="Compress every floating-point dataset of INPUT (HDF5 or netCDF-4, .npy, "
        ".npz or raw binary) into OUTPUT: .h5/.hdf5 (.nc/.nc4 for netCDF-4) for an HDF5 file "
        "of the same hierarchy, .tp for a container (single arrays).",
    )
    p.add_argument("input", metavar="INPUT")
    p.add_argument(
        "output",
        metavar="OUTPUT",
        help="ends in .h5, .hdf5, .nc, .nc4 (netCDF-4), .tp or .zarr (a zarr v3 store, "
        "written by a Dask job; INPUT HDF5, netCDF-4 or zarr)",
    )
    _bound_options(p)
    p.add_argument(
        "--codec", default="sz", metavar="NAME", help=f"one of {codec_help()}; default sz"
    )
    p.add_argument(
        "--bits", type=positive_int("bit count"), metavar="N", help="quant: bits per value"
    )
    p.add_argument(
        "--chunk",
        type=parse_bytes,
        default=None,
        metavar="BYTES",
        help="input bytes per chunk, e.g. 256K (default 4M)",
    )
    p.add_argument(
        "--chunk-samples",
        dest="chunk_samples",
        type=positive_int("sample count"),
        default=None,
        metavar="N",
        help="each compressed dataset's chunks hold N samples (rows along its first axis, "
        "whole along the others) instead of about --chunk bytes: 1 for training data, so a "
        "shuffled DataLoader reads each chunk once per epoch (HDF5 and .zarr OUTPUT)",
    )
    p.add_argument(
        "--set",
        type=parse_override,
        action="append",
        default=[],
        metavar="NAME:MODE=E",
        help="another bound for one dataset, e.g. temperature:abs=0.01 or "
        "temperature:psnr=80 (repeatable)",
    )
    p.add_argument(
        "--layout",
        choices=("filter", "stream"),
        default=None,
        help="how an HDF5 OUTPUT stores a compressed dataset: filter (the default for HDF5 "
        "input: a chunked dataset of the same shape and dtype through the tensorpress HDF5 "
        "filter, read by h5py after import tensorpress) or stream (the default for the "
        "other inputs: one container stream in a uint8 dataset)",
    )
    p.add_argument(
        "--container",
        action="store_true",
        help="write a .tp container whatever OUTPUT's extension says",
    )
    _zarr_options(p)
    _raw_options(p)
    _common(p, writes=True, workers=True)


def _bound_options(p) -> None:
    """The mutually exclusive bounds of ``compress``."""
    bound = p.add_mutually_exclusive_group()
    bound.add_argument("--abs", type=parse_bound_value, metavar="E", help="|x - y| <= E")
    bound.add_argument(
        "--rel", type=parse_rel, metavar="E", help="|x - y| <= E * (max - min), E a fraction"
    )
    bound.add_argument(
        "--pw-rel",
        dest="pw_rel",
        type=parse_bound_value,
        metavar="E",
        help="|x - y| <= E * |x|, signs kept",
    )
    bound.add_argument(
        "--psnr",
        type=parse_psnr,
        metavar="DB",
        help="the loosest abs bound found, per dataset, whose PSNR (dB, over the value "
        "range) reaches DB",
    )


def _zarr_options(p) -> None:
    """compress's options for a .zarr OUTPUT (a Dask job)."""
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="a .zarr OUTPUT: run on this Dask scheduler (tcp://host:port or a scheduler "
        "file, .json) instead of a local cluster of --workers processes",
    )
    p.add_argument(
        "--shards",
        type=parse_bytes,
        nargs="?",
        const=parse_bytes("64M"),
        default=None,
        metavar="BYTES",
        help="a .zarr OUTPUT: group chunks into shards of about BYTES input bytes "
        "(default 64M), one file each",
    )


def _add_decompress(sub) -> None:
    p = sub.add_parser("decompress", help="restore a compressed file")
    p.add_argument("input", metavar="INPUT")
    p.add_argument(
        "output",
        metavar="OUTPUT",
        help=".h5/.hdf5/.nc/.nc4 or .npz for HDF5 (netCDF-4) input; .npy, .h5 or raw (.f32, "
        ".f64, .dat, .raw, .bin) for a container",
    )
    p.add_argument(
        "--raw",
        action="store_true",
        help="write raw little-endian bytes (C order) whatever OUTPUT's extension says",
    )
    _common(p, writes=True, workers=True)


def _add_convert(sub) -> None:
    p = sub.add_parser(
        "convert",
        help="rewrite a stream-layout HDF5 file in the filter layout",
        description="Rewrite a compressed HDF5 file whose datasets are container streams "
        "(--layout stream, or written before the filter layout was the default) as chunked "
        "datasets through the tensorpress HDF5 filter, and datasets written with the filter's "
        "first id, 307 (BZIP2's), with its id. The compressed chunks are moved, not "
        "compressed again: the values read back as before; INPUT is not changed.",
    )
    p.add_argument("input", metavar="INPUT")
    p.add_argument("output", metavar="OUTPUT", help="ends in .h5 or .hdf5")
    _common(p, writes=True)


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="describe a compressed file")
    p.add_argument("file", metavar="FILE", help="a file written by tensorpress")
    _common(p)


def _add_verify(sub) -> None:
    p = sub.add_parser(
        "verify",
        help="check a compressed file against its original",
        description="Compare every dataset chunk by chunk; exit 1 if an element violates "
        "its stored bound or a NaN/Inf changed.",
    )
    p.add_argument("original", metavar="ORIGINAL")
    p.add_argument("compressed", metavar="COMPRESSED")
    _raw_options(p)
    _common(p)


def _add_bench(sub) -> None:
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
        "--repeat", type=parse_repeat, default=3, metavar="N", help="timed runs (median)"
    )
    p.add_argument("--plot", metavar="PNG", help="write a rate-distortion plot (matplotlib)")
    _raw_options(p)
    _common(p, workers=True)


def _add_demo(sub) -> None:
    p = sub.add_parser(
        "demo", help="compress a built-in scientific field and activation tensor, verify, report"
    )
    p.add_argument(
        "--rel",
        type=parse_positive_rel,
        action="append",
        metavar="E",
        help="value-range relative bound (repeatable; default 1e-2, 1e-3, 1e-4)",
    )


def _add_plugin_path(sub) -> None:
    sub.add_parser(
        "plugin-path",
        help="print the folder of the compiled HDF5 plugin, for HDF5_PLUGIN_PATH",
        description="Print the folder to put in HDF5_PLUGIN_PATH so that other programs "
        "(h5dump, netCDF tools, C and Fortran codes, h5py without tensorpress) read "
        "datasets written with the tensorpress filter: export HDF5_PLUGIN_PATH=$(tensorpress "
        "plugin-path). The plugin decodes zstd, block and int8 datasets; sz not yet.",
    )


#: the subcommands, in the order ``--help`` lists them
SUBCOMMANDS = (
    _add_compress,
    _add_decompress,
    _add_convert,
    _add_info,
    _add_verify,
    _add_bench,
    _add_demo,
    _add_plugin_path,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``tensorpress`` parser with its subcommands."""
    from .._version import __version__

    parser = _Parser(
        prog="tensorpress",
        description="Error-bounded compression of arrays and tensors.",
        epilog="Exit status: 0 success; 1 verify (or bench, demo) found an element outside "
        "its bound; 2 an error; 130 interrupted. 'tensorpress COMMAND --help' for a command.",
    )
    parser.add_argument("--version", action="version", version=f"tensorpress {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser

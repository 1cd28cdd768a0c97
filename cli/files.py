"""The ``compress``, ``decompress`` and ``info`` commands: whole files in, whole files out."""

from __future__ import annotations

import json
import os
import sys
import time

from .errors import EXIT_OK, UserError, require_input, require_output
from .output import (
    Progress,
    bound_text,
    codec_text,
    emit_json,
    finite_or_none,
    fmt,
    print_table,
    rate_text,
    size_text,
    unbounded_text,
)
from .zarr_cmd import is_zarr_path, resumed_line, run_compress_zarr


def _build_bound(given: dict | None, name: str = "bound"):
    """The ``ErrorBound`` (or the plan's ``PsnrTarget``: PSNR is a target, not an
    ErrorBound mode) of a bound option's dict, built once here and handed to
    ``compress_file`` as it is; ValueError, as ``compress_file`` words it, when it is bad."""
    from ..files.plan import bound_of

    return bound_of(given, name)


def _check_psnr(codec, given: dict, overrides: list) -> None:
    """A PSNR target (``--psnr``, ``--set NAME:psnr=``) needs a codec taking abs bounds."""
    if "psnr" in given or any("psnr" in spec for _, spec in overrides):
        if not (codec.bounded and "abs" in codec.bound_modes):
            raise UserError(f"codec {codec.name} takes no abs error bound, so no --psnr target")


def _check_codec(args) -> tuple[str, dict, dict | None]:
    """(codec name, its options, the bound options given as a dict) from ``--codec``,
    ``--bits`` and the bound options; UserError when they do not go together."""
    from .. import available_codecs, get_codec

    name = args.codec
    if name not in available_codecs():
        raise UserError(f"unknown codec {name!r}: use one of {', '.join(available_codecs())}")
    codec = get_codec(name)
    modes = ("abs", "rel", "pw_rel", "psnr")
    given = {k: getattr(args, k) for k in modes if getattr(args, k) is not None}
    if codec.bounded and not given:
        raise UserError(f"codec {name} needs an error bound: give --abs, --rel, --pw-rel or --psnr")
    if not codec.bounded and (given or args.set):
        kind = "lossless" if not codec.lossy else "bits-bounded"
        option = "--set" if args.set and not given else f"--{next(iter(given)).replace('_', '-')}"
        raise UserError(f"codec {name} is {kind} and takes no error bound: leave out {option}")
    _check_psnr(codec, given, args.set)
    options = {}
    if args.bits is not None:
        if "bits" not in codec.parameters():
            raise UserError(f"--bits is an option of the quant codec, not of {name}")
        options["bits"] = args.bits
    return name, options, given or None


def _check_raw_options(args) -> None:
    """A raw input needs both ``--dtype`` and ``--shape``: name the one that is missing."""
    if (args.dtype is None) != (args.shape is None):
        missing = "--shape" if args.shape is None else "--dtype"
        raise UserError(
            f"{missing} is missing: a raw binary input needs --dtype (float32 or float64) "
            "and --shape (sizes in C order, e.g. 100,500,500)"
        )


#: HDF5 outputs by name; a netCDF-4 file (.nc, .nc4) is an HDF5 file
HDF5_NAMES = (".h5", ".hdf5", ".nc", ".nc4")
#: what ``compress`` writes, by OUTPUT's extension
COMPRESSED_EXTENSIONS = (".tp", *HDF5_NAMES)
#: what ``decompress`` writes, by OUTPUT's extension (raw: see RAW_EXTENSIONS)
RESTORED_EXTENSIONS = (".npy", ".npz", *HDF5_NAMES)


def _extension(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def _check_compressed_name(args) -> None:
    """Refuse an OUTPUT whose extension promises a format compress does not write
    (``x.npy`` would hold a container that np.load refuses), unless ``--container``."""
    ext = _extension(args.output)
    if ext in COMPRESSED_EXTENSIONS or args.container:
        return
    stem = args.output[: len(args.output) - len(ext)] if ext else args.output
    raise UserError(
        f"{args.output}: compress writes a tensorpress container (.tp) or a compressed HDF5 "
        f"file (.h5, or .nc for netCDF-4), not {ext or 'a file without extension'}: name it "
        f"{stem}.tp, or pass "
        "--container to write the container under this name"
    )


def _check_restored_name(args) -> None:
    """Refuse an OUTPUT whose extension names no format decompress writes, unless ``--raw``."""
    from ..formats.sources import RAW_EXTENSIONS

    ext = _extension(args.output)
    if args.raw or ext in RESTORED_EXTENSIONS or ext in RAW_EXTENSIONS:
        return
    raise UserError(
        f"{args.output}: decompress writes .npy, .npz, .h5/.hdf5/.nc or raw binary "
        f"({', '.join(RAW_EXTENSIONS)}), not {ext or 'a file without extension'}: choose one "
        "of those, or pass --raw to write raw little-endian bytes under this name"
    )


def _warn_copied_overrides(overrides: dict, reports: list) -> None:
    """Warn (stderr) for every ``--set`` that named a dataset that was not compressed."""
    for key in overrides:
        for r in reports:
            if not r.compressed and key in (r.name, r.name.rsplit("/", 1)[-1]):
                why = r.note or "it is copied as it is"
                print(
                    f"tensorpress: warning: --set {key}: {r.name} was not compressed ({why}); "
                    "its bound does not apply",
                    file=sys.stderr,
                )


def _warn_all_missing(reports) -> None:
    """Warn (stderr) for every dataset none of whose cells holds a value (its note says
    so): a fill value or valid range that covers it all is more likely a mistake."""
    from ..files.compress import ALL_MISSING

    for r in reports:
        if ALL_MISSING in (r.note or ""):
            print(
                f"tensorpress: warning: {r.name}: {ALL_MISSING}; check its _FillValue, "
                "missing_value and valid range",
                file=sys.stderr,
            )


def report_dict(r) -> dict:
    """A DatasetReport as a JSON-ready dict (bytes, seconds); a PSNR target, which the
    report carries in its bound, under ``target`` as ``info`` gives it."""
    bound = dict(r.bound) if r.bound else r.bound
    target = bound.pop("target", None) if bound else None
    return {
        "name": r.name,
        "compressed": bool(r.compressed),
        "note": r.note,
        "shape": list(r.shape),
        "dtype": str(r.dtype),
        "codec": r.codec,
        "bound": bound,
        **({"target": target} if target is not None else {}),
        "original_bytes": int(r.original_bytes),
        "stored_bytes": int(r.stored_bytes),
        "ratio": finite_or_none(r.original_bytes / r.stored_bytes if r.stored_bytes else None),
        "seconds": float(r.seconds),
    }


def target_text(target: dict | None) -> str:
    """A PSNR target for people: ``psnr 60 dB (reached 61.2)``, with ``on 8 of 40
    chunks`` where the search measured a sample; "" for none."""
    if not target or "psnr" not in target:
        return ""
    reached = target.get("psnr_reached")
    text = "exact" if reached is None else f"reached {reached:.1f}"
    sample = target.get("sample_chunks")
    if sample:
        text += f" on {sample[0]} of {sample[1]} chunks"
    return f"psnr {target['psnr']:g} dB ({text})"


def _bound_cell(d: dict) -> str:
    """The bound column of a dataset row: its bound, then its PSNR target if any."""
    target = target_text(d.get("target"))
    return bound_text(d["bound"], d.get("codec")) + (f", {target}" if target else "")


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
        "ratio": finite_or_none(original / stored if stored else None),
        "seconds": seconds,
        "mb_per_s": finite_or_none(original / 1e6 / seconds if seconds > 0 else None),
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
                codec_text(d["codec"]) if d["compressed"] else d["note"].split(":")[0] or "copied",
                _bound_cell(d) if d["compressed"] else "-",
                size_text(d["original_bytes"]),
                size_text(d["stored_bytes"]),
                fmt(d["ratio"] if d["original_bytes"] else None, ".2f"),
                rate_text(d["original_bytes"], d["seconds"]),
            ]
        )
    print_table(
        ["dataset", "shape", "dtype", "codec", "bound", "original", "stored", "ratio", "MB/s"],
        rows,
    )
    original, stored = size_text(doc["original_bytes"]), size_text(doc["stored_bytes"])
    sizes = (
        f"{stored} stored -> {original}"
        if doc["command"] == "decompress"
        else f"{original} -> {stored} stored"
    )
    print(
        f"{doc['command'].removesuffix('e')}ed {len(doc['datasets'])} dataset(s): {sizes} "
        f"(ratio {fmt(doc['ratio'], '.2f')}) in {doc['seconds']:.2f} s "
        f"({rate_text(doc['original_bytes'], doc['seconds'])} MB/s, {doc['workers']} worker(s)); "
        f"wrote {doc['output']} ({size_text(doc['output_bytes'])})"
    )


# -- compress / decompress -----------------------------------------------------------


def run_compress(args) -> int:
    """``tensorpress compress``: write OUTPUT, print the summary; return the exit status."""
    from ..files import compress_file

    codec, codec_options, given = _check_codec(args)
    bound = _build_bound(given)
    overrides, given_overrides = {}, {}
    for key, value in args.set:  # a later --set of the same name wins
        overrides[key] = _build_bound(value, f"override {key!r}")
        given_overrides[key] = value
    _check_raw_options(args)
    if is_zarr_path(args.output):  # a zarr v3 store, written by a Dask job
        doc = run_compress_zarr(args, codec, codec_options, bound, overrides)
        reports = doc.pop("reports")
        doc.update(bound=given, overrides=given_overrides)
        doc["datasets"] = [report_dict(r) for r in reports]
        _warn_copied_overrides(overrides, reports)
        _warn_all_missing(reports)
        if args.json:
            emit_json(doc)
        elif not args.quiet:
            _print_summary(doc)
            if resumed_line(doc):
                print(resumed_line(doc))
        return EXIT_OK
    require_input(args.input)
    require_output(args.output, args.force)
    _check_compressed_name(args)
    kwargs = {} if args.chunk is None else {"chunk_bytes": args.chunk}
    t0 = time.perf_counter()
    with Progress(args.quiet or False) as progress:
        reports = compress_file(
            args.input,
            args.output,
            bound,
            overrides=overrides or None,
            codec=codec,
            codec_options=codec_options or None,
            workers=args.workers,
            dtype=args.dtype,
            shape=args.shape,
            overwrite=args.force,
            progress=progress,
            raw_when_larger=True,
            layout=args.layout,
            chunk_samples=args.chunk_samples,
            **kwargs,
        )
    _warn_copied_overrides(overrides, reports)
    _warn_all_missing(reports)
    doc = _summary("compress", args, reports, time.perf_counter() - t0)
    doc["bound"] = given
    doc["overrides"] = given_overrides
    if args.json:
        emit_json(doc)
    elif not args.quiet:
        _print_summary(doc)
    return EXIT_OK


def run_decompress(args) -> int:
    """``tensorpress decompress``: restore OUTPUT, print the summary; return the exit status."""
    from ..files import decompress_file

    require_input(args.input)
    require_output(args.output, args.force)
    _check_restored_name(args)
    t0 = time.perf_counter()
    with Progress(args.quiet) as progress:
        reports = decompress_file(
            args.input,
            args.output,
            raw=args.raw,
            workers=args.workers,
            overwrite=args.force,
            progress=progress,
        )
    doc = _summary("decompress", args, reports, time.perf_counter() - t0)
    if args.json:
        emit_json(doc)
    elif not args.quiet:
        _print_summary(doc)
    return EXIT_OK


def run_convert(args) -> int:
    """``tensorpress convert``: rewrite a stream-layout HDF5 file in the filter layout."""
    from ..files import convert_file

    require_input(args.input)
    require_output(args.output, args.force)
    from ..formats.sources import HDF5_EXTENSIONS

    if _extension(args.output) not in HDF5_EXTENSIONS:
        raise UserError(f"{args.output}: convert writes HDF5: name it .h5, .hdf5, .nc or .nc4")
    t0 = time.perf_counter()
    with Progress(args.quiet) as progress:
        reports = convert_file(args.input, args.output, overwrite=args.force, progress=progress)
    args.workers = 1  # the chunks are moved, not encoded: one thread
    doc = _summary("convert", args, reports, time.perf_counter() - t0)
    if args.json:
        emit_json(doc)
    elif not args.quiet:
        _print_summary(doc)
    return EXIT_OK


# -- info ----------------------------------------------------------------------------


def run_info(args) -> int:
    """``tensorpress info``: describe a .tp container or a compressed HDF5 file."""
    from ..formats.stream_header import MAGIC

    path = args.file
    require_input(path)
    with open(path, "rb") as f:
        head = f.read(len(MAGIC))
    if head == MAGIC:
        return _info_container(path, args.json)
    import h5py

    if h5py.is_hdf5(path):
        return _info_hdf5(path, args.json)
    raise UserError(f"{path} is not a tensorpress file (neither a .tp container nor an HDF5 file)")


def _info_container(path: str, as_json: bool) -> int:
    from .. import info

    meta = info(path)  # positioned reads: every checksum and the length are verified
    if as_json:
        emit_json(meta)
        return EXIT_OK
    bound = meta["bound"]
    rows = [
        ("format version", meta["format_version"]),
        ("codec", json.dumps(meta["config"])),
        ("dtype / shape", f"{meta['dtype']} {tuple(meta['shape'])} ({meta['order']} order)"),
        (
            "bound",
            unbounded_text(meta["config"])
            if bound is None
            else f"{bound['mode']}={bound['value']:g} (absolute tolerance {bound['tolerance']:g})"
            if bound["mode"] != "pw_rel"
            else f"pw_rel={bound['value']:g}",
        ),
        *([("target", target_text(meta["target"]))] if meta.get("target") else []),
        ("chunks", f"{meta['chunks']} of {meta['chunk_rows']} rows"),
        (
            "size",
            f"{meta['original_bytes']} -> {meta['compressed_bytes']} bytes "
            f"(ratio {meta['ratio']:.2f})",
        ),
        ("written by", meta["writer"]),
        ("checked", meta["checked"]),
    ]
    for k, v in rows:
        print(f"{k:>15}: {v}")
    return EXIT_OK


def _info_hdf5(path: str, as_json: bool) -> int:
    from ..files import describe_file

    datasets = describe_file(path)
    original = sum(int(d["original_bytes"]) for d in datasets)
    stored = sum(int(d["stored_bytes"]) for d in datasets)
    doc = {
        "file": path,
        "kind": "hdf5",
        "file_bytes": os.path.getsize(path),
        "original_bytes": original,
        "stored_bytes": stored,
        "ratio": finite_or_none(original / stored if stored else None),
        "datasets": [{**d, "ratio": finite_or_none(d.get("ratio"))} for d in datasets],
    }
    if as_json:
        emit_json(doc)
        return EXIT_OK
    rows = [
        [
            d["name"] + "".join(f" (= {alias})" for alias in d.get("also", [])),
            "x".join(map(str, d["shape"])) or "scalar",
            d["dtype"],
            codec_text(d["codec"]) if d["compressed"] else "copied",
            _bound_cell(d) if d["compressed"] else "-",
            size_text(d["original_bytes"]),
            size_text(d["stored_bytes"]),
            fmt(finite_or_none(d.get("ratio")) if d["original_bytes"] else None, ".2f"),
            fmt(d.get("format_version"), "d"),
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
        f"(ratio {fmt(doc['ratio'], '.2f')}); file {size_text(doc['file_bytes'])}"
    )
    return EXIT_OK

"""The ``compress``, ``decompress`` and ``info`` commands: whole files in, whole files out."""

from __future__ import annotations

import json
import os
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
)


def _check_bound(bound: dict) -> dict:
    """Validate a bound dict with tensorpress's own rules (ValueError says what to do)."""
    from ..compress import ErrorBound

    ErrorBound.from_kwargs(**bound)
    return bound


def _check_codec(name: str) -> str:
    """``name`` if it is a registered error-bounded codec, else a UserError listing them."""
    from ..compress import available_codecs
    from ..compress.registry import codec_class

    bounded = [c for c in available_codecs() if codec_class(c).bounded]
    if name not in bounded:
        raise UserError(f"unknown codec {name!r}: use one of {', '.join(bounded)}")
    return name


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
        "ratio": finite_or_none(r.original_bytes / r.stored_bytes if r.stored_bytes else None),
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
                codec_text(d["codec"]),
                bound_text(d["bound"]) if d["compressed"] else "-",
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
        f"{original} -> {stored} stored"
        if doc["command"] == "compress"
        else f"{stored} stored -> {original}"
    )
    print(
        f"{doc['command']}ed {len(doc['datasets'])} dataset(s): {sizes} "
        f"(ratio {fmt(doc['ratio'], '.2f')}) in {doc['seconds']:.2f} s "
        f"({rate_text(doc['original_bytes'], doc['seconds'])} MB/s, {doc['workers']} worker(s)); "
        f"wrote {doc['output']} ({size_text(doc['output_bytes'])})"
    )


# -- compress / decompress -----------------------------------------------------------


def run_compress(args) -> int:
    """``tensorpress compress``: write OUTPUT, print the summary; return the exit status."""
    from ..formats import compress_file

    bound = _check_bound(
        {k: getattr(args, k) for k in ("abs", "rel", "pw_rel") if getattr(args, k) is not None}
    )
    overrides = {}
    for key, value in args.set:
        overrides[key] = _check_bound(value)
    codec = _check_codec(args.codec)
    require_input(args.input)
    require_output(args.output, args.force)
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
        emit_json(doc)
    elif not args.quiet:
        _print_summary(doc)
    return EXIT_OK


def run_decompress(args) -> int:
    """``tensorpress decompress``: restore OUTPUT, print the summary; return the exit status."""
    from ..formats import decompress_file

    require_input(args.input)
    require_output(args.output, args.force)
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
        ("checked", meta["checked"]),
    ]
    for k, v in rows:
        print(f"{k:>15}: {v}")
    return EXIT_OK


def _info_hdf5(path: str, as_json: bool) -> int:
    from ..formats import describe_file

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
            d["name"],
            "x".join(map(str, d["shape"])) or "scalar",
            d["dtype"],
            codec_text(d["codec"]) if d["compressed"] else "copied",
            bound_text(d["bound"]) if d["compressed"] else "-",
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

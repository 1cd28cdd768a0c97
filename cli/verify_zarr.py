"""``tensorpress verify SRC DST.zarr``: every element of a zarr v3 output against its
original, chunk (or shard) by chunk; an unfinished store is refused."""

from __future__ import annotations

import json
import os

import numpy as np

from .errors import EXIT_OK, EXIT_VIOLATION, UserError
from .output import emit_json, finite_or_none, json_safe
from .verify import ErrorCheck, print_verify, run_verify, status_of
from .zarr_cmd import is_zarr_path, is_zarr_store


def run_verify_any(args) -> int:
    """``tensorpress verify``: a zarr store here, any other output by :func:`run_verify`."""
    if is_zarr_path(args.compressed):
        return run_verify_zarr(args)
    return run_verify(args)


def run_verify_zarr(args) -> int:
    """``tensorpress verify SRC DST.zarr``: every element of every variable against its
    recorded bound (exact for the lossless ones); refuses an unfinished store."""
    from ..files.zarr_commit import IncompleteStore, require_finished
    from ..files.zarr_source import describe

    try:
        require_finished(args.compressed)
    except IncompleteStore as exc:
        raise UserError(str(exc)) from None
    if not is_zarr_store(args.compressed):
        raise UserError(f"{args.compressed} is not a zarr store (no zarr.json)")
    _, variables = describe(args.original)
    results = [_verify_variable(args, v) for v in variables]
    failed = [r["name"] for r in results if r["status"] != "ok"]
    doc = {
        "original": args.original,
        "compressed": args.compressed,
        "ok": not failed,
        "failed": failed,
        "damaged": [],
        "datasets": results,
    }
    if args.json:
        emit_json(json_safe(doc))
    elif not args.quiet:
        print_verify(doc)
    return EXIT_OK if not failed else EXIT_VIOLATION


def _verify_variable(args, var) -> dict:
    """One variable of the original against the store's array of the same path, read
    chunk (or shard) by chunk."""
    import zarr

    from ..files.zarr_out import BOUND_ATTR
    from ..files.zarr_plan import grid_regions
    from ..files.zarr_source import read_region, source_kind

    out = {"name": var.path, "shape": list(var.shape), "bound": None, "ratio": None}
    try:
        array = zarr.open_array(store=args.compressed, path=var.path, mode="r")
    except (FileNotFoundError, KeyError, zarr.errors.NodeNotFoundError):
        return {**out, "status": "missing from the compressed store"}
    if tuple(array.shape) != tuple(var.shape):
        return {**out, "status": f"shape {tuple(array.shape)} != original {tuple(var.shape)}"}
    bound = json.loads(array.attrs[BOUND_ATTR]) if BOUND_ATTR in array.attrs else None
    out["bound"] = bound
    check = ErrorCheck(bound)
    kind = source_kind(args.original)
    unit = array.shards or array.chunks
    for region in grid_regions(var.shape, unit):
        x = read_region(args.original, kind, var.path, region)
        y = np.asarray(array[tuple(slice(a, b) for a, b in region)])
        if x.dtype.kind == "O":  # strings: compared as Python objects
            x, y = x.astype(object), y.astype(object)
        check.update(x, y, var.missing)
    stored = _stored_bytes(args.compressed, var.path)
    out["ratio"] = finite_or_none(var.nbytes / stored if stored else None)
    res = check.result()
    return {**out, **res, "status": status_of(res, bound)}


def _stored_bytes(store: str, path: str) -> int:
    folder = os.path.join(store, *path.split("/"), "c")
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)

"""The tasks of a compress job to zarr, run in whichever process Dask gives them (or in
this one): each reads its own region of the input, and either measures its value range
or writes it, reads it back from the store, checks every element and marks it done.

A task's spec is a plain dict (it travels by pickle): ``src``, ``kind`` ("hdf5"/"zarr"),
``path``, ``region`` ((start, stop) per axis), and for a write ``partial``, ``job``,
``index`` (the chunk's or shard's grid index), ``tolerance`` and ``mode`` (the resolved
bound: "abs" or "pw_rel"; tolerance None: exact) and ``missing`` (MissingSpec or None).
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np

from .zarr_commit import mark
from .zarr_source import read_region


class JobIncomplete(RuntimeError):
    """Some tasks failed: DST.partial keeps the verified chunks for a rerun."""


class BoundViolation(RuntimeError):
    """A chunk read back from the store is outside its bound: nothing is marked done."""


def range_task(spec: dict) -> dict:
    """What the plan needs of the spec's region: ``range``, (min, max) of its finite,
    valid cells (None: it has none), and ``missing``, how many distinct non-NaN values
    its missing cells hold (each needs a marker in a chunk's stream)."""
    block = read_region(spec["src"], spec["kind"], spec["path"], spec["region"])
    valid = np.isfinite(block)
    distinct = 0
    if spec.get("missing") is not None:
        missing = spec["missing"].mask(block)
        valid &= ~missing
        distinct = int(np.unique(block[missing & ~np.isnan(block)]).size)
    if not valid.any():
        return {"range": None, "missing": distinct}
    values = block[valid]
    return {"range": (float(values.min()), float(values.max())), "missing": distinct}


@functools.lru_cache(maxsize=64)
def _output(partial: str, job: str, path: str):
    """Array ``path`` of the store being written, opened once per process and job."""
    import zarr

    return zarr.open_array(store=partial, path=path, mode="r+")


def write_task(spec: dict) -> dict:
    """Write the spec's region, read it back, check it, mark it; its stats (bytes)."""
    block = read_region(spec["src"], spec["kind"], spec["path"], spec["region"])
    array = _output(spec["partial"], spec["job"], spec["path"])
    index = tuple(slice(a, b) for a, b in spec["region"])
    array[index] = block
    back = np.asarray(array[index])
    worst = check_block(block, back, spec)
    stats = {
        "in": _nbytes(block),
        "out": _stored_bytes(spec["partial"], spec["path"], spec["index"]),
        "max_error": worst,
    }
    if block.dtype.kind == "f":
        stats["numbers"] = _numbers(block, spec.get("missing"))
    mark(spec["partial"], spec["path"], spec["index"], stats)
    return stats


def _numbers(block: np.ndarray, missing) -> int:
    """Cells of float ``block`` that hold a number: neither NaN nor missing (CF or HDF5
    fill value, outside the valid range): none in every chunk, and the report says so."""
    has = ~np.isnan(block)
    if missing is not None:
        has &= ~missing.mask(block)
    return int(np.count_nonzero(has))


def _nbytes(block: np.ndarray) -> int:
    if block.dtype.kind == "O":
        return sum(len(str(s).encode()) for s in block.reshape(-1))
    return int(block.nbytes)


def _stored_bytes(partial: str, path: str, index: tuple) -> int:
    """Bytes of the chunk (or shard) file just written; 0 when zarr wrote none (every
    value equal to the fill value)."""
    key = os.path.join(partial, *path.split("/"), "c", *map(str, index))
    try:
        return os.path.getsize(key)
    except OSError:
        return 0


def check_block(x: np.ndarray, y: np.ndarray, spec: dict) -> float:
    """The largest error of ``y`` (read back) against ``x`` (the input) over finite,
    valid cells; BoundViolation when an element is outside the bound, a NaN or infinity
    changed, or a missing cell changed by a bit."""
    where = f"{spec['path']} chunk {'.'.join(map(str, spec['index'])) or '0'}"
    if x.shape != y.shape:
        raise BoundViolation(f"{where}: read back as shape {y.shape}, written {x.shape}")
    tol = spec.get("tolerance")
    if x.dtype.kind != "f" or tol is None:
        if x.dtype.kind == "f":  # bit for bit: NaN payloads and the sign of zero too
            bits = f"u{x.itemsize}"
            same = x.view(bits) == np.ascontiguousarray(y, x.dtype).view(bits)
        else:
            same = x.astype(object) == y.astype(object) if x.dtype.kind == "O" else x == y
        bad = int(np.count_nonzero(~np.asarray(same, dtype=bool)))
        if bad:
            raise BoundViolation(f"{where}: {bad} element(s) differ from a lossless copy")
        return 0.0
    missing = spec.get("missing")
    exact = ~np.isfinite(x)
    if missing is not None:
        exact |= missing.mask(x)
    changed = 0
    xv, yv = x.reshape(-1), y.reshape(-1)
    if exact.any():  # the common case has none: no copies by mask then
        bits = f"u{x.itemsize}"
        changed = int(np.count_nonzero(x[exact].view(bits) != y[exact].astype(x.dtype).view(bits)))
        xv, yv = x[~exact], y[~exact]
    err = np.abs(np.subtract(xv, yv, dtype=np.float64))  # exact for float16/32/64 inputs
    limit = tol * np.abs(xv) if spec["mode"] == "pw_rel" else tol
    bad = int(np.count_nonzero(~(err <= limit))) + _outside(yv, missing)
    if spec["mode"] == "pw_rel":
        bad += int(np.count_nonzero(np.sign(xv) != np.sign(yv)))
    if changed or bad:
        raise BoundViolation(
            f"{where}: {bad} element(s) outside the bound {spec['mode']} {tol:g} or the "
            "valid range, "
            f"{changed} NaN, infinite or missing cell(s) changed"
        )
    return float(err.max()) if err.size else 0.0


def _outside(y: np.ndarray, missing) -> int:
    """How many decoded valid cells ``y`` lie outside the valid range: such a value
    would read as missing."""
    if missing is None or (missing.lo is None and missing.hi is None):
        return 0
    lo = -np.inf if missing.lo is None else missing.lo
    hi = np.inf if missing.hi is None else missing.hi
    return int(np.count_nonzero((y < lo) | (y > hi)))


def combine_ranges(ranges: list) -> tuple[float, float]:
    """The whole variable's (min, max) from its regions' (None: no valid cell)."""
    found = [r for r in ranges if r is not None]
    if not found:
        return 0.0, 0.0
    return min(r[0] for r in found), max(r[1] for r in found)


def chunk_count(shape: tuple, unit: tuple) -> int:
    return math.prod(-(-n // u) for n, u in zip(shape, unit, strict=True)) if shape else 1

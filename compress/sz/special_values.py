"""Values the predictors must not see: non-finite values, exact patches, and
the log transform that turns a point-wise relative bound into an absolute one.

Patches are (flat index, exact value) pairs that the decoder writes over its
reconstruction; they keep NaN and ±Inf bit for bit, keep them from disturbing
the prediction of their neighbours, and repair any element a transform could
not bring within the bound.
"""

from __future__ import annotations

import math

import numpy as np

from ..byteio import ByteReader, ByteWriter


def split_nonfinite(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indices of non-finite elements, ``flat`` with them replaced by a finite fill).

    The fill is the midpoint of the finite values, so that the predictor sees a
    plausible value; the original is restored from the patch list.
    """
    bad = ~np.isfinite(flat)
    if not bad.any():
        return np.empty(0, np.int64), flat
    idx = np.flatnonzero(bad)
    good = flat[~bad]
    fill = 0.0 if good.size == 0 else 0.5 * (float(good.min()) + float(good.max()))
    filled = flat.copy()
    filled[idx] = fill
    return idx, filled


def write_patches(w: ByteWriter, idx: np.ndarray, values: np.ndarray) -> None:
    """Append a patch list: u64 count, u64 indices (ascending), raw values."""
    w.u64(idx.size)
    if idx.size:
        w.array(idx.astype(np.uint64))
        w.array(values)


def read_patches(r: ByteReader, dtype, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Read a patch list for a chunk of ``size`` elements; validates the indices."""
    n = r.u64()
    if n > size:
        raise ValueError(f"patch count {n} exceeds chunk size {size}")
    idx = r.array(np.uint64, n)
    values = r.array(dtype, n)
    if n and int(idx.max()) >= size:
        raise ValueError("patch index out of range")
    return idx.astype(np.int64), values


def log_bound(pw_rel: float) -> float:
    """Absolute bound on log2|x| that keeps |x - y| <= pw_rel * |x|.

    |log2 y - log2 x| <= log2(1 + e) gives y/x in [1/(1+e), 1+e]; the small
    margin absorbs the rounding of log2/exp2 (the encoder still verifies every
    element and patches the few that miss).
    """
    return math.log2(1.0 + pw_rel) * (1.0 - 1e-6)


def to_log_domain(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log2|x| as float64 with zeros filled, sign bits packed, indices of zeros)."""
    x64 = x.astype(np.float64, copy=False)
    zero = x64 == 0
    zero_idx = np.flatnonzero(zero)
    mag = np.abs(x64)
    if zero_idx.size:
        mag = mag.copy()
        nonzero = mag[~zero]
        mag[zero_idx] = nonzero.min() if nonzero.size else 1.0
    logs = np.log2(mag)
    signs = np.packbits(np.signbit(x64))
    return logs, signs, zero_idx


def from_log_domain(logs: np.ndarray, signs: np.ndarray, dtype) -> np.ndarray:
    """Inverse of :func:`to_log_domain` (before patches): sign * 2**logs in ``dtype``."""
    with np.errstate(over="ignore"):
        mag = np.exp2(logs)
        neg = np.unpackbits(signs, count=logs.size).astype(bool)
        out = np.where(neg, -mag, mag)
        return out.astype(dtype)


#: decoded values must stay this many ulps (of their dtype) inside the bound:
#: exp2 may differ by an ulp or two between CPUs, which can move the rounded
#: value by one ulp of the dtype on the decoding machine
PW_REL_MARGIN_ULPS = 4


def pw_rel_violations(x: np.ndarray, y: np.ndarray, pw_rel: float) -> np.ndarray:
    """Indices where |x - y| + margin > pw_rel * |x| (compared in float64).

    ``y`` is the decoded value in the data's dtype; the margin is
    ``PW_REL_MARGIN_ULPS`` ulps of ``y``, so the bound also holds where another
    machine's exp2 rounds differently.
    """
    x64 = x.astype(np.float64, copy=False)
    y64 = y.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        margin = PW_REL_MARGIN_ULPS * np.abs(np.spacing(y)).astype(np.float64)
        err = np.abs(x64 - y64) + margin
        # pw_rel * |x| can overflow to inf near the float64 maximum: a finite x
        # must also come back finite
        ok = (err <= pw_rel * np.abs(x64)) & np.isfinite(y64)
    return np.flatnonzero(~ok)

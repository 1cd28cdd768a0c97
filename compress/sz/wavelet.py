"""``sz``'s wavelet predictor (14): the values quantized onto bins of width ``2 * eb``
first, then a multilevel reversible integer CDF 5/3 lifting of the bins in every
dimension of the chunk (Mallat layout: each level transforms the low-pass block of
the one before), the coefficients coded as the quantizer's codes.

The transform is integer to integer, so the bins come back exactly and every element
is within the bound by the quantization alone (the pointwise bound holds without a
correction pass). An element whose bin exceeds ``MAX_BIN`` or whose reconstruction
misses the bound after rounding to the storage precision is a *fix*: bin 0, and its
exact value in the side information, written over the reconstruction.

Codes are ``c + radius`` for ``|c| < radius - 1``; the code ``2 * radius - 1`` escapes
a coefficient, whose int64 value is in the side information (code 0, the others'
outlier, is never used: this predictor has no outliers).

Side information (little-endian)::

    u64 n + n i64    escaped coefficients, in code order
    u64 m + m u64    flat indices of the fixes, ascending
    m f64            their exact values
"""

from __future__ import annotations

import numpy as np

from ..byteio import ByteReader, ByteWriter
from . import lifting
from .kernels.wavelet import (
    code_coefficients,
    decode_coefficients,
    lift_rows,
    missed_elements,
    quantize_bins,
    reconstruct,
    unlift_rows,
)

#: dimensions a chunk is folded to
NDIM = 4
#: largest bin taken; the lifting's sums stay far below 2**63 (about 2**46 at most)
MAX_BIN = 2.0**40
#: most levels, and the fewest elements along a dimension that a level transforms
LEVELS = 8
MIN_LENGTH = 8


def plan(shape: tuple) -> list[tuple[tuple, tuple]]:
    """The levels of the transform of a chunk of ``shape`` (see ``lifting.plan``)."""
    return lifting.plan(shape, LEVELS, MIN_LENGTH)


def forward(bins: np.ndarray) -> None:
    """The multilevel transform of the int64 array ``bins``, in place."""
    lifting.forward(bins, plan(bins.shape), lift_rows)


def inverse(coef: np.ndarray) -> None:
    """Invert :func:`forward` in place."""
    lifting.inverse(coef, plan(coef.shape), unlift_rows)


def encode_chunk(choice, data, eb, radius, prec, codes, outliers, pool=None):
    """``(0, side information)``: the codes of the chunk ``data`` (4-d) into ``codes``;
    no outliers."""
    flat = data.reshape(-1)
    two_eb = 2.0 * eb
    bins = np.empty(flat.size, np.int64)
    missed = quantize_bins(flat, two_eb, eb, prec, MAX_BIN, bins)
    fix_idx = np.empty(missed, np.int64)
    if missed:
        missed_elements(flat, two_eb, eb, prec, MAX_BIN, bins, fix_idx)
    coef = bins.reshape(data.shape)
    forward(coef)
    escapes = np.empty(flat.size, np.int64)
    n_esc = code_coefficients(bins, radius, codes, escapes)
    w = ByteWriter()
    w.u64(n_esc)
    w.array(escapes[:n_esc])
    w.u64(missed)
    w.array(fix_idx.astype(np.uint64))
    w.array(flat[fix_idx].astype(np.float64))
    return 0, w.getvalue()


def decode_chunk(choice, side, codes, outliers, eb, radius, prec, out) -> None:
    """Invert :func:`encode_chunk` into the 4-d ``out`` (the kernel dtype)."""
    size = out.size
    r = ByteReader(side, "sz wavelet side information")
    n_esc = r.u64()
    if n_esc > size:
        raise ValueError("sz payload: more wavelet escapes than elements")
    escapes = r.array(np.int64, n_esc)
    m = r.u64()
    if m > size:
        raise ValueError("sz payload: more wavelet fixes than elements")
    fix_idx = r.array(np.uint64, m).astype(np.int64)
    fix_vals = r.array(np.float64, m)
    r.done()
    if m and not (fix_idx[0] >= 0 and fix_idx[-1] < size and np.all(np.diff(fix_idx) > 0)):
        raise ValueError("sz payload: wavelet fix indices out of order or range")
    if codes.size != size:
        raise ValueError("sz payload: wavelet codes do not cover the chunk")
    bins = np.empty(size, np.int64)
    if decode_coefficients(codes, radius, escapes, bins) != n_esc:
        raise ValueError("sz payload: wavelet escapes do not match the codes")
    inverse(bins.reshape(out.shape))
    flat = out.reshape(-1)
    reconstruct(bins, 2.0 * eb, prec, flat)
    flat[fix_idx] = fix_vals

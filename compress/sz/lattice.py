"""Data on a lattice (``x = offset + k * step`` for integers ``k``): ``sz``'s lossless
coding of the indices ``k`` when the bound is below the step.

Integer-valued images and elevation models (8- or 16-bit sensors, metres) hold
values a step apart. Under a bound below that step, a coder that predicts the values
themselves reconstructs them off the lattice, and each error feeds the next
prediction: the codes spread over more values than the data's own differences.
Coding ``k`` losslessly instead (Lorenzo prediction of integers is an integer, so
bins of width 1 reconstruct every index exactly) writes what the data hold and no
error at all (measured: docs/compressors.md, "What was tried and why it was left").

The indices go through the Lorenzo kernels in float64 (exact for integers below
``2**53``; ``MAX_INDEX`` keeps the sums of a 4-d stencil far below that) with the bound
``INDEX_BOUND`` = 0.5 (bins of width 1). The decoder reconstructs ``offset + k * step``
in float64 and casts it to the data dtype; the encoder takes the lattice only when
that gives back every finite value bit for bit.
"""

from __future__ import annotations

import numpy as np

from ..kernels.rounding import PREC_FLOAT64
from .kernels.lorenzo import lorenzo_decode, lorenzo_encode

#: dimensions a chunk is folded to
NDIM = 4
#: the outliers are float64 indices, whatever the data dtype
OUTLIER_DTYPE = np.dtype(np.float64)
#: the bound the Lorenzo kernels get on the indices: bins of width 1, so an index
#: predicted as an integer comes back exactly
INDEX_BOUND = 0.5
#: largest index span taken as a lattice (sums of 15 indices stay exact in float64)
MAX_INDEX = 2.0**40
#: values sampled to find the step, a few first (the whole chunk is checked if it wins)
_SAMPLES = (256, 4096)


def find_lattice(work: np.ndarray, patch_idx: np.ndarray, eb: float) -> tuple | None:
    """``(offset, step)`` when the sampled finite values of the flat chunk ``work`` lie
    on ``offset + k * step`` for integers ``k`` and the bound ``eb`` is below ``step``;
    else None. Whether every value does is left to :func:`on_lattice`, once the lattice
    has won the choice (where it loses, the pass over the chunk is saved).

    patch_idx: the elements stored as patches (non-finite), which need not be on it.
    The step is the smallest gap between distinct sampled values, refined so that it
    divides the range; non-lattice data fail on the sample, at a small cost.
    """
    finite = np.delete(work, patch_idx) if patch_idx.size else work
    if finite.size < 2:
        return None
    step0 = 0.0
    for size in _SAMPLES:  # a few values reject most data that are not on a lattice
        sample = np.unique(finite[:: max(1, finite.size // size)].astype(np.float64))
        with np.errstate(over="ignore", invalid="ignore"):  # inf gaps fail the test
            gaps = np.diff(sample)
            if gaps.size == 0:
                return None
            step0 = float(gaps.min())
            if not eb < step0:
                return None
            ratios = gaps / step0
            if not np.max(np.abs(ratios - np.rint(ratios))) <= 1e-6:
                return None
    lo, hi = float(finite.min()), float(finite.max())
    if not (hi - lo) / step0 < MAX_INDEX:
        return None
    step = (hi - lo) / round((hi - lo) / step0)  # the range is a whole number of steps
    return (lo, step) if eb < step else None


def on_lattice(work: np.ndarray, patch_idx: np.ndarray, offset: float, step: float) -> bool:
    """Whether every element of ``work`` but the patches comes back bit for bit as the
    decoder reconstructs it from its index: ``offset + k * step`` in float64, cast."""
    back = lattice_values(lattice_indices(work, offset, step), offset, step).astype(work.dtype)
    on = back == work
    if patch_idx.size:
        on[patch_idx] = True
    return bool(on.all())


def lattice_indices(values: np.ndarray, offset: float, step: float) -> np.ndarray:
    """The nearest lattice index of each value, as float64 (integers)."""
    k = np.subtract(values, offset, dtype=np.float64)
    if step != 1.0:  # whole numbers (the common lattice) skip the pass
        k /= step
    return np.rint(k, out=k)


def lattice_values(indices: np.ndarray, offset: float, step: float) -> np.ndarray:
    """``offset + k * step`` in float64, in place in ``indices`` (float64); what the
    decoder then casts to the data dtype."""
    if step != 1.0:
        indices *= step
    indices += offset
    return indices


def encode(values4, offset, step, radius, codes, outliers) -> int:
    """Code the lattice indices of the 4-d ``values4`` losslessly (outliers: float64
    indices); the number of outliers."""
    indices = lattice_indices(values4, offset, step)
    return lorenzo_encode(indices, INDEX_BOUND, radius, PREC_FLOAT64, codes, outliers)


def decode(codes, outliers, offset, step, radius, out4) -> None:
    """Invert :func:`encode` into the 4-d float64 ``out4``: ``offset + k * step``, which
    the caller casts to the data dtype."""
    lorenzo_decode(codes, outliers, INDEX_BOUND, radius, PREC_FLOAT64, out4)
    lattice_values(out4, offset, step)


def encode_chunk(choice, data, eb, radius, prec, codes, outliers, pool=None):
    """``(outliers, None)``: the dispatch's call; alpha and beta of ``choice`` are the
    offset and the step (the bound and precision are the indices' own)."""
    return encode(data, choice[1], choice[2], radius, codes, outliers), None


def decode_chunk(choice, side, codes, outliers, eb, radius, prec, out) -> None:
    """The dispatch's call of :func:`decode`."""
    decode(codes, outliers, choice[1], choice[2], radius, out)

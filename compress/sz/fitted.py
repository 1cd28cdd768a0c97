"""``sz``'s fitted predictor (11): a causal linear prediction whose neighbours and
weights are fitted per chunk by least squares, the idea of least-squares predictors
in lossless image coding, under ``sz``'s bound.

Fixed stencils (Lorenzo, interpolation) assume a field is locally a polynomial. A
field with a spectrum (turbulence), grid-scale structure (reaction-diffusion solvers)
or channels of learned filters is predicted better by the weights its own data
choose. The fit: the chunk's values at up to ``SAMPLE_POINTS`` points whose pool
of neighbours (``pool``) lies inside the chunk, ridge regression with the
reconstructions' noise as the ridge (uniform within the bound: variance eb**2 / 3,
so the weights account for predicting from noisy values), then the neighbours with
the largest contributions kept, as few as cost under ``SLACK_BITS`` bits per value
over the whole pool (each neighbour costs decode time). Where the neighbours leave
the chunk, Lorenzo predicts: within the plane when it predicts the sample better than
across planes (noise included). The kernel is ``kernels/fitted.py``.

Model bytes (the payload's side information), little-endian::

    u8  n              neighbours, 1 .. MAX_TERMS
    u8  planar         1: Lorenzo within the plane at the edges, 0: over 3 dimensions
    3n  i8             offsets (plane, row, column), each before (0, 0, 0) in C order
    8n  f64            weights
"""

from __future__ import annotations

import itertools
import math
import struct

import numpy as np

from .kernels.fitted import fitted_decode, fitted_encode, reach

#: dimensions a chunk is folded to
NDIM = 3
#: how far the pool of neighbours reaches per dimension, by the number of dimensions
#: of the data (3-d: the causal half of a 5^3 cube, 62; 2-d: of a 7^2 square, 24)
POOL_REACH = {3: 2, 2: 3, 1: 8}
#: most neighbours a model keeps (and a payload may name)
MAX_TERMS = 32
#: points of the chunk the fit uses (at most; a sixteenth of a small chunk's)
SAMPLE_POINTS = 1 << 13
#: points in a row the fit samples together
_RUN = 64
#: fewest interior points worth a fit
MIN_POINTS = 256
#: bits per value a smaller set of neighbours may cost over the whole pool
SLACK_BITS = 0.02
#: neighbour counts tried, smallest first
_LADDER = (2, 4, 6, 8, 12, 16, 20, 24, 32)


def pool(shape3: tuple) -> np.ndarray:
    """The candidate offsets (int64, (n, 3)) for a 3-d shape: every causal offset
    within ``POOL_REACH`` along the dimensions above 1, which leaves interior points."""
    dims = [d for d in range(3) if shape3[d] > 1] or [2]
    r = POOL_REACH[len(dims)]
    ranges = []
    for d in range(3):
        if d not in dims:
            ranges.append((0,))
        elif d == 0:  # planes: only back
            ranges.append(range(-min(r, shape3[0] - 1), 1))
        else:  # back and forward, except along the only dimension
            rd = min(r, shape3[d] - 1) if len(dims) == 1 else min(r, (shape3[d] - 1) // 2)
            ranges.append(range(-rd, rd + 1))
    out = [o for o in itertools.product(*ranges) if o < (0, 0, 0)]
    return np.array(out, np.int64).reshape(-1, 3)


def interior(shape3: tuple, offsets: np.ndarray) -> tuple:
    """The slices of the points every offset of ``offsets`` keeps inside ``shape3``."""
    depth, up, down, left, right = reach(offsets)
    n0, n1, n2 = shape3
    return slice(depth, n0), slice(up, n1 - down), slice(left, n2 - right)


def interior_size(shape3: tuple, offsets: np.ndarray) -> int:
    """How many points of ``shape3`` the model predicts (the others: Lorenzo)."""
    return math.prod(max(s.stop - s.start, 0) for s in interior(shape3, offsets))


def fit(values3: np.ndarray, eb: float) -> bytes | None:
    """The model bytes for the 3-d chunk ``values3``, or None when it has too few
    interior points or the fit fails (non-finite values, a singular system)."""
    with np.errstate(all="ignore"):  # huge values: an overflowing fit is refused below
        return _fit(values3, eb)


def _fit(values3: np.ndarray, eb: float) -> bytes | None:
    """``fit``'s body: sample, solve on the whole pool, keep the strongest neighbours."""
    offsets = pool(values3.shape)
    if offsets.shape[0] == 0:
        return None
    box = interior(values3.shape, offsets)
    counts = [max(s.stop - s.start, 0) for s in box]
    total = math.prod(counts)
    if total < MIN_POINTS:
        return None
    m = min(SAMPLE_POINTS, max(MIN_POINTS, total // 16))
    # runs of up to _RUN points along rows spread over the chunk: their neighbours share
    # cache lines (single points spread over a large chunk cost a miss per neighbour)
    run = min(_RUN, counts[2])
    rows = np.linspace(0, counts[0] * counts[1] - 1, -(-m // run)).astype(np.int64)
    plane, row = np.divmod(rows, counts[1])
    col = (np.arange(rows.size) * 7919) % (counts[2] - run + 1)  # spread along the rows
    n1, n2 = values3.shape[1:]
    starts = ((plane + box[0].start) * n1 + row + box[1].start) * n2 + col + box[2].start
    points = (starts[:, None] + np.arange(run)[None, :]).reshape(-1)
    shifts = (offsets[:, 0] * n1 + offsets[:, 1]) * n2 + offsets[:, 2]
    flat = values3.reshape(-1)
    y = flat[points].astype(np.float64)
    cols = flat[points[:, None] + shifts[None, :]].astype(np.float64)
    gram = cols.T @ cols
    rhs = cols.T @ y
    yy = float(y @ y)
    if not (np.isfinite(gram).all() and math.isfinite(yy)):
        return None
    m = points.size
    gram[np.diag_indices_from(gram)] += m * eb * eb / 3.0
    solved = _solve(gram, rhs, np.arange(offsets.shape[0]))
    if solved is None:
        return None
    _, sse_full = _sse(gram, rhs, yy, *solved)
    if not math.isfinite(sse_full):
        return None
    scale = np.sqrt(np.diag(gram))
    order = np.argsort(-np.abs(solved[1]) * scale[solved[0]], kind="stable")
    floor = max(sse_full, m * eb * eb / 3.0) * 2.0 ** (2 * SLACK_BITS)
    keep = solved[0]
    for n in _LADDER:
        if n >= min(order.size, MAX_TERMS):
            keep = np.sort(order[:MAX_TERMS])
            break
        trial = _solve(gram, rhs, np.sort(order[:n]))
        if trial is not None and _sse(gram, rhs, yy, *trial)[1] <= floor:
            keep = trial[0]
            break
    solved = _solve(gram, rhs, keep)
    if solved is None:
        return None
    return pack(offsets[solved[0]], solved[1], _planar(flat, points, values3.shape, eb))


#: first-order Lorenzo's neighbours and signs, within the plane and over 3 dimensions
_LORENZO_2D = (((0, 0, -1), 1), ((0, -1, 0), 1), ((0, -1, -1), -1))
_LORENZO_3D = _LORENZO_2D + (
    ((-1, 0, 0), 1),
    ((-1, 0, -1), -1),
    ((-1, -1, 0), -1),
    ((-1, -1, -1), 1),
)


def _planar(flat, points, shape3, eb) -> bool:
    """Whether Lorenzo within the plane predicts the sample ``points`` (flat indices
    of interior points of ``shape3``) better than over three dimensions, counting the
    noise its reconstructed neighbours add (variance eb**2 / 3 each)."""
    if shape3[0] == 1:
        return True
    n1, n2 = shape3[1:]
    sse = []
    for stencil in (_LORENZO_2D, _LORENZO_3D):
        residual = flat[points].astype(np.float64)
        for (dz, dy, dx), sign in stencil:
            residual -= sign * flat[points + (dz * n1 + dy) * n2 + dx]
        sse.append(float(residual @ residual) + points.size * len(stencil) * eb * eb / 3.0)
    return sse[0] <= sse[1]


def _solve(gram, rhs, idx):
    """``(idx, weights)`` of the ridge fit on the neighbours ``idx``, or None."""
    try:
        w = np.linalg.solve(gram[np.ix_(idx, idx)], rhs[idx])
    except np.linalg.LinAlgError:
        return None
    return (idx, w) if np.isfinite(w).all() else None


def _sse(gram, rhs, yy, idx, w):
    """``(w, sum of squared residuals)`` of weights ``w`` on the neighbours ``idx``."""
    g = gram[np.ix_(idx, idx)]
    return w, yy - 2.0 * float(w @ rhs[idx]) + float(w @ g @ w)


def pack(offsets: np.ndarray, weights: np.ndarray, planar: bool) -> bytes:
    """The model bytes of ``offsets`` ((n, 3)), ``weights`` (n) and ``planar``."""
    head = struct.pack("<BB", offsets.shape[0], int(planar))
    return head + offsets.astype(np.int8).tobytes() + weights.astype("<f8").tobytes()


def unpack(blob: bytes) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(offsets, weights, planar)`` of model bytes; ValueError if they are not a model."""
    if len(blob) < 2:
        raise ValueError("sz payload: the fitted model is empty")
    n, planar = blob[0], blob[1]
    if not 1 <= n <= MAX_TERMS or len(blob) != 2 + 11 * n or planar > 1:
        raise ValueError("sz payload: the fitted model has the wrong length or flags")
    offsets = np.frombuffer(blob, np.int8, 3 * n, 2).reshape(n, 3).astype(np.int64)
    weights = np.frombuffer(blob, "<f8", n, 2 + 3 * n).astype(np.float64)
    causal = all(tuple(o) < (0, 0, 0) for o in offsets.tolist())
    if not causal or not np.isfinite(weights).all():
        raise ValueError("sz payload: the fitted model names a neighbour not yet decoded")
    if np.abs(offsets).max() > max(POOL_REACH.values()):  # bounds the decoder's planes
        raise ValueError("sz payload: the fitted model names a neighbour out of reach")
    return offsets, weights, bool(planar)


def encode(model: bytes, values3, eb, radius, prec, codes, outliers) -> int:
    """Code the 3-d ``values3`` with ``model``; the number of outliers."""
    return fitted_encode(values3, *unpack(model), eb, radius, prec, codes, outliers)


def decode(model: bytes, codes, outliers, eb, radius, prec, out3) -> None:
    """Invert :func:`encode` into the 3-d ``out3``."""
    fitted_decode(codes, outliers, *unpack(model), eb, radius, prec, out3)


def encode_chunk(choice, data, eb, radius, prec, codes, outliers, pool=None):
    """``(outliers, side information)``: the dispatch's call; the choice carries the
    side information as its fourth item."""
    return encode(choice[3], data, eb, radius, prec, codes, outliers), choice[3]


def decode_chunk(choice, side, codes, outliers, eb, radius, prec, out) -> None:
    """The dispatch's call of :func:`decode`."""
    decode(side, codes, outliers, eb, radius, prec, out)

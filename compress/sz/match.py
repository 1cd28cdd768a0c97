"""``sz``'s row-match predictor (12): each row of the chunk's 2-d layout (all dimensions
but the last merged) is predicted by one earlier, similar row, or by a constant.

Activations hold rows that nearly repeat: a token's embedding wherever the token
recurs (plus a small position term), and what the next layers make of it. Neighbours
within a row do not predict such data (it is noise-like along the row, where constant
prediction wins), but the earlier row of the same token predicts all of it. The
search (``kernels/match_search.py``) looks at the rows' first ``SKETCH_COLUMNS`` columns:
it hashes each row by which of a few columns lie above their mean, takes as a row's
candidates the row before it and the latest earlier row with its hash in each of a
few tables, keeps the closest, and keeps that where its residuals cost fewer bits than
the row's own codes. Rows that match nothing keep the constant.

References (the payload's side information): per row, the distance back to its
reference row (0: the constant predicts it), in ``width`` bits, the fewest that hold
the largest (so that zstd finds nothing in them and passes the payload quickly)::

    u8                     width, 0 .. 32
    ceil(rows * width / 8) the rows' fields in row order, least significant bit first
                           (numpy packbits with bitorder "little")
"""

from __future__ import annotations

import numpy as np

from ..._util.scratch import scratch
from .kernels.match import match_decode, match_encode, pack_refs, unpack_refs
from .kernels.match_search import match_search

#: dimensions a chunk is folded to
NDIM = 2
#: columns of a row the search looks at (at most)
SKETCH_COLUMNS = 64
#: most bits the references may cost, as a share of the constant's (on the sketch)
GAIN = 0.97
#: fewest rows, and fewest elements per row, worth a search: a shorter row's search
#: covers all of it and found nothing on the corpus's 32-wide activations
#: (benchmarks/compressors.py); attention probabilities 65 wide gained a fifth
MIN_ROWS = 4
MIN_ROW = 64


def references(rows2: np.ndarray, c: float, eb: float) -> tuple[np.ndarray, float, float] | None:
    """``(refs, constant, share)``: per row of the 2-d ``rows2``, the distance back to
    its reference row (int64, 0 for the constant); the constant (``c`` moved by whole
    quantization bins to the middle of the codes, where that stays finite in the rows'
    dtype); the references' bits as a share of the constant's on the sketch. None when
    the chunk has too few rows or columns or the references save under ``1 - GAIN``."""
    rows, n = rows2.shape
    if rows < MIN_ROWS or n < MIN_ROW:
        return None
    m = min(n, SKETCH_COLUMNS)  # the first columns: the sketch reads a fraction of the chunk
    refs, shift, bits, constant_bits = match_search(rows2, m, float(c), 0.5 / eb)
    if not (bits < np.inf and constant_bits > 0):  # no structure, or nothing to save
        return None
    # the references' bits, and the constant's codes decode a little faster
    share = (bits + rows.bit_length() * rows * m / n) / constant_bits
    if share > GAIN:
        return None
    moved = float(c) + 2.0 * eb * int(shift)
    with np.errstate(over="ignore"):  # near the dtype's largest values: keep ``c``
        fits = np.isfinite(rows2.dtype.type(moved))
    return refs, moved if fits else float(c), share


def pack(refs: np.ndarray) -> bytes:
    """The side information of ``refs``: the fewest bits that hold the largest."""
    width = int(refs.max()).bit_length() if refs.size else 0
    return bytes([width]) + pack_refs(refs.astype(np.int64), width).tobytes()


def unpack(blob: bytes, rows: int) -> np.ndarray:
    """The references (int64) of side information for ``rows`` rows; ValueError if they
    do not fit the rows."""
    width = blob[0] if blob else 64
    if width > 32 or len(blob) != 1 + (rows * width + 7) // 8:
        raise ValueError("sz payload: the row references have the wrong length")
    refs = unpack_refs(np.frombuffer(blob, np.uint8, offset=1), rows, width)
    if np.any(refs > np.arange(rows)):
        raise ValueError("sz payload: a row refers to no earlier row")
    return refs


def encode(blob: bytes, rows2, c, eb, radius, prec, codes, outliers) -> int:
    """Code the 2-d ``rows2`` with the references ``blob``; the number of outliers."""
    refs = unpack(blob, rows2.shape[0])
    with scratch(rows2.nbytes) as (buf,):  # the reconstruction, in pages already mapped
        rec = buf.view(rows2.dtype).reshape(rows2.shape)
        return match_encode(rows2, refs, c, eb, radius, prec, codes, outliers, rec)


def decode(blob: bytes, codes, outliers, c, eb, radius, prec, out2) -> None:
    """Invert :func:`encode` into the 2-d ``out2``."""
    match_decode(codes, outliers, unpack(blob, out2.shape[0]), c, eb, radius, prec, out2)


def encode_chunk(choice, data, eb, radius, prec, codes, outliers, pool=None):
    """``(outliers, side information)``: the dispatch's call; the choice carries the
    side information as its fourth item."""
    return encode(choice[3], data, choice[1], eb, radius, prec, codes, outliers), choice[3]


def decode_chunk(choice, side, codes, outliers, eb, radius, prec, out) -> None:
    """The dispatch's call of :func:`decode`."""
    decode(side, codes, outliers, choice[1], eb, radius, prec, out)

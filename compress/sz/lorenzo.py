"""``sz``'s Lorenzo predictor (1): each value predicted from its causal neighbours in
up to 4 dimensions (the corner of a hypercube), the kernels in ``kernels/lorenzo.py``."""

from __future__ import annotations

from .kernels.lorenzo import lorenzo_decode, lorenzo_encode

#: dimensions a chunk is folded to
NDIM = 4


def encode(values4, eb, radius, prec, codes, outliers) -> int:
    """Code the 4-d ``values4`` into ``codes`` and ``outliers``; the number of outliers."""
    return lorenzo_encode(values4, eb, radius, prec, codes, outliers)


def decode(codes, outliers, eb, radius, prec, out4) -> None:
    """Invert :func:`encode` into the 4-d ``out4``."""
    lorenzo_decode(codes, outliers, eb, radius, prec, out4)


def encode_chunk(choice, data, eb, radius, prec, codes, outliers, pool=None):
    """``(outliers, None)``: the dispatch's call (no side information)."""
    return encode(data, eb, radius, prec, codes, outliers), None


def decode_chunk(choice, side, codes, outliers, eb, radius, prec, out) -> None:
    """The dispatch's call of :func:`decode`."""
    decode(codes, outliers, eb, radius, prec, out)

"""``sz``'s constant predictor (6): every value predicted by one constant (the choice's
alpha), for noise-like chunks where neighbours predict nothing; ``kernels/constant.py``."""

from __future__ import annotations

from .kernels.constant import constant_decode, constant_encode

#: dimensions a chunk is folded to
NDIM = 1


def encode(values, c, eb, radius, prec, codes, outliers) -> int:
    """Code the flat ``values`` against the constant ``c``; the number of outliers."""
    return constant_encode(values, c, eb, radius, prec, codes, outliers)


def decode(codes, outliers, c, eb, radius, prec, out) -> None:
    """Invert :func:`encode` into the flat ``out``."""
    constant_decode(codes, outliers, c, eb, radius, prec, out)


def encode_chunk(choice, data, eb, radius, prec, codes, outliers, pool=None):
    """``(outliers, None)``: the dispatch's call; alpha of ``choice`` is the constant."""
    return encode(data, choice[1], eb, radius, prec, codes, outliers), None


def decode_chunk(choice, side, codes, outliers, eb, radius, prec, out) -> None:
    """The dispatch's call of :func:`decode`."""
    decode(codes, outliers, choice[1], eb, radius, prec, out)

"""``sz``'s regression predictor (7): per block, Lorenzo or a linear fit whose quantized
coefficients are the side information; the kernels in ``kernels/regression.py``."""

from __future__ import annotations

from .kernels.regression import regression_decode, regression_encode

#: dimensions a chunk is folded to
NDIM = 3


def encode(values3, eb, radius, prec, codes, outliers) -> tuple[int, bytes]:
    """Code the 3-d ``values3``: ``(outliers, side information)``."""
    return regression_encode(values3, eb, radius, prec, codes, outliers)


def decode(side: bytes, codes, outliers, eb, radius, prec, out3) -> None:
    """Invert :func:`encode` into the 3-d ``out3``."""
    regression_decode(codes, outliers, side, eb, radius, prec, out3)


def encode_chunk(choice, data, eb, radius, prec, codes, outliers, pool=None):
    """``(outliers, side information)``: the dispatch's call."""
    return encode(data, eb, radius, prec, codes, outliers)


def decode_chunk(choice, side, codes, outliers, eb, radius, prec, out) -> None:
    """The dispatch's call of :func:`decode`."""
    decode(side, codes, outliers, eb, radius, prec, out)

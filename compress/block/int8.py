"""The ``int8`` codec: one signed byte a value, ``q = rint(x / step)``, under an absolute
(or value-range) bound.

The step is ``block``'s for the same bound and values come back as ``q * step``
rounded to the dtype, so where both codecs hold a value they restore the same one. A
chunk is stored raw when a code would pass ±127 or a value is not finite. It is a
single pass each way, at one byte a value: what a training step wants for tensors
whose range spans 64 to 254 steps of the bound, where ``block``'s packing saves at
most a quarter of the bytes (``tensorpress.activation_offload`` picks it there).
The byte layout is in formats/SPEC.md.
"""

from __future__ import annotations

import math

import numpy as np

from ..codec import Codec, deliver
from ..registry import register_codec
from .kernels.int8 import INT8_MAX, from_int8_codes, int8_codes
from .kernels.layout import steps_for

MODE_RAW = 1
MODE_CODES = 2


def int8_encode(x: np.ndarray, tol: float) -> np.ndarray | None:
    """The int8 codes of flat, contiguous float32/float64 ``x`` within ``tol``, or None
    where some value cannot have one (a code past ±127, NaN, an infinity, ``tol`` <= 0)."""
    if not tol > 0:
        return None
    step, inv = steps_for(tol)
    codes = np.empty(x.size, np.int8)
    return codes if int8_codes(x, inv, step, tol, codes) else None


def int8_decode(codes: np.ndarray, tol: float, out: np.ndarray) -> np.ndarray:
    """The values ``codes`` hold under ``tol``, written into flat float32/float64 ``out``."""
    from_int8_codes(codes, steps_for(tol)[0], out)
    return out


@register_codec
class Int8Codec(Codec):
    """One byte a value within an abs or rel bound; float32 and float64."""

    name = "int8"
    dtypes = ("float32", "float64")
    bound_modes = ("abs", "rel")
    keeps_zeros = True
    default_chunk_bytes = 1 << 20

    def encode(self, chunk, bound, threads=1, offset=0) -> bytes:
        flat = np.ascontiguousarray(chunk).reshape(-1)
        codes = int8_encode(flat, bound.tolerance) if flat.size else None
        if codes is None:
            return bytes([MODE_RAW]) + flat.tobytes()
        return bytes([MODE_CODES]) + codes.tobytes()

    def decode(self, payload, shape, dtype, bound, out=None, threads=1) -> np.ndarray:
        dtype = np.dtype(dtype)
        n = math.prod(shape)
        buf = np.frombuffer(payload, np.uint8)
        if buf.size < 1:
            raise ValueError("int8 payload is empty")
        mode, body = int(buf[0]), buf[1:]
        want = {MODE_RAW: n * dtype.itemsize, MODE_CODES: n}.get(mode)
        if want is None:
            raise ValueError(f"unknown int8 chunk mode {mode}: written by a newer tensorpress")
        if body.size != want:
            raise ValueError(f"int8 payload holds {body.size} bytes, its {n} values need {want}")
        if mode == MODE_RAW:
            return deliver(body.view(dtype).copy(), shape, out)
        if not bound.tolerance > 0:  # the encoder writes codes only under a positive bound
            raise ValueError("int8 codes under a zero tolerance: the payload is corrupted")
        flat = int8_decode(body.view(np.int8), bound.tolerance, np.empty(n, dtype))
        return deliver(flat, shape, out)


__all__ = ["INT8_MAX", "Int8Codec", "int8_decode", "int8_encode"]

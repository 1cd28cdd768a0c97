"""The set-partitioning (SPECK-style) coding of ``sz``'s CDF 9/7 coefficients: the
integers ``k`` of the quantized coefficients in the Mallat layout, coded bit plane by
bit plane within sets that start as the bands and split in halves where they hold a
significant coefficient (``kernels/speck.py`` defines the bits; formats/SPEC.md, "CDF
9/7"). Runs of insignificant coefficients cost a bit per set and plane, where the
Huffman codes of ``sz/cdf97.py`` cost at least one bit per coefficient."""

from __future__ import annotations

import numpy as np

from .kernels import speck as kernels

MAX_PLANES = kernels.MAX_PLANES


def box_array(boxes: list) -> np.ndarray:
    """``(nb, 8)`` int64: each box of slices (4-d) as its starts, then its lengths."""
    out = np.empty((len(boxes), kernels.BOX), np.int64)
    for i, box in enumerate(boxes):
        out[i, :4] = [s.start for s in box]
        out[i, 4:] = [s.stop - s.start for s in box]
    return out


def planes(k: np.ndarray) -> int:
    """The bit planes ``k`` needs: the bit length of its largest magnitude."""
    return int(np.abs(k).max(initial=0)).bit_length()


def encode(k: np.ndarray, boxes: np.ndarray, top: int, limit: int) -> bytes | None:
    """The bytes of the int64 4-d ``k`` (magnitudes below ``2**top``) coded from the sets
    ``boxes`` (:func:`box_array`), or None where they would take more than ``limit``
    bytes."""
    buf = np.zeros(limit + 64, np.uint8)
    bits = kernels.encode(k, boxes, top, buf)
    if bits < 0 or (bits + 7) // 8 > limit:
        return None
    return buf[: (bits + 7) // 8].tobytes()


def decode(data, top: int, boxes: np.ndarray, shape: tuple) -> np.ndarray:
    """The int64 array of ``shape`` that :func:`encode` coded into ``data``; ValueError
    where ``data`` ends early, holds bytes past the code or padding bits that are not
    0."""
    if not 0 <= top <= MAX_PLANES:
        raise ValueError(f"sz payload: cdf97 bit planes {top} (at most {MAX_PLANES})")
    buf = np.frombuffer(data, np.uint8)
    k = np.zeros(shape, np.int64)
    bits = kernels.decode(buf, top, boxes, k)
    pad = buf.size * 8 - bits
    if pad >= 8 or (pad and int(buf[-1]) & ((1 << pad) - 1)):
        raise ValueError("sz payload: cdf97 bit planes have bytes or bits past their end")
    return k

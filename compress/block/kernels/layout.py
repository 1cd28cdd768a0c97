"""The ``block`` codec's chunk layout and quantizer rule, named once for every implementation.

formats/SPEC.md (section ``block``) is the byte-layout reference; this module names
its fields. The helpers are plain Python on integers and floats, written so that
they also work unchanged on int64 torch tensors (``kernels/block_torch.py``) and
compile as numba CPU functions (``kernels/cpu.py`` wraps them in ``njit``) and
numba.cuda device functions (``kernels/cuda_device.py``).

A chunk payload: the mode byte, one header byte per block, under pw_rel bounds
two step-exponent bytes per block, one count byte per sparse block, then the
blocks' data.
"""

from __future__ import annotations

import math
import sys

BLOCK = 64  # values per block

# -- the chunk's mode byte (payload byte 0)
#: blocks in the first layout (each sparse block's positions in a separate section):
#: no longer read; a payload in it is rejected with :func:`mode_error`
MODE_FIRST_LAYOUT = 0
MODE_RAW = 1  # the chunk's values as they are
MODE_BLOCKS = 2  # headers, exponents, counts, then each block's data
#: one zstd frame of a MODE_BLOCKS payload without its mode byte (``entropy="zstd"``);
#: written and read on the host only (``compress/block/entropy.py``), never by a kernel
MODE_BLOCKS_ZSTD = 3

# -- a block's header byte
WIDTH_MASK = 0x1F  # bits 0-4: the code width w in bits
MAX_WIDTH = 30  # widest codes: |code| <= QMAX, differences zigzagged fit 30 bits
RAW_WIDTH = 31  # width field of a raw block (its values as they are)
SIGNED = 0x20  # bit 5: codes are zigzagged
SPARSE = 0x40  # bit 6: only the non-zero codes are stored (raw block: one value for all)
DELTA = 0x80  # bit 7: codes are differences from the code before

# -- the quantizer
QMAX = (1 << 28) - 1  # largest |quantization code|
#: the step is this much under 2 * tolerance, so that values half a step away (ties:
#: common in integer-valued data) stay within the bound after rounding to the dtype
STEP_MARGIN = 1.0 - 2.0**-12
EXP_MIN, EXP_MAX = -1022, 1022  # pw_rel: range of a block's step exponent


def width(head):
    """The code width field (``RAW_WIDTH``: a raw block) of header byte(s) ``head``."""
    return head & WIDTH_MASK


def is_raw(head):
    """Whether header byte(s) ``head`` mark a raw block."""
    return (head & WIDTH_MASK) == RAW_WIDTH


def head_at(b):
    """Payload offset of block ``b``'s header byte."""
    return 1 + b


def exp_at(nb, b):
    """pw_rel: payload offset of the low byte of block ``b``'s step exponent (of ``nb``
    blocks); the high byte follows."""
    return 1 + nb + 2 * b


def counts_at(nb, pw):
    """Payload offset of the count bytes (of a chunk of ``nb`` blocks); the blocks' data
    follow the count bytes."""
    return 1 + nb * (3 if pw else 1)


def exp_lo(k):
    """Low byte of the int16 step exponent ``k``."""
    return k & 0xFF


def exp_hi(k):
    """High byte of the int16 step exponent ``k``."""
    return (k >> 8) & 0xFF


def exp_value(lo, hi):
    """The int16 step exponent of its two bytes (given as int64)."""
    return ((lo | (hi << 8)) ^ 0x8000) - 0x8000


def steps_for(tol: float) -> tuple[float, float]:
    """(quantization step, its inverse) for an abs tolerance: finite, just under 2*tol;
    the inverse is 0 for a zero tolerance (only zeros quantize)."""
    step = 2.0 * tol * STEP_MARGIN
    if not math.isfinite(step):
        step = sys.float_info.max
    return step, (1.0 / step if step > 0 else 0.0)


def codable(x, t, r, pw, tol):
    """The quantizer's rule for one value: whether code ``t`` (float64), which
    reconstructs ``x`` as ``r`` (``t * step`` rounded to the stored dtype), keeps the
    bound ``tol`` (absolute, or relative to |x| under pw_rel, ``pw``).

    Under pw_rel the sign is kept, zeros are +0.0 exactly and ``r`` must be finite
    (``tol * |x|`` can overflow near the dtype's largest value); a zero absolute
    tolerance also keeps the sign of zero.
    """
    if not abs(t) <= QMAX:
        return False
    if pw:
        if not (abs(r - x) <= tol * abs(x) and abs(r) < math.inf):
            return False
        return r * x > 0.0 or (x == 0.0 and math.copysign(1.0, x) > 0.0)
    if tol == 0.0 and x == 0.0 and math.copysign(1.0, x) < 0.0:
        return False
    return abs(r - x) <= tol


def mode_error(mode: int) -> ValueError:
    """The error for a chunk whose mode byte ``mode`` is neither MODE_RAW nor MODE_BLOCKS."""
    if mode == MODE_FIRST_LAYOUT:
        return ValueError(
            "block chunk in the first block layout (mode 0), which this tensorpress no "
            "longer reads: decode it with the tensorpress that wrote it and compress it again"
        )
    return ValueError(
        f"unknown block chunk mode {mode}: written by a newer tensorpress, or "
        "corrupted; upgrade tensorpress to read it"
    )


def check_modes(modes) -> None:
    """Raise :func:`mode_error` for the first of the chunks' mode bytes ``modes`` (ints)
    that is neither MODE_RAW nor MODE_BLOCKS."""
    for mode in modes:
        if mode != MODE_RAW and mode != MODE_BLOCKS:
            raise mode_error(mode)

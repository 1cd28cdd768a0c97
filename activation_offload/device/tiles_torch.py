"""The torch reference of the block codes (``tiles.py``): static-shape
tensor ops on any device that read nothing back to the host.

The record (one uint8 tensor, offsets in bytes):

- ``[0, 24)``: float64 ``[lo, hi, step]`` as in the fixed-width layout;
- then ``nblocks`` int32 bases (each block's smallest code), then ``nblocks`` uint8
  widths (bits a code of that block takes, 0 for a constant block), padded to 8 bytes;
- then the codes, each as ``code - base`` at its block's width, block after block,
  LSB first in little-endian 32-bit words (the fixed layout's bit order).

Codes: 0 an exact zero, 1 NaN, 2 +Inf, 3 -Inf, ``4 + rint((x - lo) / step)`` a finite
``x``. Zero comes first so that a block of a ReLU's output (zeros and values from
``lo = 0`` up) needs only the width of its own largest value, and a block of zeros none.
The last block is padded (its width unchanged) with zero bits.

A raw block: width ``RAW[dtype]`` (the dtype's own bits: 16 or 32), base 0, and each
code the element's bits (NaN payloads and the sign of zero kept). A block is raw where
its code width would reach the dtype's, where one of its finite elements lies past
``RAW_LIMIT`` steps from ``lo`` (``abs`` bounds, whose steps across the range have no
ceiling; an ``abs`` bound of 0), or where, under ``abs``, the tensor's largest
magnitude exceeds ``ABS_SPAN`` times the bound (the float64 arithmetic's error would
no longer be small next to the bound: ``tiles.py``). So no block ever
takes more than the dtype's bits, and the slot is sized by ``slot_bits``.

The tolerance (``tolerance``): ``rel * (hi - lo)`` or ``abs``; with a learned absolute
tolerance (adaptive bounds, a float64 device scalar) that one held between the bound
and the ceiling (``ceiling * (hi - lo)`` under ``rel``, ``ceiling`` under ``abs``).
"""

from __future__ import annotations

import math

import torch

from ...compress.bounds import ErrorBound, range_tolerance, tensor_range
from .codes_torch import _FORMATS, round_to

SPECIALS = 4  # zero, NaN, +Inf, -Inf ahead of the finite codes
SCALAR_BYTES = 24  # lo, hi, step (float64)
RAW_LIMIT = 2**30  # the most steps from lo a coded element may lie (bases fit int32)
ABS_SPAN = 2.0**39  # under abs: a larger magnitude / bound holds the tensor raw
#: a raw block's width: the dtype's bits; and the integer dtype of the same size
RAW = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32}
_INT = {16: torch.int16, 32: torch.int32}


def slot_bits(dtype: torch.dtype, bits: int | None) -> int:
    """The widest block of ``dtype`` under a bound whose codes take ``bits`` (None: no
    ceiling, ``abs``): raw blocks cap every width at the dtype's bits."""
    return RAW[dtype] if bits is None else min(bits, RAW[dtype])


def blocks(n: int, block: int) -> int:
    """Blocks of ``block`` elements that ``n`` elements fill."""
    return -(-n // block)


def header_bytes(n: int, block: int) -> int:
    """Bytes ahead of the codes: scalars, bases, widths (a multiple of 8)."""
    nb = blocks(n, block)
    return SCALAR_BYTES + (5 * nb + 7) // 8 * 8


def worst_bytes(n: int, block: int, bits: int) -> int:
    """The most bytes a record of ``n`` elements takes: every block at ``bits``, and a
    spare word (every code is read as a pair of words)."""
    words = -(-(blocks(n, block) * block * bits) // 32)
    return header_bytes(n, block) + 4 * (words + 1)


def coarse(lo, hi, tol, dtype: torch.dtype):
    """Whether the step may be twice the fixed layout's, for a tensor of ``dtype`` in
    ``[lo, hi]`` under the absolute bound ``tol`` (float64 device scalars): where
    rounding to the dtype moves a value by at most ``2**-8 tol``, half a step of
    ``2 tol (1 - 2**-7)`` and that rounding stay inside ``tol`` with the float64
    arithmetic's ``2**-9 tol`` (``tiles.py``)."""
    mant, emin = _FORMATS[dtype]
    top = torch.maximum(torch.maximum(lo.abs(), hi.abs()), torch.full_like(lo, 2.0**emin))
    return top * 2.0 ** -(mant + 1) <= tol * 2.0**-8


def tolerance(lo, hi, bound: float, absolute: bool, learned=None, ceiling: float = 0.0):
    """The absolute tolerance, a float64 device scalar: ``bound`` (``abs``) or ``bound``
    times ``hi - lo`` (``rel``); with ``learned`` (float64, one element) that one held
    between it and ``ceiling`` (a bound of the same mode; ``inf``: none). A NaN
    ``learned`` gives the bound. Both bounds resolve as ``ErrorBound``'s do."""
    mode = "abs" if absolute else "rel"
    tol = range_tolerance(ErrorBound(mode, bound), lo, hi)
    if learned is None:
        return tol
    learned = learned.reshape(()).to(torch.float64)
    tol = torch.where(learned > tol, learned, tol)
    if ceiling == math.inf:  # the GELU residual's abs fallback: any learned t_r
        return tol
    top = range_tolerance(ErrorBound(mode, ceiling), lo, hi)
    return torch.where(tol < top, tol, top)


def quantize(
    flat: torch.Tensor,
    bound: float,
    nsteps: int,
    margin: float,
    absolute=False,
    learned=None,
    ceiling=0.0,
    span=None,
):
    """(codes int64, scalars float64 ``[lo, hi, step]``, bool: the elements that need
    their block raw) of non-empty ``flat``; ``span``: a given ``(lo, hi)`` (float64 device
    scalars holding every finite element) in place of the finite range."""
    lo, hi = tensor_range(flat) if span is None else span
    tol = tolerance(lo, hi, bound, absolute, learned, ceiling)
    step = tol * margin
    step = torch.where(coarse(lo, hi, tol, flat.dtype), step * 2, step)
    x = flat.double()
    # a zero step (a constant tensor, or abs=0) codes only lo; any other value goes raw
    v = torch.where(step > 0, (x - lo) / step, torch.where(x == lo, 0.0, math.inf))
    wide = torch.isfinite(x) & (v > RAW_LIMIT)
    if absolute:
        wide = wide | (torch.maximum(lo.abs(), hi.abs()) > tol * ABS_SPAN)
    q = v.round().clamp(0, nsteps).to(torch.int64) + SPECIALS
    q = torch.where(x == 0, 0, q)
    q = torch.where(torch.isnan(x), 1, q)
    q = torch.where(x == math.inf, 2, q)
    q = torch.where(x == -math.inf, 3, q)
    return q, torch.stack([lo, hi, step]), wide


def _bit_length(v: torch.Tensor) -> torch.Tensor:
    """Bits of non-negative int64 ``v`` below ``2**53`` (0 for 0), exact in float64's
    exponent: ``frexp`` gives ``v = m * 2**e`` with ``0.5 <= m < 1``."""
    return torch.frexp(v.to(torch.float64)).exponent.to(torch.int64)


def raw_bits(flat: torch.Tensor) -> torch.Tensor:
    """The bits of each element of ``flat`` as a non-negative int64."""
    bits = RAW[flat.dtype]
    return flat.view(_INT[bits]).to(torch.int64) & ((1 << bits) - 1)


def _offsets(widths: torch.Tensor, n_padded: int, block: int) -> torch.Tensor:
    """Bit offset of every (padded) element's code, int64."""
    per_block = widths * block
    starts = torch.cumsum(per_block, 0) - per_block
    within = torch.arange(block, device=widths.device, dtype=torch.int64)
    return (starts[:, None] + within[None, :] * widths[:, None]).reshape(n_padded)


def compress(
    x: torch.Tensor,
    bound: float,
    nsteps: int,
    bits: int,
    margin: float,
    block: int,
    absolute=False,
    learned=None,
    ceiling=0.0,
    span=None,
):
    """(record uint8 of ``worst_bytes`` bytes, used int64[1]: the bytes in use); ``bits``:
    ``slot_bits`` of the bound, ``nsteps``: its steps (``RAW_LIMIT`` under ``abs``);
    ``span`` as :func:`quantize` takes it."""
    flat = x.reshape(-1)
    n = flat.numel()
    record = torch.zeros(worst_bytes(n, block, bits), dtype=torch.uint8, device=x.device)
    if n == 0:
        used = torch.full((1,), header_bytes(0, block), dtype=torch.int64, device=x.device)
        return record, used
    codes, scalars, wide = quantize(flat, bound, nsteps, margin, absolute, learned, ceiling, span)
    nb = blocks(n, block)
    padded = torch.nn.functional.pad(codes, (0, nb * block - n), value=0).view(nb, block)
    last = padded[-1]  # the last block's padding takes a code of that block
    real = torch.arange(block, device=x.device) < n - (nb - 1) * block
    padded[-1] = torch.where(real, last, last[0])
    base = padded.amin(1)
    widths = _bit_length(padded.amax(1) - base)
    pad = (0, nb * block - n)
    raw = (widths >= RAW[x.dtype]) | torch.nn.functional.pad(wide, pad).view(nb, block).any(1)
    widths = torch.where(raw, RAW[x.dtype], widths)
    base = torch.where(raw, 0, base)
    own = torch.nn.functional.pad(raw_bits(flat), pad).view(nb, block)
    values = torch.where(raw[:, None], own, padded - base[:, None]).reshape(-1)
    values[n:] = 0  # the padding's bits are zeros
    offsets = _offsets(widths, nb * block, block)
    shifted = values << (offsets & 31)  # below 2**63: no overflow
    nwords = (record.numel() - header_bytes(n, block)) // 4
    words = torch.zeros(nwords, dtype=torch.int64, device=x.device)
    index = offsets >> 5
    # disjoint bits: adding is or-ing, and integer sums do not depend on their order
    words.scatter_add_(0, index, shifted & 0xFFFFFFFF)
    words.scatter_add_(0, index + 1, shifted >> 32)
    head = header_bytes(n, block)
    record[:SCALAR_BYTES] = scalars.view(torch.uint8)
    record[SCALAR_BYTES : SCALAR_BYTES + 4 * nb] = base.to(torch.int32).view(torch.uint8)
    record[SCALAR_BYTES + 4 * nb : SCALAR_BYTES + 5 * nb] = widths.to(torch.uint8)
    record[head:] = words[:nwords].view(torch.uint8).view(nwords, 8)[:, :4].reshape(-1)
    used_bits = (widths * block).sum()
    used = head + 4 * ((used_bits + 31) // 32 + 1)
    return record, used.reshape(1)


def unpack(record: torch.Tensor, n: int, block: int):
    """(codes int64 of the ``n`` elements, scalars float64 ``[lo, hi, step]``, each
    element's block width int64)."""
    nb = blocks(n, block)
    head = header_bytes(n, block)
    scalars = record[:SCALAR_BYTES].view(torch.float64)
    base = record[SCALAR_BYTES : SCALAR_BYTES + 4 * nb].view(torch.int32).to(torch.int64)
    widths = record[SCALAR_BYTES + 4 * nb : SCALAR_BYTES + 5 * nb].to(torch.int64)
    words = record[head:].view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    offsets = _offsets(widths, nb * block, block)[:n]
    # a block of width 0 may start past the last word in use: its reads are clamped
    # (the spare word keeps ``words`` non-empty), and its mask takes no bit of them
    last = words.numel() - 1
    index = offsets >> 5
    pair = words[index.clamp_max(last)] | (words[(index + 1).clamp_max(last)] << 32)
    width = widths.repeat_interleave(block, output_size=nb * block)[:n]
    mask = torch.bitwise_left_shift(torch.ones_like(width), width) - 1
    values = (pair >> (offsets & 31)) & mask
    return values + base.repeat_interleave(block, output_size=nb * block)[:n], scalars, width


def restore(record: torch.Tensor, shape, dtype: torch.dtype, block: int) -> torch.Tensor:
    """The tensor of ``shape`` and ``dtype`` that ``record`` holds."""
    n = math.prod(shape)
    if n == 0:
        return torch.empty(shape, dtype=dtype, device=record.device)
    codes, scalars, width = unpack(record, n, block)
    lo, hi, step = scalars[0], scalars[1], scalars[2]
    q = (codes - SPECIALS).clamp_min(0).double()
    r = torch.minimum(torch.maximum(lo + q * step, lo), hi)
    y = round_to(r, dtype)
    y = torch.where(codes == 0, 0.0, y)
    y = torch.where(codes == 1, math.nan, y)
    y = torch.where(codes == 2, math.inf, y)
    y = torch.where(codes == 3, -math.inf, y)
    bits = RAW[dtype]
    own = torch.where(codes >= 1 << (bits - 1), codes - (1 << bits), codes).to(_INT[bits])
    y = torch.where(width == bits, own, y.to(dtype).view(_INT[bits]))
    return y.view(dtype).reshape(shape)

"""Triton kernels of the block codes (``tiles.py``; the record's bytes
are in ``tiles_torch.py``, whose bytes and restored values these match).

Compress: two launches. The first folds the tensor into at most ``PARTS`` partial finite
minima and maxima and zeroes the scan state of the second (``device_gelu_triton``'s
range kernel, whose partials are the fixed layout's). In the second, one program a block
of 256 elements folds the partials (every program the same scalars: range, tolerance,
step), codes its block, writes its base and width, and finds where its codes start by
decoupled look-back (``device_scan_triton.exclusive_prefix``): it takes a ticket (an
atomic counter, so every ticket before its own belongs to a program already running),
publishes its width, adds its predecessors' widths back to the first that published a
running sum, and publishes its own; no program waits on one that has not started, and
the running sum needs no launch of its own. A block of 256 codes at ``w`` bits is
``8 w`` whole 32-bit words, so every block starts on a word of its own and no two
programs write the same word: 32 codes fill exactly ``w`` words, as 8 codes fill ``W``
bytes in the fixed layout's kernel. A raw block (width the dtype's bits,
``tiles_torch.py``) packs the elements' own bits the same way. The last ticket
writes the bytes in use, the spare word and the header's padding.

So every byte of the used prefix is written (scalars, bases, widths, padding, each
block's words, the spare word), and the slot is ``torch.empty``: its bytes past the
prefix are never used. A restore reads the scalars, bases and widths in the header and,
for an element of a block, the word at its bit offset and the next one: for a block of
width ``w > 0`` both lie in the prefix (the last block's last code ends before the spare
word); a block of width 0 may read the spare word and the one after it (in the slot;
past a compact record's end, the load is masked), but its mask ``2**0 - 1`` takes no bit
of them. So the slot and a compact copy of its prefix restore the same values, as the
reference's ``unpack`` (which clamps those reads to the last word) does.

Restore: one cumulative sum of the widths (torch), then one program a block. The
arithmetic is the reference's, in float64 (see ``codes_triton.py`` for the
rounding and bfloat16's bits); every launch doing float math passes
``enable_fp_fusion=False``, so no multiply-add is contracted to one rounding.

With ``TRITON_INTERPRET=1`` set before triton is imported, Triton's interpreter runs the
same kernels on CPU tensors (the tests' check against the reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .codes_triton import (
    _FORMATS,
    _KIND,
    PARTS,
    RANGE_BLOCK,
    _as_kernel_input,
    _bits,
)
from .scan_triton import (
    CLEAR_BLOCK,
    exclusive_prefix,
    finish_record,
    pack_words,
    range_clear_kernel,
)
from .tiles_torch import (
    ABS_SPAN,
    RAW,
    RAW_LIMIT,
    SCALAR_BYTES,
    blocks,
    header_bytes,
    worst_bytes,
)

BLOCK = 256  # the only block size these kernels take
_LIMIT = tl.constexpr(RAW_LIMIT)
_SPAN = tl.constexpr(ABS_SPAN)
_HEAD = tl.constexpr(SCALAR_BYTES)


@triton.jit
def _codes(x_ptr, idx, inside, lo, step, KIND: tl.constexpr, NSTEPS: tl.constexpr):
    """(int64 codes of the elements at ``idx``: 0 zero, 1 NaN, 2 +Inf, 3 -Inf, 4 + step;
    whether each is a finite element past ``RAW_LIMIT`` steps, whose block goes raw)."""
    if KIND == 2:
        b = tl.load(x_ptr + idx, mask=inside, other=0).to(tl.int32)
        x = (b << 16).to(tl.float32, bitcast=True).to(tl.float64)
    else:
        x = tl.load(x_ptr + idx, mask=inside, other=0.0).to(tl.float64)
    fin = tl.abs(x) < float("inf")
    # a zero step (a constant tensor, or abs=0) codes only lo; any other value goes raw
    v = tl.where(step > 0, (x - lo) / tl.where(step > 0, step, 1.0), 0.0)
    v = tl.where(x == lo, 0.0, tl.where(step > 0, v, float("inf")))
    v = tl.where(fin, v, 0.0)
    wide = fin & (v > _LIMIT)
    v = tl.minimum(tl.maximum(v, 0.0), NSTEPS)
    q = ((v + 4503599627370496.0) - 4503599627370496.0).to(tl.int64) + 4  # rint: 2**52
    q = tl.where(x == 0, 0, q)
    q = tl.where(x != x, 1, q)
    q = tl.where(x == float("inf"), 2, q)
    return tl.where(x == float("-inf"), 3, q), wide


@triton.jit
def _raw_bits(x_ptr, idx, inside, KIND: tl.constexpr):
    """The bits of the elements at ``idx``, as non-negative int64."""
    if KIND == 0:
        b = tl.load(x_ptr + idx, mask=inside, other=0.0).to(tl.int32, bitcast=True)
        return b.to(tl.int64) & 0xFFFFFFFF
    elif KIND == 1:
        b = tl.load(x_ptr + idx, mask=inside, other=0.0).to(tl.int16, bitcast=True)
        return b.to(tl.int64) & 0xFFFF
    else:
        return tl.load(x_ptr + idx, mask=inside, other=0).to(tl.int64) & 0xFFFF


@triton.jit
def _compress_kernel(
    x_ptr, state_ptr, nparts, rec_ptr, used_ptr, n, bound_bits, margin_bits, ulp_bits,
    normal_bits, learned_ptr, ceiling_bits,
    KIND: tl.constexpr, NSTEPS: tl.constexpr, B: tl.constexpr, PARTS: tl.constexpr,
    ABS: tl.constexpr, LEARNED: tl.constexpr, RAW: tl.constexpr,
):  # fmt: skip
    nb = (n + B - 1) // B
    t = tl.atomic_add(state_ptr + nb, 1)  # this program's block: see the module docstring
    parts_ptr = (state_ptr + nb + 1).to(tl.pointer_type(tl.float32))
    head = _HEAD + (5 * nb + 7) // 8 * 8
    scalars_ptr = rec_ptr.to(tl.pointer_type(tl.float64))
    base_ptr = (rec_ptr + _HEAD).to(tl.pointer_type(tl.int32))
    words_ptr = (rec_ptr + head).to(tl.pointer_type(tl.int32))
    p = tl.arange(0, PARTS)
    lo = tl.min(tl.load(parts_ptr + p, mask=p < nparts, other=float("inf")), axis=0)
    hi = tl.max(tl.load(parts_ptr + nparts + p, mask=p < nparts, other=float("-inf")), axis=0)
    none = lo > hi  # no finite element
    lo = tl.where(none, 0.0, lo).to(tl.float64)
    hi = tl.where(none, 0.0, hi).to(tl.float64)
    scale = 1.0 if ABS else hi - lo  # bounds.range_tolerance, as tiles_torch.tolerance
    # an argument's bits: 0 (a bound or ceiling of 0.0) arrives as an int32
    tol = bound_bits.to(tl.int64).to(tl.float64, bitcast=True) * scale
    if LEARNED:
        e = tl.load(learned_ptr)
        tol = tl.where(e > tol, e, tol)
        top = ceiling_bits.to(tl.int64).to(tl.float64, bitcast=True) * scale
        tol = tl.where(tol < top, tol, top)
    step = tol * margin_bits.to(tl.float64, bitcast=True)
    big = tl.maximum(tl.abs(lo), tl.abs(hi))
    top = tl.maximum(big, normal_bits.to(tl.float64, bitcast=True))
    fine = top * ulp_bits.to(tl.float64, bitcast=True) <= tol * 0.00390625  # 2**-8
    step = tl.where(fine, step * 2, step)  # see device_blocks_torch.coarse
    first = t == 0
    tl.store(scalars_ptr, lo, mask=first)
    tl.store(scalars_ptr + 1, hi, mask=first)
    tl.store(scalars_ptr + 2, step, mask=first)
    idx = t * B + tl.arange(0, B // 32)[:, None] * 32 + tl.arange(0, 32)[None, :]
    inside = idx < n
    q, wide = _codes(x_ptr, idx, inside, lo, step, KIND, NSTEPS)
    base = tl.min(tl.min(tl.where(inside, q, 1 << 40), axis=1), axis=0)
    spread = (tl.max(tl.max(tl.where(inside, q, -1), axis=1), axis=0) - base).to(tl.float64)
    # bit length: float64's biased exponent less 1022 (exact below 2**53), 0 for 0
    width = tl.where(spread > 0, ((spread.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1022, 0)
    # the padding's lanes (zeros) are not the tensor's: they never make a block raw
    raw = (width >= RAW) | (tl.max(tl.max((wide & inside).to(tl.int32), axis=1), axis=0) > 0)
    if ABS:
        raw = raw | (big > tol * _SPAN)
    base = tl.where(raw, 0, base)
    width = tl.where(raw, RAW, width).to(tl.int64)
    tl.store(base_ptr + t, base.to(tl.int32))
    tl.store(rec_ptr + _HEAD + 4 * nb + t, width.to(tl.uint8))
    end = exclusive_prefix(state_ptr, t, width)  # the widths of the blocks before this
    if width == RAW:
        v = tl.where(inside, _raw_bits(x_ptr, idx, inside, KIND), 0)
    else:
        v = tl.where(inside, q - base, 0)
    pack_words(words_ptr, v, width, end * (B // 32), B)  # a block starts on a word
    finish_record(rec_ptr, words_ptr, used_ptr, t, nb, end + width, head, _HEAD, B)


@triton.jit
def _restore_kernel(
    words_ptr, nwords, scalars_ptr, base_ptr, width_ptr, ends_ptr, out_ptr, n,
    KIND: tl.constexpr, B: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
    RAW: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    lo = tl.load(scalars_ptr)
    hi = tl.load(scalars_ptr + 1)
    step = tl.load(scalars_ptr + 2)
    base = tl.load(base_ptr + pid).to(tl.int64)
    w = tl.load(width_ptr + pid).to(tl.int64)
    i = tl.arange(0, B)
    idx = pid * B + i
    inside = idx < n
    bit = (tl.load(ends_ptr + pid) - w) * B + i.to(tl.int64) * w
    at = bit >> 5
    low = tl.load(words_ptr + at, mask=inside & (at < nwords), other=0)
    high = tl.load(words_ptr + at + 1, mask=inside & (at + 1 < nwords), other=0)
    # each word zero-extended: int32 -> uint32 -> int64
    pair = low.to(tl.uint32).to(tl.int64) | (high.to(tl.uint32).to(tl.int64) << 32)
    q = ((pair >> (bit & 31)) & ((1 << w) - 1)) + base
    r = lo + tl.maximum(q - 4, 0).to(tl.float64) * step
    r = tl.minimum(tl.maximum(r, lo), hi)
    e = ((r.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1023
    unit = ((tl.maximum(e, EMIN) - MANT + 1023) << 52).to(tl.float64, bitcast=True)
    shift = unit * 6755399441055744.0  # 1.5 * 2**52 units: rounds once, ties to even
    y = ((r + shift) - shift).to(tl.float32)  # exact: a value of the dtype
    y = tl.where(q == 0, 0.0, y)
    y = tl.where(q == 1, float("nan"), y)
    y = tl.where(q == 2, float("inf"), y)
    y = tl.where(q == 3, float("-inf"), y)
    # out_ptr: the output's bits (int32, or int16 for 16-bit dtypes); a raw block's codes
    # are those bits (int64 -> narrower ints wrap)
    raw = w == RAW
    if KIND == 2:
        bits = tl.where(raw, q.to(tl.int16), (y.to(tl.int32, bitcast=True) >> 16).to(tl.int16))
    elif KIND == 1:
        bits = tl.where(raw, q.to(tl.int16), y.to(tl.float16).to(tl.int16, bitcast=True))
    else:
        bits = tl.where(raw, q.to(tl.int32), y.to(tl.int32, bitcast=True))
    tl.store(out_ptr + idx, bits, mask=inside)


def _fields(record: torch.Tensor, n: int):
    """(scalars, bases, widths, the widths' running sums int64, words int32) of
    ``record``: views, and one cumulative sum."""
    nb = blocks(n, BLOCK)
    scalars = record[:SCALAR_BYTES].view(torch.float64)
    base = record[SCALAR_BYTES : SCALAR_BYTES + 4 * nb].view(torch.int32)
    widths = record[SCALAR_BYTES + 4 * nb : SCALAR_BYTES + 5 * nb]
    ends = torch.cumsum(widths, 0, dtype=torch.int64)
    return scalars, base, widths, ends, record[header_bytes(n, BLOCK) :].view(torch.int32)


def compress(
    x,
    bound: float,
    nsteps: int,
    bits: int,
    margin: float,
    absolute=False,
    learned=None,
    ceiling=0.0,
):
    """(record uint8, used int64[1]) of contiguous, non-empty ``x`` (see the reference)."""
    n, kind = x.numel(), _KIND[x.dtype]
    flat = _as_kernel_input(x.reshape(-1))
    nb = blocks(n, BLOCK)
    nparts = min(triton.cdiv(n, RANGE_BLOCK), PARTS)
    # the scan state (nb look-back words, the ticket counter), then the partials (float32)
    state = torch.empty(nb + 1 + nparts, dtype=torch.int64, device=x.device)
    range_clear_kernel[(nparts,)](
        flat, state, nb + 1, n, KIND=kind, BLOCK=RANGE_BLOCK, CLEAR=CLEAR_BLOCK,
        enable_fp_fusion=False,
    )  # fmt: skip
    # every byte of the used prefix is written below; the rest is never read
    record = torch.empty(worst_bytes(n, BLOCK, bits), dtype=torch.uint8, device=x.device)
    used = torch.empty(1, dtype=torch.int64, device=x.device)
    mant, emin = _FORMATS[x.dtype]
    if learned is not None:
        learned = learned.reshape(1).to(torch.float64)
    _compress_kernel[(nb,)](
        flat, state, nparts, record, used, n, _bits(bound), _bits(margin),
        _bits(2.0 ** -(mant + 1)), _bits(2.0**emin),
        used if learned is None else learned, _bits(ceiling),
        KIND=kind, NSTEPS=nsteps, B=BLOCK, PARTS=PARTS,
        ABS=bool(absolute), LEARNED=learned is not None, RAW=RAW[x.dtype],
        enable_fp_fusion=False,  # each product rounded on its own, as the reference's
    )  # fmt: skip
    return record, used


def restore(record, shape, dtype):
    """The tensor of non-empty ``shape`` and ``dtype`` that ``record`` holds."""
    out = torch.empty(shape, dtype=dtype, device=record.device)
    n = out.numel()
    mant, emin = _FORMATS[dtype]
    scalars, base, widths, ends, words = _fields(record, n)
    bits = out.reshape(-1).view(torch.int32 if RAW[dtype] == 32 else torch.int16)
    _restore_kernel[(blocks(n, BLOCK),)](
        words, words.numel(), scalars, base, widths, ends, bits,
        n, KIND=_KIND[dtype], B=BLOCK, MANT=mant, EMIN=emin, RAW=RAW[dtype],
        enable_fp_fusion=False,  # lo + q * step rounded twice, as the reference rounds it
    )  # fmt: skip
    return out

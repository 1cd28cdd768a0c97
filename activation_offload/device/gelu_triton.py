"""Triton kernels of a GELU output's residual codes (the arithmetic and the bytes are the
torch reference's, ``gelu_torch.py``): two launches to pack, two to restore.

Pack. The first kernel folds the output ``y`` into at most ``PARTS`` partial finite
minima and maxima and zeroes the scan state of the second. In the second, one program a
block of 256 elements folds the partials again (every program the same scalars: ``y``'s
range, its tolerance, ``use``, ``t_r``, and the residual's range derived from ``y``'s, so
no reduction over the residual is needed), restores its block of the input from the
input's block record, computes the prediction and the residual, and writes the
residual's codes at their block's offset in the slot. Offsets are running sums of block
widths, the input's (to read its record) and the residual's (to write); a program finds
them by decoupled look-back: it takes a ticket (an atomic counter, so that every ticket
before its own belongs to a program already running), publishes its block's width,
then adds its predecessors' published widths back to the first one that published a
running sum, and publishes its own running sum. No program waits on one that has not
started, so the scan cannot deadlock, and it needs no launch of its own. The last
ticket writes the bytes in use, the spare word and the header's padding; bytes of the
slot past those in use are not written (a compact copy takes the used prefix).

Restore: the residual's running widths (one cumulative sum), then one program a block
computes the prediction from the restored input and adds the residual's restored block.

Every launch passes ``enable_fp_fusion=False``: a multiply-add contracted to one rounding
would give other bits than the reference's two.

With ``TRITON_INTERPRET=1`` set before triton is imported, Triton's interpreter runs the
same kernels on CPU tensors (the tests' check against the reference).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import gelu_torch as R
from .codes_triton import _FORMATS, _KIND, PARTS, RANGE_BLOCK, _bits
from .scan_triton import (
    CLEAR_BLOCK,
    exclusive_prefix,
    finish_record,
    load,
    pack_words,
    range_clear_kernel,
)
from .tiles_torch import ABS_SPAN, RAW_LIMIT, SCALAR_BYTES, blocks

BLOCK = R.BLOCK
_LIMIT = tl.constexpr(RAW_LIMIT)
_SPAN = tl.constexpr(ABS_SPAN)
_ERFC = [tl.constexpr(c) for c in R.ERFC]
_E = [tl.constexpr(c) for c in R.EXP]
_ERFC0 = tl.constexpr(R.ERFC0)
_LN2_HI = tl.constexpr(R.LN2_HI)
_LN2_LO = tl.constexpr(R.LN2_LO)
_INV_LN2 = tl.constexpr(R.INV_LN2)
_LIMIT_EXP = tl.constexpr(R.EXP_LIMIT)
_SQRT_HALF = tl.constexpr(R.SQRT_HALF)
_CUBE = tl.constexpr(R.TANH_CUBE)
_TSCALE = tl.constexpr(R.TANH_SCALE)
_USE_SPAN = tl.constexpr(R.USE_SPAN)
_FINITE = tl.constexpr(R.FINITE_SPAN)
_WIDEN = tl.constexpr(R.WIDEN)
_MARGIN = tl.constexpr(R.MARGIN)
_ZERO_TOL = tl.constexpr(R.ZERO_TOLERANCE)
_RINT = tl.constexpr(1.5 * 2.0**52)
_HEAD = tl.constexpr(SCALAR_BYTES)
_F32_ULP = tl.constexpr(2.0**-24)  # the residual is float32: coarse's 2**-(mant + 1)
_F32_NORMAL = tl.constexpr(2.0**-126)
_E0, _E1, _E2, _E3, _E4, _E5, _E6, _E7, _E8, _E9 = _E
_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8 = _ERFC


@triton.jit
def _exp(v):
    """``exp`` of float64 ``v`` as the reference's ``_exp``, operation for operation."""
    v = tl.where(v != v, 0.0, v)
    v = tl.minimum(tl.maximum(v, -_LIMIT_EXP), _LIMIT_EXP)  # NaN is gone: torch's clamp
    k = ((v * _INV_LN2) + _RINT) - _RINT  # rint, ties to even: torch.round
    r = (v - k * _LN2_HI) - k * _LN2_LO
    acc = r * _E0 + _E1
    acc = acc * r + _E2
    acc = acc * r + _E3
    acc = acc * r + _E4
    acc = acc * r + _E5
    acc = acc * r + _E6
    acc = acc * r + _E7
    acc = acc * r + _E8
    acc = acc * r + _E9
    return acc * ((k.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit
def _gelu(x, APPROX: tl.constexpr):
    """``g(x)`` of float64 ``x`` (``APPROX`` 1: the tanh form), as the reference's."""
    if APPROX == 1:
        w = ((x * x) * _CUBE + 1.0) * x
        g = x / (_exp(w * _TSCALE) + 1.0)
    else:
        a = tl.abs(x) * _SQRT_HALF
        t = 1.0 / (a * 0.5 + 1.0)
        acc = t * _C0 + _C1
        acc = acc * t + _C2
        acc = acc * t + _C3
        acc = acc * t + _C4
        acc = acc * t + _C5
        acc = acc * t + _C6
        acc = acc * t + _C7
        acc = acc * t + _C8
        half = (-(a * a) + _ERFC0) + acc * t
        half = (_exp(half) * t) * 0.5
        g = x * tl.where(x > 0, 1.0 - half, half)
    return g


@triton.jit
def _prediction(x, lo, hi, use, APPROX: tl.constexpr):
    """``p`` (float32) of float64 ``x``; ``lo``, ``hi`` float32, ``use`` a bool scalar."""
    p = _gelu(x, APPROX).to(tl.float32)
    p = tl.where(p < lo, lo, tl.where(p > hi, hi, p))
    p = tl.where(p != p, lo, p)
    return tl.where(use, p, 0.0)


@triton.jit
def _round_to(r, MANT: tl.constexpr, EMIN: tl.constexpr):
    """float64 ``r`` rounded to the nearest value of the dtype (``round_to``)."""
    e = ((r.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1023
    unit = ((tl.maximum(e, EMIN) - MANT + 1023) << 52).to(tl.float64, bitcast=True)
    shift = unit * 6755399441055744.0  # 1.5 * 2**52 units: rounds once, ties to even
    return (r + shift) - shift


@triton.jit
def _fields(rec_ptr, nb, nbytes):
    """(scalars float64, bases int32, widths uint8, words int32, the words' count) of the
    block record at ``rec_ptr`` (uint8, ``nbytes`` of it) of ``nb`` blocks."""
    head = _HEAD + (5 * nb + 7) // 8 * 8
    scalars = rec_ptr.to(tl.pointer_type(tl.float64))
    base = (rec_ptr + _HEAD).to(tl.pointer_type(tl.int32))
    words = (rec_ptr + head).to(tl.pointer_type(tl.int32))
    return scalars, base, rec_ptr + _HEAD + 4 * nb, words, (nbytes - head) // 4


@triton.jit
def _restored(words_ptr, nwords, scalars_ptr, base, w, start, i, inside,
              KIND: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
              RAW: tl.constexpr):  # fmt: skip
    """float64 values of the elements ``i`` of a block record's block (``start``: its
    first bit; ``base``, ``w`` its base and width), as ``device_blocks_torch.restore``."""
    lo = tl.load(scalars_ptr)
    hi = tl.load(scalars_ptr + 1)
    step = tl.load(scalars_ptr + 2)
    bit = start + i.to(tl.int64) * w
    at = bit >> 5
    low = tl.load(words_ptr + at, mask=inside & (at < nwords), other=0)
    high = tl.load(words_ptr + at + 1, mask=inside & (at + 1 < nwords), other=0)
    pair = low.to(tl.uint32).to(tl.int64) | (high.to(tl.uint32).to(tl.int64) << 32)
    q = ((pair >> (bit & 31)) & ((1 << w) - 1)) + base
    r = lo + tl.maximum(q - 4, 0).to(tl.float64) * step
    y = _round_to(tl.minimum(tl.maximum(r, lo), hi), MANT, EMIN)
    y = tl.where(q == 0, 0.0, y)
    y = tl.where(q == 1, float("nan"), y)
    y = tl.where(q == 2, float("inf"), y)
    y = tl.where(q == 3, float("-inf"), y)
    if KIND == 0:
        own = q.to(tl.int32).to(tl.float32, bitcast=True)
    elif KIND == 1:
        own = q.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        own = (q.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return tl.where(w == RAW, own.to(tl.float64), y)


@triton.jit
def _tolerance(lo, hi, bound, learned, ceiling, ABS: tl.constexpr, LEARNED: tl.constexpr):
    """``tiles_torch.tolerance`` of float64 scalars: ``compress/bounds.range_tolerance``'s
    formula in the kernel (the interpreter tests hold the two to the same bytes)."""
    scale = 1.0 if ABS else hi - lo
    tol = bound * scale
    if LEARNED:
        tol = tl.where(learned > tol, learned, tol)
        top = ceiling * scale
        tol = tl.where(tol < top, tol, top)
    return tol


@triton.jit
def _scalars(parts_ptr, nparts, learned_ptr, bound_bits, ceiling_bits, rbound_bits,
             rceiling_bits, ABS: tl.constexpr, LEARNED: tl.constexpr, RABS: tl.constexpr,
             ULP: tl.constexpr, NORMAL: tl.constexpr, PARTS: tl.constexpr):  # fmt: skip
    """(lo, hi, use, t_r, the residual's lo_r, hi_r, tolerance, step), as the reference's
    ``output_scalars`` and ``quantize`` compute them."""
    p = tl.arange(0, PARTS)
    lo = tl.min(tl.load(parts_ptr + p, mask=p < nparts, other=float("inf")), axis=0)
    hi = tl.max(tl.load(parts_ptr + nparts + p, mask=p < nparts, other=float("-inf")), axis=0)
    none = lo > hi  # no finite element
    lo = tl.where(none, 0.0, lo).to(tl.float64) + 0.0
    hi = tl.where(none, 0.0, hi).to(tl.float64) + 0.0
    bound = bound_bits.to(tl.int64).to(tl.float64, bitcast=True)
    ceiling = ceiling_bits.to(tl.int64).to(tl.float64, bitcast=True)
    if LEARNED:
        learned = tl.load(learned_ptr)
    else:
        learned = 0.0
    tol = _tolerance(lo, hi, bound, learned, ceiling, ABS, LEARNED)
    top = tl.maximum(tl.abs(lo), tl.abs(hi))
    use = (top <= tol * _USE_SPAN) & (top <= _FINITE)
    fine = tl.maximum(top, NORMAL) * ULP <= tol * 0.00390625  # 2**-8: see coarse
    t_r = tl.where(fine, tol, tol * 0.5) * _MARGIN
    d = (hi - lo) * _WIDEN
    lo_r = tl.where(use, -d, lo)
    hi_r = tl.where(use, d, hi)
    rbound = rbound_bits.to(tl.int64).to(tl.float64, bitcast=True)
    rceiling = rceiling_bits.to(tl.int64).to(tl.float64, bitcast=True)
    rtol = _tolerance(lo_r, hi_r, rbound, t_r, rceiling, RABS, True)
    rbig = tl.maximum(tl.abs(lo_r), tl.abs(hi_r))
    rfine = tl.maximum(rbig, _F32_NORMAL) * _F32_ULP <= rtol * 0.00390625
    step = rtol * _MARGIN
    step = tl.where(rfine, step * 2, step)
    return lo, hi, use, t_r, lo_r, hi_r, rtol, step


@triton.jit
def _codes(x, inside, lo, step, NSTEPS: tl.constexpr):
    """(int64 codes of float64 ``x`` as ``device_blocks_torch.quantize``'s, whether each
    is a finite element past ``RAW_LIMIT`` steps)."""
    fin = tl.abs(x) < float("inf")
    v = tl.where(step > 0, (x - lo) / tl.where(step > 0, step, 1.0), 0.0)
    v = tl.where(x == lo, 0.0, tl.where(step > 0, v, float("inf")))
    v = tl.where(fin, v, 0.0)
    wide = fin & (v > _LIMIT) & inside
    v = tl.minimum(tl.maximum(v, 0.0), NSTEPS)
    q = ((v + _RINT) - _RINT).to(tl.int64) + 4
    q = tl.where(x == 0, 0, q)
    q = tl.where(x != x, 1, q)
    q = tl.where(x == float("inf"), 2, q)
    return tl.where(x == float("-inf"), 3, q), wide


@triton.jit
def _pack_kernel(
    y_ptr, state_ptr, nparts, src_ptr, src_bytes, ys_ptr, rec_ptr, rec_bytes, used_ptr,
    learned_ptr, n, bound_bits, ceiling_bits, rbound_bits, rceiling_bits,
    KIND: tl.constexpr, APPROX: tl.constexpr, ABS: tl.constexpr, LEARNED: tl.constexpr,
    RABS: tl.constexpr, NSTEPS: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
    ULP: tl.constexpr, NORMAL: tl.constexpr, RAW: tl.constexpr, B: tl.constexpr,
    PARTS: tl.constexpr,
):  # fmt: skip
    nb = (n + B - 1) // B
    t = tl.atomic_add(state_ptr + 2 * nb, 1)  # this program's block: see the docstring
    parts_ptr = (state_ptr + 2 * nb + 1).to(tl.pointer_type(tl.float32))
    xscalars_ptr, xbase_ptr, xwidth_ptr, xwords_ptr, nxwords = _fields(src_ptr, nb, src_bytes)
    rscalars_ptr, rbase_ptr, rwidth_ptr, rwords_ptr, _ = _fields(rec_ptr, nb, rec_bytes)
    head = _HEAD + (5 * nb + 7) // 8 * 8
    lo, hi, use, t_r, lo_r, hi_r, rtol, step = _scalars(
        parts_ptr, nparts, learned_ptr, bound_bits, ceiling_bits, rbound_bits, rceiling_bits,
        ABS, LEARNED, RABS, ULP, NORMAL, PARTS,
    )  # fmt: skip
    first = t == 0
    tl.store(ys_ptr, lo, mask=first)
    tl.store(ys_ptr + 1, hi, mask=first)
    tl.store(ys_ptr + 2, use.to(tl.float64), mask=first)
    tl.store(rscalars_ptr, lo_r, mask=first)
    tl.store(rscalars_ptr + 1, hi_r, mask=first)
    tl.store(rscalars_ptr + 2, step, mask=first)
    i = tl.arange(0, B // 32)[:, None] * 32 + tl.arange(0, 32)[None, :]
    idx = t * B + i
    inside = idx < n
    xw = tl.load(xwidth_ptr + t).to(tl.int64)
    xstart = exclusive_prefix(state_ptr, t, xw) * B
    xbase = tl.load(xbase_ptr + t).to(tl.int64)
    x = _restored(xwords_ptr, nxwords, xscalars_ptr, xbase, xw, xstart, i, inside,
                  KIND, MANT, EMIN, RAW)  # fmt: skip
    p = _prediction(x, lo.to(tl.float32), hi.to(tl.float32), use, APPROX)
    r = tl.where(inside, load(y_ptr, idx, inside, KIND) - p, 0.0)
    smallest = (r.to(tl.int32, bitcast=True) * 0 + 1).to(tl.float32, bitcast=True)  # 2**-149
    r = tl.where(r == 0, tl.where(t_r >= _ZERO_TOL, smallest, r), r)
    q, wide = _codes(r.to(tl.float64), inside, lo_r, step, NSTEPS)
    base = tl.min(tl.min(tl.where(inside, q, 1 << 40), axis=1), axis=0)
    spread = (tl.max(tl.max(tl.where(inside, q, -1), axis=1), axis=0) - base).to(tl.float64)
    # bit length: float64's biased exponent less 1022 (exact below 2**53), 0 for 0
    width = tl.where(spread > 0, ((spread.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1022, 0)
    raw = (width >= 32) | (tl.max(tl.max(wide.to(tl.int32), axis=1), axis=0) > 0)
    if RABS:
        raw = raw | (tl.maximum(tl.abs(lo_r), tl.abs(hi_r)) > rtol * _SPAN)
    base = tl.where(raw, 0, base)
    width = tl.where(raw, 32, width).to(tl.int64)
    tl.store(rbase_ptr + t, base.to(tl.int32))
    tl.store(rwidth_ptr + t, width.to(tl.uint8))
    end = exclusive_prefix(state_ptr + nb, t, width)
    own = r.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    v = tl.where(inside, tl.where(raw, own, q - base), 0)
    pack_words(rwords_ptr, v, width, end * (B // 32), B)
    finish_record(rec_ptr, rwords_ptr, used_ptr, t, nb, end + width, head, _HEAD, B)


@triton.jit
def _restore_kernel(
    x_ptr, rec_ptr, rec_bytes, ends_ptr, ys_ptr, out_ptr, n, KIND: tl.constexpr,
    APPROX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr, B: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    rscalars_ptr, rbase_ptr, rwidth_ptr, rwords_ptr, nrwords = _fields(
        rec_ptr, (n + B - 1) // B, rec_bytes
    )
    i = tl.arange(0, B)
    idx = t * B + i
    inside = idx < n
    lo = tl.load(ys_ptr)
    hi = tl.load(ys_ptr + 1)
    use = tl.load(ys_ptr + 2) > 0
    x = load(x_ptr, idx, inside, KIND).to(tl.float64)
    p = _prediction(x, lo.to(tl.float32), hi.to(tl.float32), use, APPROX)
    w = tl.load(rwidth_ptr + t).to(tl.int64)
    base = tl.load(rbase_ptr + t).to(tl.int64)
    start = (tl.load(ends_ptr + t) - w) * B
    r = _restored(rwords_ptr, nrwords, rscalars_ptr, base, w, start, i, inside,
                  0, 23, -126, 32)  # fmt: skip
    v = p.to(tl.float64) + r
    held = _round_to(tl.where(v < lo, lo, tl.where(v > hi, hi, v)), MANT, EMIN)
    y = tl.where(tl.abs(v) < float("inf"), held, v).to(tl.float32)
    if KIND == 2:
        bits = (y.to(tl.int32, bitcast=True) >> 16).to(tl.int16)
        tl.store(out_ptr.to(tl.pointer_type(tl.int16)) + idx, bits, mask=inside)
    elif KIND == 1:
        tl.store(out_ptr + idx, y.to(tl.float16), mask=inside)
    else:
        tl.store(out_ptr + idx, y, mask=inside)


def pack(y, source, approximate: str, bound: float, absolute: bool, learned, ceiling: float):
    """``device_gelu_torch.pack`` of contiguous, non-empty ``y``: two launches (the
    records' fields are found inside the kernels, so no views are made here)."""
    n, kind, dev = y.numel(), _KIND[y.dtype], y.device
    nb = blocks(n, BLOCK)
    nparts = min(triton.cdiv(n, RANGE_BLOCK), PARTS)
    # the scan state (2 nb + 1 int64), then the partials (2 nparts float32)
    state = torch.empty(2 * nb + 1 + nparts, dtype=torch.int64, device=dev)
    range_clear_kernel[(nparts,)](
        y, state, 2 * nb + 1, n, KIND=kind, BLOCK=RANGE_BLOCK, CLEAR=CLEAR_BLOCK,
        enable_fp_fusion=False,
    )  # fmt: skip
    nbytes = R.record_bytes(n, bound, absolute)
    record = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    ys = torch.empty(3, dtype=torch.float64, device=dev)
    used = torch.empty(1, dtype=torch.int64, device=dev)
    rbound, rabs, rceiling = R.residual_settings(bound, absolute)
    mant, emin = _FORMATS[y.dtype]
    _pack_kernel[(nb,)](
        y, state, nparts, source, source.numel(), ys, record, nbytes, used,
        ys if learned is None else learned, n, _bits(bound), _bits(ceiling), _bits(rbound),
        _bits(rceiling), KIND=kind, APPROX=R.APPROXIMATIONS.index(approximate),
        ABS=bool(absolute), LEARNED=learned is not None, RABS=rabs,
        NSTEPS=R.residual_slot(bound, absolute)[0], MANT=mant, EMIN=emin,
        ULP=2.0 ** -(mant + 1), NORMAL=2.0**emin, RAW=16 if kind else 32, B=BLOCK,
        PARTS=PARTS, enable_fp_fusion=False,
    )  # fmt: skip
    return ys, record, used


def restore(x, record, scalars, approximate: str, shape, dtype):
    """``device_gelu_torch.restore`` of a non-empty ``shape`` from contiguous ``x``: two
    launches (the residual's running widths, then the kernel)."""
    out = torch.empty(shape, dtype=dtype, device=record.device)
    n = out.numel()
    nb = blocks(n, BLOCK)
    mant, emin = _FORMATS[dtype]
    ends = torch.cumsum(record[SCALAR_BYTES + 4 * nb : SCALAR_BYTES + 5 * nb], 0, dtype=torch.int64)
    _restore_kernel[(nb,)](
        x, record, record.numel(), ends, scalars, out, n, KIND=_KIND[dtype],
        APPROX=R.APPROXIMATIONS.index(approximate), MANT=mant, EMIN=emin, B=BLOCK,
        enable_fp_fusion=False,
    )  # fmt: skip
    return out

"""Triton kernels of the device codes (``codes.py``): two launches to
compress a tensor (the finite range, then quantize and pack) and one to restore it.

The range kernel runs at most ``PARTS`` programs, each folding a strided share of the
tensor into one partial min and max; every program of the quantize kernel folds those
partials again (a few KiB from cache) instead of waiting for a third launch or an
atomic, so nothing needs zeroing first. A program quantizes ``GROUPS`` groups of 8
elements: 8 codes of ``W`` bits fill exactly ``W`` bytes, so every group's bytes are
its own and no two programs write the same byte. The same arithmetic as the torch
reference (``codes_torch.py``), in float64, so both give the same bytes and
values; rounding to the dtype is done on the float64 value (``1.5 * 2**52`` units of
the dtype's last place added and taken away), and bfloat16 is moved as its int16
bits, because a cast through float32 rounds twice and the interpreter's bfloat16 cast
does not round to nearest.

With ``TRITON_INTERPRET=1`` set before triton is imported, Triton's interpreter runs the
same kernels on CPU tensors (the tests' check against the reference).
"""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from .codes_layout import payload_bytes
from .scan_triton import range_partials

PARTS = 256  # the most programs of the range kernel (partials each quantizer folds)
RANGE_BLOCK = 2048  # elements a range program folds at a time
GROUPS = 256  # groups of 8 elements per quantize or restore program
_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_FORMATS = {torch.float32: (23, -126), torch.float16: (10, -14), torch.bfloat16: (7, -126)}


@triton.jit
def _range_kernel(x_ptr, parts_ptr, n, KIND: tl.constexpr, BLOCK: tl.constexpr):
    range_partials(x_ptr, parts_ptr, n, KIND, BLOCK)


@triton.jit
def _uniform(key, i):
    """hash32(key, i) >> 8 times 2**-24 (``_util/hashing.py``), in int64 as the torch ops."""
    m = 0xFFFFFFFF
    x = (i >> 32) * 0x632BE5AB + (i & m) + (((key & m) * -1640531535) & m)
    x = x & m
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & m
    x = x ^ (x >> 15)
    x = (x * -2073254261) & m
    x = x ^ (x >> 16)
    return (x >> 8).to(tl.float64) * 5.9604644775390625e-08


@triton.jit
def _codes_kernel(
    x_ptr,
    parts_ptr,
    nparts,
    scalars_ptr,
    out_ptr,
    n,
    nbytes,
    rel_bits,
    margin_bits,
    key_ptr,
    KIND: tl.constexpr,
    NSTEPS: tl.constexpr,
    W: tl.constexpr,
    GROUPS: tl.constexpr,
    PARTS: tl.constexpr,
    STOCHASTIC: tl.constexpr,
):
    pid = tl.program_id(0)
    p = tl.arange(0, PARTS)
    lo = tl.min(tl.load(parts_ptr + p, mask=p < nparts, other=float("inf")), axis=0)
    hi = tl.max(tl.load(parts_ptr + nparts + p, mask=p < nparts, other=float("-inf")), axis=0)
    none = lo > hi  # no finite element
    lo = tl.where(none, 0.0, lo).to(tl.float64)
    hi = tl.where(none, 0.0, hi).to(tl.float64)
    rel = rel_bits.to(tl.float64, bitcast=True)
    margin = margin_bits.to(tl.float64, bitcast=True)
    step = (rel * (hi - lo)) * margin  # bounds.range_tolerance, as codes_torch.quantize
    first = pid == 0
    tl.store(scalars_ptr, lo, mask=first)
    tl.store(scalars_ptr + 1, hi, mask=first)
    tl.store(scalars_ptr + 2, step, mask=first)

    g = pid * GROUPS + tl.arange(0, GROUPS)
    k = tl.arange(0, 8)
    idx = g[:, None] * 8 + k[None, :]
    if KIND == 2:
        b = tl.load(x_ptr + idx, mask=idx < n, other=0).to(tl.int32)
        x = (b << 16).to(tl.float32, bitcast=True).to(tl.float64)
    else:
        x = tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float64)
    fin = tl.abs(x) < float("inf")
    # step 0: a constant tensor (every finite x is lo) or none finite
    v = tl.where(fin, (x - lo) / tl.where(step > 0, step, 1.0), 0.0)
    v = tl.minimum(tl.maximum(v, 0.0), NSTEPS)
    if STOCHASTIC:  # floor(v + u), u from hash32 (stochastic.py)
        v = v + _uniform(tl.load(key_ptr), idx.to(tl.int64))
        f = (v + 4503599627370496.0) - 4503599627370496.0
        q = tl.minimum(tl.where(f > v, f - 1.0, f), NSTEPS).to(tl.int32)
    else:
        q = ((v + 4503599627370496.0) - 4503599627370496.0).to(tl.int32)  # rint: 2**52
    q = tl.where(x != x, NSTEPS + 1, q)
    q = tl.where(x == float("inf"), NSTEPS + 2, q)
    q = tl.where(x == float("-inf"), NSTEPS + 3, q)
    q = tl.where(x == 0, NSTEPS + 4, q)
    q = tl.where(idx < n, q, 0)
    for b in tl.static_range(W):
        shift = k * W - 8 * b  # where code k's bits start, from byte b's first bit
        up = tl.minimum(tl.maximum(shift, 0), 31)
        down = tl.minimum(tl.maximum(-shift, 0), 31)
        part = tl.where(shift[None, :] >= 0, q << up[None, :], q >> down[None, :])
        part = tl.where(((shift < 8) & (shift > -W))[None, :], part & 0xFF, 0)
        at = g * W + b
        tl.store(out_ptr + at, tl.sum(part, axis=1).to(tl.uint8), mask=at < nbytes)


@triton.jit
def _restore_kernel(
    payload_ptr,
    scalars_ptr,
    out_ptr,
    n,
    nbytes,
    KIND: tl.constexpr,
    NSTEPS: tl.constexpr,
    W: tl.constexpr,
    MANT: tl.constexpr,
    EMIN: tl.constexpr,
    GROUPS: tl.constexpr,
):
    pid = tl.program_id(0)
    lo = tl.load(scalars_ptr)
    hi = tl.load(scalars_ptr + 1)
    step = tl.load(scalars_ptr + 2)
    g = pid * GROUPS + tl.arange(0, GROUPS)
    k = tl.arange(0, 8)
    idx = g[:, None] * 8 + k[None, :]
    inside = idx < n
    bit = k * W
    first = g[:, None] * W + (bit >> 3)[None, :]
    word = tl.zeros([GROUPS, 8], tl.int32)
    for j in tl.static_range(4):  # a code of up to 25 bits spans at most 4 bytes
        at = first + j
        byte = tl.load(payload_ptr + at, mask=inside & (at < nbytes), other=0).to(tl.int32)
        word = word | (byte << (8 * j))
    q = (word >> (bit & 7)[None, :]) & ((1 << W) - 1)
    r = lo + q.to(tl.float64) * step
    r = tl.minimum(tl.maximum(r, lo), hi)
    e = ((r.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1023
    unit = ((tl.maximum(e, EMIN) - MANT + 1023) << 52).to(tl.float64, bitcast=True)
    shift = unit * 6755399441055744.0  # 1.5 * 2**52 units: rounds once, ties to even
    y = ((r + shift) - shift).to(tl.float32)  # exact: a value of the dtype
    y = tl.where(q == NSTEPS + 1, float("nan"), y)
    y = tl.where(q == NSTEPS + 2, float("inf"), y)
    y = tl.where(q == NSTEPS + 3, float("-inf"), y)
    y = tl.where(q == NSTEPS + 4, 0.0, y)
    if KIND == 2:
        y16 = (y.to(tl.int32, bitcast=True) >> 16).to(tl.int16)
        tl.store(out_ptr + idx, y16, mask=inside)
    elif KIND == 1:
        tl.store(out_ptr + idx, y.to(tl.float16), mask=inside)
    else:
        tl.store(out_ptr + idx, y, mask=inside)


def _bits(value: float) -> int:
    """The float64 ``value``'s bits as an int64 (Triton takes float arguments as float32)."""
    return struct.unpack("<q", struct.pack("<d", value))[0]


def _as_kernel_input(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def compress(x, rel: float, nsteps: int, bits: int, margin: float, key=None):
    """(payload uint8, scalars float64[3]) of contiguous, non-empty ``x``: two launches;
    ``key`` (int64 scalar tensor): stochastic rounding keyed on it (``stochastic.py``)."""
    n, kind = x.numel(), _KIND[x.dtype]
    flat = _as_kernel_input(x.reshape(-1))
    nparts = min(triton.cdiv(n, RANGE_BLOCK), PARTS)
    parts = torch.empty(2 * nparts, dtype=torch.float32, device=x.device)
    _range_kernel[(nparts,)](flat, parts, n, KIND=kind, BLOCK=RANGE_BLOCK)
    nbytes = payload_bytes(n, bits)
    payload = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    scalars = torch.empty(3, dtype=torch.float64, device=x.device)
    grid = (triton.cdiv(triton.cdiv(n, 8), GROUPS),)
    _codes_kernel[grid](
        flat, parts, nparts, scalars, payload, n, nbytes, _bits(rel), _bits(margin),
        scalars if key is None else key,
        KIND=kind, NSTEPS=nsteps, W=bits, GROUPS=GROUPS, PARTS=PARTS, STOCHASTIC=key is not None,
        enable_fp_fusion=False,  # each product rounded on its own, as the reference's
    )  # fmt: skip
    return payload, scalars


def restore(payload, scalars, shape, dtype, nsteps: int, bits: int):
    """The tensor of non-empty ``shape`` and ``dtype`` held in ``payload``: one launch."""
    out = torch.empty(shape, dtype=dtype, device=payload.device)
    n = out.numel()
    mant, emin = _FORMATS[dtype]
    grid = (triton.cdiv(triton.cdiv(n, 8), GROUPS),)
    _restore_kernel[grid](
        payload, scalars, _as_kernel_input(out.reshape(-1)), n, payload.numel(),
        KIND=_KIND[dtype], NSTEPS=nsteps, W=bits, MANT=mant, EMIN=emin, GROUPS=GROUPS,
        enable_fp_fusion=False,  # lo + q * step rounded twice, as the reference rounds it
    )  # fmt: skip
    return out

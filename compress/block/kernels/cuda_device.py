"""Device functions shared by the ``block`` codec's numba.cuda kernels.

The simulator switch (``SIM``: ``NUMBA_ENABLE_CUDASIM=1`` runs the kernels on the
CPU, as plain Python), float64/float32 bit casts and roundings to the 16-bit dtypes
as integer operations, the layout's helpers (``kernels/layout.py``) compiled
for the device, kernels/positions.py's tables, and where each thread's block lies.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import config, cuda, float32, float64, int32, int64

from . import layout as bl
from .layout import BLOCK, QMAX
from .positions import BINOM, COST_BITS, HALF, HALF_BITS, MASK_BASE, RANK_MAX

SIM = bool(config.ENABLE_CUDASIM)
PREC = {torch.float64: 0, torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
TPB = 32 if SIM else 128  # threads per CUDA block (the simulator runs each as a thread)


def tpb(itemsize: int) -> int:
    """Threads (= blocks of 64 values) per CUDA block of the kernels that stage a tile
    of values in shared memory: TPB * 65 words of ``itemsize`` bytes (33 KiB for 4 bytes)
    stay under the 48 KiB of static shared memory, so 8-byte words take half as many."""
    return TPB if itemsize <= 4 else TPB // 2


if SIM:

    def device_fn(f):
        return f

    def f32(v):
        """float64 ``v`` rounded to float32 (round to nearest even), as float64."""
        with np.errstate(over="ignore"):
            return float(np.float32(v))

    def f32_bits(f):
        return int(np.float32(f).view(np.int32))

    def bits_f32(i):
        return float(np.int32(i).view(np.float32))

    def f64_bits(d):
        return int(np.float64(d).view(np.int64))

    def bits_f64(i):
        return float(np.int64(i).view(np.float64))

    def rint(x):
        return float(np.rint(x))

    def mul(a, b):
        return a * b

    def byte(buf, p):
        return int(buf[p])

else:
    from numba.cuda import libdevice

    def device_fn(f):
        return cuda.jit(device=True, inline=True)(f)

    @device_fn
    def f32(v):
        return float64(float32(v))

    @device_fn
    def f32_bits(f):
        return libdevice.float_as_int(float32(f))

    @device_fn
    def bits_f32(i):
        return float64(libdevice.int_as_float(int32(i)))

    @device_fn
    def f64_bits(d):
        return libdevice.double_as_longlong(d)

    @device_fn
    def bits_f64(i):
        return libdevice.longlong_as_double(i)

    @device_fn
    def rint(x):
        return libdevice.rint(x)

    @device_fn
    def mul(a, b):
        return libdevice.dmul_rn(a, b)  # never fused into an FMA

    @device_fn
    def byte(buf, p):
        return int64(buf[p])  # int() of a uint8 is unsigned: mixed with int64, a float


@device_fn
def pow2(k):
    """2.0**k for integer k in [-1022, 1023]."""
    return bits_f64((k + 1023) << 52)


@device_fn
def round_f16(f):
    """float32 value ``f`` (as float64) rounded to float16, round half to even."""
    u = f32_bits(f)
    a = u & 0x7FFFFFFF
    if a >= 0x7F800000:  # inf, nan
        return f
    if a >= 0x477FF000:  # 65520: rounds to inf
        return -math.inf if u < 0 else math.inf
    if a < 0x38800000:  # under 2**-14: multiples of 2**-24 (exact float64 steps)
        r = rint(abs(f) * 16777216.0) * 5.9604644775390625e-08
    else:
        r = bits_f32((a + 0xFFF + ((a >> 13) & 1)) & 0x7FFFE000)
    return -r if u < 0 else r


@device_fn
def round_bf16(f):
    """float32 value ``f`` (as float64) rounded to bfloat16, round half to even."""
    u = f32_bits(f)
    a = u & 0x7FFFFFFF
    if a >= 0x7F800000:
        return f
    if a >= 0x7F7F8000:  # (2 - 2**-8) * 2**127: rounds to inf
        return -math.inf if u < 0 else math.inf
    r = bits_f32((a + 0x7FFF + ((a >> 16) & 1)) & 0x7FFF0000)
    return -r if u < 0 else r


@device_fn
def to_storage(v, prec):
    """float64 ``v`` as the stored dtype holds it (16-bit types through float32)."""
    if prec == 0:
        return v
    f = f32(v)
    if prec == 1:
        return f
    if prec == 2:
        return round_f16(f)
    return round_bf16(f)


# the layout's helpers and the quantizer's rule (kernels/layout.py) as device functions
width = device_fn(bl.width)
head_at = device_fn(bl.head_at)
exp_at = device_fn(bl.exp_at)
exp_lo = device_fn(bl.exp_lo)
exp_hi = device_fn(bl.exp_hi)
exp_value = device_fn(bl.exp_value)
_within = device_fn(bl.codable)


@device_fn
def codable(x, t, prec, pw, tol, bstep):
    """Whether code ``t`` reconstructs ``x`` within the bound (layout.codable)."""
    if not abs(t) <= QMAX:  # before the product: t may be huge
        return False
    return _within(x, t, to_storage(mul(t, bstep), prec), pw, tol)


@device_fn
def bit_width(v):
    w = 0
    while v:
        v >>= 1
        w += 1
    return w


@device_fn
def cost_bits(m, k):
    """kernels/positions.py's cost_bits."""
    return COST_BITS[k] if k <= RANK_MAX else m


@device_fn
def index_bits(m, k, a):
    """Bits of the index of ``k`` non-zero codes, ``a`` in the second half (``a`` < 0: a
    mask; kernels/positions.py's index_bits)."""
    if a < 0:
        return m
    nlo = m if m < HALF else HALF
    nhi = m - HALF if m > HALF else 0
    return HALF_BITS[nlo, k - a] + HALF_BITS[nhi, a]


@device_fn
def count_code(k, a):
    """kernels/positions.py's count_code."""
    return k * (k + 1) // 2 + a if k <= RANK_MAX else MASK_BASE + k


@device_fn
def unrank(r, i):
    """The mask of the ``i`` positions (below 32) of rank ``r`` < C(32, i)."""
    mask = 0
    p = HALF - 1
    while i > 0:
        while BINOM[i, p] > r:
            p -= 1
        r -= BINOM[i, p]
        mask |= 1 << p
        i -= 1
        p -= 1
    return mask


@device_fn
def geometry(g, n, chunk_elems, bpc):
    """Block ``g``: (chunk, index in the chunk, first element, values, chunk's first
    element, blocks in the chunk)."""
    c = g // bpc
    local = g - c * bpc
    cs = c * chunk_elems
    ce = cs + chunk_elems
    if ce > n:
        ce = n
    s = cs + local * BLOCK
    m = ce - s
    if m > BLOCK:
        m = BLOCK
    return c, local, s, m, cs, (ce - cs + BLOCK - 1) // BLOCK


@device_fn
def tile_span(g0, n, chunk_elems, bpc, nblocks, tpb):
    """First element and number of values of the tile of blocks ``g0`` .. ``g0 + tpb - 1``
    (those below ``nblocks``): consecutive blocks hold consecutive values, across chunk
    boundaries too, so a tile's values are one contiguous range."""
    gl = g0 + tpb - 1
    if gl >= nblocks:
        gl = nblocks - 1
    c, local, s0, m, cs, nbc = geometry(g0, n, chunk_elems, bpc)
    c, local, sl, m, cs, nbc = geometry(gl, n, chunk_elems, bpc)
    return s0, sl + m - s0


@device_fn
def tile_index(i):
    """Where a tile's value ``i`` sits in shared memory: one word of padding after every
    64, so that the threads of a warp, each walking its own block, hit distinct banks."""
    return i + (i >> 6)

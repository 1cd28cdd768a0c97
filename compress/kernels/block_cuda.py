"""The ``block`` codec as numba.cuda kernels: the bytes and values of ``block_torch``.

One CUDA thread per block of 64 values, each a direct port of the per-block
body of ``kernels/block.py``'s ``encode_chunk``; the threads of a CUDA block share
the memory traffic of their tile of consecutive blocks (whose values are one
contiguous range), so that consecutive threads touch consecutive addresses:

1. ``_QUANT`` (the quantization kernel): the tile's values are loaded into shared
   memory together; each thread gives its block's codes (into an int32 scratch,
   transposed: code ``j`` of block ``g`` at ``j * nblocks + g``), step exponent
   and raw flag (quantization, neighbour retry, direct width).
2. ``_plan_kernel``: with the previous block's raw flag and last code known, the
   delta statistics, the packing choice, the header and count bytes and the byte
   counts.
3. torch ops on the device: one running sum over all blocks' byte counts gives the
   per-chunk sizes (and raw chunks, and where each chunk's regions start); one
   host sync for the lengths.
4. ``_write_kernel``: each block's offsets from the running sum; header, exponent
   and count bytes; the data (packed codes and a sparse block's index, staged in
   shared memory, or the bytes of raw blocks and raw chunks) are copied out by the
   whole CUDA block.

Float arithmetic is float64 with only +, -, *, rint and comparisons; products
that meet an addition go through ``dmul_rn`` so the compiler cannot fuse them
into an FMA; 16-bit roundings are integer operations on the float32 bits.

The decoder (``decode``, the values of ``block_torch.decode``): torch ops parse the
headers and counts and give every block its index and data offsets; ``_scan_kernel``
checks each sparse block's index and sums its codes (delta) or takes its last code
(direct); one host sync rejects inconsistent payloads; a segmented scan gives each
delta block its carry-in; ``_DECODE`` (the decoding kernel) unpacks, reconstructs, rounds
to the dtype and puts the values' bits (raw blocks and raw chunks: their bytes) in a
shared-memory tile that the CUDA block writes out together.

With ``NUMBA_ENABLE_CUDASIM=1`` the kernels run in numba's simulator on CPU
tensors (numpy arrays), which is how the tests check the bytes.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import config, cuda, float32, float64, int16, int32, int64, uint8

from .block import (
    BLOCK,
    DELTA,
    MODE_BLOCKS,
    MODE_LEGACY,
    MODE_RAW,
    QMAX,
    RAW_WIDTH,
    SIGNED,
    SPARSE,
    LegacyLayout,
)
from .positions import (
    BINOM,
    CODE_COUNT,
    CODE_HIGH,
    COST_BITS,
    HALF,
    HALF_BITS,
    MASK_BASE,
    RANK_MAX,
)

SIM = bool(config.ENABLE_CUDASIM)
PREC = {torch.float64: 0, torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
TPB = 32 if SIM else 128  # threads per CUDA block (the simulator runs each as a thread)


def _tpb(itemsize: int) -> int:
    """Threads (= blocks of 64 values) per CUDA block of the kernels that stage a tile
    of values in shared memory: TPB * 65 words of ``itemsize`` bytes (33 KiB for 4 bytes)
    stay under the 48 KiB of static shared memory, so 8-byte words take half as many."""
    return TPB if itemsize <= 4 else TPB // 2


if SIM:

    def _device(f):
        return f

    def _f32(v):
        """float64 ``v`` rounded to float32 (round to nearest even), as float64."""
        with np.errstate(over="ignore"):
            return float(np.float32(v))

    def _f32_bits(f):
        return int(np.float32(f).view(np.int32))

    def _bits_f32(i):
        return float(np.int32(i).view(np.float32))

    def _f64_bits(d):
        return int(np.float64(d).view(np.int64))

    def _bits_f64(i):
        return float(np.int64(i).view(np.float64))

    def _rint(x):
        return float(np.rint(x))

    def _mul(a, b):
        return a * b

    def _byte(buf, p):
        return int(buf[p])

else:
    from numba.cuda import libdevice

    def _device(f):
        return cuda.jit(device=True, inline=True)(f)

    @_device
    def _f32(v):
        return float64(float32(v))

    @_device
    def _f32_bits(f):
        return libdevice.float_as_int(float32(f))

    @_device
    def _bits_f32(i):
        return float64(libdevice.int_as_float(int32(i)))

    @_device
    def _f64_bits(d):
        return libdevice.double_as_longlong(d)

    @_device
    def _bits_f64(i):
        return libdevice.longlong_as_double(i)

    @_device
    def _rint(x):
        return libdevice.rint(x)

    @_device
    def _mul(a, b):
        return libdevice.dmul_rn(a, b)  # never fused into an FMA

    @_device
    def _byte(buf, p):
        return int64(buf[p])  # int() of a uint8 is unsigned: mixed with int64, a float


@_device
def _pow2(k):
    """2.0**k for integer k in [-1022, 1023]."""
    return _bits_f64((k + 1023) << 52)


@_device
def _round_f16(f):
    """float32 value ``f`` (as float64) rounded to float16, round half to even."""
    u = _f32_bits(f)
    a = u & 0x7FFFFFFF
    if a >= 0x7F800000:  # inf, nan
        return f
    if a >= 0x477FF000:  # 65520: rounds to inf
        return -math.inf if u < 0 else math.inf
    if a < 0x38800000:  # under 2**-14: multiples of 2**-24 (exact float64 steps)
        r = _rint(abs(f) * 16777216.0) * 5.9604644775390625e-08
    else:
        r = _bits_f32((a + 0xFFF + ((a >> 13) & 1)) & 0x7FFFE000)
    return -r if u < 0 else r


@_device
def _round_bf16(f):
    """float32 value ``f`` (as float64) rounded to bfloat16, round half to even."""
    u = _f32_bits(f)
    a = u & 0x7FFFFFFF
    if a >= 0x7F800000:
        return f
    if a >= 0x7F7F8000:  # (2 - 2**-8) * 2**127: rounds to inf
        return -math.inf if u < 0 else math.inf
    r = _bits_f32((a + 0x7FFF + ((a >> 16) & 1)) & 0x7FFF0000)
    return -r if u < 0 else r


@_device
def _store(v, prec):
    """float64 ``v`` as the stored dtype holds it (16-bit types through float32)."""
    if prec == 0:
        return v
    f = _f32(v)
    if prec == 1:
        return f
    if prec == 2:
        return _round_f16(f)
    return _round_bf16(f)


@_device
def _codable(x, t, prec, pw, tol, bstep):
    """Whether code ``t`` reconstructs ``x`` within the bound (kernels/block.py's rule)."""
    if not abs(t) <= QMAX:
        return False
    r = _store(_mul(t, bstep), prec)
    if pw:  # tol * |x| can overflow: the reconstruction must also be finite
        if not (abs(r - x) <= tol * abs(x) and abs(r) < math.inf):
            return False
        return r * x > 0.0 or (x == 0.0 and math.copysign(1.0, x) > 0.0)
    if tol == 0.0 and x == 0.0 and math.copysign(1.0, x) < 0.0:
        return False
    return abs(r - x) <= tol


@_device
def _bit_width(v):
    w = 0
    while v:
        v >>= 1
        w += 1
    return w


@_device
def _cost_bits(m, k):
    """kernels/positions.py's cost_bits."""
    return COST_BITS[k] if k <= RANK_MAX else m


@_device
def _index_bits(m, k, a):
    """Bits of the index of ``k`` non-zero codes, ``a`` in the second half (``a`` < 0: a
    mask; kernels/positions.py's index_bits)."""
    if a < 0:
        return m
    nlo = m if m < HALF else HALF
    nhi = m - HALF if m > HALF else 0
    return HALF_BITS[nlo, k - a] + HALF_BITS[nhi, a]


@_device
def _count_code(k, a):
    """kernels/positions.py's count_code."""
    return k * (k + 1) // 2 + a if k <= RANK_MAX else MASK_BASE + k


@_device
def _unrank(r, i):
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


@_device
def _geometry(g, n, chunk_elems, bpc):
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


@_device
def _tile_span(g0, n, chunk_elems, bpc, nblocks, tpb):
    """First element and number of values of the tile of blocks ``g0`` .. ``g0 + tpb - 1``
    (those below ``nblocks``): consecutive blocks hold consecutive values, across chunk
    boundaries too, so a tile's values are one contiguous range."""
    gl = g0 + tpb - 1
    if gl >= nblocks:
        gl = nblocks - 1
    c, local, s0, m, cs, nbc = _geometry(g0, n, chunk_elems, bpc)
    c, local, sl, m, cs, nbc = _geometry(gl, n, chunk_elems, bpc)
    return s0, sl + m - s0


@_device
def _sh(i):
    """Where a tile's value ``i`` sits in shared memory: one word of padding after every
    64, so that the threads of a warp, each walking its own block, hit distinct banks."""
    return i + (i >> 6)


# the encoder's per-block int64 rows, ``blk[row, g]``: raw flag and step exponent (from
# the quantization kernel), header byte and count byte (from the plan)
RAW, KEXP, HEAD, COUNT = 0, 1, 2, 3
# and its per-block byte counts, ``sizes[row, g]``: count bytes (1 for a sparse block of
# codes) and data bytes; one running sum over all of them gives every block's offsets
# within its chunk and every chunk's totals
SPARSE_ROW, DATA_ROW = 0, 1


@_device
def _pred(codes, blk, g, local, nblocks):
    """The code before block ``g``'s first value: the previous block's last, or 0 (the
    previous block of the chunk is a full one)."""
    if local == 0 or blk[RAW, g - 1]:
        return 0
    return int(codes[(BLOCK - 1) * nblocks + g - 1])


@_device
def _rank(incl, sizes, row, g, first):
    """Bytes of ``row`` in the blocks of block ``g``'s chunk before it (``first``: the
    chunk's first block), from ``incl``, the running sum of the flattened ``sizes``."""
    return (incl[row, g] - sizes[row, g]) - (incl[row, first] - sizes[row, first])


# ``codes``, the int32 scratch of the encoder, is stored transposed: block ``g``'s code
# ``j`` at ``codes[j * nblocks + g]``, so that the threads of a warp (consecutive blocks)
# read and write consecutive words.


@_device
def _quant_block(tile, o, g, m, pw, prec, itemsize, tol, step, inv, nblocks, codes, blk):
    """Block ``g``: its ``m`` values at ``tile[_sh(o + j)]``; its codes, raw flag and step
    exponent."""
    k = 0
    bstep = step
    binv = inv
    if pw:
        lo = math.inf
        for j in range(m):
            a = abs(float(tile[_sh(o + j)]))
            if a != 0.0 and a < lo:
                lo = a
        a2 = _mul(tol, lo if lo != math.inf else 0.0)
        a2 = 2.0 * a2  # LLVM makes this a2 + a2: a plain product would fuse into an FMA
        if not abs(a2) < math.inf:
            k = 1022
        elif a2 == 0.0:
            k = -1  # frexp(0) has exponent 0
        else:
            be = (_f64_bits(a2) >> 52) & 0x7FF
            k = be - 1023 if be else -1022  # subnormal: clamped to -1022
        if k < -1022:
            k = -1022
        if k > 1022:
            k = 1022
        bstep = _pow2(k)
        binv = _pow2(-k)
    bad = 0
    or_d = 0
    zz_d = 0
    for j in range(m):
        x = float(tile[_sh(o + j)])
        u = x * binv
        t = _rint(u)
        if not _codable(x, t, prec, pw, tol, bstep):
            t2 = t + 1.0 if u > t else t - 1.0
            if _codable(x, t2, prec, pw, tol, bstep):
                t = t2
            else:
                bad += 1
        q = int(t) if abs(t) <= QMAX else 0
        codes[j * nblocks + g] = q
        or_d |= q
        zz_d |= (q << 1) ^ (q >> 63)
    w_d = _bit_width(zz_d if or_d < 0 else or_d)
    blk[RAW, g] = 1 if bad or (m * w_d + 7) // 8 > m * itemsize else 0
    blk[KEXP, g] = k


def _make_quant_kernel(tpb, word):
    """The quantization kernel for ``tpb`` threads per CUDA block and input values of
    numba type ``word``: the CUDA block loads its tile of ``tpb`` blocks into shared
    memory (consecutive threads, consecutive values), then each thread quantizes one."""
    nsh = tpb * (BLOCK + 1)

    @cuda.jit
    def quant(xv, n, chunk_elems, bpc, nblocks, itemsize, prec, pw, tol, step, inv,
              codes, blk):  # fmt: skip
        tile = cuda.shared.array(nsh, word)
        tid = cuda.threadIdx.x
        g0 = cuda.blockIdx.x * tpb
        s0, size = _tile_span(g0, n, chunk_elems, bpc, nblocks, tpb)
        for i in range(tid, size, tpb):
            tile[_sh(i)] = xv[s0 + i]
        cuda.syncthreads()  # every thread of the CUDA block gets here
        g = g0 + tid
        if g < nblocks:
            c, local, s, m, cs, nbc = _geometry(g, n, chunk_elems, bpc)
            _quant_block(tile, s - s0, g, m, pw, prec, itemsize, tol, step, inv, nblocks,
                         codes, blk)  # fmt: skip

    return quant


# per input word size (float32 values: 4, float64: 8): (threads per CUDA block, kernel)
_QUANT = {w: (_tpb(w), _make_quant_kernel(_tpb(w), t)) for w, t in ((4, float32), (8, float64))}


@cuda.jit
def _plan_kernel(rawb, codes, blk, n, chunk_elems, bpc, nblocks, itemsize, sizes):
    g = cuda.grid(1)
    if g >= nblocks:
        return
    c, local, s, m, cs, nbc = _geometry(g, n, chunk_elems, bpc)
    if blk[RAW, g]:
        same = True
        for j in range(itemsize, m * itemsize):
            if rawb[s * itemsize + j] != rawb[s * itemsize + j % itemsize]:
                same = False
                break
        blk[HEAD, g] = RAW_WIDTH | (SPARSE if same else 0)
        blk[COUNT, g] = 0
        sizes[SPARSE_ROW, g] = 0
        sizes[DATA_ROW, g] = itemsize if same else m * itemsize
        return
    last = _pred(codes, blk, g, local, nblocks)
    or_d = 0
    zz_d = 0
    nz_d = 0
    or_l = 0
    zz_l = 0
    nz_l = 0
    for j in range(m):
        q = int(codes[j * nblocks + g])
        d = q - last
        last = q
        nz_d += q != 0
        or_d |= q
        zz_d |= (q << 1) ^ (q >> 63)
        nz_l += d != 0
        or_l |= d
        zz_l |= (d << 1) ^ (d >> 63)
    w_d = _bit_width(zz_d if or_d < 0 else or_d)
    w_l = _bit_width(zz_l if or_l < 0 else or_l)
    sg_d = SIGNED if or_d < 0 else 0
    sg_l = SIGNED if or_l < 0 else 0
    best = (m * w_d + 7) // 8
    h = w_d | sg_d
    cost = 1 + (nz_d * w_d + _cost_bits(m, nz_d) + 7) // 8
    if cost < best:
        best, h = cost, w_d | sg_d | SPARSE
    cost = (m * w_l + 7) // 8
    if cost < best:
        best, h = cost, w_l | sg_l | DELTA
    cost = 1 + (nz_l * w_l + _cost_bits(m, nz_l) + 7) // 8
    if cost < best:
        best, h = cost, w_l | sg_l | DELTA | SPARSE
    blk[HEAD, g] = h
    blk[COUNT, g] = 0
    sizes[SPARSE_ROW, g] = 0
    sizes[DATA_ROW, g] = best
    if h & SPARSE:  # the count byte, and the bytes of the codes and the index
        delta = h & DELTA != 0
        k = nz_l if delta else nz_d
        a = -1  # a mask; else the non-zero codes in the second half
        if k <= RANK_MAX:
            a = 0
            last = int(codes[(HALF - 1) * nblocks + g])
            for j in range(HALF, m):
                q = int(codes[j * nblocks + g])
                a += (q - last if delta else q) != 0
                last = q
        blk[COUNT, g] = _count_code(k, a)
        sizes[SPARSE_ROW, g] = 1
        sizes[DATA_ROW, g] = (k * (h & 31) + _index_bits(m, k, a) + 7) // 8


@_device
def _push(out, p, acc, nbits, v, w):
    """Append the ``w`` <= 32 bits of ``v`` to the LSB-first stream whose unwritten bits
    are ``acc`` (``nbits`` < 8 of them) and whose next byte is ``out[p]``: (acc, nbits, p)."""
    acc |= v << nbits
    nbits += w
    while nbits >= 8:
        out[p] = acc & 0xFF
        acc >>= 8
        nbits -= 8
        p += 1
    return acc, nbits, p


@_device
def _pack(out, p, codes, g, nblocks, m, pred, delta, sparse, ranked, signed, w):
    """Write block ``g``'s codes at ``w`` bits each, LSB first, from byte ``p`` (a sparse
    block: its non-zero codes, then its index: with ``ranked``, the ranks of its halves'
    positions, else its mask); returns the end."""
    acc = 0
    nbits = 0
    last = pred
    b = 0  # non-zero codes in each half; their ranks or masks
    a = 0
    rlo = 0
    rhi = 0
    mlo = 0
    mhi = 0
    for j in range(m):
        q = int(codes[j * nblocks + g])
        v = q - last if delta else q
        last = q
        if sparse and v == 0:
            continue
        if ranked and j < HALF:  # table lookups only for blocks of few non-zero codes
            b += 1
            rlo += BINOM[b, j]
        elif ranked:
            a += 1
            rhi += BINOM[a, j - HALF]
        elif sparse and j < HALF:
            mlo |= 1 << j
        elif sparse:
            mhi |= 1 << (j - HALF)
        if signed:
            v = (v << 1) ^ (v >> 63)
        acc, nbits, p = _push(out, p, acc, nbits, v, w)
    if ranked:  # the ranks of the two halves' positions
        nlo = m if m < HALF else HALF
        nhi = m - HALF if m > HALF else 0
        acc, nbits, p = _push(out, p, acc, nbits, rlo, HALF_BITS[nlo, b])
        acc, nbits, p = _push(out, p, acc, nbits, rhi, HALF_BITS[nhi, a])
    elif sparse:  # the mask of the m positions
        acc, nbits, p = _push(out, p, acc, nbits, mlo, m if m < HALF else HALF)
        acc, nbits, p = _push(out, p, acc, nbits, mhi, m - HALF if m > HALF else 0)
    if nbits > 0:
        out[p] = acc & 0xFF
        p += 1
    return p


# the encoder's per-chunk table, ``chunks[row, c]``: where the chunk's payload starts,
# whether it is stored raw, and where its counts and data start
START, RAW_CHUNK, COUNTS, DATA = 0, 1, 2, 3


@_device
def _write_head(codes, blk, sizes, incl, chunks, g, n, chunk_elems, bpc, nblocks, pw, out):
    """Block ``g``'s bytes other than its data: the chunk's mode byte (first block), its
    header, exponent and count bytes. Returns whether its data are packed codes (else
    bytes of the input, as they are)."""
    c, local, s, m, cs, nbc = _geometry(g, n, chunk_elems, bpc)
    base = chunks[START, c]
    if chunks[RAW_CHUNK, c]:  # the chunk is stored as it is
        if local == 0:
            out[base] = MODE_RAW
        return False
    if local == 0:
        out[base] = MODE_BLOCKS
    h = int(blk[HEAD, g])
    out[base + 1 + local] = h
    raw = blk[RAW, g] != 0
    if pw:
        kk = 0 if raw else int(blk[KEXP, g]) & 0xFFFF
        out[base + 1 + nbc + 2 * local] = kk & 0xFF
        out[base + 2 + nbc + 2 * local] = kk >> 8
    if raw:
        return False
    if h & SPARSE:
        out[chunks[COUNTS, c] + _rank(incl, sizes, SPARSE_ROW, g, g - local)] = blk[COUNT, g]
    return True


@_device
def _write_data(codes, blk, g, n, chunk_elems, bpc, nblocks, out, p):
    """Block ``g``'s packed codes into ``out`` from byte ``p``."""
    c, local, s, m, cs, nbc = _geometry(g, n, chunk_elems, bpc)
    h = int(blk[HEAD, g])
    w = h & 31
    if w:
        delta = h & DELTA != 0
        sparse = h & SPARSE != 0
        ranked = sparse and CODE_HIGH[int(blk[COUNT, g])] >= 0
        pred = _pred(codes, blk, g, local, nblocks) if delta else 0
        _pack(out, p, codes, g, nblocks, m, pred, delta, sparse, ranked, h & SIGNED != 0, w)


# the writer stages a tile's packed data (up to this many bytes; the threads past it pack
# straight into the payload) in shared memory, then the CUDA block copies the data of its
# tile, packed or raw, to the payload: consecutive threads, consecutive bytes
_WCAP = 512 if SIM else 16384


@cuda.jit
def _write_kernel(rawb, codes, blk, sizes, incl, chunks, n, chunk_elems, bpc, nblocks,
                  itemsize, pw, out):  # fmt: skip
    stage = cuda.shared.array(_WCAP, uint8)
    ends = cuda.shared.array(TPB, int64)  # the tile's data bytes to copy: inclusive sums
    pends = cuda.shared.array(TPB, int64)  # its packed bytes: inclusive sums
    dest = cuda.shared.array(TPB, int64)  # where each block's data go in the payload
    src = cuda.shared.array(TPB, int64)  # from rawb[src], or from stage[-1 - src]
    tid = cuda.threadIdx.x
    g = cuda.blockIdx.x * TPB + tid
    size = 0
    packed = False
    if g < nblocks:
        packed = _write_head(codes, blk, sizes, incl, chunks, g, n, chunk_elems, bpc, nblocks,
                             pw, out)  # fmt: skip
        c, local, s, m, cs, nbc = _geometry(g, n, chunk_elems, bpc)
        if chunks[RAW_CHUNK, c]:
            dest[tid] = chunks[START, c] + 1 + (s - cs) * itemsize
            size = m * itemsize
        else:
            dest[tid] = chunks[DATA, c] + _rank(incl, sizes, DATA_ROW, g, g - local)
            size = sizes[DATA_ROW, g]
        src[tid] = s * itemsize
    pends[tid] = size if packed else 0
    off = 1
    while off < TPB:  # inclusive scan (every thread runs the same steps)
        cuda.syncthreads()
        v = pends[tid - off] if tid >= off else 0
        cuda.syncthreads()
        pends[tid] += v
        off *= 2
    staged = packed and pends[tid] <= _WCAP
    ends[tid] = size if staged or not packed else 0
    if staged:
        src[tid] = -1 - (pends[tid] - size)
    off = 1
    while off < TPB:
        cuda.syncthreads()
        v = ends[tid - off] if tid >= off else 0
        cuda.syncthreads()
        ends[tid] += v
        off *= 2
    if packed:
        if staged:
            _write_data(codes, blk, g, n, chunk_elems, bpc, nblocks, stage, -1 - src[tid])
        else:
            _write_data(codes, blk, g, n, chunk_elems, bpc, nblocks, out, dest[tid])
    cuda.syncthreads()
    for i in range(tid, ends[TPB - 1], TPB):
        lo = 0  # the block whose data hold byte i: the first with ends > i
        hi = TPB - 1
        while lo < hi:
            mid = (lo + hi) >> 1
            if ends[mid] > i:
                hi = mid
            else:
                lo = mid + 1
        k = i - (ends[lo - 1] if lo > 0 else 0)
        sv = src[lo]
        out[dest[lo] + k] = stage[-1 - sv + k] if sv < 0 else rawb[sv + k]


def _dev(t: torch.Tensor):
    """A torch tensor as a kernel argument: no copy on a GPU; its numpy view in the
    simulator (which copies it in and back around each launch)."""
    if t.is_cuda:  # no host sync: the kernels run on torch's current stream
        return cuda.as_cuda_array(t, sync=False)
    if not SIM:
        raise ValueError("block_cuda needs a CUDA tensor (or NUMBA_ENABLE_CUDASIM=1)")
    return t.numpy()


def encode(t: torch.Tensor, chunk_elems: int, pw: bool, tol: float, step: float, inv: float):
    """Payloads of all chunks of the flattened C-contiguous ``t``: (uint8 tensor on
    ``t.device``, lengths), the bytes of ``block_torch.encode``."""
    dtype = t.dtype
    prec = PREC[dtype]
    itemsize = t.element_size()
    dev = t.device
    flat = t.reshape(-1).contiguous()
    n = flat.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.uint8, device=dev), []
    nchunks = -(-n // chunk_elems)
    bpc = -(-chunk_elems // BLOCK)  # blocks per full chunk
    nblocks = (n // chunk_elems) * bpc + -(-(n % chunk_elems) // BLOCK)
    xv = flat if itemsize >= 4 else flat.to(torch.float32)
    rawb = flat.view(torch.uint8)
    codes = torch.empty(nblocks * BLOCK, dtype=torch.int32, device=dev)
    blk = torch.empty((4, nblocks), dtype=torch.int64, device=dev)
    sizes = torch.empty((2, nblocks), dtype=torch.int64, device=dev)
    # launch on torch's current stream so the kernels and the torch ops stay in order
    stream = cuda.external_stream(torch.cuda.current_stream(dev).cuda_stream) if t.is_cuda else 0
    geo = (n, chunk_elems, bpc, nblocks, itemsize)
    d_rawb, d_codes, d_blk, d_sizes = _dev(rawb), _dev(codes), _dev(blk), _dev(sizes)
    tpb, quant = _QUANT[xv.element_size()]
    quant[(nblocks + tpb - 1) // tpb, tpb, stream](
        _dev(xv), *geo, prec, 1 if pw else 0, float(tol), float(step), float(inv), d_codes, d_blk
    )
    grid = (nblocks + TPB - 1) // TPB
    _plan_kernel[grid, TPB, stream](d_rawb, d_codes, d_blk, *geo, d_sizes)

    # per chunk: sizes (one running sum over all blocks' byte counts), then chunks that
    # would not shrink are stored raw
    incl = torch.cumsum(sizes.reshape(-1), 0).reshape(2, nblocks)
    first = torch.arange(nchunks, device=dev) * bpc
    last = torch.clamp(first + bpc, max=nblocks) - 1
    per_chunk = incl[:, last] - incl[:, first] + sizes[:, first]
    n_c = torch.clamp(n - torch.arange(nchunks, device=dev) * chunk_elems, max=chunk_elems)
    head_bytes = (last - first + 1) * (3 if pw else 1)
    size_c = 1 + head_bytes + per_chunk.sum(0)
    raw_c = size_c >= 1 + n_c * itemsize
    size_c = torch.where(raw_c, 1 + n_c * itemsize, size_c)
    lengths = size_c.tolist()  # the one host sync
    start_c = torch.cumsum(size_c, 0) - size_c
    counts_c = start_c + 1 + head_bytes
    data_c = counts_c + per_chunk[SPARSE_ROW]
    chunks = torch.stack([start_c, raw_c.long(), counts_c, data_c])
    out = torch.empty(sum(lengths), dtype=torch.uint8, device=dev)
    if SIM:
        out.fill_(0xA5)  # a byte the kernels miss shows in the tests
    _write_kernel[grid, TPB, stream](
        d_rawb, d_codes, d_blk, d_sizes, _dev(incl), _dev(chunks), *geo, 1 if pw else 0, _dev(out)
    )
    return out, lengths


# ---------------------------------------------------------------------------- decoder


@_device
def _bits_in(buf, p, acc, nbits, w):
    """The next ``w`` bits of the LSB-first stream whose unread bits are ``acc``
    (``nbits`` of them) and whose next byte is ``buf[p]``: (value, acc, nbits, p).
    Reads only the bytes it needs."""
    while nbits < w:
        acc |= _byte(buf, p) << nbits
        p += 1
        nbits += 8
    v = acc & ((1 << w) - 1)
    return v, acc >> w, nbits - w, p


@_device
def _sparse_mask(buf, p, code, w, m, end):
    """The mask of a sparse block's non-zero codes from its count byte ``code`` and its
    index, which follows its codes (``w`` bits each) from byte ``p``; and whether they
    are consistent (a valid count byte, ranks in range or a mask of as many bits, all
    before the chunk's ``end``; kernels/positions.py's decode_index)."""
    k = CODE_COUNT[code]
    a = CODE_HIGH[code]
    if k < 1 or k > m or p + (k * w + _index_bits(m, k, a) + 7) // 8 > end:
        return 0, False
    bit = k * w
    skip, acc, nbits, q = _bits_in(buf, p + (bit >> 3), 0, 0, bit & 7)
    nlo = m if m < HALF else HALF
    nhi = m - HALF if m > HALF else 0
    if a < 0:  # a mask of m bits
        lo, acc, nbits, q = _bits_in(buf, q, acc, nbits, nlo)
        hi, acc, nbits, q = _bits_in(buf, q, acc, nbits, nhi)
        ones = 0
        for j in range(HALF):
            ones += ((lo >> j) & 1) + ((hi >> j) & 1)
        return lo | (hi << HALF), ones == k
    b = k - a
    if b > nlo or a > nhi:
        return 0, False
    rlo, acc, nbits, q = _bits_in(buf, q, acc, nbits, HALF_BITS[nlo, b])
    rhi, acc, nbits, q = _bits_in(buf, q, acc, nbits, HALF_BITS[nhi, a])
    if rlo >= BINOM[b, nlo] or rhi >= BINOM[a, nhi]:
        return 0, False
    return _unrank(rlo, b) | (_unrank(rhi, a) << HALF), True


@_device
def _load_int(buf, p, itemsize):
    """The little-endian signed integer of ``itemsize`` bytes at ``buf[p]``."""
    v = 0
    for i in range(itemsize - 1):
        v |= _byte(buf, p + i) << (8 * i)
    top = _byte(buf, p + itemsize - 1)
    if top >= 128:
        top -= 256
    return v | (top << (8 * (itemsize - 1)))


@_device
def _stored_bits(r, prec):
    """The bits (a signed integer of the dtype's size) of ``r``, a value the stored
    dtype holds exactly (what ``_store`` returns)."""
    if prec == 0:
        return _f64_bits(r)
    u = _f32_bits(r)
    if prec == 1:
        return u
    if prec == 3:
        return u >> 16  # arithmetic shift: the bfloat16 bits as a signed int16
    a = u & 0x7FFFFFFF
    if a >= 0x7F800000:
        h = 0x7C00 if a == 0x7F800000 else 0x7E00
    elif a >= 0x38800000:  # normal float16
        h = (a >> 13) - 0x1C000
    else:  # subnormal float16: a multiple of 2**-24
        h = int(_rint(abs(r) * 16777216.0))
    return h - 0x8000 if u < 0 else h


@cuda.jit
def _scan_kernel(buf, n, chunk_elems, bpc, nblocks, start_c, len_c, mode_c, head, code,
                 doff, bad, rel):  # fmt: skip
    """Per block of a blocks-mode chunk: whether its index is inconsistent, and its
    codes' sum (delta blocks) or last code (direct blocks), 0 for raw blocks."""
    g = cuda.grid(1)
    if g >= nblocks:
        return
    c, local, s, m, cs, nbc = _geometry(g, n, chunk_elems, bpc)
    bad[g] = 0
    rel[g] = 0
    if mode_c[c] != MODE_BLOCKS:
        return
    end = start_c[c] + len_c[c]
    h = int(head[g])
    w = h & 31
    if w == RAW_WIDTH:
        return
    sparse = h & SPARSE != 0
    mask = -1
    cnt = m
    p = int(doff[g])
    if sparse:
        cnt = CODE_COUNT[int(code[g])]
        mask, ok = _sparse_mask(buf, p, int(code[g]), w, m, end)
        if not ok:
            bad[g] = 1
            return
    if p + (cnt * w + 7) // 8 > end:
        bad[g] = 1
        return
    signed = h & SIGNED != 0
    acc = 0
    nbits = 0
    total = 0
    v = 0
    for j in range(m):
        v = 0
        if (mask >> j) & 1:
            v, acc, nbits, p = _bits_in(buf, p, acc, nbits, w)
            if signed:
                v = (v >> 1) ^ -(v & 1)
        total += v
    rel[g] = total if h & DELTA else v


@_device
def _decode_block(buf, g, n, chunk_elems, bpc, itemsize, prec, pw, step, start_c, mode_c, head,
                  code, doff, carry, tile, s0):  # fmt: skip
    """Block ``g``'s values, as the bits of the dtype, into ``tile`` (an integer array) at
    ``_sh(s - s0)`` and on, ``s`` its first element."""
    c, local, s, m, cs, nbc = _geometry(g, n, chunk_elems, bpc)
    o = s - s0
    base = int(start_c[c])
    if mode_c[c] != MODE_BLOCKS:  # a raw chunk: the values as they are
        p = base + 1 + (s - cs) * itemsize
        for j in range(m):
            tile[_sh(o + j)] = _load_int(buf, p + j * itemsize, itemsize)
        return
    h = int(head[g])
    w = h & 31
    p = int(doff[g])
    if w == RAW_WIDTH:  # a raw block: its values, or one repeated
        stride = 0 if h & SPARSE else itemsize
        for j in range(m):
            tile[_sh(o + j)] = _load_int(buf, p + j * stride, itemsize)
        return
    bstep = step
    if pw:
        kb = _byte(buf, base + 1 + nbc + 2 * local) | (_byte(buf, base + 2 + nbc + 2 * local) << 8)
        bstep = _pow2(kb - 65536 if kb >= 32768 else kb)
    mask = -1
    if h & SPARSE:
        mask, ok = _sparse_mask(buf, p, int(code[g]), w, m, 1 << 62)
    signed = h & SIGNED != 0
    delta = h & DELTA != 0
    q = int(carry[g]) if delta else 0
    acc = 0
    nbits = 0
    for j in range(m):
        v = 0
        if (mask >> j) & 1:
            v, acc, nbits, p = _bits_in(buf, p, acc, nbits, w)
            if signed:
                v = (v >> 1) ^ -(v & 1)
        q = q + v if delta else v
        tile[_sh(o + j)] = _stored_bits(_store(_mul(float(q), bstep), prec), prec)


def _make_decode_kernel(tpb, word):
    """The decoding kernel for ``tpb`` threads per CUDA block and values of ``word`` (the
    numba integer type of the dtype's size): each thread decodes one block into the tile
    in shared memory, then the CUDA block writes the tile out (consecutive threads,
    consecutive values)."""
    nsh = tpb * (BLOCK + 1)

    @cuda.jit
    def dec(buf, n, chunk_elems, bpc, nblocks, itemsize, prec, pw, step, start_c, mode_c, head,
            code, doff, carry, out):  # fmt: skip
        tile = cuda.shared.array(nsh, word)
        tid = cuda.threadIdx.x
        g0 = cuda.blockIdx.x * tpb
        g = g0 + tid
        s0, size = _tile_span(g0, n, chunk_elems, bpc, nblocks, tpb)
        if g < nblocks:
            _decode_block(buf, g, n, chunk_elems, bpc, itemsize, prec, pw, step, start_c,
                          mode_c, head, code, doff, carry, tile, s0)  # fmt: skip
        cuda.syncthreads()  # every thread of the CUDA block gets here
        for i in range(tid, size, tpb):
            out[s0 + i] = tile[_sh(i)]

    return dec


# per dtype size: (threads per CUDA block, kernel)
_DECODE = {
    w: (_tpb(w), _make_decode_kernel(_tpb(w), t)) for w, t in ((2, int16), (4, int32), (8, int64))
}


def decode(payload: torch.Tensor, lengths: list, n: int, chunk_elems: int, dtype, pw, step):
    """The ``n`` values (flattened) of the chunk payloads concatenated in ``payload``,
    on ``payload.device``: the values of ``block_torch.decode``.

    Raises ValueError when a payload is inconsistent with its length.
    """
    from .block_torch import BlockFields, Layout, _int_view, last_marked

    dev = payload.device
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if n == 0:
        return torch.zeros(0, dtype=dtype, device=dev)
    lay = Layout(n, chunk_elems, dev)
    nch = lay.nchunks
    if len(lengths) != nch:
        raise ValueError(f"{len(lengths)} chunk payloads for {nch} chunks")
    if min(lengths) < 1:
        raise ValueError("a block chunk payload is empty")
    total = sum(lengths)
    buf = payload.reshape(-1)
    if buf.numel() < total:
        raise ValueError("block payload is shorter than its chunk lengths")
    buf = buf[:total].contiguous()
    prec = PREC[dtype]
    i64 = dict(dtype=torch.int64, device=dev)
    len_c = torch.tensor(lengths, device=dev)
    start_c = torch.cumsum(len_c, 0) - len_c
    # block-level bookkeeping (as block_torch.decode): headers, counts, offsets
    p = BlockFields(buf, start_c, lay, pw, itemsize)
    mode_c, head, raw, code, doff = p.mode_c, p.head, p.raw, p.code, p.doff

    # per block: index checks and the codes' sum or last code (one thread per block)
    nblocks = lay.nblocks
    bpc = lay.bpc
    grid = (nblocks + TPB - 1) // TPB
    stream = cuda.external_stream(torch.cuda.current_stream(dev).cuda_stream) if buf.is_cuda else 0
    geo = (n, chunk_elems, bpc, nblocks)
    bad = torch.empty(nblocks, **i64)
    rel = torch.empty(nblocks, **i64)
    d_buf, d_start, d_mode = _dev(buf), _dev(start_c), _dev(mode_c)
    d_head, d_code, d_doff = _dev(head), _dev(code), _dev(doff)
    _scan_kernel[grid, TPB, stream](
        d_buf, *geo, d_start, _dev(len_c), d_mode, d_head, d_code, d_doff, _dev(bad), _dev(rel),
    )  # fmt: skip

    bad_head = (bad != 0) | raw & (head & (SIGNED | DELTA) != 0)
    if pw:
        k = p.exponents()
        bad_head = bad_head | ~raw & ((k < -1022) | (k > 1022))
    bad_c = torch.where(mode_c == MODE_LEGACY, 2, p.bad_chunks(bad_head, len_c).long())
    worst = int(bad_c.max())  # the one host sync
    if worst == 2:
        raise LegacyLayout("a chunk in the first block layout")
    if worst:
        raise ValueError("block payload is inconsistent (corrupted or truncated)")

    # the running value behind delta blocks: a segmented scan over blocks
    is_delta = (head & DELTA != 0) & ~raw
    tsum = torch.where(is_delta, rel, 0)
    reset = ~is_delta
    first = lay.local == 0
    S = torch.cumsum(tsum, 0)
    anchor_val = torch.where(reset & ~raw, rel, 0)
    anchor_S = torch.where(reset, S, S - tsum)
    mi = last_marked(reset | first)
    q_last = anchor_val[mi] + S - anchor_S[mi]
    carry = torch.where(first, 0, torch.cat([q_last.new_zeros(1), q_last[:-1]]))

    out = torch.empty(n, dtype=dtype, device=dev)
    ints = out.view(_int_view(dtype))
    tpb, dec = _DECODE[itemsize]
    dec[(nblocks + tpb - 1) // tpb, tpb, stream](
        d_buf, *geo, itemsize, prec, 1 if pw else 0, float(step), d_start, d_mode, d_head,
        d_code, d_doff, _dev(carry), _dev(ints),
    )  # fmt: skip
    return out


def _bench(n: int = 1 << 26, chunk_bytes: int = 1 << 20, reps: int = 5, device="cuda") -> None:
    """On a GPU: byte identity with ``block_torch`` (encoded bytes, decoded bits) and the
    throughput of both (GB/s of uncompressed values)."""
    import time

    from ..block import steps_for
    from . import block_torch

    g = torch.Generator(device=device).manual_seed(0)
    base = torch.randn(n, device=device, generator=g, dtype=torch.float64)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    base = torch.where(base > 1.5, 0.0, base.cumsum(0) * 1e-3)  # smooth, with zeros
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        x = base.to(dtype)
        ce = chunk_bytes // x.element_size()
        for mode, tol in (("abs", 1e-3), ("pw_rel", 1e-2)):
            step, inv = steps_for(tol)
            args = (ce, mode == "pw_rel", tol, step, inv)
            times = {}
            for name, fn in (("cuda", encode), ("torch", block_torch.encode)):
                t0 = time.perf_counter()
                out, lengths = fn(x, *args)  # first call: numba compiles the kernels
                sync()
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn(x, *args)
                sync()
                times[name] = ((time.perf_counter() - t0) / reps, first, out, lengths)
            (tc, fc, oc, lc), (tt, _, ot, lt) = times["cuda"], times["torch"]
            same = lc == lt and torch.equal(oc, ot)
            gb = x.numel() * x.element_size() / 1e9
            print(
                f"{str(dtype):15} {mode:6} ratio {gb * 1e9 / oc.numel():6.2f} "
                f"cuda {gb / tc:7.2f} GB/s (first call {fc:5.1f} s)  "
                f"torch {gb / tt:7.2f} GB/s  same bytes: {same}"
            )
            dargs = (ot, lt, x.numel(), ce, dtype, mode == "pw_rel", step)
            for name, fn in (("cuda", decode), ("torch", block_torch.decode)):
                t0 = time.perf_counter()
                y = fn(*dargs)  # first call: numba compiles the kernels
                sync()
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn(*dargs)
                sync()
                times[name] = ((time.perf_counter() - t0) / reps, first, y)
            (tc, fc, yc), (tt, _, yt) = times["cuda"], times["torch"]
            same = torch.equal(yc.view(torch.uint8), yt.view(torch.uint8))
            print(
                f"{'':15} {'decode':6} {'':12} "
                f"cuda {gb / tc:7.2f} GB/s (first call {fc:5.1f} s)  "
                f"torch {gb / tt:7.2f} GB/s  same bits: {same}"
            )


if __name__ == "__main__":  # python -m tensorpress.compress.kernels.block_cuda [n]
    import sys

    _bench(*(int(a) for a in sys.argv[1:2]))

"""The ``block`` codec's encoder as numba.cuda kernels (``kernels/cuda.py`` runs them).

One CUDA thread per block of 64 values, each a direct port of the per-block body of
``kernels/cpu.py``'s ``encode_chunk``: ``QUANT`` quantizes, ``plan_kernel`` chooses
each block's packing and counts its bytes, ``write_kernel`` writes the payloads.
"""

from __future__ import annotations

import math

from numba import cuda, float32, float64, int64, uint8

from .cuda_device import (
    SIM,
    TPB,
    bit_width,
    codable,
    cost_bits,
    count_code,
    device_fn,
    exp_at,
    exp_hi,
    exp_lo,
    f64_bits,
    geometry,
    head_at,
    index_bits,
    mul,
    pow2,
    rint,
    tile_index,
    tile_span,
    tpb,
    width,
)
from .layout import (
    BLOCK,
    DELTA,
    EXP_MAX,
    EXP_MIN,
    MODE_BLOCKS,
    MODE_RAW,
    QMAX,
    RAW_WIDTH,
    SIGNED,
    SPARSE,
)
from .positions import BINOM, CODE_HIGH, HALF, HALF_BITS, RANK_MAX

# the encoder's per-block int64 rows, ``blk[row, g]``: raw flag and step exponent (from
# the quantization kernel), header byte and count byte (from the plan)
RAW, KEXP, HEAD, COUNT = 0, 1, 2, 3
# and its per-block byte counts, ``sizes[row, g]``: count bytes (1 for a sparse block of
# codes) and data bytes; one running sum over all of them gives every block's offsets
# within its chunk and every chunk's totals
SPARSE_ROW, DATA_ROW = 0, 1


@device_fn
def _pred(codes, blk, g, local, nblocks):
    """The code before block ``g``'s first value: the previous block's last, or 0 (the
    previous block of the chunk is a full one)."""
    if local == 0 or blk[RAW, g - 1]:
        return 0
    return int(codes[(BLOCK - 1) * nblocks + g - 1])


@device_fn
def _rank(incl, sizes, row, g, first):
    """Bytes of ``row`` in the blocks of block ``g``'s chunk before it (``first``: the
    chunk's first block), from ``incl``, the running sum of the flattened ``sizes``."""
    return (incl[row, g] - sizes[row, g]) - (incl[row, first] - sizes[row, first])


# ``codes``, the int32 scratch of the encoder, is stored transposed: block ``g``'s code
# ``j`` at ``codes[j * nblocks + g]``, so that the threads of a warp (consecutive blocks)
# read and write consecutive words.


@device_fn
def _quant_block(tile, o, g, m, pw, prec, itemsize, tol, step, inv, nblocks, codes, blk):
    """Block ``g``: its ``m`` values at ``tile[tile_index(o + j)]``; its codes, raw flag and step
    exponent."""
    k = 0
    bstep = step
    binv = inv
    if pw:
        lo = math.inf
        for j in range(m):
            a = abs(float(tile[tile_index(o + j)]))
            if a != 0.0 and a < lo:
                lo = a
        a2 = mul(tol, lo if lo != math.inf else 0.0)
        a2 = 2.0 * a2  # LLVM makes this a2 + a2: a plain product would fuse into an FMA
        if not abs(a2) < math.inf:
            k = EXP_MAX
        elif a2 == 0.0:
            k = -1  # frexp(0) has exponent 0
        else:
            be = (f64_bits(a2) >> 52) & 0x7FF
            k = be - 1023 if be else EXP_MIN  # subnormal: clamped to EXP_MIN
        if k < EXP_MIN:
            k = EXP_MIN
        if k > EXP_MAX:
            k = EXP_MAX
        bstep = pow2(k)
        binv = pow2(-k)
    bad = 0
    or_d = 0
    zz_d = 0
    for j in range(m):
        x = float(tile[tile_index(o + j)])
        u = x * binv
        t = rint(u)
        if not codable(x, t, prec, pw, tol, bstep):
            t2 = t + 1.0 if u > t else t - 1.0
            if codable(x, t2, prec, pw, tol, bstep):
                t = t2
            else:
                bad += 1
        q = int(t) if abs(t) <= QMAX else 0
        codes[j * nblocks + g] = q
        or_d |= q
        zz_d |= (q << 1) ^ (q >> 63)
    w_d = bit_width(zz_d if or_d < 0 else or_d)
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
        s0, size = tile_span(g0, n, chunk_elems, bpc, nblocks, tpb)
        for i in range(tid, size, tpb):
            tile[tile_index(i)] = xv[s0 + i]
        cuda.syncthreads()  # every thread of the CUDA block gets here
        g = g0 + tid
        if g < nblocks:
            c, local, s, m, cs, nbc = geometry(g, n, chunk_elems, bpc)
            _quant_block(tile, s - s0, g, m, pw, prec, itemsize, tol, step, inv, nblocks,
                         codes, blk)  # fmt: skip

    return quant


# per input word size (float32 values: 4, float64: 8): (threads per CUDA block, kernel)
QUANT = {w: (tpb(w), _make_quant_kernel(tpb(w), t)) for w, t in ((4, float32), (8, float64))}


@cuda.jit
def plan_kernel(rawb, codes, blk, n, chunk_elems, bpc, nblocks, itemsize, sizes):
    g = cuda.grid(1)
    if g >= nblocks:
        return
    c, local, s, m, cs, nbc = geometry(g, n, chunk_elems, bpc)
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
    w_d = bit_width(zz_d if or_d < 0 else or_d)
    w_l = bit_width(zz_l if or_l < 0 else or_l)
    sg_d = SIGNED if or_d < 0 else 0
    sg_l = SIGNED if or_l < 0 else 0
    best = (m * w_d + 7) // 8
    h = w_d | sg_d
    cost = 1 + (nz_d * w_d + cost_bits(m, nz_d) + 7) // 8
    if cost < best:
        best, h = cost, w_d | sg_d | SPARSE
    cost = (m * w_l + 7) // 8
    if cost < best:
        best, h = cost, w_l | sg_l | DELTA
    cost = 1 + (nz_l * w_l + cost_bits(m, nz_l) + 7) // 8
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
        blk[COUNT, g] = count_code(k, a)
        sizes[SPARSE_ROW, g] = 1
        sizes[DATA_ROW, g] = (k * width(h) + index_bits(m, k, a) + 7) // 8


@device_fn
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


@device_fn
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


@device_fn
def _write_head(codes, blk, sizes, incl, chunks, g, n, chunk_elems, bpc, nblocks, pw, out):
    """Block ``g``'s bytes other than its data: the chunk's mode byte (first block), its
    header, exponent and count bytes. Returns whether its data are packed codes (else
    bytes of the input, as they are)."""
    c, local, s, m, cs, nbc = geometry(g, n, chunk_elems, bpc)
    base = chunks[START, c]
    if chunks[RAW_CHUNK, c]:  # the chunk is stored as it is
        if local == 0:
            out[base] = MODE_RAW
        return False
    if local == 0:
        out[base] = MODE_BLOCKS
    h = int(blk[HEAD, g])
    out[base + head_at(local)] = h
    raw = blk[RAW, g] != 0
    if pw:
        kk = 0 if raw else int(blk[KEXP, g])
        at = base + exp_at(nbc, local)
        out[at] = exp_lo(kk)
        out[at + 1] = exp_hi(kk)
    if raw:
        return False
    if h & SPARSE:
        out[chunks[COUNTS, c] + _rank(incl, sizes, SPARSE_ROW, g, g - local)] = blk[COUNT, g]
    return True


@device_fn
def _write_data(codes, blk, g, n, chunk_elems, bpc, nblocks, out, p):
    """Block ``g``'s packed codes into ``out`` from byte ``p``."""
    c, local, s, m, cs, nbc = geometry(g, n, chunk_elems, bpc)
    h = int(blk[HEAD, g])
    w = width(h)
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
def write_kernel(rawb, codes, blk, sizes, incl, chunks, n, chunk_elems, bpc, nblocks,
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
        c, local, s, m, cs, nbc = geometry(g, n, chunk_elems, bpc)
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

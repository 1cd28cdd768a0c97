"""The ``block`` codec's decoder as numba.cuda kernels (``kernels/cuda.py`` runs them).

``scan_kernel`` checks each sparse block's index and sums its codes (delta) or takes
its last code (direct); ``DECODE`` unpacks, reconstructs, rounds to the dtype and puts
the values' bits in a shared-memory tile that the CUDA block writes out together.
"""

from __future__ import annotations

from numba import cuda, int16, int32, int64

from .cuda_device import (
    byte,
    device_fn,
    exp_at,
    exp_value,
    f32_bits,
    f64_bits,
    geometry,
    index_bits,
    mul,
    pow2,
    rint,
    tile_index,
    tile_span,
    to_storage,
    tpb,
    unrank,
    width,
)
from .layout import BLOCK, DELTA, MODE_BLOCKS, RAW_WIDTH, SIGNED, SPARSE
from .positions import BINOM, CODE_COUNT, CODE_HIGH, HALF, HALF_BITS


@device_fn
def _bits_in(buf, p, acc, nbits, w):
    """The next ``w`` bits of the LSB-first stream whose unread bits are ``acc``
    (``nbits`` of them) and whose next byte is ``buf[p]``: (value, acc, nbits, p).
    Reads only the bytes it needs."""
    while nbits < w:
        acc |= byte(buf, p) << nbits
        p += 1
        nbits += 8
    v = acc & ((1 << w) - 1)
    return v, acc >> w, nbits - w, p


@device_fn
def _sparse_mask(buf, p, code, w, m, end):
    """The mask of a sparse block's non-zero codes from its count byte ``code`` and its
    index, which follows its codes (``w`` bits each) from byte ``p``; and whether they
    are consistent (a valid count byte, ranks in range or a mask of as many bits, all
    before the chunk's ``end``; kernels/positions.py's decode_index)."""
    k = CODE_COUNT[code]
    a = CODE_HIGH[code]
    if k < 1 or k > m or p + (k * w + index_bits(m, k, a) + 7) // 8 > end:
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
    return unrank(rlo, b) | (unrank(rhi, a) << HALF), True


@device_fn
def _load_int(buf, p, itemsize):
    """The little-endian signed integer of ``itemsize`` bytes at ``buf[p]``."""
    v = 0
    for i in range(itemsize - 1):
        v |= byte(buf, p + i) << (8 * i)
    top = byte(buf, p + itemsize - 1)
    if top >= 128:
        top -= 256
    return v | (top << (8 * (itemsize - 1)))


@device_fn
def _stored_bits(r, prec):
    """The bits (a signed integer of the dtype's size) of ``r``, a value the stored
    dtype holds exactly (what ``to_storage`` returns)."""
    if prec == 0:
        return f64_bits(r)
    u = f32_bits(r)
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
        h = int(rint(abs(r) * 16777216.0))
    return h - 0x8000 if u < 0 else h


@cuda.jit
def scan_kernel(buf, n, chunk_elems, bpc, nblocks, start_c, len_c, mode_c, head, code,
                 doff, bad, rel):  # fmt: skip
    """Per block of a blocks-mode chunk: whether its index is inconsistent, and its
    codes' sum (delta blocks) or last code (direct blocks), 0 for raw blocks."""
    g = cuda.grid(1)
    if g >= nblocks:
        return
    c, local, s, m, cs, nbc = geometry(g, n, chunk_elems, bpc)
    bad[g] = 0
    rel[g] = 0
    if mode_c[c] != MODE_BLOCKS:
        return
    end = start_c[c] + len_c[c]
    h = int(head[g])
    w = width(h)
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


@device_fn
def _decode_block(buf, g, n, chunk_elems, bpc, itemsize, prec, pw, step, start_c, mode_c, head,
                  code, doff, carry, tile, s0):  # fmt: skip
    """Block ``g``'s values, as the bits of the dtype, into ``tile`` (an integer array) at
    ``tile_index(s - s0)`` and on, ``s`` its first element."""
    c, local, s, m, cs, nbc = geometry(g, n, chunk_elems, bpc)
    o = s - s0
    base = int(start_c[c])
    if mode_c[c] != MODE_BLOCKS:  # a raw chunk: the values as they are
        p = base + 1 + (s - cs) * itemsize
        for j in range(m):
            tile[tile_index(o + j)] = _load_int(buf, p + j * itemsize, itemsize)
        return
    h = int(head[g])
    w = width(h)
    p = int(doff[g])
    if w == RAW_WIDTH:  # a raw block: its values, or one repeated
        stride = 0 if h & SPARSE else itemsize
        for j in range(m):
            tile[tile_index(o + j)] = _load_int(buf, p + j * stride, itemsize)
        return
    bstep = step
    if pw:
        at = base + exp_at(nbc, local)
        bstep = pow2(exp_value(byte(buf, at), byte(buf, at + 1)))
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
        tile[tile_index(o + j)] = _stored_bits(to_storage(mul(float(q), bstep), prec), prec)


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
        s0, size = tile_span(g0, n, chunk_elems, bpc, nblocks, tpb)
        if g < nblocks:
            _decode_block(buf, g, n, chunk_elems, bpc, itemsize, prec, pw, step, start_c,
                          mode_c, head, code, doff, carry, tile, s0)  # fmt: skip
        cuda.syncthreads()  # every thread of the CUDA block gets here
        for i in range(tid, size, tpb):
            out[s0 + i] = tile[tile_index(i)]

    return dec


# per dtype size: (threads per CUDA block, kernel)
DECODE = {
    w: (tpb(w), _make_decode_kernel(tpb(w), t)) for w, t in ((2, int16), (4, int32), (8, int64))
}

"""Kernels of the set-partitioning coder of ``sz``'s CDF 9/7 coefficients
(``sz/speck.py``): integers in a 4-d array, coded as SPECK codes them down to bit plane
0, but depth first (the same bits per set, not embedded: every plane is coded).

A set is a box of the array whose magnitudes are known to be below ``2**u``. Its bit
length ``b`` (of its largest magnitude) is coded in unary from plane ``u - 1`` down (a 0
per plane where the set is insignificant, then a 1; ``u`` zeros where it is all zero).
A significant single element then has its sign (1: negative) and the ``b - 1`` bits of
its magnitude below the leading one, most significant first. A significant box of more
elements is split in two along every dimension longer than 1 (the first half the
longer), its children in C order of their halves, and each child says with one bit
whether its bit length is ``b`` too (the last child's bit is left out where no child
before it was: it must be); the children are then coded in order, depth first, below
``2**b`` where they said 1 (their bit length is known) and ``2**(b - 1)`` where they
said 0. Bits fill bytes most significant first.
"""

import numpy as np
from numba import njit

#: a box is 8 int64s: its first index and its length along each of the 4 dimensions
BOX = 8
#: the most bits a magnitude may have (k of at most 2**52, as the quantizer allows)
MAX_PLANES = 53
#: stack room beyond the initial boxes: a split pushes at most 16 children and nests at
#: most 64 deep (lengths below 2**64)
STACK_ROOM = 16 * 66


@njit(cache=True, nogil=True, inline="always")
def _bit_length(v) -> int:
    b = 0
    while v:
        v >>= 1
        b += 1
    return b


@njit(cache=True, nogil=True)
def _box_max(mag, box) -> int:
    """The largest value of ``mag`` (4-d) in ``box``."""
    m = 0
    for i0 in range(box[0], box[0] + box[4]):
        for i1 in range(box[1], box[1] + box[5]):
            for i2 in range(box[2], box[2] + box[6]):
                for i3 in range(box[3], box[3] + box[7]):
                    v = mag[i0, i1, i2, i3]
                    if v > m:
                        m = v
    return m


@njit(cache=True, nogil=True, inline="always")
def _child(box, j, out) -> None:
    """Child ``j`` of ``box`` into ``out``: the halves of the dimensions longer than 1,
    the first such dimension's half in the highest bit of ``j``."""
    s = 0
    for d in range(4):
        s += box[4 + d] > 1
    for d in range(4):
        lo, n = box[d], box[4 + d]
        if n > 1:
            s -= 1
            h = (n + 1) // 2
            if (j >> s) & 1:
                lo, n = lo + h, n - h
            else:
                n = h
        out[d] = lo
        out[4 + d] = n


@njit(cache=True, nogil=True, inline="always")
def _children(box) -> int:
    s = 0
    for d in range(4):
        s += box[4 + d] > 1
    return 1 << s


@njit(cache=True, nogil=True, inline="always")
def _put(buf, pos, bit) -> int:
    if bit:
        buf[pos >> 3] |= np.uint8(0x80 >> (pos & 7))
    return pos + 1


@njit(cache=True, nogil=True)
def encode(k, boxes, top, buf) -> int:
    """Code the int64 4-d ``k`` (every magnitude below ``2**top``) starting from the
    sets ``boxes`` (``(nb, 8)``, in order) into ``buf`` (uint8, zeroed); returns the bits
    written, or -1 where they would not fit in ``buf`` (the caller codes otherwise)."""
    mag = np.abs(k)
    cap = buf.size * 8 - 2 * 128
    nb = boxes.shape[0]
    stack = np.empty((nb + STACK_ROOM, BOX + 3), np.int64)
    for i in range(nb):  # the first box on top
        s = stack[nb - 1 - i]
        s[:BOX] = boxes[i]
        s[BOX], s[BOX + 1], s[BOX + 2] = top, 0, _box_max(mag, boxes[i])
    sp, pos = nb, 0
    cur = np.empty(BOX + 3, np.int64)
    child = np.empty(BOX, np.int64)
    while sp:
        sp -= 1
        cur[:] = stack[sp]
        if pos > cap:
            return -1
        u, m = cur[BOX], cur[BOX + 2]
        b = u if cur[BOX + 1] else _bit_length(m)
        if not cur[BOX + 1]:
            pos += u - b  # zeros: insignificant at planes u - 1 .. b
            if b == 0:
                continue
            pos = _put(buf, pos, 1)
        if cur[4] * cur[5] * cur[6] * cur[7] == 1:
            pos = _put(buf, pos, k[cur[0], cur[1], cur[2], cur[3]] < 0)
            for p in range(b - 2, -1, -1):
                pos = _put(buf, pos, (m >> p) & 1)
            continue
        nc = _children(cur)
        said = False
        for j in range(nc):
            _child(cur, j, child)
            cm = _box_max(mag, child)
            sig = _bit_length(cm) == b
            if j < nc - 1 or said:
                pos = _put(buf, pos, sig)
            said = said or sig
            s = stack[sp + nc - 1 - j]
            s[:BOX] = child
            s[BOX], s[BOX + 1], s[BOX + 2] = b if sig else b - 1, sig, cm
        sp += nc
        if pos > cap:
            return -1
    return pos


@njit(cache=True, nogil=True, inline="always")
def _get(buf, pos, nbits) -> int:
    if pos >= nbits:
        raise ValueError("corrupt stream: the cdf97 bit planes end early")
    return (buf[pos >> 3] >> (7 - (pos & 7))) & 1


@njit(cache=True, nogil=True)
def decode(buf, top, boxes, k) -> int:
    """Invert :func:`encode` into the int64 4-d ``k`` (zeroed); returns the bits read.
    A stream that ends early raises ValueError."""
    nbits = buf.size * 8
    nb = boxes.shape[0]
    stack = np.empty((nb + STACK_ROOM, BOX + 2), np.int64)
    for i in range(nb):
        s = stack[nb - 1 - i]
        s[:BOX] = boxes[i]
        s[BOX], s[BOX + 1] = top, 0
    sp, pos = nb, 0
    cur = np.empty(BOX + 2, np.int64)
    child = np.empty(BOX, np.int64)
    while sp:
        sp -= 1
        cur[:] = stack[sp]
        b = cur[BOX]
        if not cur[BOX + 1]:
            while b > 0 and not _get(buf, pos, nbits):
                pos += 1
                b -= 1
            if b == 0:
                continue
            pos += 1
        if cur[4] * cur[5] * cur[6] * cur[7] == 1:
            neg = _get(buf, pos, nbits)
            pos += 1
            v = np.int64(1)
            for _ in range(b - 1):
                v = (v << 1) | _get(buf, pos, nbits)
                pos += 1
            k[cur[0], cur[1], cur[2], cur[3]] = -v if neg else v
            continue
        nc = _children(cur)
        said = False
        for j in range(nc):
            _child(cur, j, child)
            if j < nc - 1 or said:
                sig = _get(buf, pos, nbits) == 1
                pos += 1
            else:
                sig = True
            said = said or sig
            s = stack[sp + nc - 1 - j]
            s[:BOX] = child
            s[BOX], s[BOX + 1] = b if sig else b - 1, sig
        sp += nc
    return pos

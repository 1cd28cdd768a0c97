"""The ``block`` codec in torch tensor ops: the same bytes as the numba kernels, on any device.

All chunks of a tensor are processed together as one ``[blocks, 64]`` matrix;
every step is element- or block-parallel (the one sequential dependency, the
running value behind delta-coded blocks, is a segmented scan over blocks).
The host learns the payload sizes (encode), the chunk modes (decode) and the
positions of the rare values or blocks that need extra work.
Arithmetic matches ``kernels/block.py`` operation for operation: float64
products, round-half-even, rounding to 16-bit dtypes through float32.
"""

from __future__ import annotations

import math

import torch

from . import positions as ps
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


def _arange64(device) -> torch.Tensor:
    return torch.arange(BLOCK, dtype=torch.int64, device=device)


def _int_view(dtype: torch.dtype) -> torch.dtype:
    return {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]


def to_storage(r: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``r`` rounded as ``dtype`` stores it, returned as float64."""
    if dtype == torch.float64:
        return r
    f = r.to(torch.float32)
    if dtype != torch.float32:
        f = f.to(dtype)
    return f.to(torch.float64)


def pow2(k: torch.Tensor) -> torch.Tensor:
    """2.0**k exactly, for int64 ``k`` in [-1022, 1023] (normal numbers)."""
    return ((k + 1023) << 52).view(torch.float64)


def bit_width(v: torch.Tensor) -> torch.Tensor:
    """Bits needed for non-negative int64 ``v`` < 2**53 (0 for 0)."""
    return torch.frexp(v.to(torch.float64)).exponent.to(torch.int64)


def zigzag(v: torch.Tensor) -> torch.Tensor:
    return (v << 1) ^ (v >> 63)


class Layout:
    """Where each chunk's elements sit in the padded ``[blocks, 64]`` matrix."""

    def __init__(self, n: int, chunk_elems: int, device):
        self.n = n
        self.chunk_elems = chunk_elems
        self.nchunks = -(-n // chunk_elems) if n else 0
        self.nfull = n // chunk_elems
        self.tail = n - self.nfull * chunk_elems
        self.bpc = -(-chunk_elems // BLOCK)  # blocks per full chunk
        self.nblocks = self.nfull * self.bpc + -(-self.tail // BLOCK)
        # per chunk (all but a tail chunk, the last, are full): first block, blocks,
        # elements; made on the device, with no host lists to copy over
        c = torch.arange(self.nchunks, device=device)
        self.first_block = c * self.bpc
        self.blocks_c = torch.clamp(self.nblocks - self.first_block, max=self.bpc)
        self.elems_c = torch.clamp(n - c * chunk_elems, max=chunk_elems)
        # per block: chunk id, index within the chunk, valid elements
        self.chunk_id = torch.arange(self.nblocks, device=device) // self.bpc
        self.local = torch.arange(self.nblocks, device=device) - self.chunk_id * self.bpc
        self.valid = torch.clamp(self.elems_c[self.chunk_id] - self.local * BLOCK, max=BLOCK)

    def chunk_elems_of(self, c: int) -> int:
        """Elements of chunk ``c``."""
        return min(self.chunk_elems, self.n - c * self.chunk_elems)

    def per_chunk(self, x: torch.Tensor) -> torch.Tensor:
        """Per-block int64 ``x`` summed over each chunk's blocks (from one running sum:
        no atomics, which serialise on a GPU when thousands of blocks add to one chunk)."""
        return self.ranks(x)[1]

    def ranks(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(per block: the sum of per-block int64 ``x`` over the blocks before it in its
        chunk; per chunk: the sum over all its blocks), from one running sum."""
        excl = torch.cumsum(x, 0) - x
        first = self.first_block
        last = first + self.blocks_c - 1
        start = excl[first]
        return excl - start[self.chunk_id], excl[last] + x[last] - start

    def to_blocks(self, flat: torch.Tensor, fill=0) -> torch.Tensor:
        """``flat`` (n elements) as the padded [blocks, 64] matrix."""
        parts = []
        if self.nfull:
            full = flat[: self.nfull * self.chunk_elems].view(self.nfull, self.chunk_elems)
            pad = self.bpc * BLOCK - self.chunk_elems
            if pad:
                full = torch.nn.functional.pad(full, (0, pad), value=fill)
            parts.append(full.reshape(-1, BLOCK))
        if self.tail:
            tail = flat[self.nfull * self.chunk_elems :]
            pad = -self.tail % BLOCK
            if pad:
                tail = torch.nn.functional.pad(tail, (0, pad), value=fill)
            parts.append(tail.reshape(-1, BLOCK))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def from_blocks(self, blocks: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`to_blocks`: the n elements, in order."""
        parts = []
        nfb = self.nfull * self.bpc
        if self.nfull:
            full = blocks[:nfb].reshape(self.nfull, self.bpc * BLOCK)[:, : self.chunk_elems]
            parts.append(full.reshape(-1))
        if self.tail:
            parts.append(blocks[nfb:].reshape(-1)[: self.tail])
        return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)


def _quantize(xb, lay, dtype, pw, tol, step, inv):
    """Codes, raw flags and step exponents of every block (the encoder's first half)."""
    x = xb.to(torch.float64)
    dev = x.device
    pos = _arange64(dev)
    valid = pos[None, :] < lay.valid[:, None]
    if pw:
        a = torch.where((x != 0) & valid, x.abs(), torch.full_like(x, math.inf))
        lo = a.amin(1)
        lo = torch.where(lo == math.inf, torch.zeros_like(lo), lo)
        a2 = tol * lo
        a2 = a2 + a2
        k = torch.where(
            torch.isfinite(a2),
            torch.frexp(a2).exponent.to(torch.int64) - 1,
            torch.full_like(lo, 1022, dtype=torch.int64),
        ).clamp(-1022, 1022)
        bstep = pow2(k)[:, None]
        binv = pow2(-k)[:, None]
    else:
        k = torch.zeros(x.shape[0], dtype=torch.int64, device=dev)
        bstep, binv = step, inv
    t = torch.round(x * binv)
    good = _codable(x, t, dtype, pw, tol, bstep)
    miss = torch.nonzero(~good & valid, as_tuple=True)  # rare: a host sync, small work
    if miss[0].numel():  # a value that misses after rounding gets the other neighbour
        xm, tm = x[miss], t[miss]
        sm = bstep[miss[0], 0] if pw else bstep
        t2 = torch.where(xm * (binv[miss[0], 0] if pw else binv) > tm, tm + 1, tm - 1)
        ok2 = _codable(xm, t2, dtype, pw, tol, sm)
        t[miss] = torch.where(ok2, t2, tm)
        good[miss] = ok2
    inrange = t.abs() <= QMAX
    bad = (~good & valid).any(1)
    v = torch.where(inrange & valid, t, torch.zeros_like(t)).to(torch.int64)
    return v, valid, bad, k


def _codable(x, t, dtype, pw, tol, bstep):
    """Whether codes ``t`` reconstruct ``x`` within the bound (as kernels/block.py)."""
    r = to_storage(t * bstep, dtype)
    ok = (t.abs() <= QMAX) & ((r - x).abs() <= (tol * x.abs() if pw else tol))
    if pw:  # signs kept, zeros exact (-0.0 cannot be coded: its block goes raw), finite
        ok = ok & ((r * x > 0) | ((x == 0) & ~torch.signbit(x))) & torch.isfinite(r)
    elif tol == 0:  # a zero tolerance keeps every bit, the sign of zero too
        ok = ok & ~((x == 0) & torch.signbit(x))
    return ok


class Tables:
    """kernels/positions.py's tables as int64 tensors on one device."""

    _cache: dict = {}

    def __init__(self, device):
        for name in ("BINOM", "HALF_BITS", "SMALL", "SMALL_BASE", "CODE_COUNT", "CODE_HIGH"):
            setattr(
                self,
                name.lower(),
                torch.as_tensor(getattr(ps, name).astype("int64"), device=device),
            )
        self.cost = torch.as_tensor(ps.COST_BITS, device=device)

    @classmethod
    def on(cls, device) -> Tables:
        key = str(device)
        if key not in cls._cache:
            cls._cache[key] = cls(device)
        return cls._cache[key]

    def cost_bits(self, m: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Index bits the encoder counts for ``k`` non-zero codes (ps.cost_bits)."""
        return torch.where(k <= ps.RANK_MAX, self.cost[k.clamp(max=ps.RANK_MAX)], m)

    def index_bits(self, m, k, a) -> torch.Tensor:
        """Bits of the index of ``k`` non-zero codes, ``a`` in the second half (ps.index_bits;
        ``a`` < 0: a mask)."""
        lo = self.half_bits[m.clamp(max=ps.HALF), (k - a).clamp(0, ps.HALF)]
        hi = self.half_bits[(m - ps.HALF).clamp(min=0), a.clamp(0, ps.HALF)]
        return torch.where(a < 0, m, lo + hi)

    def rank(self, where: torch.Tensor) -> torch.Tensor:
        """Per row: the rank of the positions where ``where`` ([rows, <= 32] booleans) is
        set (ps.rank_half)."""
        order = torch.cumsum(where.long(), 1)  # j + 1 for the j-th set position
        p = torch.arange(where.shape[1], device=where.device)
        terms = self.binom[order.clamp(max=ps.RANK_MAX), p]
        return torch.where(where, terms, 0).sum(1)

    def unrank(self, r: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        """The 32-bit masks of ``i`` positions of rank ``r`` (per row, ps.unrank_half)."""
        mask = torch.zeros_like(r)
        binom = self.binom.reshape(-1)  # C(p, i) at i * 33 + p
        steps = int((i - ps.TAIL).max()) if i.numel() else 0  # a host sync
        for _ in range(steps):
            go = i > ps.TAIL
            row = i.clamp(max=ps.RANK_MAX) * (ps.HALF + 1)
            p = torch.zeros_like(r)  # the largest p < 32 with C(p, i) <= r: binary search
            for step in (16, 8, 4, 2, 1):
                p = torch.where(binom[row + p + step] <= r, p + step, p)
            r = torch.where(go, r - binom[row + p], r)
            mask = torch.where(go, mask | (1 << p), mask)
            i = torch.where(go, i - 1, i)
        tail = self.small_base[i.clamp(max=ps.TAIL)] + r
        return mask | self.small[tail.clamp(0, self.small.numel() - 1)]


def last_marked(mark: torch.Tensor) -> torch.Tensor:
    """Per position: the index of the last marked position at or before it (``mark[0]``
    must be set). Searches the running count of marks: torch's ``cummax`` scans a long
    1-d tensor on one CUDA block (6 ms for 8M blocks on an H200)."""
    count = torch.cumsum(mark.long(), 0)
    return torch.searchsorted(count, count)


def _scatter_bits(words, bitpos, values, width, where):
    """OR ``values`` (``width`` bits each) into int64 ``words`` at ``bitpos`` where ``where``."""
    zero = torch.zeros_like(bitpos)
    val = torch.where(where, values, zero)
    widx = torch.where(where, bitpos >> 6, zero)
    shift = bitpos & 63
    words.scatter_add_(0, widx.reshape(-1), (val << shift).reshape(-1))
    spill = where & (shift + width > 64)
    hi = torch.where(spill, (val >> (64 - shift).clamp(max=63)) & ((1 << shift) - 1), zero)
    words.scatter_add_(0, (widx + 1).reshape(-1), hi.reshape(-1))


def _extract_bits(words, bitpos, width, where):
    """The ``width``-bit values at ``bitpos`` in int64 ``words`` (0 where not ``where``)."""
    widx = torch.where(where, bitpos >> 6, 0).clamp(0, words.numel() - 2)
    shift = bitpos & 63
    lo = (words[widx] >> shift) & torch.where(shift == 0, -1, (1 << (64 - shift).clamp(max=63)) - 1)
    hi = torch.where(shift == 0, 0, words[widx + 1] << (64 - shift).clamp(max=63))
    width = torch.as_tensor(width)
    wmask = torch.where(width >= 64, -1, (1 << width.clamp(max=63)) - 1)
    return torch.where(where, (lo | hi) & wmask, 0)


class BlockFields:
    """Every block's header fields, count byte and data offset in chunk payloads
    concatenated in ``buf`` (chunk ``c`` from ``start_c[c]``; int64 tensors, per block
    unless named ``_c``): what the torch and CUDA decoders read first."""

    def __init__(self, buf: torch.Tensor, start_c, lay: Layout, pw: bool, itemsize: int):
        self._buf, self._lay = buf, lay
        cid, m = lay.chunk_id, lay.valid
        self.mode_c = buf[start_c].long()
        self.base = start_c[cid]
        self.head_c = lay.blocks_c * (3 if pw else 1)  # header and exponent bytes
        self.head = self.get(self.base + 1 + lay.local)
        self.width = self.head & 31
        self.raw = self.width == RAW_WIDTH
        self.same = self.raw & (self.head & SPARSE != 0)  # a raw block of one value
        self.is_sparse = (self.head & SPARSE != 0) & ~self.raw
        # sparse blocks: count bytes; each one's index follows its codes
        tab = Tables.on(buf.device)
        sp_rank, sparse_c = lay.ranks(self.is_sparse.long())
        count_start = self.base + 1 + self.head_c[cid]
        self.code = torch.where(self.is_sparse, self.get(count_start + sp_rank), 0)
        self.cnt_sp = torch.where(self.is_sparse, tab.code_count[self.code], 0)
        self.high = tab.code_high[self.code]  # non-zero codes in the second half; -1: mask
        self.ibits = torch.where(self.is_sparse, tab.index_bits(m, self.cnt_sp, self.high), 0)
        cnt = torch.where(self.is_sparse, self.cnt_sp, m)
        dsize = (cnt * self.width + self.ibits + 7) // 8
        dsize = torch.where(self.raw, torch.where(self.same, itemsize, m * itemsize), dsize)
        d_rank, data_c = lay.ranks(dsize)
        self.doff = d_rank + count_start + sparse_c[cid]
        n_c = lay.elems_c
        self.need_c = torch.where(
            self.mode_c == MODE_RAW, 1 + n_c * itemsize, 1 + self.head_c + sparse_c + data_c
        )

    def get(self, index: torch.Tensor) -> torch.Tensor:
        """Payload bytes at ``index`` (clamped into the payload) as int64."""
        return self._buf[index.clamp(0, self._buf.numel() - 1)].long()

    def exponents(self) -> torch.Tensor:
        """pw_rel: each block's step exponent."""
        lay, nb = self._lay, self._lay.blocks_c[self._lay.chunk_id]
        kb = self.get(self.base + 1 + nb + 2 * lay.local)
        kb = kb | (self.get(self.base + 2 + nb + 2 * lay.local) << 8)
        return torch.where(kb >= 32768, kb - 65536, kb)

    def bad_chunks(self, bad_head: torch.Tensor, len_c: torch.Tensor) -> torch.Tensor:
        """Per chunk: its length is not what its blocks need, its mode is unknown, or a
        block of a blocks-mode chunk is bad (``bad_head``)."""
        mode_c, lay = self.mode_c, self._lay
        bad = (self.need_c != len_c) | ((mode_c != MODE_RAW) & (mode_c != MODE_BLOCKS))
        return bad | (lay.per_chunk((bad_head & (mode_c[lay.chunk_id] == MODE_BLOCKS)).long()) > 0)


def _sparse_masks(tab, words, bitpos, ibits, m, cnt, high):
    """(uint64 masks of the sparse blocks' non-zero codes from their indexes at bit
    ``bitpos``, whether an index is inconsistent), per block (kernels/positions.py)."""
    is_sparse = cnt > 0
    ival = _extract_bits(words, bitpos, ibits, is_sparse)
    ranked = is_sparse & (high >= 0)
    b = cnt - high
    nlo, nhi = m.clamp(max=ps.HALF), (m - ps.HALF).clamp(min=0)
    wlo = tab.half_bits[nlo, b.clamp(0, ps.HALF)]
    rlo, rhi = ival & ((1 << wlo) - 1), ival >> wlo
    bl, hl = b.clamp(0, ps.RANK_MAX), high.clamp(0, ps.RANK_MAX)
    bad = (b < 0) | (b > nlo) | (high > nhi) | (rlo >= tab.binom[bl, nlo])
    bad = ranked & (bad | (rhi >= tab.binom[hl, nhi]))
    ok = ranked & ~bad
    halves = tab.unrank(
        torch.where(ok, torch.cat([rlo, rhi]).view(2, -1), 0).view(-1),
        torch.where(ok, torch.stack([bl, hl]), 0).view(-1),
    ).view(2, -1)
    mask = torch.where(ranked, halves[0] | (halves[1] << ps.HALF), ival)
    return mask, bad


def encode(t: torch.Tensor, chunk_elems: int, pw: bool, tol: float, step: float, inv: float):
    """Payloads of all chunks of the flattened C-contiguous ``t``: (uint8 tensor, lengths)."""
    dtype = t.dtype
    itemsize = t.element_size()
    dev = t.device
    flat = t.reshape(-1)
    n = flat.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.uint8, device=dev), []
    lay = Layout(n, chunk_elems, dev)
    xb = lay.to_blocks(flat)
    v, valid, bad, k = _quantize(xb, lay, dtype, pw, tol, step, inv)
    m = lay.valid
    zero = torch.zeros_like(v)

    # direct codes decide raw blocks (from the block alone)
    neg_d = (v < 0).any(1)
    code_d = torch.where(neg_d[:, None], zigzag(v), v)
    w_d = bit_width(code_d.amax(1))
    raw = bad | ((m * w_d + 7) // 8 > m * itemsize)

    # delta codes: the predecessor of a block is the last code of the block before
    # it in the chunk, or 0 after a raw block and at the start of a chunk
    last = v.gather(1, (m - 1)[:, None]).squeeze(1)
    pred = torch.cat([zero[:1, 0], torch.where(raw[:-1], zero[:-1, 0], last[:-1])])
    pred = torch.where(lay.local == 0, zero[:, 0], pred)
    d = torch.where(valid, v - torch.cat([pred[:, None], v[:, :-1]], 1), zero)
    neg_l = (d < 0).any(1)
    code_l = torch.where(neg_l[:, None], zigzag(d), d)
    w_l = bit_width(code_l.amax(1))
    nz_d = (v != 0).sum(1)
    nz_l = (d != 0).sum(1)
    tab = Tables.on(dev)
    costs = torch.stack(
        [
            (m * w_d + 7) // 8,
            1 + (nz_d * w_d + tab.cost_bits(m, nz_d) + 7) // 8,
            (m * w_l + 7) // 8,
            1 + (nz_l * w_l + tab.cost_bits(m, nz_l) + 7) // 8,
        ]
    )
    choice = costs.argmin(0)
    is_delta = choice >= 2
    is_sparse = (choice % 2 == 1) & ~raw
    width = torch.where(is_delta, w_l, w_d)
    head = width | torch.where(torch.where(is_delta, neg_l, neg_d), SIGNED, 0)
    head = head | torch.where(is_sparse, SPARSE, 0) | torch.where(is_delta, DELTA, 0)

    # raw blocks: one value when all their values have the same bits
    ibits = xb.view(_int_view(dtype))
    same = ((ibits == ibits[:, :1]) | ~valid).all(1)
    head = torch.where(raw, RAW_WIDTH | torch.where(same, SPARSE, 0), head)
    raw_size = torch.where(same, itemsize, m * itemsize)
    best = costs.gather(0, choice[None]).squeeze(0)
    nnz = torch.where(is_sparse, torch.where(is_delta, nz_l, nz_d), 0)
    is_delta = is_delta & ~raw
    codes = torch.where(is_delta[:, None], code_l, code_d)
    emit = torch.where(is_sparse[:, None], torch.where(is_delta[:, None], d, v) != 0, valid)
    emit = emit & ~raw[:, None]
    # sparse blocks: count byte and index (kernels/positions.py), after the codes
    high = emit[:, ps.HALF :].sum(1)
    ranked = is_sparse & (nnz <= ps.RANK_MAX)
    code_sp = torch.where(ranked, nnz * (nnz + 1) // 2 + high, ps.MASK_BASE + nnz)
    ibits = torch.where(is_sparse, tab.index_bits(m, nnz, torch.where(ranked, high, -1)), 0)
    mask = (torch.where(emit, 1, 0) << _arange64(dev)).sum(1)
    nlo = tab.half_bits[m.clamp(max=ps.HALF), (nnz - high).clamp(0, ps.HALF)]
    ival = tab.rank(emit[:, : ps.HALF]) | (tab.rank(emit[:, ps.HALF :]) << nlo)
    ival = torch.where(ranked, ival, mask)
    sparse_size = (nnz * width + ibits + 7) // 8
    dsize = torch.where(raw, raw_size, torch.where(is_sparse, sparse_size, best))

    # per chunk sizes; chunks that would not shrink are stored raw
    nch = lay.nchunks
    cid = lay.chunk_id

    nb_c = lay.blocks_c
    n_c = lay.elems_c
    head_bytes = nb_c * (3 if pw else 1)
    sp_rank, sparse_c = lay.ranks(is_sparse.long())
    d_rank, data_c = lay.ranks(dsize)
    size_c = 1 + head_bytes + sparse_c + data_c
    raw_c = size_c >= 1 + n_c * itemsize
    size_c = torch.where(raw_c, 1 + n_c * itemsize, size_c)
    # the one host sync: sizes, which chunks are raw, whether any block is raw
    host = torch.cat([size_c, raw_c.long(), raw.any().long()[None]]).tolist()
    lengths, raw_chunks, any_raw = host[:nch], host[nch : 2 * nch], host[-1]
    total = sum(lengths)
    start_c = torch.cumsum(size_c, 0) - size_c

    words = torch.zeros(total // 8 + 2, dtype=torch.int64, device=dev)
    out = words.view(torch.uint8)
    dump = out.numel() - 1  # writes of raw chunks' blocks land here and are cut off
    keep = ~raw_c[cid]
    base = start_c[cid]

    def put(index, values):
        out.index_put_((torch.where(keep.view(-1, *[1] * (index.dim() - 1)), index, dump),), values)

    out[start_c] = torch.where(raw_c, MODE_RAW, MODE_BLOCKS).to(torch.uint8)
    put(base + 1 + lay.local, head.to(torch.uint8))
    if pw:
        kk = torch.where(raw, 0, k) & 0xFFFF
        put(base + 1 + nb_c[cid] + 2 * lay.local, (kk & 0xFF).to(torch.uint8))
        put(base + 2 + nb_c[cid] + 2 * lay.local, (kk >> 8).to(torch.uint8))
    # sparse blocks: a count byte each; then the block data
    count_start = base + 1 + head_bytes[cid]
    put(torch.where(is_sparse, count_start + sp_rank, dump), code_sp.to(torch.uint8))
    emit = emit & keep[:, None]
    doff = d_rank + count_start + sparse_c[cid]
    if any_raw:  # raw blocks: their bytes as they are
        nbytes = BLOCK * itemsize
        bidx = doff[:, None] + torch.arange(nbytes, device=dev)
        ok = raw[:, None] & (torch.arange(nbytes, device=dev)[None, :] < raw_size[:, None])
        put(torch.where(ok, bidx, dump), xb.contiguous().view(torch.uint8).view(-1, nbytes))
    rank = torch.where(is_sparse[:, None], torch.cumsum(emit.long(), 1) - 1, _arange64(dev))
    _scatter_bits(words, doff[:, None] * 8 + rank * width[:, None], codes, width[:, None], emit)
    # each sparse block's index right after its codes
    _scatter_bits(words, doff * 8 + nnz * width, ival, ibits, is_sparse & keep)
    # raw chunks: a mode byte and the values as they are
    st = 0
    for c in range(nch):
        if raw_chunks[c]:
            s0 = c * lay.chunk_elems
            src = flat[s0 : s0 + lay.chunk_elems_of(c)].contiguous().view(torch.uint8)
            out[st + 1 : st + 1 + src.numel()] = src
        st += lengths[c]
    return out[:total], lengths


def decode(payload: torch.Tensor, lengths: list, n: int, chunk_elems: int, dtype, pw, step):
    """The ``n`` values (flattened) of the chunk payloads concatenated in ``payload``.

    Raises ValueError when a payload is inconsistent with its length.
    """
    dev = payload.device
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if n == 0:
        return torch.zeros(0, dtype=dtype, device=dev)
    lay = Layout(n, chunk_elems, dev)
    nch = lay.nchunks
    if len(lengths) != nch:
        raise ValueError(f"{len(lengths)} chunk payloads for {nch} chunks")
    len_c = torch.tensor(lengths, device=dev)
    start_c = torch.cumsum(len_c, 0) - len_c
    if min(lengths) < 1:
        raise ValueError("a block chunk payload is empty")
    total = sum(lengths)
    words = torch.zeros(total // 8 + 2, dtype=torch.int64, device=dev)
    buf = words.view(torch.uint8)
    buf[:total] = payload[:total]
    p = BlockFields(buf[:total], start_c, lay, pw, itemsize)
    mode_c, head, width, raw, same = p.mode_c, p.head, p.width, p.raw, p.same
    is_sparse, cnt_sp, doff, m = p.is_sparse, p.cnt_sp, p.doff, lay.valid
    is_delta = (head & DELTA != 0) & ~raw
    signed = (head & SIGNED != 0) & ~raw
    if pw:
        k = p.exponents()
    tab = Tables.on(dev)
    mask, bad_index = _sparse_masks(
        tab, words, doff * 8 + cnt_sp * width, p.ibits, m, cnt_sp, p.high
    )
    pos = _arange64(dev)
    mbits = ((mask[:, None] >> pos) & 1) == 1
    valid = pos[None, :] < m[:, None]
    bad_head = ~raw & (width > 30) | raw & (head & (SIGNED | DELTA) != 0)
    bad_sparse = (cnt_sp < 1) | (cnt_sp > m) | (mbits.sum(1) != cnt_sp) | bad_index
    bad_head = bad_head | is_sparse & (bad_sparse | (mbits & ~valid).any(1))
    if pw:
        bad_head = bad_head | ~raw & ((k < -1022) | (k > 1022))
    bad_c = p.bad_chunks(bad_head, len_c)
    check = torch.cat([bad_c.long(), mode_c]).tolist()  # the host sync: validity and modes
    raw_chunks = check[nch:]
    if MODE_LEGACY in raw_chunks:
        raise LegacyLayout("a chunk in the first block layout")
    if any(check[:nch]):
        raise ValueError("block payload is inconsistent (corrupted or truncated)")
    raw_chunks = [md == MODE_RAW for md in raw_chunks]

    emit = torch.where(is_sparse[:, None], mbits, valid) & ~raw[:, None]
    rank = torch.where(is_sparse[:, None], torch.cumsum(emit.long(), 1) - 1, pos)
    c = _extract_bits(words, doff[:, None] * 8 + rank * width[:, None], width[:, None], emit)
    c = torch.where(signed[:, None], (c >> 1) ^ -(c & 1), c)

    # running values behind delta blocks: a segmented scan over blocks
    cs = torch.cumsum(c, 1)
    tsum = torch.where(is_delta, cs[:, -1], 0)
    direct_last = c.gather(1, (m - 1)[:, None]).squeeze(1)
    reset = ~is_delta
    first = lay.local == 0
    mark = reset | first
    S = torch.cumsum(tsum, 0)
    anchor_val = torch.where(reset & ~raw, direct_last, 0)
    anchor_S = torch.where(reset, S, S - tsum)
    mi = last_marked(mark)
    q_last = anchor_val[mi] + S - anchor_S[mi]
    carry = torch.cat([q_last.new_zeros(1), q_last[:-1]])
    carry = torch.where(first, 0, carry)
    q = torch.where(is_delta[:, None], carry[:, None] + cs, c)
    bstep = pow2(torch.where(raw, 0, k))[:, None] if pw else step
    vals = to_storage(q.to(torch.float64) * bstep, dtype).to(dtype)
    if bool(raw.any()):
        rid = torch.nonzero(raw).view(-1)
        nbytes = BLOCK * itemsize
        j = torch.arange(nbytes, device=dev)
        src = torch.where(same[rid, None], doff[rid, None] + j % itemsize, doff[rid, None] + j)
        rb = buf[src.clamp(0, total - 1)]
        vals = vals.contiguous()
        vals.view(torch.uint8).view(-1, nbytes)[rid] = rb
    flat = lay.from_blocks(vals)
    if any(raw_chunks):
        flat = flat.clone()
        st = 0
        for ch in range(nch):
            if raw_chunks[ch]:
                s0 = ch * chunk_elems
                cnt_b = lay.chunk_elems_of(ch) * itemsize
                flat[s0 : s0 + lay.chunk_elems_of(ch)] = (
                    buf[st + 1 : st + 1 + cnt_b].clone().view(dtype)
                )
            st += lengths[ch]
    return flat

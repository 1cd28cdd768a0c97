"""The ``block`` codec in torch tensor ops: the same bytes as the numba kernels, on any device.

All chunks of a tensor are processed together as one ``[blocks, 64]`` matrix;
every step is element- or block-parallel (the one sequential dependency, the
running value behind delta-coded blocks, is a segmented scan over blocks).
The host learns the payload sizes (encode), the chunk modes (decode) and the
positions of the rare values or blocks that need extra work. Fields and offsets
come from ``kernels/layout.py``; bit fields and the sparse blocks' index from
``kernels/torch_bits.py``.
Arithmetic matches ``kernels/cpu.py`` operation for operation: float64
products, round-half-even, rounding to 16-bit dtypes through float32.
"""

from __future__ import annotations

import math

import torch

from . import layout as bl
from . import positions as ps
from .layout import BLOCK, DELTA, MODE_BLOCKS, MODE_RAW, QMAX, RAW_WIDTH, SIGNED, SPARSE
from .torch_bits import Tables, extract_bits, last_marked, scatter_bits, sparse_masks

__all__ = [
    "BlockFields",
    "BlockGrid",
    "Tables",
    "carry_in",
    "decode",
    "encode",
    "int_view",
    "last_marked",
]


def _arange64(device) -> torch.Tensor:
    return torch.arange(BLOCK, dtype=torch.int64, device=device)


def int_view(dtype: torch.dtype) -> torch.dtype:
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


class BlockGrid:
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
    """Whether codes ``t`` reconstruct ``x`` within the bound (layout.codable,
    element-wise)."""
    r = to_storage(t * bstep, dtype)
    ok = (t.abs() <= QMAX) & ((r - x).abs() <= (tol * x.abs() if pw else tol))
    if pw:  # signs kept, zeros exact (-0.0 cannot be coded: its block goes raw), finite
        ok = ok & ((r * x > 0) | ((x == 0) & ~torch.signbit(x))) & torch.isfinite(r)
    elif tol == 0:  # a zero tolerance keeps every bit, the sign of zero too
        ok = ok & ~((x == 0) & torch.signbit(x))
    return ok


class BlockFields:
    """Every block's header fields, count byte and data offset in chunk payloads
    concatenated in ``buf`` (chunk ``c`` from ``start_c[c]``; int64 tensors, per block
    unless named ``_c``): what the torch and CUDA decoders read first."""

    def __init__(self, buf: torch.Tensor, start_c, lay: BlockGrid, pw: bool, itemsize: int):
        self._buf, self._lay = buf, lay
        cid, m = lay.chunk_id, lay.valid
        self.mode_c = buf[start_c].long()
        self.base = start_c[cid]
        self.counts_c = bl.counts_at(lay.blocks_c, pw)  # where each chunk's count bytes start
        self.head = self.get(self.base + bl.head_at(lay.local))
        self.width = bl.width(self.head)
        self.raw = bl.is_raw(self.head)
        self.same = self.raw & (self.head & SPARSE != 0)  # a raw block of one value
        self.is_sparse = (self.head & SPARSE != 0) & ~self.raw
        # sparse blocks: count bytes; each one's index follows its codes
        tab = Tables.on(buf.device)
        sp_rank, sparse_c = lay.ranks(self.is_sparse.long())
        count_start = self.base + self.counts_c[cid]
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
            self.mode_c == MODE_RAW, 1 + n_c * itemsize, self.counts_c + sparse_c + data_c
        )

    def get(self, index: torch.Tensor) -> torch.Tensor:
        """Payload bytes at ``index`` (clamped into the payload) as int64."""
        return self._buf[index.clamp(0, self._buf.numel() - 1)].long()

    def exponents(self) -> torch.Tensor:
        """pw_rel: each block's step exponent."""
        lay = self._lay
        at = self.base + bl.exp_at(lay.blocks_c[lay.chunk_id], lay.local)
        return bl.exp_value(self.get(at), self.get(at + 1))

    def bad_chunks(self, bad_head: torch.Tensor, len_c: torch.Tensor) -> torch.Tensor:
        """Per chunk: its length is not what its blocks need, its mode is unknown, or a
        block of a blocks-mode chunk is bad (``bad_head``)."""
        mode_c, lay = self.mode_c, self._lay
        bad = (self.need_c != len_c) | ((mode_c != MODE_RAW) & (mode_c != MODE_BLOCKS))
        return bad | (lay.per_chunk((bad_head & (mode_c[lay.chunk_id] == MODE_BLOCKS)).long()) > 0)


def carry_in(lay: BlockGrid, is_delta, raw, total, last) -> torch.Tensor:
    """Per block: the code before its first value, which delta blocks add their codes
    to: a segmented scan over blocks. ``total``: a delta block's sum of codes, ``last``:
    a direct block's last code; a chunk's first block and a raw block reset it to 0."""
    tsum = torch.where(is_delta, total, 0)
    reset = ~is_delta
    first = lay.local == 0
    S = torch.cumsum(tsum, 0)
    anchor_val = torch.where(reset & ~raw, last, 0)
    anchor_S = torch.where(reset, S, S - tsum)
    mi = last_marked(reset | first)
    q_last = anchor_val[mi] + S - anchor_S[mi]
    return torch.where(first, 0, torch.cat([q_last.new_zeros(1), q_last[:-1]]))


class _Plan:
    """Every block's packing, chosen from its codes ``v`` (the encoder's second half):
    header byte, the codes to emit, count byte, index and data bytes (int64 tensors,
    per block)."""

    def __init__(self, xb, v, valid, bad, lay: BlockGrid, itemsize: int):
        m = lay.valid
        zero = torch.zeros_like(v)
        # direct codes decide raw blocks (from the block alone)
        neg_d = (v < 0).any(1)
        code_d = torch.where(neg_d[:, None], zigzag(v), v)
        w_d = bit_width(code_d.amax(1))
        self.raw = raw = bad | ((m * w_d + 7) // 8 > m * itemsize)
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
        tab = Tables.on(v.device)
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
        self.is_sparse = is_sparse = (choice % 2 == 1) & ~raw
        self.width = width = torch.where(is_delta, w_l, w_d)
        head = width | torch.where(torch.where(is_delta, neg_l, neg_d), SIGNED, 0)
        head = head | torch.where(is_sparse, SPARSE, 0) | torch.where(is_delta, DELTA, 0)
        # raw blocks: one value when all their values have the same bits
        ints = xb.view(int_view(xb.dtype))
        same = ((ints == ints[:, :1]) | ~valid).all(1)
        self.head = torch.where(raw, RAW_WIDTH | torch.where(same, SPARSE, 0), head)
        self.raw_size = torch.where(same, itemsize, m * itemsize)
        self.nnz = torch.where(is_sparse, torch.where(is_delta, nz_l, nz_d), 0)
        is_delta = is_delta & ~raw
        self.codes = torch.where(is_delta[:, None], code_l, code_d)
        emit = torch.where(is_sparse[:, None], torch.where(is_delta[:, None], d, v) != 0, valid)
        self.emit = emit & ~raw[:, None]
        self._index(tab, m, costs.gather(0, choice[None]).squeeze(0))

    def _index(self, tab: Tables, m, best) -> None:
        """Sparse blocks: count byte and index (kernels/positions.py); every block's data
        bytes (``best``: those of its packing, if not raw)."""
        emit, nnz, is_sparse = self.emit, self.nnz, self.is_sparse
        high = emit[:, ps.HALF :].sum(1)
        ranked = is_sparse & (nnz <= ps.RANK_MAX)
        self.code_sp = torch.where(ranked, nnz * (nnz + 1) // 2 + high, ps.MASK_BASE + nnz)
        a = torch.where(ranked, high, -1)
        self.ibits = torch.where(is_sparse, tab.index_bits(m, nnz, a), 0)
        mask = (torch.where(emit, 1, 0) << _arange64(emit.device)).sum(1)
        nlo = tab.half_bits[m.clamp(max=ps.HALF), (nnz - high).clamp(0, ps.HALF)]
        ival = tab.rank(emit[:, : ps.HALF]) | (tab.rank(emit[:, ps.HALF :]) << nlo)
        self.ival = torch.where(ranked, ival, mask)
        sparse_size = (nnz * self.width + self.ibits + 7) // 8
        self.dsize = torch.where(self.raw, self.raw_size, torch.where(is_sparse, sparse_size, best))

    def chunk_sizes(self, lay: BlockGrid, pw: bool, itemsize: int):
        """(per chunk: payload bytes, whether it is stored raw: when its blocks would not
        be smaller than its values); keeps each block's offsets in its chunk."""
        self.counts_c = bl.counts_at(lay.blocks_c, pw)
        self.sp_rank, self.sparse_c = lay.ranks(self.is_sparse.long())
        self.d_rank, data_c = lay.ranks(self.dsize)
        size_c = self.counts_c + self.sparse_c + data_c
        raw_c = size_c >= 1 + lay.elems_c * itemsize
        return torch.where(raw_c, 1 + lay.elems_c * itemsize, size_c), raw_c


def encode(t: torch.Tensor, chunk_elems: int, pw: bool, tol: float, step: float, inv: float):
    """Payloads of all chunks of the flattened C-contiguous ``t``: (uint8 tensor, lengths)."""
    dev = t.device
    flat = t.reshape(-1)
    n = flat.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.uint8, device=dev), []
    lay = BlockGrid(n, chunk_elems, dev)
    xb = lay.to_blocks(flat)
    v, valid, bad, k = _quantize(xb, lay, t.dtype, pw, tol, step, inv)
    p = _Plan(xb, v, valid, bad, lay, t.element_size())
    size_c, raw_c = p.chunk_sizes(lay, pw, t.element_size())
    # the one host sync: sizes, which chunks are raw, whether any block is raw
    nch = lay.nchunks
    host = torch.cat([size_c, raw_c.long(), p.raw.any().long()[None]]).tolist()
    lengths, raw_chunks, any_raw = host[:nch], host[nch : 2 * nch], host[-1]
    total = sum(lengths)
    start_c = torch.cumsum(size_c, 0) - size_c
    words = torch.zeros(total // 8 + 2, dtype=torch.int64, device=dev)
    _write_blocks(words, p, xb, k, lay, pw, start_c, raw_c, any_raw)
    out = words.view(torch.uint8)
    st = 0
    for c in range(nch):  # raw chunks: a mode byte and the values as they are
        if raw_chunks[c]:
            s0 = c * lay.chunk_elems
            src = flat[s0 : s0 + lay.chunk_elems_of(c)].contiguous().view(torch.uint8)
            out[st + 1 : st + 1 + src.numel()] = src
        st += lengths[c]
    return out[:total], lengths


def _write_blocks(words, p: _Plan, xb, k, lay: BlockGrid, pw, start_c, raw_c, any_raw) -> None:
    """Every chunk's mode byte and its blocks' bytes (raw chunks: the mode byte only) into
    the int64 ``words`` (zeros, 16 bytes past the payloads)."""
    out = words.view(torch.uint8)
    dump = out.numel() - 1  # writes of raw chunks' blocks land here and are cut off
    cid = lay.chunk_id
    keep = ~raw_c[cid]
    base = start_c[cid]

    def put(index, values):
        out.index_put_((torch.where(keep.view(-1, *[1] * (index.dim() - 1)), index, dump),), values)

    out[start_c] = torch.where(raw_c, MODE_RAW, MODE_BLOCKS).to(torch.uint8)
    put(base + bl.head_at(lay.local), p.head.to(torch.uint8))
    if pw:
        kk = torch.where(p.raw, 0, k)
        at = base + bl.exp_at(lay.blocks_c[cid], lay.local)
        put(at, bl.exp_lo(kk).to(torch.uint8))
        put(at + 1, bl.exp_hi(kk).to(torch.uint8))
    # sparse blocks: a count byte each; then the block data
    count_start = base + p.counts_c[cid]
    put(torch.where(p.is_sparse, count_start + p.sp_rank, dump), p.code_sp.to(torch.uint8))
    emit = p.emit & keep[:, None]
    doff = p.d_rank + count_start + p.sparse_c[cid]
    if any_raw:  # raw blocks: their bytes as they are
        nbytes = BLOCK * xb.element_size()
        j = torch.arange(nbytes, device=xb.device)
        ok = p.raw[:, None] & (j[None, :] < p.raw_size[:, None])
        put(
            torch.where(ok, doff[:, None] + j, dump),
            xb.contiguous().view(torch.uint8).view(-1, nbytes),
        )
    width = p.width[:, None]
    rank = torch.where(p.is_sparse[:, None], torch.cumsum(emit.long(), 1) - 1, _arange64(xb.device))
    scatter_bits(words, doff[:, None] * 8 + rank * width, p.codes, width, emit)
    # each sparse block's index right after its codes
    scatter_bits(words, doff * 8 + p.nnz * p.width, p.ival, p.ibits, p.is_sparse & keep)


def decode(payload: torch.Tensor, lengths: list, n: int, chunk_elems: int, dtype, pw, step):
    """The ``n`` values (flattened) of the chunk payloads concatenated in ``payload``.

    Raises ValueError when a payload is inconsistent with its length.
    """
    dev = payload.device
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if n == 0:
        return torch.zeros(0, dtype=dtype, device=dev)
    lay = BlockGrid(n, chunk_elems, dev)
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
    k = p.exponents() if pw else None
    emit, raw_chunks = _check(p, words, lay, k, len_c)
    width, raw, m = p.width, p.raw, lay.valid
    rank = torch.where(p.is_sparse[:, None], torch.cumsum(emit.long(), 1) - 1, _arange64(dev))
    c = extract_bits(words, p.doff[:, None] * 8 + rank * width[:, None], width[:, None], emit)
    c = torch.where((p.head & SIGNED != 0)[:, None] & ~raw[:, None], (c >> 1) ^ -(c & 1), c)
    # running values behind delta blocks
    is_delta = (p.head & DELTA != 0) & ~raw
    cs = torch.cumsum(c, 1)
    carry = carry_in(lay, is_delta, raw, cs[:, -1], c.gather(1, (m - 1)[:, None]).squeeze(1))
    q = torch.where(is_delta[:, None], carry[:, None] + cs, c)
    bstep = pow2(torch.where(raw, 0, k))[:, None] if pw else step
    vals = to_storage(q.to(torch.float64) * bstep, dtype).to(dtype)
    if bool(raw.any()):  # raw blocks: their bytes, or one value's repeated
        rid = torch.nonzero(raw).view(-1)
        nbytes = BLOCK * itemsize
        j = torch.arange(nbytes, device=dev)
        doff = p.doff[rid, None]
        src = torch.where(p.same[rid, None], doff + j % itemsize, doff + j)
        vals = vals.contiguous()
        vals.view(torch.uint8).view(-1, nbytes)[rid] = buf[src.clamp(0, total - 1)]
    flat = lay.from_blocks(vals)
    if any(raw_chunks):  # raw chunks: their values as they are
        flat = flat.clone()
        st = 0
        for ch in range(nch):
            if raw_chunks[ch]:
                s0, cnt = ch * chunk_elems, lay.chunk_elems_of(ch)
                flat[s0 : s0 + cnt] = buf[st + 1 : st + 1 + cnt * itemsize].clone().view(dtype)
            st += lengths[ch]
    return flat


def _check(p: BlockFields, words, lay: BlockGrid, k, len_c) -> tuple[torch.Tensor, list]:
    """(per block: where its codes sit among its 64 values, per chunk: whether it is
    stored raw); raises ValueError for a chunk in an unknown mode or inconsistent with
    its length, its header bytes or its index (``k``: pw_rel step exponents, or None)."""
    tab = Tables.on(words.device)
    width, raw, m, cnt_sp = p.width, p.raw, lay.valid, p.cnt_sp
    mask, bad_index = sparse_masks(
        tab, words, p.doff * 8 + cnt_sp * width, p.ibits, m, cnt_sp, p.high
    )
    pos = _arange64(words.device)
    mbits = ((mask[:, None] >> pos) & 1) == 1
    valid = pos[None, :] < m[:, None]
    bad_head = ~raw & (width > bl.MAX_WIDTH) | raw & (p.head & (SIGNED | DELTA) != 0)
    bad_sparse = (cnt_sp < 1) | (cnt_sp > m) | (mbits.sum(1) != cnt_sp) | bad_index
    bad_head = bad_head | p.is_sparse & (bad_sparse | (mbits & ~valid).any(1))
    if k is not None:
        bad_head = bad_head | ~raw & ((k < bl.EXP_MIN) | (k > bl.EXP_MAX))
    nch = lay.nchunks
    bad_c = p.bad_chunks(bad_head, len_c)
    check = torch.cat([bad_c.long(), p.mode_c]).tolist()  # the host sync: validity and modes
    bl.check_modes(check[nch:])
    if any(check[:nch]):
        raise ValueError("block payload is inconsistent (corrupted or truncated)")
    emit = torch.where(p.is_sparse[:, None], mbits, valid) & ~raw[:, None]
    return emit, [md == MODE_RAW for md in check[nch:]]

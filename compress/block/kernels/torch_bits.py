"""Bit fields and the sparse blocks' index of the ``block`` codec in torch tensor ops.

``kernels/block_torch.py``'s helpers for the parts of the layout that are not whole
bytes: codes packed LSB first at any bit offset (into or out of int64 words) and
each sparse block's index (kernels/positions.py's ranks of each half's positions,
or a mask), for all blocks at once.
"""

from __future__ import annotations

import torch

from . import positions as ps


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
    1-d tensor on one CUDA block (see ``python -m tensorpress.compress.block.kernels.cuda``
    for the decoder's throughput on a GPU)."""
    count = torch.cumsum(mark.long(), 0)
    return torch.searchsorted(count, count)


def scatter_bits(words, bitpos, values, width, where):
    """OR ``values`` (``width`` bits each) into int64 ``words`` at ``bitpos`` where ``where``."""
    zero = torch.zeros_like(bitpos)
    val = torch.where(where, values, zero)
    widx = torch.where(where, bitpos >> 6, zero)
    shift = bitpos & 63
    words.scatter_add_(0, widx.reshape(-1), (val << shift).reshape(-1))
    spill = where & (shift + width > 64)
    hi = torch.where(spill, (val >> (64 - shift).clamp(max=63)) & ((1 << shift) - 1), zero)
    words.scatter_add_(0, (widx + 1).reshape(-1), hi.reshape(-1))


def extract_bits(words, bitpos, width, where):
    """The ``width``-bit values at ``bitpos`` in int64 ``words`` (0 where not ``where``)."""
    widx = torch.where(where, bitpos >> 6, 0).clamp(0, words.numel() - 2)
    shift = bitpos & 63
    lo = (words[widx] >> shift) & torch.where(shift == 0, -1, (1 << (64 - shift).clamp(max=63)) - 1)
    hi = torch.where(shift == 0, 0, words[widx + 1] << (64 - shift).clamp(max=63))
    width = torch.as_tensor(width)
    wmask = torch.where(width >= 64, -1, (1 << width.clamp(max=63)) - 1)
    return torch.where(where, (lo | hi) & wmask, 0)


def sparse_masks(tab, words, bitpos, ibits, m, cnt, high):
    """(uint64 masks of the sparse blocks' non-zero codes from their indexes at bit
    ``bitpos``, whether an index is inconsistent), per block (kernels/positions.py)."""
    is_sparse = cnt > 0
    ival = extract_bits(words, bitpos, ibits, is_sparse)
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

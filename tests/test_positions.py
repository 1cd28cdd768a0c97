"""Where a sparse ``block`` block's non-zero codes sit: count bytes, ranks of the two
halves' positions, masks (compress/kernels/positions.py), and the torch twins."""

import math
from itertools import combinations

import numpy as np
import pytest
import torch
from tensorpress.compress.block.kernels import positions as ps
from tensorpress.compress.block.kernels.torch_codec import Tables


def _mask(positions) -> np.uint64:
    return np.uint64(sum(1 << p for p in positions))


def test_count_bytes_name_each_count_and_split_once():
    seen = {}
    for k in range(1, 65):
        for a in range(k + 1) if k <= ps.RANK_MAX else [-1]:
            code = ps.count_code(k, max(a, 0))
            assert 0 < code < 256 and code not in seen
            seen[code] = (k, a)
            assert (ps.CODE_COUNT[code], ps.CODE_HIGH[code]) == (k, a)
    for code in set(range(256)) - set(seen):  # 0 and the tail name nothing
        assert ps.CODE_COUNT[code] == 0


def test_small_table_holds_every_set_of_up_to_three_positions():
    for i in range(ps.TAIL + 1):
        got = {int(ps.SMALL[ps.SMALL_BASE[i] + r]) for r in range(math.comb(32, i))}
        assert got == {int(_mask(c)) for c in combinations(range(32), i)}


@pytest.mark.parametrize("m", [64, 63, 50, 33, 32, 20, 1])
def test_index_round_trip(m):
    rng = np.random.default_rng(m)
    sets = [[0], [m - 1], list(range(min(m, ps.RANK_MAX)))]
    sets += [sorted(rng.choice(m, k, replace=False).tolist()) for k in range(1, m + 1)] * 3
    if m > 32:  # all in the second half
        sets.append(list(range(32, min(m, 32 + ps.RANK_MAX))))
    for positions in sets:
        mask = _mask(positions)
        code, value, bits = ps.encode_index(mask, m)
        k, a = len(positions), sum(p >= 32 for p in positions)
        assert code == ps.count_code(k, a)
        assert bits == ps.index_bits(m, k, a if k <= ps.RANK_MAX else -1)
        assert int(value) < 2**bits or bits == 64
        assert bits <= ps.cost_bits(m, k) or m < 64  # what the encoder counted
        back, ok = ps.decode_index(np.uint64(value), code, m)
        assert ok and back == mask, positions


def test_ranks_past_their_range_are_refused():
    b, a = 2, 1
    code = ps.count_code(b + a, a)
    nlo = int(ps.HALF_BITS[32, b])
    for rlo, rhi in [(math.comb(32, b), 0), (0, math.comb(18, a))]:
        value = np.uint64(rlo | (rhi << nlo))
        assert not ps.decode_index(value, code, 50)[1]
    assert ps.decode_index(np.uint64(0), ps.count_code(10, 9), 40)[1] is False  # 9 > 8
    assert not ps.decode_index(_mask(range(19)), ps.MASK_BASE + 20, 64)[1]  # 19 bits, not 20
    assert not ps.decode_index(np.uint64(0), 0, 64)[1]


def test_cost_bits_cover_every_split():
    for k in range(1, ps.RANK_MAX + 1):
        for a in range(k + 1):
            assert ps.index_bits(64, k, a) <= ps.cost_bits(64, k)
        assert ps.cost_bits(64, k) < 64


def test_torch_tables_rank_and_unrank_as_the_kernels():
    rng = np.random.default_rng(3)
    tab = Tables.on("cpu")
    rows, counts, ranks = [], [], []
    for _ in range(400):
        i = int(rng.integers(0, ps.RANK_MAX + 1))
        pos = sorted(rng.choice(32, i, replace=False).tolist())
        rows.append([p in pos for p in range(32)])
        counts.append(i)
        ranks.append(ps.rank_half(_mask(pos), i))
    where = torch.tensor(rows)
    assert tab.rank(where).tolist() == ranks
    masks = tab.unrank(torch.tensor(ranks), torch.tensor(counts))
    assert masks.tolist() == [int(_mask(np.flatnonzero(r))) for r in rows]

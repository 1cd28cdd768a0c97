"""``sz``'s candidate cost: counts taken once give ``huffman_encode``'s stream, byte for
byte; the cost is that of the codes shifted down to the smallest, within a few bytes of
the stream of the codes themselves (only the first symbol's gap in the header differs)."""

import numpy as np
import pytest
from tensorpress.compress.sz import steps as sz_steps
from tensorpress.compress.sz.huffman import huffman_encode
from tensorpress.compress.zstd import zstd_compress


def _reference_bits(codes: np.ndarray) -> float:
    bits = sz_steps.huffman_bits(codes)
    if bits < sz_steps._ZSTD_BELOW * codes.size:
        return 8.0 * len(zstd_compress(huffman_encode(codes), 1))
    return bits


@pytest.mark.parametrize("n", [1, 2, 100, 4096, 70000])
@pytest.mark.parametrize("spread", [0.0, 0.3, 2.0, 40.0, 3000.0])
def test_stream_and_cost_match_the_coder(n, spread):
    rng = np.random.default_rng(n + int(spread * 10))
    codes = np.clip(np.rint(32768 + spread * rng.standard_normal(n)), 0, 65535).astype(np.uint16)
    codes[rng.random(n) < 0.01] = 0  # outliers
    assert huffman_encode(codes, hist=np.bincount(codes)) == huffman_encode(codes)
    _assert_cost(codes)


def _assert_cost(codes):
    cost = sz_steps.code_bits(codes)
    assert cost == _reference_bits(codes - codes.min())
    assert abs(cost - _reference_bits(codes)) <= 64


def test_empty_and_constant_codes():
    assert sz_steps.code_bits(np.zeros(0, np.uint16)) == 0.0
    codes = np.full(1000, 32768, np.uint16)  # one distinct code: no bitstream
    _assert_cost(codes)

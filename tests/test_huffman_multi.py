"""Tests of the Huffman decoders with second tables for long codes (up to three codes a
lookup at low rates, one at high rates): the same symbols as the stream holds, in one
piece or many, and damaged streams raise."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorpress.compress.sz.huffman import HuffmanDecoder, huffman_decode, huffman_encode


def _low_rate(rng, n, p_zero, tail):
    """Mostly one symbol, with a geometric tail of ``tail`` distinct rarer ones (long
    codes beyond the first table's 12 bits when ``n`` is large)."""
    x = np.full(n, 32768, np.uint16)
    rare = rng.random(n) >= p_zero
    x[rare] = 32768 + np.minimum(rng.geometric(0.5, int(rare.sum())), tail).astype(np.uint16)
    return x


def _bits_per_code(buf, count):
    nbits = int(np.frombuffer(buf, "<u8", 1, 4)[0])
    return nbits / count


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 30_000),
    p_zero=st.floats(0.3, 0.9999),
    tail=st.integers(1, 40),
    pieces=st.lists(st.integers(0, 30_000), max_size=6),
)
def test_low_rate_streams_round_trip_in_pieces(seed, n, p_zero, tail, pieces):
    rng = np.random.default_rng(seed)
    x = _low_rate(rng, n, p_zero, tail)
    buf = huffman_encode(x)
    np.testing.assert_array_equal(huffman_decode(buf, n), x)
    decoder = HuffmanDecoder(buf, n)
    for stop in sorted(pieces):
        decoder.decode_to(stop)
        k = min(stop, n)
        np.testing.assert_array_equal(decoder.symbols[:k], x[:k])
    np.testing.assert_array_equal(decoder.finish(), x)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 30_000),
    scale=st.floats(8.0, 5000.0),
    pieces=st.lists(st.integers(0, 30_000), max_size=6),
)
def test_high_rate_streams_round_trip_in_pieces(seed, n, scale, pieces):
    rng = np.random.default_rng(seed)
    x = np.clip(32768 + np.rint(rng.laplace(0, scale, n)), 0, 65535).astype(np.uint16)
    buf = huffman_encode(x)
    decoder = HuffmanDecoder(buf, n)
    for stop in sorted(pieces):
        decoder.decode_to(stop)
        k = min(stop, n)
        np.testing.assert_array_equal(decoder.symbols[:k], x[:k])
    np.testing.assert_array_equal(decoder.finish(), x)


def test_high_rate_long_codes_and_damage():
    rng = np.random.default_rng(5)
    x = np.clip(32768 + np.rint(rng.laplace(0, 400.0, 300_000)), 0, 65535).astype(np.uint16)
    buf = huffman_encode(x)
    n = np.unique(x).size
    assert _bits_per_code(buf, x.size) > 6
    assert np.frombuffer(buf, np.uint8, n, 12 + 2 * n).max() > 12  # past the first table
    np.testing.assert_array_equal(huffman_decode(buf, x.size), x)
    with pytest.raises(ValueError):
        huffman_decode(buf[:-1], x.size)
    with pytest.raises(ValueError):
        huffman_decode(buf, x.size + 1)
    b = bytearray(buf)
    b[len(b) // 2] ^= 0x5A  # a flip inside the bitstream: other symbols or an error
    try:
        y = huffman_decode(bytes(b), x.size)
    except ValueError:
        pass
    else:
        assert not np.array_equal(y, x)


@pytest.mark.parametrize("p_zero", [0.5, 0.8, 0.95])
def test_long_codes_at_low_rates(p_zero):
    # a long geometric tail: codes up to the 24-bit limit behind a short dominant one
    rng = np.random.default_rng(7)
    x = _low_rate(rng, 400_000, p_zero, 60)
    x[rng.integers(0, x.size, 50)] = rng.integers(0, 65536, 50).astype(np.uint16)
    buf = huffman_encode(x)
    assert _bits_per_code(buf, x.size) <= 4
    lengths = np.frombuffer(buf, np.uint8, np.unique(x).size, 12 + 2 * np.unique(x).size)
    assert lengths.max() > 12  # past the first table
    np.testing.assert_array_equal(huffman_decode(buf, x.size), x)


def test_streams_near_the_kernel_switch():
    # mean code lengths around 4 bits: either decoder, the same symbols
    rng = np.random.default_rng(3)
    for scale in (1.0, 1.5, 2.0, 2.5, 3.0):
        x = (32768 + np.rint(rng.laplace(0, scale, 100_003))).astype(np.uint16)
        buf = huffman_encode(x)
        np.testing.assert_array_equal(huffman_decode(buf, x.size), x)


def test_low_rate_damage_raises_or_stays_in_bounds():
    rng = np.random.default_rng(11)
    x = _low_rate(rng, 20_000, 0.9, 30)
    buf = huffman_encode(x)
    assert _bits_per_code(buf, x.size) <= 4
    with pytest.raises(ValueError):
        huffman_decode(buf[:-1], x.size)
    with pytest.raises(ValueError):
        huffman_decode(buf, x.size + 1)
    with pytest.raises(ValueError):  # the same bits cannot hold more codes
        huffman_decode(buf, 2 * x.size)
    raised = 0
    for _ in range(200):
        b = bytearray(buf)
        b[int(rng.integers(12 + 3 * 31, len(b)))] ^= int(rng.integers(1, 256))
        try:
            y = huffman_decode(bytes(b), x.size)
        except ValueError:
            raised += 1
        else:
            assert y.shape == x.shape
    assert raised > 50

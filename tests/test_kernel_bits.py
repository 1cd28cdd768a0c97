"""The bit-level primitives of the numba kernels, against plain Python."""

import numpy as np
import pytest
from numba import njit
from tensorpress.compress.block.codec import steps_for
from tensorpress.compress.block.kernels import cpu as kb
from tensorpress.compress.block.kernels.bits import (
    copy_bytes,
    get_bits,
    load_u64,
    popcount,
    put_bits,
    store_u64,
    trailing_zeros,
)
from tensorpress.compress.block.kernels.layout import MODE_BLOCKS
from tensorpress.compress.kernels.rounding import PREC_FLOAT32


@njit(cache=True)
def _bit_counts(values):
    """(trailing zeros, popcount) of each value, from the kernels' own primitives."""
    zeros = np.empty(values.size, np.int64)
    ones = np.empty(values.size, np.int64)
    for i in range(values.size):
        zeros[i] = trailing_zeros(values[i])
        ones[i] = popcount(values[i])
    return zeros, ones


@njit(cache=True)
def _copy(dst, at, src, start, n):
    copy_bytes(dst, at, src, start, n)


@njit(cache=True)
def _load_all(buf, count):
    out = np.empty(count, np.uint64)
    for i in range(count):
        out[i] = load_u64(buf, i)
    return out


@njit(cache=True)
def _store(buf, idx, value):
    store_u64(buf, idx, value)


def test_trailing_zeros_of_every_single_bit_and_mixtures():
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            np.uint64(1) << np.arange(64, dtype=np.uint64),
            rng.integers(1, 2**63, 200, dtype=np.uint64)
            << rng.integers(0, 8, 200).astype(np.uint64),
        ]
    )
    want = [(int(v) & -int(v)).bit_length() - 1 for v in values]
    assert _bit_counts(values)[0].tolist() == want


def test_popcount_against_python():
    rng = np.random.default_rng(2)
    values = np.concatenate(
        [np.array([0, 1, 2**64 - 1], np.uint64), rng.integers(0, 2**64, 300, dtype=np.uint64)]
    )
    assert _bit_counts(values)[1].tolist() == [bin(int(v)).count("1") for v in values]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 23])
def test_copy_bytes_copies_exactly_n(n):
    src = np.random.default_rng(n).integers(0, 256, 40, dtype=np.uint8)
    dst = np.full(40, 0xAB, np.uint8)
    _copy(dst, 3, src, 5, n)
    want = np.full(40, 0xAB, np.uint8)
    want[3 : 3 + n] = src[5 : 5 + n]
    assert np.array_equal(dst, want)


def test_load_u64_reads_little_endian_at_any_offset():
    buf = np.random.default_rng(1).integers(0, 256, 40, dtype=np.uint8)
    got = _load_all(buf, buf.size - 7)
    want = [int.from_bytes(buf[i : i + 8].tobytes(), "little") for i in range(buf.size - 7)]
    assert [int(v) for v in got] == want


@pytest.mark.parametrize("idx", [0, 1, 5, 8, 13])
def test_store_u64_writes_exactly_eight_little_endian_bytes(idx):
    buf = np.full(24, 0xAB, np.uint8)
    value = 0xF102030405060708
    _store(buf, idx, np.uint64(value))
    want = np.full(24, 0xAB, np.uint8)
    want[idx : idx + 8] = np.frombuffer(value.to_bytes(8, "little"), np.uint8)
    assert np.array_equal(buf, want)


def test_block_encoder_refuses_a_short_scratch():
    x = np.linspace(0, 1, 100, dtype=np.float32)
    step, inv = steps_for(0.01)
    out = np.empty(1 + 12 * 2 + x.nbytes, np.uint8)
    with pytest.raises(ValueError, match="scratch"):
        kb.encode_chunk(
            x,
            x.view(np.uint8),
            4,
            PREC_FLOAT32,
            False,
            0.01,
            step,
            inv,
            np.empty(x.nbytes + 7, np.uint8),
            out,
        )


def test_block_decoder_refuses_a_short_scratch_and_ignores_what_it_held():
    x = np.linspace(0, 1, 100, dtype=np.float32)
    step, inv = steps_for(0.01)
    out = np.empty(1 + 12 * 2 + x.nbytes, np.uint8)
    data = np.empty(x.nbytes + 8, np.uint8)
    size = kb.encode_chunk(x, x.view(np.uint8), 4, PREC_FLOAT32, False, 0.01, step, inv, data, out)
    payload = out[:size].copy()
    payload[0] = MODE_BLOCKS

    def decode(pad):
        y = np.empty_like(x)
        assert kb.decode_chunk(
            payload, x.size, 4, PREC_FLOAT32, False, step, y, y.view(np.uint8), pad
        )
        return y

    with pytest.raises(ValueError, match="scratch"):
        decode(np.empty(size + 7, np.uint8))
    # a reused scratch holds old bytes: they must not matter
    decoded = [decode(np.full(size + 64, fill, np.uint8)) for fill in (0x00, 0xFF)]
    assert np.array_equal(decoded[0], decoded[1])
    assert np.max(np.abs(decoded[0] - x)) <= 0.01


@njit(cache=True)
def _put_get(buf, at, bit, v, nbits):
    put_bits(buf, at, bit, v, nbits)
    return get_bits(buf, at, bit, nbits)


def test_put_bits_writes_any_width_at_any_bit_and_keeps_the_bits_below():
    rng = np.random.default_rng(11)
    for _ in range(2000):
        at, bit, nbits = int(rng.integers(0, 8)), int(rng.integers(0, 80)), int(rng.integers(0, 65))
        v = int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2)) & ((1 << nbits) - 1)
        buf = rng.integers(0, 256, 40).astype(np.uint8)
        before = int.from_bytes(buf.tobytes(), "little")
        got = _put_get(buf, at, bit, np.uint64(v), nbits)
        after = int.from_bytes(buf.tobytes(), "little")
        start = 8 * at + bit
        assert int(got) == v
        assert after & ((1 << start) - 1) == before & ((1 << start) - 1)  # below: kept
        assert (after >> start) & ((1 << nbits) - 1) == v

"""Tests of the canonical Huffman coder (tensorpress.compress.huffman)."""

import heapq
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tensorpress.compress.sz.huffman import (
    MAX_CODE_LEN,
    code_lengths,
    huffman_decode,
    huffman_encode,
)
from tensorpress.compress.sz.kernels.huffman import huffman_depths

RNG_SEED = 20240611


def _laplace(rng, n, scale, center=32768):
    x = center + np.round(rng.laplace(0.0, scale, n))
    return np.clip(x, 0, 65535).astype(np.uint16)


def _fib_symbols(k):
    """Symbols 0..k-1 where symbol i occurs fib(i+1) times (1, 1, 2, 3, 5, ...)."""
    fib = [1, 1]
    while len(fib) < k:
        fib.append(fib[-1] + fib[-2])
    x = np.repeat(np.arange(k, dtype=np.uint16), fib)
    np.random.default_rng(RNG_SEED).shuffle(x)
    return x


def _header(buf):
    """(n, nbits, symbols, lengths) parsed from a stream."""
    n, nbits = struct.unpack_from("<IQ", buf)
    gaps = np.frombuffer(buf, dtype="<u2", count=n, offset=12).astype(np.int64)
    syms = np.cumsum(gaps + 1) - 1
    lengths = np.frombuffer(buf, dtype=np.uint8, count=n, offset=12 + 2 * n)
    return n, nbits, syms, lengths


def _kraft_units(lengths, max_len):
    return int(sum(1 << (max_len - int(x)) for x in lengths))


def _reference_cost(freqs):
    """Total coded bits of an optimal (unlimited) Huffman code, via heapq."""
    heap = [int(f) for f in freqs]
    heapq.heapify(heap)
    cost = 0
    while len(heap) > 1:
        s = heapq.heappop(heap) + heapq.heappop(heap)
        cost += s
        heapq.heappush(heap, s)
    return cost


def _cases():
    rng = np.random.default_rng(RNG_SEED)
    every = np.concatenate([np.arange(65536), rng.integers(0, 65536, 50_000)])
    rng.shuffle(every)
    return {
        "empty": np.zeros(0, dtype=np.uint16),
        "count1": np.array([12345], dtype=np.uint16),
        "single_symbol": np.full(10_000, 32768, dtype=np.uint16),
        "single_symbol_zero": np.zeros(77, dtype=np.uint16),
        "two_symbols": rng.choice(np.array([0, 65535], dtype=np.uint16), 5000),
        "two_symbols_skewed": np.where(rng.random(4000) < 0.999, 7, 8).astype(np.uint16),
        "uniform_few": rng.integers(32760, 32770, 20_000).astype(np.uint16),
        "uniform_many": rng.integers(0, 5000, 100_000).astype(np.uint16),
        "laplace": _laplace(rng, 200_000, 1.5),
        "laplace_wide": _laplace(rng, 200_000, 300.0),
        "geometric": (rng.geometric(0.3, 100_000) + 32767).astype(np.uint16),
        "low_entropy": np.where(
            rng.random(100_000) < 0.95, 32768, _laplace(rng, 100_000, 2.0)
        ).astype(np.uint16),
        "all_65536": every.astype(np.uint16),
        "fibonacci": _fib_symbols(27),
    }


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip(name):
    x = CASES[name]
    buf = huffman_encode(x)
    assert isinstance(buf, bytes)
    y = huffman_decode(buf, x.shape[0])
    assert y.dtype == np.uint16 and y.shape == x.shape
    np.testing.assert_array_equal(y, x)
    n, nbits, syms, lengths = _header(buf)
    np.testing.assert_array_equal(syms, np.unique(x))
    assert len(buf) == 12 + 3 * n + (nbits + 7) // 8
    if n >= 2:
        assert 1 <= lengths.min() and lengths.max() <= MAX_CODE_LEN
        assert _kraft_units(lengths, MAX_CODE_LEN) == 1 << MAX_CODE_LEN


def test_empty_and_single_symbol_layout():
    assert huffman_encode(np.zeros(0, np.uint16)) == struct.pack("<IQ", 0, 0)
    buf = huffman_encode(np.full(1000, 513, np.uint16))
    assert buf == struct.pack("<IQHB", 1, 0, 513, 0)
    np.testing.assert_array_equal(huffman_decode(buf, 3), [513, 513, 513])


def test_byte_layout_pinned():
    # freqs: 1 -> 4, 2 -> 2, 3 -> 1: lengths 1, 2, 2; canonical codes 0, 10, 11.
    x = np.array([1, 1, 1, 1, 2, 2, 3], dtype=np.uint16)
    # bits in order 0 0 0 0 1 0 1 0 1 1, packed from bit 0 of byte 0
    expected = struct.pack("<IQ", 3, 10) + struct.pack("<3H", 1, 0, 0) + bytes([1, 2, 2, 0x50, 3])
    assert huffman_encode(x) == expected
    np.testing.assert_array_equal(huffman_decode(expected, 7), x)


def test_input_buffer_types():
    x = CASES["laplace"][:5000]
    buf = huffman_encode(x)
    arr = np.frombuffer(buf, dtype=np.uint8)
    for b in (buf, bytearray(buf), memoryview(buf), arr, arr.copy()):
        np.testing.assert_array_equal(huffman_decode(b, x.shape[0]), x)


def test_non_contiguous_input_and_determinism():
    x = CASES["laplace"]
    strided = np.repeat(x, 2)[::2]
    assert not strided.flags.c_contiguous
    assert huffman_encode(strided) == huffman_encode(x) == huffman_encode(x.copy())


def test_bad_input_types():
    with pytest.raises(TypeError):
        huffman_encode(np.arange(10, dtype=np.int32))
    with pytest.raises(TypeError):
        huffman_encode(np.zeros((2, 2), dtype=np.uint16))
    with pytest.raises(TypeError):
        huffman_decode(np.zeros(12, dtype=np.int16), 0)


def test_threads_give_same_bytes():
    chunks = [CASES["laplace"][i::4].copy() for i in range(4)]
    with ThreadPoolExecutor(2) as ex:
        bufs = list(ex.map(huffman_encode, chunks))
        outs = list(ex.map(huffman_decode, bufs, [c.shape[0] for c in chunks]))
    for c, b, o in zip(chunks, bufs, outs, strict=True):
        assert b == huffman_encode(c)
        np.testing.assert_array_equal(o, c)


# --- code lengths -------------------------------------------------------------


def test_fibonacci_needs_and_gets_length_limit():
    fib = [1, 1]
    while len(fib) < 40:
        fib.append(fib[-1] + fib[-2])
    free = code_lengths(np.array(fib), max_len=64)
    assert free.max() == 39  # unlimited Huffman: a chain of depth n - 1
    for limit in (24, 16, 8, 6):
        lengths = code_lengths(np.array(fib), max_len=limit)
        assert lengths.max() == limit
        assert _kraft_units(lengths, limit) == 1 << limit


def test_fibonacci_round_trip_is_limited():
    x = _fib_symbols(31)  # unlimited code would reach 30 bits
    buf = huffman_encode(x)
    _, _, _, lengths = _header(buf)
    assert lengths.max() == MAX_CODE_LEN
    np.testing.assert_array_equal(huffman_decode(buf, x.shape[0]), x)


@pytest.mark.parametrize("n", [2, 3, 17, 300, 511, 512, 2000, 20_000])
def test_code_lengths_are_optimal_and_monotone(n):
    rng = np.random.default_rng(n)
    freqs = np.maximum(1, (rng.pareto(1.0, n) * 10).astype(np.int64))
    lengths = code_lengths(freqs)
    assert _kraft_units(lengths, MAX_CODE_LEN) == 1 << MAX_CODE_LEN
    if lengths.max() < MAX_CODE_LEN:  # not limited: must be an optimal code
        assert int(np.dot(freqs, lengths.astype(np.int64))) == _reference_cost(freqs)
    order = np.argsort(freqs, kind="stable")
    assert np.all(np.diff(lengths[order].astype(np.int64)) <= 0)  # rarer -> not shorter


def test_construction_is_optimal():
    rng = np.random.default_rng(RNG_SEED)
    for n in (2, 5, 64, 1000, 5000):
        for w in (
            np.sort(rng.integers(1, 5, n)),
            np.sort(rng.integers(1, 10**9, n)),
            np.sort(np.maximum(1, (rng.pareto(0.7, n) * 3).astype(np.int64))),
        ):
            w = w.astype(np.int64)
            depths = huffman_depths(w)
            assert int(np.dot(w, depths)) == _reference_cost(w)


def test_small_limit_many_symbols():
    rng = np.random.default_rng(3)
    freqs = np.maximum(1, (rng.pareto(0.5, 256) * 5).astype(np.int64))
    lengths = code_lengths(freqs, max_len=8)
    assert np.all(lengths == 8)  # 256 symbols, 8 bits: the only complete code
    lengths = code_lengths(freqs[:200], max_len=9)
    assert lengths.max() <= 9 and _kraft_units(lengths, 9) == 1 << 9
    with pytest.raises(ValueError):
        code_lengths(freqs, max_len=7)


def test_size_close_to_entropy():
    rng = np.random.default_rng(RNG_SEED)
    x = _laplace(rng, 1_000_000, 1.5)
    counts = np.bincount(x)
    p = counts[counts > 0] / x.shape[0]
    entropy_bytes = -(p * np.log2(p)).sum() * x.shape[0] / 8
    buf = huffman_encode(x)
    n = int(np.count_nonzero(counts))
    assert len(buf) <= 1.02 * entropy_bytes + 12 + 3 * n


# --- damaged streams ----------------------------------------------------------


def _stream(n=20_000):
    x = _laplace(np.random.default_rng(5), n, 3.0)
    return x, huffman_encode(x)


def test_truncation_raises():
    x, buf = _stream()
    for cut in [0, 1, 5, 11, 12, 13, 20, len(buf) // 2, len(buf) - 2, len(buf) - 1]:
        with pytest.raises(ValueError):
            huffman_decode(buf[:cut], x.shape[0])
    with pytest.raises(ValueError):
        huffman_decode(buf + b"\0", x.shape[0])


def test_wrong_count_raises():
    x, buf = _stream()
    for count in (0, 1, x.shape[0] - 1, x.shape[0] + 1, 10 * x.shape[0]):
        with pytest.raises(ValueError):
            huffman_decode(buf, count)
    with pytest.raises(ValueError):
        huffman_decode(buf, -1)
    with pytest.raises(ValueError):
        huffman_decode(huffman_encode(np.zeros(0, np.uint16)), 5)


def test_random_byte_flips_never_crash():
    x, buf = _stream(5000)
    rng = np.random.default_rng(11)
    raised = 0
    for trial in range(400):
        b = bytearray(buf)
        # first half of the trials hit the header and table, the rest anywhere
        hi = 12 + 3 * 40 if trial < 200 else len(b)
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(0, hi))] ^= int(rng.integers(1, 256))
        try:
            y = huffman_decode(bytes(b), x.shape[0])
        except ValueError:
            raised += 1
        else:
            assert y.shape == x.shape and y.dtype == np.uint16
    assert raised > 100


def _raw(n, nbits, syms, lengths, payload=b""):
    gaps = np.diff(np.concatenate([[-1], syms])) - 1
    return (
        struct.pack("<IQ", n, nbits)
        + gaps.astype("<u2").tobytes()
        + np.asarray(lengths, np.uint8).tobytes()
        + payload
    )


@pytest.mark.parametrize(
    "buf, count, match",
    [
        (_raw(2, 1, [3, 9], [1, 2], b"\0"), 2, "complete prefix code"),  # Kraft 3/4
        (_raw(3, 3, [3, 9, 11], [1, 1, 1], b"\0"), 3, "complete prefix code"),  # over-full
        (_raw(2, 3, [3, 9], [0, 1], b"\0"), 3, "outside"),
        (_raw(2, 30, [3, 9], [25, 1], b"\0" * 4), 3, "outside"),
        (_raw(1, 0, [3], [1]), 3, "single-symbol"),
        (_raw(1, 8, [3], [0], b"\0"), 3, "single-symbol"),
        (_raw(2, 3, [3, 9], [1, 1], b"\x08"), 3, "padding"),
        (_raw(2, 2, [3, 9], [1, 1], b"\0"), 3, "cannot hold"),
        (_raw(3, 3, [3, 9, 11], [1, 2, 2], b"\0"), 2, "below"),
        (struct.pack("<IQ", 70000, 0), 5, "alphabet"),
        (struct.pack("<IQHHBB", 2, 0, 65535, 0, 1, 1), 5, "runs past"),
        (struct.pack("<IQ", 0, 8) + b"\0", 0, "nonempty"),
        (struct.pack("<IQ", 0, 2**63), 0, "header implies"),
    ],
)
def test_malformed_headers(buf, count, match):
    with pytest.raises(ValueError, match=match):
        huffman_decode(buf, count)


def test_kernel_overrun_and_trailing_flags():
    # lengths 1 (sym 3: code 0) and 2, 2 (codes 10, 11); 4 codes of 2 bits = 8 bits
    good = _raw(3, 8, [3, 9, 11], [1, 2, 2], bytes([0b11111111]))
    np.testing.assert_array_equal(huffman_decode(good, 4), [11, 11, 11, 11])
    # 5 symbols need at least 5 bits; the 8 available decode to 4 symbols, then overrun
    with pytest.raises(ValueError, match="ends in the middle"):
        huffman_decode(good, 5)
    # 4 symbols of code 0 consume 4 of the 8 bits
    zeros = _raw(3, 8, [3, 9, 11], [1, 2, 2], bytes([0]))
    with pytest.raises(ValueError, match="left over"):
        huffman_decode(zeros, 4)

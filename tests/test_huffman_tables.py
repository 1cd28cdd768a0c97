"""The Huffman encoder's one-call table (kernels/huffman.py ``encode_table``): the code
lengths of ``code_lengths`` and the canonical codes of ``_canonical``, bit-reversed, for
any frequencies (ties, one dominant symbol, lengths past the limit); and the span
histogram counts every symbol once."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorpress.compress.huffman import (
    MAX_CODE_LEN,
    _canonical,
    _reverse_bits,
    code_lengths,
    huffman_decode,
    huffman_encode,
)
from tensorpress.compress.kernels.huffman import canonical_table, encode_table, histogram_span


def _expected_table(freqs, syms):
    lengths = code_lengths(freqs)
    codes, *_ = _canonical(lengths, MAX_CODE_LEN)
    ln = lengths.astype(np.int64)
    return lengths, (_reverse_bits(codes, ln) | (ln << 24)).astype(np.uint32)


@settings(max_examples=40, deadline=None)
@given(
    freqs=st.lists(st.integers(1, 1 << 40), min_size=2, max_size=300),
    start=st.integers(0, 1000),
    gap=st.integers(1, 50),
)
def test_table_is_the_canonical_code(freqs, start, gap):
    freqs = np.array(freqs, np.int64)
    syms = start + gap * np.arange(freqs.size, dtype=np.int64)
    lengths, table = encode_table(freqs, syms, MAX_CODE_LEN)
    want_lengths, want = _expected_table(freqs, syms)
    if table.size == 0:  # past the limit: the caller limits the lengths
        assert code_lengths(freqs, 64).max() > MAX_CODE_LEN
        table = canonical_table(want_lengths, syms, MAX_CODE_LEN)
    else:
        assert lengths.tobytes() == want_lengths.tobytes()
    assert table[syms].tobytes() == want.tobytes()


def test_limited_lengths_and_spans_round_trip():
    fib = [1, 1]
    while len(fib) < 27:
        fib.append(fib[-1] + fib[-2])
    symbols = np.repeat(np.arange(30000, 30027, dtype=np.uint16), fib)[::-1].copy()
    counts, lo = histogram_span(symbols)
    assert lo == 30000 and counts.tolist() == fib
    stream = huffman_encode(symbols)
    assert max(stream[12 + 2 * 27 : 12 + 3 * 27]) == MAX_CODE_LEN
    assert np.array_equal(huffman_decode(stream, symbols.size), symbols)

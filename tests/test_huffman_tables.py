"""The Huffman tables (kernels/huffman.py): the encoder's one-call table
(``encode_table``) and the decoder's (``decode_tables``) hold the code lengths of
``code_lengths`` and the canonical code, bit-reversed, as a plain numpy construction
gives it, for any frequencies (ties, one dominant symbol, lengths past the limit); and
the span histogram counts every symbol once."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorpress.compress.sz.huffman import (
    MAX_CODE_LEN,
    code_lengths,
    huffman_decode,
    huffman_encode,
)
from tensorpress.compress.sz.kernels.huffman import (
    canonical_table,
    decode_tables,
    encode_table,
    histogram_span,
)


def _canonical(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, rank)`` of the canonical code of ``lengths``: codes of one length
    consecutive in symbol order, shorter lengths first; rank, the symbols by (length,
    symbol)."""
    lengths = lengths.astype(np.int64)
    cnt = np.bincount(lengths, minlength=MAX_CODE_LEN + 1)
    cnt[0] = 0
    first = np.zeros(MAX_CODE_LEN + 1, np.int64)
    for ln in range(1, MAX_CODE_LEN + 1):
        first[ln] = (first[ln - 1] + cnt[ln - 1]) << 1
    offset = np.concatenate(([0], np.cumsum(cnt)[:-1]))
    rank = np.argsort(lengths, kind="stable")
    codes = np.empty(lengths.size, np.int64)
    codes[rank] = first[lengths[rank]] + np.arange(lengths.size) - offset[lengths[rank]]
    return codes, rank


def _reversed(codes: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each code's low ``lengths`` bits in reverse order."""
    bits = (codes[:, None] >> np.arange(MAX_CODE_LEN)) & 1
    weights = np.where(
        np.arange(MAX_CODE_LEN) < lengths[:, None],
        1 << np.maximum(lengths[:, None] - 1 - np.arange(MAX_CODE_LEN), 0),
        0,
    )
    return (bits * weights).sum(axis=1)


def _expected_table(freqs, syms):
    lengths = code_lengths(freqs)
    codes, _ = _canonical(lengths)
    ln = lengths.astype(np.int64)
    return lengths, (_reversed(codes, ln) | (ln << 24)).astype(np.uint32)


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
    ln = want_lengths.astype(np.int64)
    rev, first, cnt, offset, ordered = decode_tables(syms, ln, MAX_CODE_LEN)
    codes, rank = _canonical(want_lengths)
    assert rev.tolist() == _reversed(codes, ln).tolist()
    assert ordered.tolist() == syms[rank].tolist()
    for length in np.unique(ln):  # each length's codes: from first, in rank order
        at = rank[offset[length] : offset[length] + cnt[length]]
        assert (ln[at] == length).all()
        assert codes[at].tolist() == list(range(first[length], first[length] + cnt[length]))


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

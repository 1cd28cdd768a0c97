"""Huffman code lengths for codes that come in long runs: an encoder's choice.

zstd, after the Huffman stream, shortens a long run of one code to a few bytes, however
long the run; the codes inside such runs cost next to nothing. A Huffman code built from
the plain counts still gives the run's code a short length, and so every other code a
longer one than its share outside the runs asks for: on causal attention probabilities
the upper triangle's zeros are half the codes, and every other code pays about a bit
more for them. Counting each long run once gives the other codes their share.

The stream is an ordinary one of ``sz/huffman.py`` (any complete prefix code decodes),
so the decoder, the payload layout and every older stream are unchanged. The encoder
keeps it where its payload is at least ``RUN_GAIN`` times smaller (``sz/codec.py``), and
the choice prices codes with long runs by ``run_bits`` (``sz/steps.py``).
"""

from __future__ import annotations

import numpy as np

from .huffman import _HEADER, MAX_CODE_LEN, code_lengths, huffman_encode
from .kernels import huffman as _k
from .kernels.runs import long_runs

#: runs of at least this many equal codes count once towards their code's length
MIN_RUN = 16
#: the share of the codes in such runs from which the run-weighted code is tried
RUN_SHARE = 0.05
#: what zstd's coding of one long run costs, in bits (a match: its length and offset)
RUN_BITS = 24
#: the run-weighted code is taken where it makes the payload at most this share of the
#: plain code's: it decodes slower (longer codes per lookup, and zstd decoding matches
#: and literals where it copied the plain stream's incompressible blocks), so a small
#: gain does not pay for it
RUN_GAIN = 0.95


def _priced(counts: np.ndarray, lo: int, found: tuple):
    """``(syms, lengths, bits)``: the codes present (``counts``: the counts of the codes
    from the value ``lo`` on), the lengths of their run-weighted code and ``bits`` its
    estimated cost with every run of at least ``MIN_RUN`` equal codes at ``RUN_BITS``
    (2 bytes per distinct code for the table, as ``steps.huffman_bits``); or the plain
    code's cost where the weighted one's is not under ``RUN_GAIN`` of it (``lengths``
    None then). ``found``: ``long_runs``'s ``(beyond, in_runs, runs)`` for ``counts``."""
    beyond, _, runs = found
    present = np.flatnonzero(counts)
    weights = counts - beyond  # each long run counted once
    syms = (present + lo).astype(np.int64)
    cost = []
    for freqs in (counts[present], weights[present]):
        lengths, table = _k.encode_table(freqs, syms, MAX_CODE_LEN)
        if table.size == 0:  # longer than MAX_CODE_LEN: limited here (rare)
            lengths = code_lengths(freqs)
        bits = float(np.dot(weights[present], lengths.astype(np.int64)))
        cost.append((bits + RUN_BITS * runs + 16.0 * present.size, lengths))
    (plain, _), (weighted, lengths) = cost
    if weighted <= RUN_GAIN * plain:
        return syms, lengths, weighted
    return syms, None, plain


def _enough(codes: np.ndarray, found: tuple) -> bool:
    """Whether ``found`` (``long_runs``'s) puts ``RUN_SHARE`` of the ``codes`` in long
    runs, of two codes or more."""
    return found[1] >= RUN_SHARE * codes.size and found[1] < codes.size


def run_bits(codes: np.ndarray, counts: np.ndarray, lo: int) -> float | None:
    """Estimated bits of the uint16 ``codes`` (``counts``: their counts from the value
    ``lo`` on) where zstd shortens every run of at least ``MIN_RUN`` equal codes to
    ``RUN_BITS``, under the code the encoder would take; None where under ``RUN_SHARE``
    of the codes lie in such runs."""
    if np.count_nonzero(counts) < 2:
        return None
    found = long_runs(codes, lo, counts.size, MIN_RUN)
    return _priced(counts, lo, found)[2] if _enough(codes, found) else None


def weighted_stream(codes: np.ndarray) -> bytes | None:
    """The Huffman stream of the uint16 ``codes`` (1-d) whose code lengths are built from
    the counts with every run of at least ``MIN_RUN`` equal codes counted once; None
    where ``_priced`` does not expect it to pay."""
    # the runs first, over the whole alphabet: most chunks have none, and stop here
    beyond, in_runs, runs = long_runs(codes, 0, 1 << 16, MIN_RUN)
    if not _enough(codes, (beyond, in_runs, runs)):
        return None
    counts, lo = _k.histogram_span(codes)
    if np.count_nonzero(counts) < 2:
        return None
    found = (beyond[lo : lo + counts.size], in_runs, runs)
    syms, lengths, _ = _priced(counts, lo, found)
    if lengths is None:
        return None
    present = syms - lo
    table = _k.canonical_table(lengths, syms, MAX_CODE_LEN)
    nbits = int(np.dot(counts[present], lengths.astype(np.int64)))
    words = np.empty((nbits + 63) // 64, dtype=np.uint64)
    if _k.encode_bits(codes, table, words, 0) != nbits:  # pragma: no cover - a kernel bug
        raise RuntimeError("run-weighted huffman stream: bit count mismatch")
    gaps = np.empty(syms.size, dtype="<u2")
    gaps[0] = syms[0]
    gaps[1:] = np.diff(syms) - 1
    bitstream = words.view(np.uint8)[: (nbits + 7) // 8]
    return b"".join((_HEADER.pack(syms.size, nbits), gaps.tobytes(), lengths.tobytes(), bitstream))


def streams(codes: np.ndarray, pool=None) -> list[bytes]:
    """The Huffman streams worth trying for ``codes``: ``huffman_encode``'s (``pool``:
    its threads), then the run-weighted one where it may pay (``weighted_stream``)."""
    plain = huffman_encode(codes, pool)
    weighted = weighted_stream(codes)
    return [plain] if weighted is None else [plain, weighted]

"""The plugin's decoder of `sz` predictor 14 (wavelet: formats/hdf5_plugin/sz_wavelet.c),
built with AddressSanitizer and UndefinedBehaviorSanitizer, against the Python decoder:
streams (float16/32/64, big-endian too, 1-d to 4-d, odd shapes with partial edge chunks
and dimensions under a level's minimum length, NaN and Inf, escapes from a small radius,
fixes, abs, rel and pw_rel) decode bit for bit as `tp.decompress` decodes them; crafted
side information (lengths, counts, escapes, fix indices) is refused as Python
refuses them, and mutants decode to Python's values or are refused, never with a
sanitizer report; h5py without tensorpress reads a filter-layout dataset whose chunks
were coded with the wavelet predictor."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from plugin_tools import (
    decode_driver,
    decodes_as_python,
    fuzz_bodies,
    predictors,
    read_one_predictor_alike,
    side_of,
    special_field,
)
from tensorpress.formats import read_header
from transform_cases import (
    assert_random_settings_decode_alike,
    assert_sides_decode_alike,
    assert_sides_refused_alike,
    assert_streams_decode_alike,
    coded,
)

WAVELET = 14


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return decode_driver(tmp_path_factory)


def wavelet(x, bound, radius=32768, chunk_bytes=None) -> bytes:
    return coded(x, "wavelet", bound, radius, chunk_bytes)


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8", ">f4", ">f8"])
def test_wavelet_streams_decode_bit_for_bit(driver, tmp_path, dtype):
    assert_streams_decode_alike(driver, tmp_path, dtype, "wavelet", WAVELET)


def test_large_chunks_use_every_level(driver, tmp_path):
    """A 4-d chunk with 2**8 elements along an axis runs all eight levels, one axis under
    the minimum length is left alone; NaN, Inf and bins over MAX_BIN make fixes."""
    for dtype, bound in (("<f4", {"abs": 1e-3}), ("<f2", {"abs": 1e-2}), ("<f8", {"abs": 1e-6})):
        x = special_field((2, 5, 9, 300), dtype, 7)
        if dtype != "<f2":
            x[0, 0, 0, :40] = 1e12  # bins over MAX_BIN: fixes
        stream = wavelet(x, bound, chunk_bytes=x.nbytes)
        assert read_header(stream).nchunks == 1 and predictors(stream) == {WAVELET}
        assert _fixes(side_of(stream)), dtype
        decodes_as_python(driver, tmp_path, stream)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_random_shapes_and_settings_decode_bit_for_bit(driver, tmp_path, seed):
    assert_random_settings_decode_alike(driver, tmp_path, "wavelet", seed)


# -- crafted side information ----------------------------------------------------------


def _parts(side: bytes) -> tuple[list[int], list[int], list[float]]:
    n = struct.unpack_from("<Q", side, 0)[0]
    esc = list(struct.unpack_from(f"<{n}q", side, 8))
    m = struct.unpack_from("<Q", side, 8 + 8 * n)[0]
    idx = list(struct.unpack_from(f"<{m}Q", side, 16 + 8 * n))
    vals = list(struct.unpack_from(f"<{m}d", side, 16 + 8 * n + 8 * m))
    return esc, idx, vals


def _side(esc, idx, vals, n=None, m=None) -> bytes:
    n = len(esc) if n is None else n
    m = len(idx) if m is None else m
    return (
        struct.pack(f"<Q{len(esc)}q", n, *esc)
        + struct.pack(f"<Q{len(idx)}Q", m, *idx)
        + struct.pack(f"<{len(vals)}d", *vals)
    )


def _fixes(side: bytes) -> int:
    return len(_parts(side)[1])


@pytest.fixture(scope="module")
def source():
    """A one-chunk stream with escapes (radius 16) and fixes (bins over MAX_BIN)."""
    x = special_field((6, 7, 40), "<f4", 3)
    x[0, 0, :10] = 1e12  # bins over MAX_BIN: fixes
    stream = wavelet(x, {"abs": 1e-2}, radius=16, chunk_bytes=x.nbytes)
    esc, idx, _ = _parts(side_of(stream))
    assert read_header(stream).nchunks == 1 and len(esc) > 4 and len(idx) >= 4
    return stream


def test_round_tripped_side_decodes(driver, tmp_path, source):
    """The test's own side-information writer reproduces the original bytes."""
    side = side_of(source)
    assert _side(*_parts(side)) == side
    assert_sides_decode_alike(driver, tmp_path, source, [side])


def test_crafted_side_information_is_refused(driver, tmp_path, source):
    side = side_of(source)
    esc, idx, vals = _parts(side)
    size = 6 * 7 * 40
    crafted = {
        "empty": b"",
        "short": side[:5],
        "cut": side[:-1],
        "extra": side + b"\0",
        "more escapes than elements": _side([], [], [], n=size + 1),
        "escape count past the end": _side(esc, idx, vals, n=len(esc) + 1),
        "one escape short": _side(esc[:-1], idx, vals),
        "one escape too many": _side(esc + [5], idx, vals),
        "more fixes than elements": _side(esc, [], [], m=size + 1),
        "fix count past the end": _side(esc, idx, vals, m=len(idx) + 1),
        "fix index out of range": _side(esc, idx[:-1] + [size], vals),
        "fix index huge": _side(esc, idx[:-1] + [2**64 - 1], vals),
        "fix indices unordered": _side(esc, [idx[1], idx[0], *idx[2:]], vals),
        "fix index repeated": _side(esc, [idx[0], *idx[:-1]], vals),
        "values short": _side(esc, idx, vals[:-1]),
    }
    assert_sides_refused_alike(driver, tmp_path, source, crafted)


def test_edited_escapes_and_fixes_decode_alike(driver, tmp_path, source):
    """Valid edits (other escaped values, other fix values and places) decode to
    Python's values: the escapes feed the inverse lifting exactly, fixes overwrite."""
    esc, idx, vals = _parts(side_of(source))
    edits = [
        ([e + 7 for e in esc], idx, vals),
        ([-(2**40) * (k % 3) for k in range(len(esc))], idx, vals),
        # the lifting's int64 sums wrap (two's complement) in both decoders
        ([2**63 - 1 if k % 2 else -(2**63) for k in range(len(esc))], idx, vals),
        ([2**62 if k % 3 else -(2**62) - 1 for k in range(len(esc))], idx, vals),
        (esc, [i + 1 for i in idx[:-1]] + [idx[-1]], [1.5, -np.inf, np.nan] + vals[3:]),
        (esc, [], []),
    ]
    assert_sides_decode_alike(driver, tmp_path, source, [_side(*e) for e in edits])


def test_mutated_payloads_agree_with_python(driver, tmp_path, source):
    decoded, refused = fuzz_bodies(driver, tmp_path, {"source": source}, seed=5, count=60)
    assert decoded and refused


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_fuzz_mutated_payloads(driver, tmp_path, source, seed):
    fuzz_bodies(driver, tmp_path, {"source": source}, seed=300 + seed, count=500)


# -- h5py through the compiled plugin ---------------------------------------------------


def test_h5py_without_tensorpress_reads_wavelet_chunks(tmp_path):
    """The filter's cd_values cannot name a predictor (``auto`` picks per chunk), so
    the chunks are written directly, each a stream coded with the wavelet predictor at
    the dataset's bound; the in-process filter and the compiled plugin read the same
    bytes, the latter in a process that never imports tensorpress."""
    read_one_predictor_alike(tmp_path, "wavelet", WAVELET)

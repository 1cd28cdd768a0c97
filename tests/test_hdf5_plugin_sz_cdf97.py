"""The plugin's decoder of `sz` predictor 15 (cdf97: formats/hdf5_plugin/sz_cdf97.c),
built with AddressSanitizer and UndefinedBehaviorSanitizer, against the Python decoder:
streams (float16/32/64, big-endian too, 1-d to 4-d, odd shapes with partial edge chunks
and dimensions under a level's minimum length, NaN and Inf, escapes from a small radius,
corrections and exact values, abs, rel and pw_rel) decode bit for bit as
`tp.decompress` decodes them (the float64 inverse lifting included); crafted side
information is refused as Python refuses it, and mutants decode to Python's values or
are refused, never with a sanitizer report; h5py without tensorpress reads a
filter-layout dataset whose chunks were coded with the cdf97 predictor. Both codings of
the coefficients: the codes and the bit planes (formats/hdf5_plugin/sz_speck.c), each
forced, and crafted or mutated bit planes refused alike."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
import tensorpress as tp
from plugin_tools import (
    c_verdict,
    decode_driver,
    decodes_as_python,
    fuzz_bodies,
    predictors,
    py_decode,
    read_one_predictor_alike,
    refused_alike,
    side_of,
    special_field,
    with_side,
)
from tensorpress.compress.sz import speck
from tensorpress.compress.sz.cdf97 import PLANES_MARK
from tensorpress.formats import read_header
from test_sz_cdf97 import coding

CDF97 = 15


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return decode_driver(tmp_path_factory)


def cdf97(x, bound, radius=32768, chunk_bytes=None, how="smaller") -> bytes:
    """``x`` coded by the cdf97 predictor, its coefficients as ``how`` says (cdf97.CODING)."""
    codec = {"id": "sz", "predictor": "cdf97", "radius": radius, **bound}
    with coding(how):
        return tp.compress(x, codec=codec, chunk_bytes=chunk_bytes or max(64, x.nbytes // 3))


def planes_of(stream: bytes) -> bool:
    """Whether a one-chunk stream's coefficients are bit planes."""
    side = side_of(stream)
    return len(side) >= 8 and struct.unpack_from("<Q", side)[0] in (PLANES_MARK, PLANES_MARK - 1)


SHAPES = [(301,), (37, 23), (9, 11, 13), (5, 6, 7, 8), (3, 1, 40), (17, 9, 8, 10)]
BOUNDS = [{"abs": 1e-2}, {"rel": 1e-3}, {"pw_rel": 1e-2}]


@pytest.mark.parametrize("how", ["codes", "planes", "codes+", "planes+", "smaller"])
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8", ">f4", ">f8"])
def test_cdf97_streams_decode_bit_for_bit(driver, tmp_path, dtype, how):
    seen = set()
    for k, shape in enumerate(SHAPES):
        for b, bound in enumerate(BOUNDS):
            x = special_field(shape, dtype, k)
            radius = 16 if (k + b) % 2 else 32768  # a small radius: many escapes
            stream = cdf97(x, bound, radius, how=how)
            ids = predictors(stream)
            assert ids <= {0, CDF97}, (shape, bound, ids)
            seen |= ids
            decodes_as_python(driver, tmp_path, stream)
    assert CDF97 in seen


@pytest.mark.parametrize("how", ["codes", "planes", "codes+", "planes+", "smaller"])
def test_large_chunks_use_every_level(driver, tmp_path, how):
    """A 4-d chunk with 2**11 elements along an axis runs all ten levels, one axis under
    the minimum length is left alone."""
    for dtype, bound in (("<f4", {"abs": 1e-3}), ("<f2", {"abs": 1e-2}), ("<f8", {"abs": 1e-6})):
        x = special_field((2, 5, 9, 2100), dtype, 7)
        stream = cdf97(x, bound, chunk_bytes=x.nbytes, how=how)
        assert read_header(stream).nchunks == 1 and predictors(stream) == {CDF97}
        if how != "smaller":
            assert planes_of(stream) == how.startswith("planes"), dtype
        decodes_as_python(driver, tmp_path, stream)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_random_shapes_and_settings_decode_bit_for_bit(driver, tmp_path, seed):
    rng = random.Random(seed)
    for case in range(120):
        shape = tuple(rng.choice([1, 2, 3, 7, 8, 9, 17, 33, 64]) for _ in range(rng.randint(1, 4)))
        x = special_field(shape, rng.choice(["<f2", "<f4", "<f8"]), case)
        bound = rng.choice([{"abs": 1e-2}, {"rel": 1e-3}, {"pw_rel": 1e-2}, {"abs": 1e-5}])
        how = rng.choice(["codes", "planes", "codes+", "planes+", "smaller"])
        stream = cdf97(x, bound, rng.choice([2, 16, 32768]), rng.choice([64, 1000, 10**6]), how)
        decodes_as_python(driver, tmp_path, stream)


# -- crafted side information ----------------------------------------------------------


def _parts(side: bytes) -> tuple[list[int], list[int], list[int], list[float]]:
    """(escapes, index gaps, corrections, exact values)"""
    n = struct.unpack_from("<Q", side, 0)[0]
    esc = list(struct.unpack_from(f"<{n}q", side, 8))
    m = struct.unpack_from("<Q", side, 8 + 8 * n)[0]
    gaps = list(struct.unpack_from(f"<{m}Q", side, 16 + 8 * n))
    ks = list(struct.unpack_from(f"<{m}q", side, 16 + 8 * n + 8 * m))
    at = 16 + 8 * n + 16 * m
    e = struct.unpack_from("<Q", side, at)[0]
    return esc, gaps, ks, list(struct.unpack_from(f"<{e}d", side, at + 8))


def _side(esc, gaps, ks, exact, n=None, m=None, e=None) -> bytes:
    n = len(esc) if n is None else n
    m = len(gaps) if m is None else m
    e = len(exact) if e is None else e
    return (
        struct.pack(f"<Q{len(esc)}q", n, *esc)
        + struct.pack(f"<Q{len(gaps)}Q", m, *gaps)
        + struct.pack(f"<{len(ks)}q", *ks)
        + struct.pack(f"<Q{len(exact)}d", e, *exact)
    )


@pytest.fixture(scope="module")
def source():
    """A one-chunk stream with escapes (radius 16) and corrections, four of them turned
    into exact values (the encoder writes those only where a correction cannot reach)."""
    x = special_field((6, 7, 40), "<f4", 3)
    stream = cdf97(x, {"abs": 1e-2}, radius=16, chunk_bytes=x.nbytes, how="codes")
    esc, gaps, ks, exact = _parts(side_of(stream))
    assert read_header(stream).nchunks == 1 and len(esc) > 4 and len(gaps) > 8
    assert not exact
    stream = with_side(stream, _side(esc, gaps, [0] * 4 + ks[4:], [1.0, -2.5, 1e9, 0.0]))
    assert py_decode(stream) is not None
    return stream


def test_round_tripped_side_decodes(driver, tmp_path, source):
    """The test's own side-information writer reproduces the original bytes."""
    side = side_of(source)
    assert _side(*_parts(side)) == side
    decodes_as_python(driver, tmp_path, with_side(source, side))


def test_crafted_side_information_is_refused(driver, tmp_path, source):
    side = side_of(source)
    esc, gaps, ks, exact = _parts(side)
    size = 6 * 7 * 40
    crafted = {
        "empty": b"",
        "short": side[:5],
        "cut": side[:-1],
        "extra": side + b"\0",
        "more escapes than elements": _side([], [], [], [], n=size + 1),
        "escape count past the end": _side(esc, gaps, ks, exact, n=len(esc) + 1),
        "one escape short": _side(esc[:-1], gaps, ks, exact),
        "one escape too many": _side(esc + [5], gaps, ks, exact),
        "more corrections than elements": _side(esc, [], [], [], m=size + 1),
        "correction count past the end": _side(esc, gaps, ks, exact, m=len(gaps) + 1),
        "gap out of range": _side(esc, gaps[:-1] + [size], ks, exact),
        "gap huge": _side(esc, gaps[:-1] + [2**64 - 1], ks, exact),
        "gaps past the end": _side(esc, [g + size // len(gaps) for g in gaps], ks, exact),
        "exact count wrong": _side(esc, gaps, ks, exact, e=len(exact) + 1),
        "exact value short": _side(esc, gaps, ks, exact[:-1]),
        "a correction made 0": _side(esc, gaps, [0, *ks[1:]], exact) if ks[0] else b"",
    }
    for name, new in crafted.items():
        stream = with_side(source, new)
        assert py_decode(stream) is None, name
        got, code = c_verdict(driver, tmp_path, stream)
        assert got is None and code < 0, name


def test_edited_escapes_and_corrections_decode_alike(driver, tmp_path, source):
    """Valid edits (other escaped values, corrections, exact values and places) decode
    to Python's values: the escapes feed the float64 inverse lifting in both decoders,
    huge ones to Inf and NaN alike."""
    esc, gaps, ks, exact = _parts(side_of(source))
    edits = [
        ([e + 7 for e in esc], gaps, ks, exact),
        ([-(2**40) * (k % 3) for k in range(len(esc))], gaps, ks, exact),
        ([2**63 - 1 if k % 2 else -(2**63) for k in range(len(esc))], gaps, ks, exact),
        (esc, gaps, [k * 3 or 0 for k in ks], exact),
        (esc, gaps, ks, [1.5, -np.inf, np.nan] + exact[3:]),
        (esc, [], [], []),
    ]
    for e, g, k, x in edits:
        decodes_as_python(driver, tmp_path, with_side(source, _side(e, g, k, x)))


def test_mutated_payloads_agree_with_python(driver, tmp_path, source):
    decoded, refused = fuzz_bodies(driver, tmp_path, {"source": source}, seed=5, count=60)
    assert decoded and refused


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2))
def test_fuzz_mutated_payloads(driver, tmp_path, source, planes_source, fixes_source, seed):
    sources = {"source": source, "planes": planes_source, **fixes_source}
    fuzz_bodies(driver, tmp_path, sources, seed=300 + seed, count=500)


# -- crafted bit planes -----------------------------------------------------------------


@pytest.fixture(scope="module")
def planes_source():
    """A one-chunk stream whose coefficients are bit planes, with corrections."""
    for seed in range(4, 40):  # one whose bit planes end inside their last byte
        x = special_field((6, 7, 40), "<f4", seed)
        stream = cdf97(x, {"abs": 1e-2}, chunk_bytes=x.nbytes, how="planes")
        if _planes(side_of(stream))[1][-1] & 1 == 0 and py_decode(_padded(stream)) is None:
            break
    assert read_header(stream).nchunks == 1 and planes_of(stream)
    return stream


def _padded(stream: bytes) -> bytes:
    """``stream`` with the last bit of its bit planes' last byte set."""
    top, data, rest = _planes(side_of(stream))
    return with_side(stream, _planes_side(top, data[:-1] + bytes([data[-1] | 1]), rest))


def _planes(side: bytes) -> tuple[int, bytes, bytes]:
    """(planes, their bytes, the corrections' part) of bit-plane side information."""
    top, n = struct.unpack_from("<BQ", side, 8)
    return top, side[17 : 17 + n], side[17 + n :]


def _planes_side(top: int, data: bytes, rest: bytes) -> bytes:
    return struct.pack("<QBQ", PLANES_MARK, top, len(data)) + data + rest


def test_crafted_bit_planes_are_refused(driver, tmp_path, planes_source):
    side = side_of(planes_source)
    top, data, rest = _planes(side)
    assert _planes_side(top, data, rest) == side and data and rest
    crafted = {
        "planes above 53": _planes_side(54, data, rest),
        "planes 255": _planes_side(255, data, rest),
        "bits cut": _planes_side(top, data[:-1], rest),
        "a byte past the end": _planes_side(top, data + b"\0", rest),
        "padding bits set": _planes_side(top, data[:-1] + bytes([data[-1] | 1]), rest),
        "length past the end": struct.pack("<QBQ", PLANES_MARK, top, len(side)) + data + rest,
        "length huge": struct.pack("<QBQ", PLANES_MARK, top, 2**64 - 2) + data + rest,
        "no length": struct.pack("<QB", PLANES_MARK, top),
        "no corrections": _planes_side(top, data, b""),
    }
    for name, new in crafted.items():
        assert py_decode(with_side(planes_source, new)) is None, name
        refused_alike(driver, tmp_path, with_side(planes_source, new))
    for fewer in range(top):  # other integers, or refused, alike
        stream = with_side(planes_source, _planes_side(fewer, data, rest))
        want = py_decode(stream)
        got, code = c_verdict(driver, tmp_path, stream)
        assert got == want and (code < 0) == (want is None), fewer


def test_codes_beside_bit_planes_are_refused(driver, tmp_path, source, planes_source):
    """The codes of a stream of the first layout under bit-plane side information."""
    refused_alike(driver, tmp_path, with_side(source, side_of(planes_source)))


def test_mutated_bit_planes_agree_with_python(driver, tmp_path, planes_source):
    decoded, refused = fuzz_bodies(driver, tmp_path, {"planes": planes_source}, 6, 80)
    assert decoded and refused


# -- h5py through the compiled plugin ---------------------------------------------------


def test_h5py_without_tensorpress_reads_cdf97_chunks(tmp_path):
    """The filter's cd_values cannot name a predictor (``auto`` picks per chunk), so
    the chunks are written directly, each a stream coded with the cdf97 predictor at
    the dataset's bound; the in-process filter and the compiled plugin read the same
    bytes, the latter in a process that never imports tensorpress."""
    read_one_predictor_alike(tmp_path, "cdf97", CDF97)


# -- crafted corrections' bit planes ------------------------------------------------------


@pytest.fixture(scope="module")
def fixes_source():
    """One-chunk streams whose corrections are bit planes, with an exact value: beside the
    coefficients' bit planes (planes+) and beside their codes (codes+)."""
    x = special_field((6, 7, 40), "<f4", 5, specials=False)
    x.reshape(-1)[9] = 3e38  # no correction reaches it: exact
    streams = {}
    for how in ("planes+", "codes+"):
        streams[how] = cdf97(x, {"abs": 1e-2}, radius=16, chunk_bytes=x.nbytes, how=how)
        assert read_header(streams[how]).nchunks == 1
    return streams


def _fixes_parts(side: bytes) -> tuple[bytes, int, bytes, bytes]:
    """(the coefficients' part, the corrections' planes, their bytes, the exact part)."""
    (first,) = struct.unpack_from("<Q", side)
    if first == PLANES_MARK - 1:
        at = 17 + struct.unpack_from("<Q", side, 9)[0]
    else:
        at = 16 + 8 * struct.unpack_from("<Q", side, 8)[0]
    top, n = struct.unpack_from("<BQ", side, at)
    return side[:at], top, side[at + 9 : at + 9 + n], side[at + 9 + n :]


def _fixes_side(head: bytes, top: int, data: bytes, tail: bytes) -> bytes:
    return head + struct.pack("<BQ", top, len(data)) + data + tail


def test_crafted_corrections_planes_are_refused(driver, tmp_path, fixes_source):
    for how, stream in fixes_source.items():
        head, top, data, tail = _fixes_parts(side_of(stream))
        assert _fixes_side(head, top, data, tail) == side_of(stream) and data
        assert struct.unpack_from("<Q", tail)[0] == 1  # the exact value
        size = 6 * 7 * 40
        crafted = {
            "planes above 53": _fixes_side(head, 54, data, tail),
            "bits cut": _fixes_side(head, top, data[:-1], tail),
            "a byte past the end": _fixes_side(head, top, data + b"\0", tail),
            "length past the end": head + struct.pack("<BQ", top, 2**64 - 1) + data + tail,
            "exact count past the end": _fixes_side(head, top, data, struct.pack("<Q", 2)),
            "exact count huge": _fixes_side(head, top, data, struct.pack("<Q", size + 1)),
            "exact index out of range": _fixes_side(
                head, top, data, struct.pack("<QQd", 1, size, 1.0)
            ),
            "exact value short": _fixes_side(head, top, data, tail[:-1]),
            "extra byte": _fixes_side(head, top, data, tail + b"\0"),
            "no exact part": _fixes_side(head, top, data, b""),
        }
        if how == "codes+":
            crafted["escape count huge"] = head[:8] + struct.pack("<Q", size + 1) + head[16:]
            crafted["a marker as the count"] = head[:8] + struct.pack("<Q", PLANES_MARK)
        for name, new in crafted.items():
            assert py_decode(with_side(stream, new)) is None, (how, name)
            refused_alike(driver, tmp_path, with_side(stream, new))


def test_exact_value_on_a_correction_is_refused(driver, tmp_path, fixes_source):
    """Each element has one value: an exact one where the planes hold a correction too
    is refused by both decoders."""
    stream = fixes_source["planes+"]
    head, top, data, tail = _fixes_parts(side_of(stream))
    (gap,) = struct.unpack_from("<Q", tail, 8)
    k = np.zeros((1, 6, 7, 40), np.int64)
    k.reshape(-1)[gap] = -3
    whole = speck.box_array([tuple(slice(0, n) for n in k.shape)])
    new = _fixes_side(head, speck.planes(k), speck.encode(k, whole, speck.planes(k), 4096), tail)
    refused_alike(driver, tmp_path, with_side(stream, new))
    k.reshape(-1)[gap] = 0
    k.reshape(-1)[gap + 1] = -3  # beside it: decodes, alike
    new = _fixes_side(head, speck.planes(k), speck.encode(k, whole, speck.planes(k), 4096), tail)
    decodes_as_python(driver, tmp_path, with_side(stream, new))


def test_mutated_corrections_planes_agree_with_python(driver, tmp_path, fixes_source):
    decoded, refused = fuzz_bodies(driver, tmp_path, fixes_source, 7, 60)
    assert decoded and refused

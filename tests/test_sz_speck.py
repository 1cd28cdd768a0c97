"""The bit-plane (set-partitioning) coding of ``sz``'s CDF 9/7 coefficients
(sz/speck.py): the kernels give the integers back exactly and refuse damaged streams;
the codec forced through it holds the bound on every element (hypothesis: float16/32/64,
0-d to 5-d, odd shapes, NaN/Inf, constants, bounds 1e-7 to 1e-1 of the range); the
encoder keeps the smaller of the codes and the bit planes per chunk; crafted side
information with valid CRCs raises the library's errors."""

import struct

import numpy as np
import pytest
import tensorpress as tp
from hypothesis import given
from hypothesis import strategies as st
from tensorpress.compress.sz import cdf97, speck
from tensorpress.compress.sz.kernels import speck as kernels
from test_bound_properties import FAST, run_case
from test_sz_cdf97 import SIDE_AT, _rewrite_side, _side, _smooth, coding
from test_sz_predictors import assert_flipped_bytes_handled, sz_contents
from transform_cases import transform_cases


def _ints(shape, seed, scale):
    """int64 integers of ``shape``: mostly 0, some up to ``scale``, a few at the extremes."""
    rng = np.random.default_rng(seed)
    k = np.rint(rng.standard_normal(shape) * rng.choice([0, 0, 0, 1, scale], size=shape))
    k = k.astype(np.int64)
    if k.size > 3:
        k.flat[[0, k.size // 2]] = [2**52, -(2**52)]
    return k


def _round_trip(k):
    boxes = speck.box_array(cdf97.band_boxes(k.shape))
    top = speck.planes(k)
    data = speck.encode(k, boxes, top, 64 * k.size + 64)
    return data, top, boxes


SHAPES = [(1, 1, 1, 1), (1, 1, 1, 2), (1, 1, 1, 9), (1, 3, 33, 17), (5, 8, 9, 31), (2, 2, 2, 2)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [1, 300, 2**30])
def test_integers_come_back_exactly(shape, scale):
    """Every integer (including +-2**52, the quantizer's largest) decodes exactly, and
    the same bytes again; one byte fewer than they need and the encoder gives up."""
    k = _ints(shape, sum(shape) + scale, scale)
    data, top, boxes = _round_trip(k)
    assert top == (53 if k.size > 3 else int(np.abs(k).max()).bit_length())
    np.testing.assert_array_equal(speck.decode(data, top, boxes, shape), k)
    assert speck.encode(k, boxes, top, len(data)) == data
    if data:
        assert speck.encode(k, boxes, top, len(data) - 1) is None


def test_bits_of_zero_sets_and_of_one_value():
    """An all-zero array costs one bit per plane per band; ``[5, 0]`` as one set under
    3 planes costs the 8 bits kernels/speck.py's docstring gives it."""
    shape = (1, 1, 1, 64)
    k = np.zeros(shape, np.int64)
    boxes = speck.box_array(cdf97.band_boxes(shape))
    buf = np.zeros(1024, np.uint8)
    assert kernels.encode(k, boxes, 7, buf) == 7 * len(boxes)
    k = np.array([5, 0], np.int64).reshape(1, 1, 1, 2)
    one = speck.box_array([tuple(slice(0, n) for n in k.shape)])
    buf[:] = 0
    bits = kernels.encode(k, one, 3, buf)
    # 1 (band significant at plane 2), 1 0 (children), 0 (sign +), 0 1 (low bits of
    # 5), 0 0 (the second child: insignificant at planes 1 and 0)
    assert bits == 8 and buf[0] == 0b11000100


def test_damaged_bit_planes_raise():
    """A stream that ends early, carries a byte past its end or padding bits that are
    not 0, or claims more planes than 53, is refused."""
    k = _ints((1, 3, 33, 17), 1, 300)
    data, top, boxes = _round_trip(k)
    with pytest.raises(ValueError, match="end early"):
        speck.decode(data[:-1], top, boxes, k.shape)
    with pytest.raises(ValueError, match="past their end"):
        speck.decode(data + b"\0", top, boxes, k.shape)
    with pytest.raises(ValueError, match="bit planes 54"):
        speck.decode(data, 54, boxes, k.shape)
    rng = np.random.default_rng(0)
    for _ in range(200):  # random bytes: an error or some integers, never a crash
        junk = rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8).tobytes()
        try:
            speck.decode(junk, int(rng.integers(0, 54)), boxes, k.shape)
        except ValueError:
            pass


def test_padding_bits_must_be_zero():
    """``[5]`` takes 4 bits (its 1 at plane 2, its sign, 2 low bits): 4 of padding."""
    k = np.array([5], np.int64).reshape(1, 1, 1, 1)
    boxes = speck.box_array(cdf97.band_boxes(k.shape))
    data = speck.encode(k, boxes, 3, 16)
    assert speck.decode(data, 3, boxes, k.shape)[0, 0, 0, 0] == 5
    with pytest.raises(ValueError, match="past their end"):
        speck.decode(bytes([data[0] | 1]) + data[1:], 3, boxes, k.shape)


#: the side information's first u64 each forced coding writes (None: a count)
FIRST = {
    "planes": cdf97.PLANES_MARK,
    "planes+": cdf97.FIXES_MARK,
    "codes+": cdf97.CODES_FIXES_MARK,
}


@FAST
@given(case=transform_cases("cdf97"), how=st.sampled_from(sorted(FIRST)))
def test_bound_holds_through_the_bit_planes(case, how):
    """Forced through the bit planes (of the coefficients, the corrections or both),
    every element is within the bound, and every chunk the wavelet codes carries them."""
    with coding(how):
        run_case(case)
        kw = case.kwargs(case.array())
        blob = tp.compress(case.array(), **kw)
    for content in sz_contents(blob):
        if content[0] == 15:
            (n,) = struct.unpack_from("<Q", content, SIDE_AT + 8)
            assert n == FIRST[how]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(40, 50), (9, 17, 23), (3, 5, 9, 17), (2, 1000)])
def test_the_smaller_coding_is_kept(dtype, shape):
    """By default the chunk carries whichever of the codes and the bit planes writes
    fewer bytes (within the estimate's slack), and decodes within the bound."""
    x = _smooth(shape, dtype)
    eb = 1e-3 * float(np.ptp(x.astype(np.float64)))
    sizes = {}
    for mode in ("codes", "planes"):
        with coding(mode):
            sizes[mode] = len(tp.compress(x, abs=eb, predictor="cdf97"))
    with coding("smaller"):
        blob = tp.compress(x, abs=eb, predictor="cdf97")
    assert len(blob) <= min(sizes.values()) + 24
    with coding("planes+"):
        assert len(blob) <= len(tp.compress(x, abs=eb, predictor="cdf97")) + 24
    y = tp.decompress(blob)
    assert np.all(np.abs(y.astype(np.float64) - x.astype(np.float64)) <= eb)


def test_bit_planes_pay_on_a_smooth_field():
    """On a smooth 3-d field at rel 1e-3 the bit planes write fewer bytes than the
    codes (runs of insignificant coefficients cost a bit per set, not per value)."""
    x = _smooth((48, 40, 56))
    with coding("codes"):
        codes = tp.compress(x, rel=1e-3, predictor="cdf97")
    with coding("smaller"):
        planes = tp.compress(x, rel=1e-3, predictor="cdf97")
    assert struct.unpack_from("<Q", _side(planes))[0] in (cdf97.PLANES_MARK, cdf97.FIXES_MARK)
    assert len(planes) < 0.9 * len(codes)


def test_damaged_payloads_raise():
    """Flipped bytes reach the decoder: a FormatError or a whole array."""
    with coding("planes"):
        blob = tp.compress(_smooth(), rel=1e-4, predictor="cdf97")
    assert_flipped_bytes_handled(blob, "cdf97", flips=40)


def _planes_side(top: int, data: bytes, rest: bytes = b"") -> bytes:
    rest = rest or struct.pack("<QQ", 0, 0)
    return struct.pack("<QBQ", cdf97.PLANES_MARK, top, len(data)) + data + rest


def _crafted():
    x = np.linspace(0, 1, 500).astype(np.float32)
    with coding("planes"):
        blob = tp.compress(x, rel=1e-3, predictor="cdf97")
    side = _side(blob)
    top, n = struct.unpack_from("<BQ", side, 8)
    return x, blob, side, top, side[17 : 17 + n]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda top, data: _planes_side(54, data), "bit planes 54"),
        (lambda top, data: _planes_side(top, data[:-1]), "end early"),
        (lambda top, data: _planes_side(top, data + b"\0"), "past their end"),
        (lambda top, data: _planes_side(top, data, struct.pack("<QQQ", 0, 0, 0)), "trailing"),
        (lambda top, data: _planes_side(top, data, struct.pack("<Q", 0)), "truncated"),
        (lambda top, data: struct.pack("<QB", cdf97.PLANES_MARK, top), "truncated"),
        (lambda top, data: _planes_side(top, data, struct.pack("<QQ", 2**40, 0)), "more cdf97"),
    ],
)
def test_crafted_bit_planes_raise(make, message):
    _, blob, _, top, data = _crafted()
    with pytest.raises(ValueError, match=message):
        tp.decompress(_rewrite_side(blob, make(top, data)))


def test_codes_beside_bit_planes_raise():
    """With the bit planes every code must be that of k = 0 (a stream has one coding)."""
    x, blob, side, _, _ = _crafted()
    with coding("codes"):
        other = tp.compress(x, rel=1e-3, predictor="cdf97")
    # the codes of the first layout with the side information of the bit planes
    with pytest.raises(ValueError, match="must all be zero"):
        tp.decompress(_rewrite_side(other, side))


def test_auto_keeps_its_bytes():
    """``auto``'s trial of the path codes the coefficients as before the bit planes
    (cdf97_choice.CODES): where it takes the path, its bytes are those it wrote then."""
    from test_sz_cdf97 import _gray_scott_u

    x = _gray_scott_u()
    blob = tp.compress(x, rel=0.1)
    assert [c[0] for c in sz_contents(blob)] == [15]
    with coding("codes"):
        assert tp.compress(x, rel=0.1) == blob
    assert struct.unpack_from("<Q", _side(blob))[0] != cdf97.PLANES_MARK


def test_planar_corrections_pay():
    """On a smooth 3-d field at rel 1e-3 the corrections' bit planes write fewer bytes
    than their list."""
    x = _smooth((48, 40, 56))
    with coding("planes"):
        listed = tp.compress(x, rel=1e-3, predictor="cdf97")
    with coding("planes+"):
        planar = tp.compress(x, rel=1e-3, predictor="cdf97")
    assert struct.unpack_from("<Q", _side(planar))[0] == cdf97.FIXES_MARK
    assert len(planar) < len(listed)
    y = tp.decompress(planar)
    assert np.all(np.abs(y.astype(np.float64) - x) <= 1e-3 * float(np.ptp(x.astype(np.float64))))


def _fixes_source():
    """A one-chunk stream with planar corrections and an exact value; its side parts."""
    x = np.linspace(0, 1, 500).astype(np.float32)
    x[7] = 3e38  # no correction reaches it: exact
    with coding("planes+"):
        blob = tp.compress(x, abs=1e-3, predictor="cdf97")
    side = _side(blob)
    top, n = struct.unpack_from("<BQ", side, 8)
    head, rest = side[: 17 + n], side[17 + n :]
    ftop, fn = struct.unpack_from("<BQ", rest, 0)
    fixes, tail = rest[9 : 9 + fn], rest[9 + fn :]
    (e,) = struct.unpack_from("<Q", tail)
    assert e == 1 and struct.unpack_from("<Q", tail, 8)[0] == 7
    return blob, head, ftop, fixes, tail


def _fixes_side(head, ftop, fixes, tail) -> bytes:
    return head + struct.pack("<BQ", ftop, len(fixes)) + fixes + tail


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda h, t, f, e: (h, 54, f, e), "bit planes 54"),
        (lambda h, t, f, e: (h, t, f[:-1], e), "end early"),
        (lambda h, t, f, e: (h, t, f + b"\0", e), "past their end"),
        (lambda h, t, f, e: (h, t, f, e + b"\0"), "trailing"),
        (lambda h, t, f, e: (h, t, f, e[:-1]), "truncated"),
        (lambda h, t, f, e: (h, t, f, struct.pack("<QQd", 1, 500, 1.0)), "out of range"),
        (lambda h, t, f, e: (h, t, f, struct.pack("<Q", 2**40)), "more cdf97 exact"),
        (lambda h, t, f, e: (h[:8] + b"\xff" * 8, t, f, e), "more cdf97 escapes"),
    ],
)
def test_crafted_planar_corrections_raise(edit, message):
    blob, head, ftop, fixes, tail = _fixes_source()
    if message == "more cdf97 escapes":  # the codes' layout: a count after the marker
        head = struct.pack("<Q", cdf97.CODES_FIXES_MARK) + b"\xff" * 8
    new = _fixes_side(*edit(head, ftop, fixes, tail))
    with pytest.raises(ValueError, match=message):
        tp.decompress(_rewrite_side(blob, new))


def test_exact_values_where_corrections_are_raise():
    """An exact element must have no correction in the bit planes (one value each)."""
    blob, head, ftop, fixes, tail = _fixes_source()
    assert tp.decompress(blob)[7] == np.float32(3e38)  # the exact value, element 7
    k = np.zeros((1, 1, 1, 500), np.int64)
    k[..., 7] = 1
    whole = speck.box_array([tuple(slice(0, n) for n in k.shape)])
    data = speck.encode(k, whole, 1, 4096)
    new = _fixes_side(head, 1, data, tail)
    with pytest.raises(ValueError, match="where corrections are"):
        tp.decompress(_rewrite_side(blob, new))

"""The predictors ``sz`` gained past SZ3's: multi-dimensional interpolation
(``md-linear``, ``md-cubic``) and constant prediction (``constant``). The bound on
every element, exactness where they are exact, damaged payloads, and the automatic
choice taking them where they pay."""

import dataclasses
import itertools
import struct
import zlib

import numpy as np
import pytest
import tensorpress as tp
import zstandard
from hypothesis import given
from hypothesis import strategies as st
from tensorpress.compress.sz.kernels.constant import constant_decode, constant_encode
from tensorpress.compress.sz.kernels.interp_md import md_decode, md_encode
from tensorpress.compress.sz.kernels.interpolation import interp_num_levels
from tensorpress.formats import ChecksumError, ContainerReader, FormatError, TruncatedError
from test_bound_properties import FAST, cases, run_case

MD = ("md-linear", "md-cubic")
NEW = (*MD, "constant")


@st.composite
def new_predictor_cases(draw):
    """The sz property cases (float16/32/64, 0-d to 5-d, odd shapes, NaN/Inf, constants,
    abs/rel/pw_rel, layouts, radii, chunk sizes) with one of the new predictors."""
    return dataclasses.replace(draw(cases()), predictor=draw(st.sampled_from(NEW)))


@FAST
@given(case=new_predictor_cases())
def test_bound_holds_on_every_element(case):
    run_case(case)


def _kernel_roundtrip(x3, eb, cubic, radius=32768):
    levels = np.full(interp_num_levels(x3.shape) + 1, eb)
    codes = np.empty(x3.size, np.uint16)
    outliers = np.empty(x3.size, x3.dtype)
    n = md_encode(x3, levels, radius, 0, cubic, codes, outliers)
    out = np.empty_like(x3)
    md_decode(codes, outliers[:n].copy(), levels, radius, 0, cubic, out)
    assert np.all(np.abs(out - x3) <= eb)
    return codes, outliers[:n], levels


@pytest.mark.parametrize("cubic", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 17), (1, 17, 17), (17, 17, 17), (1, 33, 33)])
def test_exact_on_linear_functions(shape, cubic):
    """A linear function is interpolated exactly along every dimension and in every
    average of them. With sides of 2**k + 1 only the corners of the coarsest level
    lack a neighbour at +s (they are copied); every other code is the zero-error one."""
    i, j, k = np.meshgrid(*(np.arange(n, dtype=np.float64) for n in shape), indexing="ij")
    x3 = np.ascontiguousarray(0.25 * i - 0.125 * j + 0.0625 * k)
    codes, outliers, _ = _kernel_roundtrip(x3, 1e-3, cubic)
    assert outliers.size == 0
    corners = 2 ** sum(n > 1 for n in shape) - 1
    assert np.count_nonzero(codes != 32768) <= corners


@pytest.mark.parametrize("cubic", [False, True])
def test_damaged_outliers_raise(cubic):
    x3 = np.random.default_rng(1).standard_normal((6, 7, 9))
    codes, outliers, levels = _kernel_roundtrip(x3, 1e-3, cubic, radius=4)
    assert outliers.size > 1
    with pytest.raises(ValueError, match="outlier"):
        md_decode(codes, outliers[:-1].copy(), levels, 4, 0, cubic, np.empty_like(x3))


def _smooth(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    for axis in range(len(shape)):
        x = np.cumsum(x, axis=axis)
    return x.astype(np.float32)


@pytest.mark.parametrize("predictor", NEW)
def test_damaged_payloads_raise(predictor):
    """Flipped bytes reach the predictor's decoder: a FormatError or a whole array."""
    x = _smooth((40, 50))
    assert_flipped_bytes_handled(tp.compress(x, rel=1e-3, predictor=predictor), predictor)


#: the predictor byte that opens an sz payload's content (formats/SPEC.md, sz), by config
#: name: stream bytes, so fixed here rather than read from the codec
PREDICTOR_BYTE = {
    "raw": 0,
    "lorenzo": 1,
    "linear": 2,
    "cubic": 3,
    "md-linear": 4,
    "md-cubic": 5,
    "constant": 6,
    "regression": 7,
    "linear-rev": 8,
    "cubic-rev": 9,
    "lattice": 10,
    "fitted": 11,
    "match": 12,
    "pivot": 13,
}


def stream_payloads(blob: bytes) -> list[bytes]:
    """The chunk payloads of a version-2 stream, found as formats/SPEC.md lays them out
    (not through the reader, whose checks the damaged streams below must get past)."""
    (header_len,) = struct.unpack_from("<I", blob, 12)
    (n,) = struct.unpack_from("<Q", blob, 20 + header_len)
    lengths = [struct.unpack_from("<Q", blob, 28 + header_len + 12 * i)[0] for i in range(n)]
    start = 32 + header_len + 12 * n
    ends = np.cumsum([start, *lengths]).tolist()
    return [blob[a:b] for a, b in itertools.pairwise(ends)]


def with_payloads(blob: bytes, payloads: list[bytes]) -> bytes:
    """``blob`` with its chunk payloads replaced, the index, every chunk CRC (of the
    payload followed by its position as a u64) and the index CRC rewritten to match."""
    (header_len,) = struct.unpack_from("<I", blob, 12)
    index = struct.pack("<Q", len(payloads)) + b"".join(
        struct.pack("<QI", len(p), zlib.crc32(p + struct.pack("<Q", i)))
        for i, p in enumerate(payloads)
    )
    return (
        blob[: 20 + header_len] + index + struct.pack("<I", zlib.crc32(index)) + b"".join(payloads)
    )


def sz_contents(blob: bytes) -> list[bytes]:
    """Each chunk's sz payload content: the one zstd frame of formats/SPEC.md opened."""
    return [zstandard.ZstdDecompressor().decompress(p) for p in stream_payloads(blob)]


def predictor_bytes(blob: bytes) -> list[int]:
    """The predictor byte of each chunk of an sz stream."""
    return [content[0] for content in sz_contents(blob)]


def _assert_every_element_written(blob: bytes, shape: tuple, dtype) -> None:
    """Decoded into a buffer of zeros and into one of NaNs, the stream gives the same
    bytes: the decoder wrote every element (and read none it had not written)."""
    reader = ContainerReader(blob)
    zeros = reader.read_rows(0, shape[0], out=np.zeros(shape, dtype))
    nans = reader.read_rows(0, shape[0], out=np.full(shape, np.nan, dtype))
    assert zeros.tobytes() == nans.tobytes(), "the decoder left elements unwritten"


def assert_flipped_bytes_handled(blob: bytes, predictor: str, flips: int = 20) -> None:
    """Bytes flipped inside the sz content of ``blob``'s chunks coded by ``predictor``,
    with the zstd frame and every CRC rewritten so that the damage reaches that
    predictor's decoder: each stream raises FormatError (ValueError's kind the reader
    documents; nothing else, and never one of the checksums) or decodes to an array of
    the stream's shape and dtype with every element written."""
    original = tp.decompress(blob)
    contents = sz_contents(blob)
    coded = [i for i, c in enumerate(contents) if c[0] == PREDICTOR_BYTE[predictor]]
    assert coded, f"no chunk is coded by {predictor}: {predictor_bytes(blob)}"
    rng = np.random.default_rng(2)
    noticed = 0
    for _ in range(flips):
        i = int(rng.choice(coded))
        damaged = bytearray(contents[i])
        damaged[rng.integers(2, len(damaged))] ^= int(rng.integers(1, 256))  # not the id
        payloads = stream_payloads(blob)
        payloads[i] = zstandard.ZstdCompressor().compress(bytes(damaged))
        bad = with_payloads(blob, payloads)
        try:
            y = tp.decompress(bad)
        except FormatError as e:
            assert not isinstance(e, (ChecksumError, TruncatedError)), e
            noticed += 1
            continue
        assert y.shape == original.shape and y.dtype == original.dtype
        if y.ndim:
            _assert_every_element_written(bad, y.shape, y.dtype)
        noticed += y.tobytes() != original.tobytes()
    assert noticed, "no flipped byte changed what the stream decodes to"


def test_rewritten_streams_pass_every_check_and_decode_the_same():
    """The helpers above: a stream rebuilt from its own contents passes tp.info's
    checksum checks and decodes to the same values; a flipped byte left without its CRC
    rewritten is a ChecksumError."""
    x = _smooth((40, 50))
    blob = tp.compress(x, rel=1e-3, chunk_bytes=2000)
    contents = sz_contents(blob)
    assert len(contents) > 1
    again = with_payloads(blob, [zstandard.ZstdCompressor().compress(c) for c in contents])
    assert tp.info(again)["chunks"] == len(contents)
    assert tp.decompress(again).tobytes() == tp.decompress(blob).tobytes()
    assert with_payloads(blob, stream_payloads(blob)) == blob
    bad = bytearray(blob)
    bad[-1] ^= 1
    with pytest.raises(ChecksumError):
        tp.decompress(bytes(bad))


def _smooth_random_field(shape, width=12.0, seed=0):
    """White noise low-pass filtered (a Gaussian of ``width`` cycles^-1 per sample)."""
    rng = np.random.default_rng(seed)
    axes = tuple(range(len(shape)))
    freqs = [np.fft.fftfreq(n) for n in shape[:-1]] + [np.fft.rfftfreq(shape[-1])]
    k2 = sum(f**2 for f in np.meshgrid(*freqs, indexing="ij"))
    spectrum = np.fft.rfftn(rng.standard_normal(shape), axes=axes) * np.exp(-k2 * width**2)
    return np.fft.irfftn(spectrum, shape, axes=axes).astype(np.float32)


def test_multidim_beats_one_dim_on_a_smooth_volume():
    """On a smooth 3-d field the multi-dimensional cubic writes fewer bytes than the
    dimension-by-dimension cubic at the same bound (the gain it is there for), and the
    default predictor choice (by sampling) takes the gain."""
    x = _smooth_random_field((40, 40, 40))
    kw = {"rel": 1e-2, "alpha": 1.25, "beta": 2.0}
    md = tp.compress(x, predictor="md-cubic", **kw)
    one = tp.compress(x, predictor="cubic", **kw)
    assert len(md) < 0.9 * len(one)
    assert len(tp.compress(x, rel=1e-2)) <= len(md)
    assert np.max(np.abs(tp.decompress(md) - x)) <= 1e-2 * float(np.ptp(x))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_constant_kernel_round_trip_and_damage(dtype):
    x = np.random.default_rng(3).standard_normal(1000).astype(dtype)
    x[::97] = 1e6  # far from the middle: outliers
    codes = np.empty(x.size, np.uint16)
    outliers = np.empty(x.size, dtype)
    prec = 0 if dtype == np.float64 else 1
    n = constant_encode(x, 0.25, 1e-2, 32768, prec, codes, outliers)
    assert n == np.count_nonzero(x == 1e6) and np.all((codes == 0) == (x == 1e6))
    out = np.empty_like(x)
    assert constant_decode(codes, outliers[:n].copy(), 0.25, 1e-2, 32768, prec, out) == n
    assert np.all(np.abs(out.astype(np.float64) - x) <= 1e-2)
    with pytest.raises(ValueError, match="outlier"):
        constant_decode(codes, outliers[: n - 1].copy(), 0.25, 1e-2, 32768, prec, out)


def test_constant_prediction_pays_on_noise():
    """On independent noise a prediction from neighbours adds their noise; the default
    choice takes constant prediction and writes fewer bytes than any interpolation."""
    x = np.random.default_rng(4).standard_normal((64, 256)).astype(np.float32)
    auto = len(tp.compress(x, rel=1e-3))
    others = [len(tp.compress(x, rel=1e-3, predictor=p)) for p in ("interp", "lorenzo")]
    assert auto < 0.98 * min(others)  # about 0.29 of the 8.3 bits per value
    assert auto <= len(tp.compress(x, rel=1e-3, predictor="constant"))


def _payload_flags(payload: bytes) -> int:
    from tensorpress.compress.zstd import zstd_decompress

    return zstd_decompress(payload, 1 << 26)[1]


def _channels(shape, seed=5):
    """N, C, H, W: every channel its own smooth image, unrelated to its neighbours."""
    rng = np.random.default_rng(seed)
    x = np.cumsum(np.cumsum(rng.standard_normal(shape), axis=-1), axis=-2)
    return (x * rng.uniform(0.1, 10.0, shape[:-2] + (1, 1))).astype(np.float32)


def test_unrelated_channels_are_coded_as_2d():
    """Channels that do not predict each other: the chunk is coded as 2-d (flag bit 2,
    all dimensions but the last merged), within the bound."""
    from tensorpress.compress import sz
    from tensorpress.compress.bounds import ErrorBound

    x = _channels((4, 16, 32, 32))
    codec = sz.SZCodec()
    bound = ErrorBound("rel", 1e-3).resolve(x)
    payload = codec.encode(x, bound)
    assert _payload_flags(payload) & sz.FLAG_ROWS
    y = codec.decode(payload, x.shape, x.dtype)
    assert np.all(np.abs(y.astype(np.float64) - x) <= bound.tolerance)
    assert np.array_equal(y, codec.decode(payload, x.shape, x.dtype, threads=2))


def test_two_layout_flags_are_refused():
    from tensorpress.compress import sz
    from tensorpress.compress.bounds import ErrorBound
    from tensorpress.compress.zstd import zstd_compress, zstd_decompress

    x = _channels((4, 16, 32, 32))
    codec = sz.SZCodec()
    raw = bytearray(zstd_decompress(codec.encode(x, ErrorBound("rel", 1e-3).resolve(x)), 1 << 26))
    raw[1] |= sz.FLAG_FLAT | sz.FLAG_ROWS
    with pytest.raises(ValueError, match="layout"):
        codec.decode(zstd_compress(bytes(raw), 3), x.shape, x.dtype)
    with pytest.raises(ValueError, match="layout"):  # 2-d needs 3 dimensions or more
        codec.decode(
            zstd_compress(bytes(raw[:1]) + bytes([sz.FLAG_ROWS]) + bytes(raw[2:]), 3),
            (4096, 64),
            x.dtype,
        )

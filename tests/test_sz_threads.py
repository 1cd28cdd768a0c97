"""Threads inside one ``sz`` chunk: the bytes and the decoded values never depend on them.

Encoding splits the large interpolation passes by lines over the threads;
decoding reconstructs pieces of the passes while another thread Huffman-decodes
the codes ahead. The thresholds are lowered here so that small arrays are cut
into many parts and pieces.
"""

import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorpress as tp
from tensorpress.compress import sz
from tensorpress.compress.bounds import ErrorBound
from tensorpress.compress.sz import interpolation as sz_interpolation
from tensorpress.compress.sz import steps as sz_steps
from tensorpress.compress.sz.huffman import HuffmanDecoder, huffman_decode, huffman_encode
from tensorpress.compress.sz.kernels.interpolation import (
    ALL,
    interp_code,
    interp_encode,
    interp_num_levels,
    interp_pass_sizes,
)
from tensorpress.compress.zstd import zstd_compress, zstd_decompress

# the dimension order, passed as the library passes it: calls that leave it out compile
# kernels of their own that nothing else uses
ORDER = 0
SHAPES = [(1, 1, 1000), (1, 37, 64), (5, 17, 33), (16, 16, 16), (1, 2, 4097), (9, 1, 130)]


def _field(shape, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    x = np.cumsum(rng.standard_normal(shape), axis=-1) + 0.1 * rng.standard_normal(shape)
    x.reshape(-1)[::97] *= 1e3  # outliers
    return x.astype(dtype)


@pytest.fixture
def many_parts(monkeypatch):
    """Thread pools for every chunk, passes split from 64 points, pieces of 1/8."""
    monkeypatch.setattr(sz_steps, "PARALLEL_MIN_ELEMENTS", 1)
    monkeypatch.setattr(sz_interpolation, "SPLIT_MIN_POINTS", 64)


def test_pass_sizes_add_up_to_the_array():
    for shape in SHAPES + [(0, 4, 4), (1, 1, 1), (2, 3, 1)]:
        sizes = interp_pass_sizes(*shape, ORDER)
        assert len(sizes) == 3 * interp_num_levels(shape) + 1
        assert int((sizes[:, 0] * sizes[:, 1]).sum()) == int(np.prod(shape))


@pytest.mark.parametrize("cubic", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_line_ranges_in_any_split_give_the_one_call_codes(shape, dtype, cubic):
    """Each pass coded as two or three line ranges, the later ones first and with
    their own outlier buffers, gives the codes and outliers of interp_encode."""
    x = _field(shape, dtype)
    prec = 0 if dtype == np.float64 else 1
    levels = np.full(interp_num_levels(shape) + 1, 1e-3)
    codes = np.empty(x.size, np.uint16)
    outliers = np.empty(x.size, dtype)
    k = interp_encode(x, levels, 32768, prec, cubic, codes, outliers, ORDER)
    assert k > 0

    codes2 = np.full(x.size, 7, np.uint16)
    rec = np.empty_like(x)
    found = []
    for q, (lines, _) in enumerate(interp_pass_sizes(*shape, ORDER).tolist()):
        cuts = sorted({0, lines // 3, (2 * lines) // 3, lines})
        parts = []
        for a, b in reversed(list(zip(cuts, cuts[1:], strict=False))):
            buf = np.empty(x.size, dtype)
            n = interp_code(
                x, rec, codes2, buf, levels, 32768, prec, cubic, False, q, q + 1, a, b, 0, ORDER
            )
            parts.append(buf[:n])
        found.extend(reversed(parts))
    assert np.array_equal(codes2, codes)
    assert np.array_equal(np.concatenate(found), outliers[:k])

    # decoding the passes piece by piece, outlier index carried along
    out = np.empty_like(x)
    oi = 0
    for q, (lines, _) in enumerate(interp_pass_sizes(*shape, ORDER).tolist()):
        for a, b in ((0, lines // 2), (lines // 2, ALL)):
            oi = interp_code(
                out, out, codes, outliers[:k], levels, 32768, prec, cubic, True,
                q, q + 1, a, b, oi, ORDER,
            )  # fmt: skip
    assert oi == k
    assert np.array_equal(out.view(np.uint8), rec.view(np.uint8))


def test_encoding_more_outliers_than_room_raises_instead_of_writing_past():
    x = _field((1, 1, 1000))
    levels = np.full(interp_num_levels(x.shape) + 1, 1e-3)
    codes = np.empty(x.size, np.uint16)
    for q, ln, oi in ((-1, 0, 0), (1, -5, 0), (1, 0, -1)):
        with pytest.raises(ValueError, match=">= 0"):
            interp_code(
                x,
                np.empty_like(x),
                codes,
                np.empty(x.size),
                levels,
                32768,
                0,
                True,
                False,
                q,
                ALL,
                ln,
                ALL,
                oi,
                ORDER,
            )
    with pytest.raises(ValueError, match="capacity"):
        interp_code(
            x,
            np.empty_like(x),
            codes,
            np.empty(1),
            levels,
            32768,
            0,
            True,
            False,
            0,
            ALL,
            0,
            ALL,
            0,
            ORDER,
        )


@pytest.mark.parametrize("scale", [0.3, 2, 40, 3000])  # two codes a lookup up to ~6 bits
def test_huffman_decoder_in_pieces_equals_one_call(scale):
    rng = np.random.default_rng(3)
    symbols = np.clip(32768 + np.round(rng.laplace(0, scale, 50_000)), 0, 65535)
    symbols = symbols.astype(np.uint16)
    stream = huffman_encode(symbols)
    assert np.array_equal(huffman_decode(stream, symbols.size), symbols)
    dec = HuffmanDecoder(stream, symbols.size)
    for stop in sorted(set(rng.integers(0, symbols.size, 40).tolist())):
        dec.decode_to(stop)
        assert dec.done == stop
        assert np.array_equal(dec.symbols[:stop], symbols[:stop])
    assert np.array_equal(dec.finish(), symbols)
    with pytest.raises(ValueError):  # the bitstream cut short
        n = struct.unpack_from("<I", stream)[0]
        cut = stream[: 12 + 3 * n + (len(stream) - 12 - 3 * n) // 2]
        cut = cut[:4] + struct.pack("<Q", 8 * (len(cut) - 12 - 3 * n)) + cut[12:]
        huffman_decode(cut, symbols.size)
    for short in (np.full(10, 5, np.uint16), np.empty(0, np.uint16)):
        assert np.array_equal(HuffmanDecoder(huffman_encode(short), short.size).finish(), short)


@pytest.mark.parametrize("size", [2, 3, 127, 128, 129, 1000, 4097, 100_000])
def test_huffman_encode_in_two_halves_writes_the_same_stream(size):
    rng = np.random.default_rng(size)
    laplace = np.clip(32768 + np.round(rng.laplace(0, 30, size)), 0, 65535).astype(np.uint16)
    two = (rng.random(size) < 0.5).astype(np.uint16)  # 1-bit codes: halves end on word edges
    skewed = np.where(rng.random(size) < 0.999, 7, rng.integers(0, 65536, size)).astype(np.uint16)
    with ThreadPoolExecutor(2) as pool:
        for symbols in (laplace, two, skewed):
            stream = huffman_encode(symbols)
            assert huffman_encode(symbols, pool) == stream
            assert np.array_equal(huffman_decode(stream, size), symbols)


def test_huffman_decoder_in_pieces_still_catches_damage():
    symbols = np.arange(4000, dtype=np.uint16) % 300
    stream = bytearray(huffman_encode(symbols))
    with pytest.raises(ValueError, match="left over"):
        HuffmanDecoder(bytes(stream), symbols.size - 5).finish()  # fewer symbols than coded
    dec = HuffmanDecoder(bytes(stream), symbols.size)
    dec.decode_to(100)
    assert np.array_equal(dec.symbols[:100], symbols[:100])
    stream[-40:] = b"\xff" * 40
    with pytest.raises(ValueError):
        d = HuffmanDecoder(bytes(stream), symbols.size)
        for stop in range(0, symbols.size + 1, 500):
            d.decode_to(stop)
        out = d.finish()
        assert not np.array_equal(out, symbols)  # not reached: damage is detected
    assert np.array_equal(huffman_decode(huffman_encode(symbols), symbols.size), symbols)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("mode", ["abs", "rel", "pw_rel"])
def test_bytes_and_values_do_not_depend_on_threads(many_parts, dtype, mode):
    bound = {"abs": 1e-4, "rel": 1e-3, "pw_rel": 1e-2}[mode]
    for predictor in ("linear", "cubic", "auto"):
        for shape in [(37, 64), (5, 17, 33), (2, 3, 20, 30), (4097,)]:
            x = _field(shape, dtype, seed=len(shape))
            x.reshape(-1)[5::211] = np.nan
            blobs = [
                tp.compress(x, codec="sz", predictor=predictor, workers=w, **{mode: bound})
                for w in (1, 2, 3)
            ]
            assert blobs[0] == blobs[1] == blobs[2], (predictor, shape)
            ys = [tp.decompress(blobs[0], workers=w) for w in (1, 2, 3)]
            for y in ys[1:]:
                assert np.array_equal(ys[0].view(np.uint8), y.view(np.uint8))
            tol = np.float64(bound)
            x64, y64 = x.astype(np.float64), ys[1].astype(np.float64)
            fin = np.isfinite(x64)
            assert np.array_equal(np.isnan(x64), np.isnan(y64))
            err = np.abs(x64[fin] - y64[fin])
            if mode == "abs":
                assert np.all(err <= tol)
            elif mode == "rel":
                assert np.all(err <= tol * (x64[fin].max() - x64[fin].min()))
            else:
                assert np.all(err <= tol * np.abs(x64[fin]))


def test_real_size_chunk_uses_threads_and_matches_one_thread():
    """Above the real thresholds (2**19 elements): one 4 MiB chunk, two threads."""
    x = _field((1024, 1024), np.float32)
    one = tp.compress(x, rel=1e-3, workers=1)
    assert tp.compress(x, rel=1e-3, workers=2) == one
    assert np.array_equal(tp.decompress(one, workers=2), tp.decompress(one, workers=1))


def _payload(x, predictor="cubic"):
    codec = sz.SZCodec(predictor=predictor)
    return codec, codec.encode(x, ErrorBound("abs", 1e-3).resolve(None), threads=1)


def test_a_huffman_error_midway_stops_the_overlapped_decoder(many_parts, monkeypatch):
    x = _field((64, 256), np.float32)
    codec, payload = _payload(x)
    pieces = []
    real = HuffmanDecoder.decode_to

    def failing(self, stop):
        if pieces:
            raise ValueError("huffman: bitstream holds a bit pattern that is no code")
        pieces.append(stop)
        real(self, stop)

    monkeypatch.setattr(HuffmanDecoder, "decode_to", failing)
    with pytest.raises(ValueError, match="no code"):
        codec.decode(payload, x.shape, x.dtype, threads=2)
    assert len(pieces) == 1


@pytest.mark.parametrize("threads", [1, 2])
def test_codes_out_of_range_raise_with_and_without_threads(many_parts, threads):
    """A payload whose radius field was lowered decodes codes beyond it: an error."""
    x = _field((64, 256), np.float32)
    codec, payload = _payload(x)
    raw = bytearray(zstd_decompress(payload, 1 << 26))
    raw[2 + 24 : 2 + 24 + 4] = (2).to_bytes(4, "little")  # after predictor, flags, 3 f64
    damaged = zstd_compress(bytes(raw), 3)
    with pytest.raises(ValueError, match="out of range|outlier"):
        codec.decode(damaged, x.shape, x.dtype, threads=threads)
    assert np.array_equal(
        codec.decode(payload, x.shape, x.dtype, threads=threads),
        tp.decompress(tp.compress(x, abs=1e-3, codec="sz", predictor="cubic")),
    )


# -- 1-d layout for chunks with small dimensions ------------------------------------


def _flags(payload) -> int:
    return zstd_decompress(payload, 1 << 26)[1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_trailing_dims_may_be_coded_as_1d(dtype):
    """A (64, 32, 3, 3) gradient-like array is coded as 1-d (flag bit 1) and decodes
    within the bound; with a last dimension of 8 or more the flag is never set."""
    rng = np.random.default_rng(0)
    grad = rng.standard_normal((64, 32, 3, 3)).astype(dtype)
    grad += np.linspace(0, 1, 9, dtype=dtype).reshape(3, 3)  # kernels alike
    codec = sz.SZCodec()
    for x, as_1d in ((grad, True), (grad.reshape(2, 1024, 9)[:, :, :8].copy(), False)):
        bound = ErrorBound("rel", 1e-3).resolve(x)
        payload = codec.encode(x, bound)
        assert bool(_flags(payload) & sz.FLAG_FLAT) == as_1d
        y = codec.decode(payload, x.shape, x.dtype)
        assert np.all(np.abs(y.astype(np.float64) - x) <= bound.tolerance)
        with_threads = codec.decode(payload, x.shape, x.dtype, threads=2)
        assert np.array_equal(y, with_threads)


def test_unknown_flag_bits_are_refused():
    x = _field((64, 32), np.float32)
    codec, payload = _payload(x)
    raw = bytearray(zstd_decompress(payload, 1 << 26))
    raw[1] |= 8
    with pytest.raises(ValueError, match="flags"):
        codec.decode(zstd_compress(bytes(raw), 3), x.shape, x.dtype)

"""The plugin's C decoder, built with AddressSanitizer and UndefinedBehaviorSanitizer
into a command-line driver, against the Python decoder: every golden stream of the
codecs it decodes gives the same bytes, and crafted streams and cd_values (truncations,
bad checksums, lying cd_values, header fields out of range, mutated payloads with valid
checksums) give the same values or the same refusal, never a crash or a sanitizer
report. The seeded mutation fuzz loop is in the slow set."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import random

import numpy as np
import pytest
import tensorpress as tp
import zstandard
from plugin_tools import (
    DATA,
    c_decode,
    decode_driver,
    edits_agree,
    filter_cd,
    payload_mutants,
    py_decode,
    tally,
)
from stream_edits import rewrite_header
from stream_edits import set_bound as _bound
from stream_edits import set_field as _set
from tensorpress.formats import hdf5_filter, read_header

#: golden streams of codecs the plugin decodes, bit for bit (sz's are in
#: test_hdf5_plugin_sz.py, quant's float streams in test_hdf5_plugin_quant.py); bfloat16
#: streams, whatever their codec, are refused
DECODED = ("zstd_", "block", "int8_", "quant_")


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return decode_driver(tmp_path_factory)


def golden_streams():
    for version in ("v1", "v2"):
        for name in json.loads((DATA / version / "manifest.json").read_text()):
            yield f"{version}/{name}"


@pytest.mark.parametrize("name", [n for n in golden_streams() if "/sz_" not in n])
def test_golden_streams_decode_as_in_python_or_are_refused(driver, tmp_path, name):
    blob = (DATA / f"{name}.tp").read_bytes()
    got = c_decode(driver, tmp_path, blob)
    supported = name.split("/")[1].startswith(DECODED) and "bf16" not in name
    if supported:
        assert got == py_decode(blob)
    else:
        assert got is None  # bfloat16 (block2_bf16_rel, quant_bf16_4bit): refused cleanly


def test_the_first_block_layout_is_refused(driver, tmp_path):
    assert c_decode(driver, tmp_path, (DATA / "block_first_layout_f32.tp").read_bytes()) is None


def _chunk(codec: str, dtype: str, chunks, **bound):
    """(stream, cd_values) of one HDF5 chunk as the filter writes it."""
    x = np.random.default_rng(7).standard_normal(chunks).cumsum(axis=0).astype(dtype)
    x.reshape(-1)[3] = 0.0
    cd = filter_cd(codec, dtype, chunks, **bound)
    return bytes(hdf5_filter.encode_chunk(x.tobytes(), cd)), cd


@pytest.fixture(scope="module")
def chunks():
    return {
        "block": _chunk("block", "<f4", (40, 30), abs=1e-2),
        "block_pw": _chunk("block", ">f8", (9, 70), pw_rel=1e-3),
        "block16": _chunk("block", "<f2", (130,), abs=1e-2),
        "int8": _chunk("int8", "<f8", (20, 8), abs=0.05),
        "zstd": _chunk("zstd", ">f4", (5, 6, 7)),
        "sz": _chunk("sz", "<f4", (40, 30), abs=1e-2),
        "sz_pw": _chunk("sz", ">f8", (9, 70), pw_rel=1e-3),
    }


#: header edits (checksums valid) with whether Python decodes the result
HEADER_EDITS = [
    (_set("dtype", "<f8"), False),
    (_set("dtype", ">f4"), False),
    (_set("dtype", "<i4"), False),
    (_set("shape", [30, 40]), False),
    (_set("shape", [2**28, 30]), False),
    (_set("shape", [40.0, 30]), False),
    (_set("shape", [40, True]), False),
    (_set("chunk_rows", 0), False),
    (_set("chunk_rows", 2**62), True),  # one chunk, as 40 rows
    (_set("chunk_rows", 7), False),  # the chunk count no longer matches
    (_set("order", "K"), False),
    (_set("codec", {"id": "int8"}), False),
    (_set("codec", {"id": "block", "entropy": "lz4"}), False),
    (_set("codec", {"id": "block", "radius": 3}), False),
    (_set("codec", {"id": "block", "stages": [{"id": "zstd", "level": 99}]}), False),
    (_set("codec", {"id": "block", "stages": "zstd"}), False),
    (_set("codec", {"id": "block", "abs": 1.0, "pw_rel": 1.0}), False),
    (_set("codec", {"id": "nope"}), False),
    (_set("codec", {"id": "block", "entropy": "zstd"}), True),
    (_set("codec", {"id": "block", "abs": None}), True),
    (_set("bound", None), False),
    (_bound("tolerance", float("nan")), False),
    (_bound("tolerance", -0.01), False),
    (_bound("tolerance", 0.5), False),  # an abs bound's tolerance is its value
    (_bound("tolerance", 1e-3), False),
    (_bound("mode", "psnr"), False),
    (_bound("value", True), False),
    (_set("order", "F"), True),
    (_set("writer", 12), True),
    (_set("target", {"psnr": float("nan")}), True),
    (_set("extra", {"a": [1, 2, {"b": None}], "\u00e9": "\u2603"}), True),
    (lambda h: h.pop("bound"), False),
]


def test_header_edits_agree_with_python(driver, tmp_path, chunks):
    stream, cd = chunks["block"]
    edits_agree(driver, tmp_path, stream, HEADER_EDITS, cd)


@pytest.mark.parametrize(
    "text",
    [
        b"[" * 10_000 + b"]" * 10_000,
        b'{"a":' * 5000 + b"1" + b"}" * 5000,
        b"[1, 2]",
        b"\xff",
        b"",
        b"{",
        b'{"dtype": "<f4",}',
        b'{"dtype": "\\x"}',
        b"{}  x",
        b'{"a": 01}',
        b'{"a": -}',
        b'{"a": "\x01"}',
        b'{"a": 1e}',
        b'{"a": "\xc0\xaf"}',
        b'{"a": tru}',
    ],
)
def test_headers_that_are_not_json_objects_are_refused(driver, tmp_path, chunks, text):
    stream, cd = chunks["block"]
    bad = rewrite_header(stream, text=text)
    assert py_decode(bad, cd) is None
    assert c_decode(driver, tmp_path, bad, cd) is None


def _lying_cd(cd):
    """cd_values that misstate the chunk's layout, codec or bound."""
    rank = cd[7]
    yield [3, *cd[1:]]  # a layout version this reader does not know
    yield cd[:5]  # no chunk layout
    yield cd[:-1]  # ends early
    yield [*cd, 1]  # a value after the shape
    yield [*cd[:5], 8, *cd[6:]]  # element size
    yield [*cd[:5], 3, *cd[6:]]
    yield [*cd[:6], 2, *cd[7:]]  # byte order
    yield [*cd[:7], 0]  # rank
    yield [*cd[:7], 33, *cd[8:]]
    yield [*cd[:8], 0, *cd[9:]]  # a zero dimension
    yield [*cd[:8], *[65536] * rank]  # a chunk past 4 GiB
    yield [*cd[:8], *(d * 2 for d in cd[8:])]  # another chunk shape
    yield [cd[0], 1, *cd[2:]]  # another codec (sz)
    yield [cd[0], cd[1], 2, *cd[3:]]  # another bound mode
    yield [cd[0], cd[1], cd[2], 0, 0, *cd[5:]]  # a tighter bound (0)
    yield [cd[0], cd[1], 7, *cd[3:]]  # an unknown bound mode


def test_lying_cd_values_are_refused(driver, tmp_path, chunks):
    stream, cd = chunks["block"]
    assert c_decode(driver, tmp_path, stream, cd) == py_decode(stream, cd) is not None
    for lie in _lying_cd(cd):
        assert py_decode(stream, lie) is None, lie
        assert c_decode(driver, tmp_path, stream, lie) is None, lie


def test_a_lossless_chunk_reads_in_any_dataset_of_its_layout(driver, tmp_path, chunks):
    stream, cd = chunks["zstd"]
    for codec, mode in ((2, 1), (3, 1), (2, 2)):  # a short last chunk that convert stored
        lie = [cd[0], codec, mode, *cd[3:]]
        assert c_decode(driver, tmp_path, stream, lie) == py_decode(stream, lie) is not None


def test_version_1_cd_values_still_read(driver, tmp_path, chunks):
    stream, cd = chunks["block"]  # little-endian: layout 1 has no byte order
    v1 = [1, *cd[1:6], *cd[7:]]
    assert c_decode(driver, tmp_path, stream, v1) == py_decode(stream, v1) is not None


@pytest.mark.parametrize("name", ["block", "block_pw", "block16", "int8", "zstd", "sz"])
def test_truncations_trailing_bytes_and_bad_checksums_are_refused(driver, tmp_path, chunks, name):
    stream, cd = chunks[name]
    assert c_decode(driver, tmp_path, stream, cd) == py_decode(stream, cd) is not None
    h = read_header(stream)
    cuts = sorted({*range(0, 40), h.payload_offset - 1, h.payload_offset, len(stream) - 1})
    for cut in cuts:
        assert c_decode(driver, tmp_path, stream[:cut], cd) is None, cut
    assert c_decode(driver, tmp_path, stream + b"\0", cd) is None
    for at in (20, h.payload_offset - 2, h.payload_offset + 1, len(stream) - 1):
        flipped = bytearray(stream)
        flipped[at] ^= 0x10
        assert c_decode(driver, tmp_path, bytes(flipped), cd) is None, at


def _zstd_versions_disagree(stream: bytes) -> bool:
    """Whether a chunk payload of ``stream`` starts (at byte 0 or 1) with a zstd frame that
    the system's libzstd (the plugin's) decodes and Python's zstandard refuses or decodes
    to different bytes: a damaged frame without a checksum decodes to different garbage,
    or is caught, in different zstd versions (1.5.4 and 1.5.7 here), a difference of
    zstd's, not of the decoders."""
    lib = ctypes.CDLL(ctypes.util.find_library("zstd") or "libzstd.so.1")
    lib.ZSTD_getFrameContentSize.restype = ctypes.c_ulonglong
    lib.ZSTD_decompress.restype = ctypes.c_size_t
    lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
    h = read_header(stream)
    for o, n in zip(h.offsets, h.lengths, strict=False):
        for frame in (stream[o : o + n], stream[o + 1 : o + n]):
            size = lib.ZSTD_getFrameContentSize(frame, len(frame))
            if size > 1 << 26:  # unknown, an error, or more than a test chunk holds
                continue
            out = ctypes.create_string_buffer(max(size, 1))
            got = lib.ZSTD_decompress(out, size, frame, len(frame))
            if lib.ZSTD_isError(got):
                continue
            try:
                mine = zstandard.ZstdDecompressor().decompress(frame)
            except zstandard.ZstdError:
                return True  # libzstd decodes what zstandard calls corrupt
            if out.raw[:got] != mine:
                return True
    return False


def _agree(driver, tmp_path, chunks, seed: int, per_chunk: int):
    rng = random.Random(seed)
    cases = (
        ((name, seed), bad, cd)
        for name, (stream, cd) in chunks.items()
        for bad in payload_mutants(stream, rng, per_chunk)
    )
    return tally(driver, tmp_path, cases, excuse=_zstd_versions_disagree)


def test_payload_mutants_with_valid_checksums_agree_with_python(driver, tmp_path, chunks):
    decoded, refused = _agree(driver, tmp_path, chunks, seed=1, per_chunk=24)
    assert decoded and refused  # both outcomes were exercised


@pytest.fixture(scope="module")
def entropy_chunks():
    """block in mode 3 (zstd over the packed blocks), and a zstd stage."""
    x = np.tile(np.maximum(np.random.default_rng(3).standard_normal((4, 64)), 0), (16, 1))
    x = x.astype(np.float32)
    out = {}
    for name, codec in (
        ("mode3", {"id": "block", "entropy": "zstd", "abs": 1e-3}),
        ("stage", {"id": "block", "abs": 1e-3, "stages": [{"id": "zstd", "checksum": True}]}),
    ):
        stream = tp.compress(x, codec=codec, chunk_bytes=1 << 30)
        assert read_header(stream).nchunks == 1
        out[name] = (stream, filter_cd("block", "<f4", x.shape, abs=1e-3))
    assert out["mode3"][0][read_header(out["mode3"][0]).payload_offset] == 3
    return out


def test_block_entropy_and_stages_agree_with_python(driver, tmp_path, entropy_chunks):
    for stream, cd in entropy_chunks.values():
        assert c_decode(driver, tmp_path, stream, cd) == py_decode(stream, cd) is not None
    _agree(driver, tmp_path, entropy_chunks, seed=2, per_chunk=16)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_fuzz_payload_and_header_mutants(driver, tmp_path, chunks, entropy_chunks, seed):
    """Seeded mutation fuzzing: CRC-valid payload mutants, and header bytes mutated with
    the header's checksum made valid; same values or the same refusal as Python."""
    _agree(driver, tmp_path, {**chunks, **entropy_chunks}, seed=100 + seed, per_chunk=120)
    rng = random.Random(seed)
    stream, cd = chunks["block"]
    hlen = int.from_bytes(stream[12:16], "little")
    for _ in range(300):
        text = bytearray(stream[16 : 16 + hlen])
        for _ in range(rng.choice((1, 2, 3))):
            text[rng.randrange(len(text))] = rng.choice(b'{}[]",:0123456789.eE-+ntfa\\u\x00\xff')
        bad = rewrite_header(stream, text=bytes(text))
        got, want = c_decode(driver, tmp_path, bad, cd), py_decode(bad, cd)
        assert got is None or got == want, bytes(text)  # never values Python refuses


#: a normal tolerance whose half is subnormal and rounds: the stochastic step is
#: steps_for(tol / 2), which then differs from tol * (1 - 2**-12)
_TOL_HALF_ROUNDS = (2**52 + 1) * 2.0**-1074


def _stochastic_cases():
    x = np.random.default_rng(0).standard_normal((50, 40))
    yield x.astype(np.float32), {"abs": 1e-2}
    yield x.astype(np.float16), {"abs": 1e-2}
    yield x, {"rel": 1e-3, "entropy": "zstd"}
    yield x * (100 * _TOL_HALF_ROUNDS), {"abs": _TOL_HALF_ROUNDS}


@pytest.mark.parametrize("case", range(4))
def test_stochastic_block_streams_decode_bit_for_bit(driver, tmp_path, case):
    """block's stochastic codes count in the step of half the tolerance, divided as
    Python divides it: the C decoder reads them bit for bit as Python (every chunk),
    values that differ from the same codes read on the nearest-rounding step."""
    x, opts = list(_stochastic_cases())[case]
    stream = tp.compress(x, codec="block", stochastic=True, seed=4, chunk_bytes=2048, **opts)
    assert read_header(stream).nchunks > 1
    got = c_decode(driver, tmp_path, stream)
    assert got is not None and got == py_decode(stream)
    y = np.frombuffer(got, x.dtype).astype(np.float64)
    tol = read_header(stream).bound.tolerance
    assert np.all(np.abs(y - x.reshape(-1).astype(np.float64)) <= tol)
    nearest = rewrite_header(stream, lambda h: h["codec"].update(stochastic=False))
    assert c_decode(driver, tmp_path, nearest) == py_decode(nearest) != got


def test_stochastic_payload_mutants_agree_with_python(driver, tmp_path):
    x = np.random.default_rng(2).standard_normal((50, 40)).astype(np.float32)
    stream = tp.compress(x, codec="block", abs=1e-2, stochastic=True, seed=3, chunk_bytes=2048)
    decoded, refused = _agree(driver, tmp_path, {"stochastic": (stream, None)}, 5, 64)
    assert decoded and refused


def test_a_stochastic_block_stream_reads_as_an_hdf5_chunk(driver, tmp_path):
    x = np.random.default_rng(1).standard_normal((40, 30)).astype(np.float32)
    stream = tp.compress(x, codec="block", abs=1e-2, stochastic=True, seed=9)
    cd = filter_cd("block", ">f4", x.shape, abs=1e-2)  # a big-endian dataset
    got = c_decode(driver, tmp_path, stream, cd)
    assert got is not None and got == py_decode(stream, cd)
    assert np.array_equal(np.frombuffer(got, ">f4"), np.frombuffer(py_decode(stream), "<f4"))


def _codec_of(**params):
    return _set("codec", {"id": "block", **params})


#: stochastic configs (checksums valid) with whether Python decodes the stream
STOCHASTIC_EDITS = [
    (_codec_of(stochastic=True, seed=-1), False),
    (_codec_of(stochastic=True, seed=2**31), False),
    (_codec_of(stochastic=True, seed=4.0), False),
    (_codec_of(stochastic=True, seed=True), False),
    (_codec_of(stochastic=True, seed="4"), False),
    (_codec_of(stochastic=True, seed=None), False),
    (_codec_of(stochastic=False, seed=-1), False),  # the seed is checked either way
    (_codec_of(stochastic=1, seed=4), False),
    (_codec_of(stochastic=None, seed=4), False),
    (_codec_of(stochastic="true", seed=4), False),
    (_codec_of(stochastic=True, seed=4, pw_rel=1e-2), False),
    (_codec_of(stochastic=True, seed=4, pw_rel=None), True),
    (_codec_of(stochastic=True, seed=4, abs=1e-2), True),
    (_codec_of(stochastic=True, seed=4, rel=1e-2), True),
    (_codec_of(stochastic=True), True),  # the seed only drew the noise
    (_codec_of(stochastic=True, seed=2**31 - 1, entropy="zstd"), True),
    (_codec_of(stochastic=False), True),  # other values: the nearest step
]


def test_stochastic_configs_agree_with_python(driver, tmp_path):
    x = np.random.default_rng(0).standard_normal((50, 40)).astype(np.float32)
    stream = tp.compress(x, codec="block", abs=1e-2, stochastic=True, seed=4)
    edits_agree(driver, tmp_path, stream, STOCHASTIC_EDITS)


def test_stochastic_under_a_pw_rel_header_bound_is_refused_alike(driver, tmp_path, chunks):
    """A pw_rel bound of the stream's alone (none in the config), which the encoder never
    writes with stochastic codes: both decoders refuse the chunk, as the config's."""
    stream, cd = chunks["block_pw"]
    assert py_decode(stream, cd) is not None
    edited = rewrite_header(stream, lambda h: h["codec"].update(stochastic=True, seed=1))
    assert py_decode(edited, cd) is None
    assert c_decode(driver, tmp_path, edited, cd) is None


def _with_first_payload(stream: bytes, payload: bytes) -> bytes:
    """``stream`` with its first chunk's payload replaced by ``payload`` (any length), its
    index and checksums made valid."""
    from tensorpress.formats.stream_header import chunk_crc, encode_index

    h = read_header(stream)
    lengths, crcs = list(h.lengths), list(h.crcs)
    lengths[0], crcs[0] = len(payload), chunk_crc(payload, 0, h.version)
    at = h.payload_offset - len(encode_index(h.lengths, h.crcs))
    rest = stream[h.offsets[0] + h.lengths[0] :]
    return stream[:at] + encode_index(lengths, crcs) + payload + rest


_SKIPPABLE = b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"abcd"


def _frame_variants(head: bytes, frame: bytes, checksum: bool):
    """(payload, whether it decodes as the original) per SPEC.md's rule on the first
    zstd frame of a payload (check 7); ``checksum``: the frame has a content checksum."""
    unsized = zstandard.ZstdCompressor(write_content_size=False, write_checksum=True)
    unsized = unsized.compress(zstandard.ZstdDecompressor().decompress(frame))
    yield head + frame + b"\x01\x02\x03", True  # bytes after the frame: ignored
    yield head + frame + frame, True  # a second frame: ignored
    yield head + frame + _SKIPPABLE, True
    yield head + frame + frame[:5], True
    yield head + unsized + b"xyz", True  # no declared size, then bytes after it
    yield head + _SKIPPABLE + frame, False  # a skippable frame first
    yield head + frame[:-1], False  # cut short
    if checksum:
        yield head + frame[:-3] + bytes(b ^ 0xFF for b in frame[-3:]), False


@pytest.mark.parametrize("codec", ["zstd", "sz", "stage", "mode3"])
def test_bytes_after_the_first_zstd_frame_are_ignored_by_both(driver, tmp_path, codec):
    """The codec's frame (zstd, sz), a stage's, block's mode 3: the first frame decodes,
    what follows it is ignored; a skippable frame first, a cut frame, a bad checksum are
    refused; the C decoder and Python agree on each."""
    x = np.cumsum(np.random.default_rng(0).standard_normal((40, 30)), 0).astype(np.float32)
    config = {
        "zstd": {"id": "zstd"},
        "sz": {"id": "sz", "abs": 1e-2},
        "stage": {"id": "block", "abs": 1e-3, "stages": [{"id": "zstd", "checksum": True}]},
        "mode3": {"id": "block", "entropy": "zstd", "abs": 1e-3},
    }[codec]
    x = np.tile(np.maximum(x[:4], 0), (10, 1)) if codec == "mode3" else x
    stream = tp.compress(x, codec=config, chunk_bytes=1 << 30)
    h = read_header(stream)
    payload = stream[h.offsets[0] : h.offsets[0] + h.lengths[0]]
    skip = 1 if codec == "mode3" else 0
    assert payload[:skip] == (b"\x03" if skip else b"")
    want = py_decode(stream)
    variants = _frame_variants(payload[:skip], payload[skip:], codec == "stage")
    for k, (bad, same) in enumerate(variants):
        edited = _with_first_payload(stream, bad)
        got = c_decode(driver, tmp_path, edited)
        assert got == py_decode(edited), (codec, k)
        assert (got == want) if same else (got is None), (codec, k)

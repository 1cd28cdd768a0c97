"""Streams made to hurt the reader: every field of a header whose checksums are valid is
checked before anything is decoded, chunks cannot change places, and a stream cannot
make the reader allocate more than its chunks can hold (see SPEC.md, "What a decoder
validates")."""

import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import tensorpress as tp
from peak_memory import CODE as PEAK_CODE
from stream_edits import rewrite_header as _rewrite_header
from stream_edits import set_bound as _set_bound
from stream_edits import set_field as _set
from tensorpress.formats import ChecksumError, ContainerReader, FormatError, read_header
from tensorpress.formats.stream_header import machine_memory
from tensorpress.formats.stream_writer import write_stream


@pytest.fixture(scope="module")
def sz_blob():
    x = np.cumsum(np.random.default_rng(0).standard_normal((64, 16)), axis=0)
    return tp.compress(x.astype(np.float32), abs=1e-2, chunk_bytes=1024)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (_set_bound("tolerance", float("nan")), "tolerance"),
        (_set_bound("tolerance", -0.01), "tolerance"),
        (_set_bound("tolerance", float("inf")), "tolerance"),
        (_set_bound("tolerance", "0.01"), "tolerance"),
        (_set_bound("tolerance", 0.5), "tolerance"),  # an abs bound's is its value
        (_set_bound("value", float("nan")), "bound"),
        (_set_bound("mode", "psnr"), "mode"),
        (_set("bound", None), "bound"),  # sz needs one
        (_set("bound", [1]), "bound"),
        (_set("dtype", ">f4"), "dtype"),
        (_set("dtype", "<i4"), "does not hold"),
        (_set("dtype", "<U4"), "dtype"),
        (_set("dtype", "<c8"), "dtype"),
        (_set("dtype", "<M8[s]"), "dtype"),
        (_set("dtype", "|O"), "dtype"),
        (_set("dtype", [["a", "<f4"]]), "dtype"),
        (_set("dtype", "bfloat16"), "does not hold"),  # sz has no bfloat16 form
        (_set("codec", {"predictor": "auto"}), "id"),
        (_set("codec", {"id": 7}), "id"),
        (_set("codec", "sz"), "id"),
        (_set("codec", {"id": "sz", "radius": "many"}), "codec"),
        (_set("shape", [64.0, 16]), "shape"),
        (_set("shape", [64, True]), "shape"),
        (_set("shape", "64"), "shape"),
        (_set("chunk_rows", 0), "chunk_rows"),
        (_set("chunk_rows", 2.5), "chunk_rows"),
        (_set("order", "K"), "order"),
        (lambda h: h.pop("chunk_rows"), "chunk_rows"),
    ],
)
def test_insane_header_fields_are_format_errors(sz_blob, edit, match):
    bad = _rewrite_header(sz_blob, edit)
    with pytest.raises(FormatError, match=match):
        tp.decompress(bad)
    with pytest.raises(FormatError):
        tp.info(bad)


@pytest.mark.parametrize(
    "text",
    [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000, b"[1, 2]", b"\xff"],
)
def test_headers_that_are_not_json_objects_are_format_errors(sz_blob, text):
    bad = _rewrite_header(sz_blob, text=text)
    with pytest.raises(FormatError, match="header"):
        tp.decompress(bad)


def test_a_bound_on_a_lossless_codec_is_refused():
    blob = tp.compress(np.arange(100, dtype=np.int32), codec="zstd")
    bad = _rewrite_header(blob, _set("bound", {"mode": "abs", "value": 1.0, "tolerance": 1.0}))
    with pytest.raises(FormatError, match="bound"):
        tp.decompress(bad)
    with pytest.raises(FormatError, match="does not hold"):
        tp.decompress(_rewrite_header(blob, _set("dtype", "bfloat16")))


def test_an_unsupported_bound_mode_for_the_codec_is_refused():
    blob = tp.compress(np.linspace(0, 1, 100, dtype=np.float32), codec="int8", abs=0.01)
    edit = _set("bound", {"mode": "pw_rel", "value": 0.01, "tolerance": 0.01})
    with pytest.raises(FormatError, match="pw_rel"):
        tp.decompress(_rewrite_header(blob, edit))


def _two_equal_chunks() -> tuple[bytes, np.ndarray]:
    x = np.random.default_rng(1).integers(-(2**31), 2**31, 512, dtype=np.int32)  # no pattern
    blob = tp.compress(x, codec="zstd", chunk_bytes=1024)
    h = read_header(blob)
    assert h.nchunks == 2 and h.lengths[0] == h.lengths[1]
    return blob, x


def _swap_chunks(blob: bytes) -> bytes:
    """The two chunks of ``blob`` moved to each other's place, index entries too (their
    lengths and CRCs), with the index's own checksum made valid again."""
    h = read_header(blob)
    (a, b), n = h.offsets, h.lengths[0]
    at = h.payload_offset - 4 - 24  # the two index entries
    entries = blob[at : at + 24]
    index = blob[at - 8 : at] + entries[12:] + entries[:12]
    return b"".join(
        [
            blob[: at - 8],
            index,
            struct.pack("<I", zlib.crc32(index)),
            blob[b : b + n],
            blob[a : a + n],
        ]
    )


def test_chunks_swapped_between_positions_are_detected():
    blob, x = _two_equal_chunks()
    assert read_header(blob).version == 2
    swapped = _swap_chunks(blob)
    read_header(swapped)  # header and index are intact
    with pytest.raises(ChecksumError, match="chunk 0"):
        tp.decompress(swapped)


def test_version_1_streams_keep_their_payload_only_checksums():
    """A v1 stream's chunk CRC covers its payload alone: such streams still decode (and a
    swap there is what version 2 was made to catch)."""
    blob, x = _two_equal_chunks()
    h = read_header(blob)
    crcs = [zlib.crc32(blob[o : o + n]) for o, n in zip(h.offsets, h.lengths, strict=True)]
    index = struct.pack("<Q", 2) + b"".join(
        struct.pack("<QI", n, c) for n, c in zip(h.lengths, crcs, strict=True)
    )
    at = h.payload_offset - len(index) - 4
    v1 = (
        blob[:8] + struct.pack("<H", 1) + blob[10:at] + index + struct.pack("<I", zlib.crc32(index))
    )
    v1 = v1 + blob[h.payload_offset :]
    head_end = 16 + struct.unpack_from("<I", v1, 12)[0]
    v1 = v1[:head_end] + struct.pack("<I", zlib.crc32(v1[:head_end])) + v1[head_end + 4 :]
    assert read_header(v1).version == 1
    assert np.array_equal(tp.decompress(v1), x)
    assert np.array_equal(tp.decompress(_swap_chunks(v1)), np.roll(x, 256))


def _stream(shape, chunk_rows, nchunks, dtype="<f4") -> bytes:
    """A stream of ``shape`` whose ``nchunks`` payloads are a few junk bytes each."""
    codec = {"id": "zstd", "level": 3, "shuffle": True}
    return write_stream(dtype, shape, "C", codec, None, chunk_rows, [b"junk"] * nchunks)


def test_a_chunk_larger_than_the_machine_is_refused_before_allocating():
    rows = machine_memory() // 4 + 1
    blob = _stream((rows,), rows, 1)
    with pytest.raises(FormatError, match=f"needs {rows * 4} bytes"):
        tp.decompress(blob)
    with pytest.raises(FormatError, match="memory"):
        tp.info(blob)


def test_an_array_larger_than_the_machine_is_refused_before_allocating():
    """Chunks that fit, together more than the machine holds: a slice still reads."""
    rows = machine_memory() // 4 // 8
    blob = _stream((16 * rows,), rows, 16)
    with pytest.raises(FormatError, match=f"needs {16 * rows * 4} bytes"):
        tp.decompress(blob)
    reader = ContainerReader(blob)
    with pytest.raises(FormatError, match="cannot be decoded"):  # the junk payload
        reader[5]


# -- memory bombs: zstd frames that declare more than their chunk holds ------------------


def _zstd_bomb(size: int, block: int = 1 << 17) -> bytes:
    """A valid zstd frame of ``size`` zero bytes made of run-length blocks (4 bytes per
    ``block`` bytes: 64 KiB declare 2 GiB), its header declaring ``size``."""
    n = size // block
    blocks = [((block << 3) | 2 | (k == n - 1)).to_bytes(3, "little") + b"\0" for k in range(n)]
    return b"\x28\xb5\x2f\xfd\xa0" + struct.pack("<I", size) + b"".join(blocks)


def test_the_bomb_is_a_frame_zstd_decodes():
    import zstandard

    assert zstandard.ZstdDecompressor().decompress(_zstd_bomb(1 << 20)) == bytes(1 << 20)


_BOMB_SCRIPT = """
import sys, time
import tensorpress as tp
from tensorpress.formats import FormatError
blobs = [open(p, "rb").read() for p in sys.argv[1:]]
reset_peak()
before = peak_bytes()
t0 = time.perf_counter()
for blob in blobs:
    try:
        tp.decompress(blob)
    except FormatError as exc:
        print("refused:", exc)
    else:
        print("decoded")
grew = (peak_bytes() - before) // 1024
print(f"grew {grew} KiB in {time.perf_counter() - t0:.1f} s")
"""


def test_a_zstd_frame_declaring_2_gib_is_refused_without_allocating_it(tmp_path):
    """1 KiB chunks whose zstd frame declares 2 GiB, in each codec that runs zstd (the
    ``zstd`` codec, ``sz``, a stage after ``block``): FormatError, quickly, and the
    process's peak memory grows by less than 64 MiB."""
    bomb = _zstd_bomb(1 << 31)
    configs = [
        {"id": "zstd", "level": 3, "shuffle": True},
        {"id": "sz", "predictor": "auto", "alpha": None, "beta": None, "radius": 32768, "level": 3},
        {"id": "block", "stages": [{"id": "zstd", "level": 3, "checksum": False}]},
    ]
    paths = []
    for k, codec in enumerate(configs):
        bound = None if codec["id"] == "zstd" else tp.ErrorBound("abs", 0.1, 0.1)
        path = tmp_path / f"bomb{k}.tp"
        path.write_bytes(write_stream("<f4", (256,), "C", codec, bound, 256, [bomb]))
        paths.append(str(path))
    assert 64 << 10 < len(bomb) < 128 << 10
    run = subprocess.run(
        [sys.executable, "-c", PEAK_CODE + _BOMB_SCRIPT, *paths],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 4 and all("refused" in line and "2147483648" in line for line in lines[:3])
    grew_kib = int(lines[3].split()[1])
    assert grew_kib < 64 << 10, lines[3]


# -- a file that shrinks under an open reader ---------------------------------------------

_SHRINK_SCRIPT = """
import os, sys
import numpy as np
import tensorpress as tp
from tensorpress.formats import ContainerReader, TruncatedError
path = sys.argv[1]
with ContainerReader(path) as reader:
    assert reader.header.nchunks > 4
    reader[0]
    os.truncate(path, os.path.getsize(path) // 2)  # as a copy over the file does
    try:
        reader.read()
    except TruncatedError as exc:
        print("truncated:", exc)
print("alive")
"""


def test_a_file_that_shrinks_under_a_reader_raises_truncated_error(tmp_path):
    x = np.cumsum(np.random.default_rng(2).standard_normal((200, 64)), axis=0)
    path = tmp_path / "x.tp"
    path.write_bytes(tp.compress(x.astype(np.float32), abs=1e-3, chunk_bytes=4096))
    run = subprocess.run(
        [sys.executable, "-c", _SHRINK_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"the reader died ({run.returncode}): {run.stderr}"
    assert run.stdout.splitlines()[0].startswith("truncated:") and "alive" in run.stdout


# -- tp.info checks what it reports -------------------------------------------------------


def _with_payload(blob: bytes, i: int, payload: bytes) -> bytes:
    """``blob`` with chunk ``i``'s payload replaced by ``payload`` (same length), its
    checksum and the index's made valid: a chunk as its writer could have written it."""
    from tensorpress.formats.stream_header import chunk_crc, encode_index

    h = read_header(blob)
    assert len(payload) == h.lengths[i]
    crcs = list(h.crcs)
    crcs[i] = chunk_crc(payload, i)
    index = encode_index(h.lengths, crcs)
    at = h.payload_offset - len(index)
    o = h.offsets[i]
    return blob[:at] + index + blob[h.payload_offset : o] + payload + blob[o + len(payload) :]


@pytest.fixture(scope="module")
def quant_blob():
    x = np.random.default_rng(3).standard_normal((64, 32)).astype(np.float32)
    return tp.compress(x, codec="quant", bits=4, chunk_bytes=2048)


def test_info_verifies_the_chunk_whose_max_error_it_reports(quant_blob):
    h = read_header(quant_blob)
    assert h.nchunks > 1 and 0 < tp.info(quant_blob)["max_error"] < 1
    bad = bytearray(quant_blob)
    bad[h.offsets[1] + 8] ^= 0x40  # the top of chunk 1's max_error: 2.5e-1 -> 2.6e+307
    with pytest.raises(ChecksumError, match="chunk 1"):
        tp.info(bytes(bad))


@pytest.mark.parametrize(
    "head", [b"\x07", b"\x00" + struct.pack("<d", float("nan")), b"\x00" + struct.pack("<d", -1.0)]
)
def test_info_refuses_a_quant_chunk_it_cannot_read(quant_blob, head):
    h = read_header(quant_blob)
    payload = quant_blob[h.offsets[0] : h.offsets[0] + h.lengths[0]]
    bad = _with_payload(quant_blob, 0, head + payload[len(head) :])
    with pytest.raises(FormatError, match="chunk 0"):
        tp.info(bad)


def test_info_reads_max_error_under_stages():
    x = np.random.default_rng(4).standard_normal((64, 32)).astype(np.float32)
    plain = tp.info(tp.compress(x, codec="quant", bits=4))
    staged = tp.info(tp.compress(x, codec="quant", bits=4, stages=["zstd"]))
    assert staged["config"]["stages"] and staged["max_error"] == plain["max_error"] > 0


def test_info_refuses_trailing_bytes_and_corrupted_chunks(sz_blob, tmp_path):
    assert "chunk checksums" in tp.info(sz_blob)["checked"]
    with pytest.raises(FormatError, match="trailing"):
        tp.info(sz_blob + b"\0")
    h = read_header(sz_blob)
    bad = bytearray(sz_blob)
    bad[h.offsets[-1]] ^= 1
    with pytest.raises(ChecksumError, match=f"chunk {h.nchunks - 1}"):
        tp.info(bytes(bad))
    path = tmp_path / "x.tp"
    path.write_bytes(sz_blob)
    assert tp.info(path) == tp.info(sz_blob) == tp.info(str(path))
    path.write_bytes(sz_blob[:-1])
    with pytest.raises(FormatError, match="truncated"):
        tp.info(path)


def test_a_reader_of_a_path_unpickles_only_onto_the_same_file(tmp_path, sz_blob):
    import pickle

    path = tmp_path / "x.tp"
    path.write_bytes(sz_blob)
    reader = ContainerReader(path)
    again = pickle.loads(pickle.dumps(reader))
    assert np.array_equal(again.read(), tp.decompress(sz_blob))
    other = tmp_path / "y.tp"
    other.write_bytes(tp.compress(np.ones((8, 8), np.float32), abs=0.1))
    other.replace(path)  # an atomic rename over it
    with pytest.raises(FormatError, match="replaced"):
        pickle.loads(pickle.dumps(reader))
    reader.close()
    again.close()

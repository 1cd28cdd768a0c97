"""The container: header, index, checksums, truncation, slicing, versions."""

import struct
import zlib

import numpy as np
import pytest
import tensorpress as tp
from tensorpress.formats import (
    ChecksumError,
    ContainerReader,
    FormatError,
    TruncatedError,
    UnknownCodecError,
    UnsupportedVersionError,
    read_header,
)
from tensorpress.formats.stream_header import VALID_VERSION


@pytest.fixture(scope="module")
def field():
    rng = np.random.default_rng(1)
    return np.cumsum(rng.standard_normal((40, 30, 20)), axis=0).astype(np.float32)


@pytest.fixture(scope="module", params=["sz", "zstd"])
def blob(request, field):
    kw = {"rel": 1e-3} if request.param == "sz" else {}
    return tp.compress(field, codec=request.param, chunk_bytes=6000, **kw)


def test_many_chunks(blob, field):
    h = read_header(blob)
    assert h.nchunks == 40 // h.chunk_rows + (40 % h.chunk_rows > 0) and h.nchunks > 4


def test_every_single_byte_flip_is_detected(blob, field):
    ref = tp.decompress(blob)
    rng = np.random.default_rng(0)
    positions = sorted(set(rng.integers(0, len(blob), 300).tolist()) | set(range(0, 64)))
    for pos in positions:
        bad = bytearray(blob)
        bad[pos] ^= 1 << int(rng.integers(0, 8))
        with pytest.raises(FormatError):
            tp.decompress(bytes(bad))
    assert np.array_equal(tp.decompress(blob), ref)


def test_every_truncation_is_detected(blob):
    for n in list(range(0, 80)) + list(range(80, len(blob), max(1, len(blob) // 200))):
        with pytest.raises(FormatError):
            tp.decompress(blob[:n])
    with pytest.raises(TruncatedError):
        tp.decompress(blob[:-1])


def test_trailing_bytes_refused(blob):
    with pytest.raises(FormatError, match="trailing"):
        tp.decompress(blob + b"\0")


def _rewrite_header(blob, version=None, edit=None):
    """Rebuild preamble + header with valid checksum, to test semantic checks."""
    import json

    _, ver, flags, hlen = struct.unpack_from("<8sHHI", blob)
    head = json.loads(blob[16 : 16 + hlen])
    if edit:
        edit(head)
    new = json.dumps(head).encode()
    pre = blob[:8] + struct.pack("<HHI", version or ver, flags, len(new)) + new
    return pre + struct.pack("<I", zlib.crc32(pre)) + blob[16 + hlen + 4 :]


def test_newer_version_refused(blob):
    with pytest.raises(UnsupportedVersionError, match="upgrade"):
        tp.decompress(_rewrite_header(blob, version=VALID_VERSION + 1))


def test_unknown_codec_refused(blob):
    def edit(h):
        h["codec"] = {"id": "nonexistent"}

    with pytest.raises(UnknownCodecError, match="nonexistent"):
        tp.decompress(_rewrite_header(blob, edit=edit))


def test_not_a_stream():
    with pytest.raises(FormatError, match="magic"):
        tp.decompress(b"hello world, this is not compressed data")


@pytest.mark.parametrize(
    "key",
    [
        np.s_[:],
        np.s_[3:17],
        np.s_[-5:],
        np.s_[::3],
        np.s_[30:5:-4],
        np.s_[7],
        np.s_[-1],
        np.s_[2:9, 4],
        np.s_[5, 1:3, ::2],
        np.s_[10:10],
        np.s_[..., 0],
    ],
)
def test_slice_equals_slice_of_decoded(blob, key):
    reader = ContainerReader(blob)
    assert np.array_equal(reader[key], tp.decompress(blob)[key])


def test_slice_decodes_only_touched_chunks(blob):
    """Every chunk but the second damaged: a slice inside it still decodes, one that
    reaches a neighbour raises."""
    h = read_header(blob)
    assert h.nchunks >= 3
    bad = bytearray(blob)
    for i in range(h.nchunks):
        if i != 1:
            bad[h.offsets[i]] ^= 0xFF
    reader = ContainerReader(bytes(bad))
    rows = h.chunk_rows
    assert np.array_equal(reader[rows : rows + 1], tp.decompress(blob)[rows : rows + 1])
    assert np.array_equal(reader.read_rows(rows, 2 * rows), tp.decompress(blob)[rows : 2 * rows])
    with pytest.raises(ChecksumError):
        reader[rows - 1 : rows + 1]
    with pytest.raises(ChecksumError):
        reader[2 * rows]


def test_read_rows_into_out(blob):
    reader = ContainerReader(blob)
    full = tp.decompress(blob)
    rows = reader.header.chunk_rows
    for start, stop in [(0, 0), (1, rows + 2), (0, len(full)), (rows, 2 * rows)]:
        assert np.array_equal(reader.read_rows(start, stop), full[start:stop])
        out = np.full((stop - start, *full.shape[1:]), np.nan, full.dtype)
        assert reader.read_rows(start, stop, out) is out
        assert np.array_equal(out, full[start:stop])
    with pytest.raises(ValueError, match="C-contiguous"):
        reader.read_rows(0, 4, np.empty((4, *full.shape[1:]), np.float64))
    with pytest.raises(IndexError, match="outside"):
        reader.read_rows(2, len(full) + 1)


def test_reader_from_file(tmp_path, blob):
    path = tmp_path / "x.tp"
    path.write_bytes(blob)
    assert np.array_equal(ContainerReader(path)[2:4], tp.decompress(blob)[2:4])


def test_output_independent_of_workers(field):
    a = tp.compress(field, rel=1e-3, chunk_bytes=6000, workers=1)
    b = tp.compress(field, rel=1e-3, chunk_bytes=6000, workers=2)
    assert a == b
    assert np.array_equal(tp.decompress(a, workers=1), tp.decompress(a, workers=2))


def test_index_checksum(blob):
    h = read_header(blob)
    bad = bytearray(blob)
    bad[h.payload_offset - 5] ^= 0xFF  # inside the index
    with pytest.raises(ChecksumError):
        read_header(bytes(bad))


def test_reader_from_empty_file(tmp_path):
    path = tmp_path / "empty.tp"
    path.write_bytes(b"")
    with pytest.raises(TruncatedError, match="empty"):
        ContainerReader(path)


def test_will_read_rows_hints_the_payload_spans(blob):
    """A source with ``will_read`` is told the byte spans of the chunks of each range;
    other sources are left alone."""
    h = read_header(blob)

    class Hinted:
        size = len(blob)
        spans: list = []

        def read(self, offset, length):
            return memoryview(blob)[offset : offset + length]

        def will_read(self, spans):
            self.spans.extend(spans)

    src = Hinted()
    reader = ContainerReader(src)
    rows = h.chunk_rows
    reader.will_read_rows([(5, 5)])
    assert src.spans == []  # nothing to read: no hint
    reader.will_read_rows([(0, 1), (rows - 1, 2 * rows + 1), (5, 5)])
    end = [o + n for o, n in zip(h.offsets, h.lengths, strict=True)]
    assert src.spans == [(h.offsets[0], end[0]), (h.offsets[0], end[2])]
    ContainerReader(blob).will_read_rows([(0, 3)])  # a bytes source takes no hint


def test_checksums_made_in_the_encoding_threads_are_the_payloads(field):
    """``checked_chunks`` yields each payload with its checksum (computed where it was
    encoded: the CRC-32 of the payload and its position), the payloads of
    ``encode_chunks``; the stream is the same either way."""
    from tensorpress.compress import ErrorBound, get_codec
    from tensorpress.formats.stream_writer import checked_chunks, encode_chunks, write_stream

    codec = get_codec("block")
    bound = ErrorBound.from_kwargs(abs=1e-3).resolve(None)
    pairs = list(checked_chunks(field, codec, bound, 3, workers=2))
    assert len(pairs) == 14
    assert all(
        zlib.crc32(struct.pack("<Q", i), zlib.crc32(p)) == c for i, (p, c) in enumerate(pairs)
    )
    assert [p for p, _ in pairs] == list(encode_chunks(field, codec, bound, 3, workers=1))
    args = ("<f4", field.shape, "C", codec.get_config(), bound, 3)
    given = write_stream(*args, [p for p, _ in pairs], crcs=[c for _, c in pairs])
    assert given == write_stream(*args, [p for p, _ in pairs])
    assert np.abs(ContainerReader(given).read() - field).max() <= 1e-3
